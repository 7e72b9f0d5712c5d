/* supervise.c: run the program and make sure nothing outlives it.
 *
 * With a PID namespace, the launcher forks the init (pid 1 inside); the init makes its mounts
 * (mounts.c), forks the program, reaps everything, and when the program is reaped reports status
 * and usage, hands the program's outcome to the launcher over a pipe and exits: the kernel then
 * kills the rest of the namespace. Without one, the launcher is a subreaper, forks the program
 * itself, and after the program is reaped kills every remaining descendant (and, with
 * --uid, every process of that uid): sweep.c.
 *
 * The launcher blocks SIGTERM SIGINT SIGHUP SIGCHLD and reads them from a signalfd in a poll()
 * loop, so no wakeup is lost and every wait can be cut short. One of the first three ends the run:
 * without a PID namespace the launcher sweeps the tree itself; with one, the launcher sends SIGTERM
 * to the init, which kills and reaps the namespace and reports, and after INIT_STOP_MS the launcher
 * sends SIGKILL to the init instead.
 *
 * The launcher mirrors the program's end: its exit code, or the program's signal re-raised on
 * itself (the init, being pid 1, could not); a run ended by a signal to the launcher ends by
 * SIGKILL, as the program did.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- signals ---- */

int supervise_prepare(struct launch *L)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGCHLD);
	/* Report writes to a closed pipe fail with EPIPE instead of killing us (and the program,
	 * until it resets its signals), as writes past the program's file-size limit to a report
	 * file fail with EFBIG. A SIGCHLD ignored by whoever started us would make the kernel reap
	 * our children behind our back. */
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);
	signal(SIGCHLD, SIG_DFL);
	if (!L->start_program)  /* corral-zygote's program resets every one itself */
		signals_note(L); /* what the program must set back to the default before execve */
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
		goto fail;
	L->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (L->sigfd < 0)
		goto fail;
	return 0;
fail:
	report_fatal(W_SIGNALS, errno, NULL);
	return -1;
}

/* Reads every pending signal; 1 when one of them asks to end the run. */
static int drain_signals(int sigfd)
{
	struct signalfd_siginfo si;
	int stop = 0;

	while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT || si.ssi_signo == SIGHUP)
			stop = 1;
	return stop;
}

/* The supervisor needs no stdin/stdout/stderr once the program has them: let the host see EOF
 * as soon as the program's tree is gone. */
static void null_stdio(void)
{
	int rfd = report_get_fd();
	int nfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	int fd;

	for (fd = 0; fd <= 2; fd++) {
		if (fd == rfd || fd == nfd)
			continue;
		if (nfd >= 0)
			dup2(nfd, fd);
		else
			close(fd);
	}
	if (nfd > 2 && nfd != rfd)
		close(nfd);
}

/* The program is started as posix_spawn() does: clone(CLONE_VM | CLONE_VFORK) on a stack of its
 * own. It runs in our memory, without a copy of it, until its execve() (or _exit), and we wait
 * meanwhile: no page tables copied, no copy-on-write fault in either process, no copied memory to
 * tear down at its execve. The supervisor would only wait for that execve anyway (prog_read). What
 * the program changes of its own (fds, working directory, signal dispositions, credentials,
 * rlimits, Landlock, seccomp) is its own: CLONE_FILES, CLONE_FS, CLONE_SIGHAND and CLONE_THREAD are
 * not given. Its writes to memory (the report buffer, errno, its stack below) are ours to ignore;
 * child.c calls nothing that allocates or takes a lock. corral-zygote's program, which runs the
 * program in place of execve, is an ordinary fork. The stack is static, not the run's state: a
 * process starts one program. */
#define CHILD_STACK (256 * 1024)

static struct {
	struct launch *L;
	pid_t parent;
	int rfd, wfd;
	char stack[CHILD_STACK] __attribute__((aligned(16)));
} spawn;

static int child_entry(void *unused)
{
	(void)unused;
	close(spawn.rfd);
	if (spawn.L->sigfd >= 0)
		close(spawn.L->sigfd);
	child_run(spawn.L, spawn.parent, spawn.wfd);
}

static int prog_start(struct launch *L, struct prog *c)
{
	int fds[2];
	int err;

	memset(c, 0, sizeof *c);
	c->errfd = -1;
	c->statusfd = -1;
	if (pipe2(fds, O_CLOEXEC) != 0) {
		report_fatal(W_PIPE, errno, NULL);
		return -1;
	}
	/* --status-fd: a program that execs (a wrapper) gets the write end at fd N (child.c) */
	if (L->plan->status_fd >= 0 && !L->start_program && !L->run_program) {
		int sfd[2];

		/* the read end alone non-blocking: read at the end, whoever still holds the
		 * write end */
		if (pipe2(sfd, O_CLOEXEC) != 0) {
			report_fatal(W_PIPE, errno, NULL);
			close(fds[0]);
			close(fds[1]);
			return -1;
		}
		fcntl(sfd[0], F_SETFL, O_NONBLOCK);     /* cannot fail on a pipe we own */
		c->statusfd = sfd[0];
		L->child.status_wfd = sfd[1];
	}
	report_flush();         /* our lines before the program's */
	if (L->start_program) {
		/* corral-zygote, only into a PID namespace, whose init (we) inherits the program */
		if (L->pidns)
			c->pid = L->start_program(L, fds[1]);
		else
			errno = EINVAL;
		err = errno;
		close(fds[1]);
		if (!L->pidns || c->pid < 0) {
			close(fds[0]);
			report_fatal(W_WARM, err, NULL);
			return -1;
		}
		c->errfd = fds[0];
		c->shown = c->pid;
		return 0;
	}
	spawn.L = L;
	spawn.parent = getpid();
	spawn.rfd = fds[0];
	spawn.wfd = fds[1];
	if (L->run_program) {
		/* corral-zygote: the program never calls execve, it runs the program in the warm
		 * interpreter, so it needs memory of its own (and we must not wait for it
		 * meanwhile) */
		c->pid = fork();
		if (c->pid == 0)
			child_entry(NULL);
	} else {
		c->pid = clone(child_entry, spawn.stack + sizeof spawn.stack,
			       CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
	}
	err = errno;
	/* The program changing its euid may have set the memory's dumpable flag (fs.suid_dumpable):
	 * ours */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	close(fds[1]);
	if (L->child.status_wfd >= 0) {
		close(L->child.status_wfd);
		L->child.status_wfd = -1;
	}
	child_prepared_close(L);
	if (c->pid < 0) {
		close(fds[0]);
		if (c->statusfd >= 0)
			close(c->statusfd);
		c->statusfd = -1;
		report_fatal(W_FORK, err, NULL);
		return -1;
	}
	c->errfd = fds[0];
	c->shown = c->pid;
	return 0;
}

/* ---- PID namespace: the init ---- */

/* The init's parent the launcher is outside the namespace (getppid() is 0): the launcher's death
 * shows as POLLERR on the pipe to the launcher, whose only read end the launcher holds. */
static int launcher_gone(int outfd)
{
	struct pollfd p = { outfd, POLLOUT, 0 };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP));
}

/* --prestart: the host started this launch ahead of its run, and writes one byte on the report
 * socket when the run comes (its code is in place by then). Everything that does not depend on
 * the code is done: the namespaces, the mounts. EOF, or no socket to read: the host let the
 * launch go, and the program never starts. */
static int prestart_wait(const struct launch *L)
{
	char b;
	ssize_t n;

	if (!L->plan->prestart)
		return 0;
	report_flush();
	do
		n = read(L->plan->report_fd, &b, 1);
	while (n < 0 && errno == EINTR);
	return n == 1 ? 0 : -1;
}

/* What the program would do first and does not depend on the code, done by the init ahead of it:
 * the Landlock ruleset, and the seccomp filter (the init's own, inherited) when the init itself
 * starts the program. */
static void init_prepare(struct launch *L)
{
	if (L->start_program) {
		/* corral-zygote: the program is not ours, and makes its own confinement from the
		 * plan */
		if (L->prepare_program)
			L->prepare_program(L);
		return;
	}
	child_prepare(L);
	seccomp_load_early(L->plan);
}

/* --files-wait-fd: the program, started, waits for its files while the init makes them (its
 * interpreter starts meanwhile, on another CPU when there is one). With --prestart the host
 * writes them while the launcher starts: its byte says they are all there. Then the init closes
 * the pipe, and the program goes on to its code. When they cannot be made, or the byte does not
 * come, the program is killed and reaped before it can read EOF there: the run ends as when the
 * files are made first. */
static int files_in_late(struct launch *L, struct prog *c)
{
	close(L->ws.wait_rfd);
	L->ws.wait_rfd = -1;
	if (prestart_wait(L) == 0 && workspace_in(L) == 0) {
		workspace_wait_close(L, 1);
		return 0;
	}
	kill(c->pid, SIGKILL);
	workspace_wait_close(L, 0);
	while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
		;
	close(c->errfd);
	c->errfd = -1;
	return -1;
}

static NORETURN void init_main(struct launch *L, int outfd)
{
	struct prog c;
	struct outcome o = { OUTCOME_EXIT, EXIT_SETUP };
	int late = 0;

	/* Like the launcher: no process of our uid may ptrace us or take our fds (the report
	 * fd). */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	init_block_signals();
	/* pid 1 of the run: its /proc/1/cmdline shows no plan (steps.c) */
	args_hide();
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || launcher_gone(outfd))
		_exit(EXIT_SETUP);
	if (mounts_apply(L) != 0)
		init_end(outfd, &o);
	/* the files are made before the program starts, or while it starts and waits for them
	 * (not corral-zygote's program: forked, it would keep the pipe's write end) */
	if (!L->start_program && !L->run_program)
		late = workspace_wait_open(L);          /* -1: fatal, reported */
	if (late >= 0 && (late || workspace_in(L) == 0)) {
		/* corral-zygote's program is started ahead too, and waits for the run itself */
		int ahead = L->start_program && L->plan->prestart;

		init_prepare(L);
		if ((ahead || late || prestart_wait(L) == 0) && prog_start(L, &c) == 0 &&
		    (!late || files_in_late(L, &c) == 0)) {
			null_stdio();
			init_watch(L, &c, &o);
		}
	}
	init_end(outfd, &o);
}

/* How long the init may take to kill and reap the namespace after SIGTERM before the launcher sends
 * SIGKILL. */
#define INIT_STOP_MS 1000

static void run_pidns(struct launch *L, struct outcome *out)
{
	int sp[2];
	struct outcome from_init;
	size_t have = 0;
	int open_ = 1, init_done = 0, stopping = 0, killed = 0;
	long long deadline = 0;
	pid_t init;

	if (pipe2(sp, O_CLOEXEC) != 0) {
		report_fatal(W_PIPE, errno, NULL);
		goto setup_failed;
	}
	report_flush();         /* our lines before the init's */
	init = fork();
	if (init == 0) {
		close(sp[0]);
		close(L->sigfd);
		L->sigfd = -1;
		init_main(L, sp[1]);
	}
	if (init < 0) {
		report_fatal(W_FORK, errno, NULL);
		close(sp[0]);
		close(sp[1]);
		goto setup_failed;
	}
	close(sp[1]);
	null_stdio();

	while (open_ || !init_done) {
		struct pollfd fds[2] = {
			{ L->sigfd, POLLIN, 0 },
			{ open_ ? sp[0] : -1, POLLIN, 0 },
		};
		int timeout = -1, st;

		if (stopping && !killed) {
			long long left = deadline - now_ms();

			timeout = left > 0 ? (int)left : 0;
		}
		if (poll(fds, 2, timeout) < 0 && errno != EINTR) {
			/* Cannot wait properly: end the run rather than spin. */
			kill(init, SIGKILL);
			killed = 1;
			while (waitpid(init, &st, 0) < 0 && errno == EINTR)
				;
			break;
		}
		if (fds[1].revents) {
			ssize_t n = read(sp[0], (char *)&from_init + have, sizeof from_init - have);

			if (n > 0) {
				have += (size_t)n;
			} else if (n == 0 || errno != EINTR) {
				close(sp[0]);
				open_ = 0;
			}
		}
		if ((fds[0].revents & POLLIN) && drain_signals(L->sigfd) && !stopping) {
			/* The init kills and reaps the namespace, and reports; SIGKILL if it takes
			 * too long (the kernel then kills the whole namespace with the init). */
			kill(init, SIGTERM);
			stopping = 1;
			deadline = now_ms() + INIT_STOP_MS;
		}
		if (stopping && !killed && !init_done && now_ms() >= deadline) {
			kill(init, SIGKILL);
			killed = 1;
		}
		if (!init_done && waitpid(init, &st, WNOHANG) == init)
			init_done = 1;
	}
	if (open_)
		close(sp[0]);

	if (have == sizeof from_init) {
		*out = from_init;
	} else {
		/* The init did not tell: it was killed before the program was reaped. */
		struct rusage ru;

		budget_finish(L, 0);
		report_status(SIGKILL);
		if (getrusage(RUSAGE_CHILDREN, &ru) == 0) {
			report_usage(&ru);
			budget_report_total(L, &ru);
		}
		out->kind = OUTCOME_SIGNAL;
		out->value = SIGKILL;
	}
	return;

setup_failed:
	out->kind = OUTCOME_EXIT;
	out->value = EXIT_SETUP;
}

/* ---- no PID namespace: a subreaper ---- */

/* prestart_wait() for the launcher itself, which must also hear a stop: 0 when the byte came;
 * -1 on EOF, an error or a stop signal (the program never starts). */
static int subreaper_prestart_wait(struct launch *L)
{
	struct pollfd fds[2] = {
		{ L->plan->report_fd, POLLIN, 0 },
		{ L->sigfd, POLLIN, 0 },
	};

	if (!L->plan->prestart)
		return 0;
	report_flush();
	for (;;) {
		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if ((fds[1].revents & POLLIN) && drain_signals(L->sigfd))
			return -1;
		if (fds[0].revents)
			return prestart_wait(L);
	}
}

/* A stop: FLUSH_SIGNAL to the program (the prelude's handler writes out what the program buffered,
 * then dies), and at most --flush-ms for it to end, before the sweep kills the tree. Only the
 * program: without a namespace there is no atomic way to signal the tree, and the sweep must freeze
 * it first. */
static void flush_program(struct launch *L, struct prog *c)
{
	long long deadline = now_ms() + L->plan->flush_ms, left;
	struct pollfd pfd = { L->sigfd, POLLIN, 0 };

	kill(c->pid, FLUSH_SIGNAL);
	for (;;) {
		while (reap_one(c) > 0)
			;
		left = deadline - now_ms();
		if (c->reaped || left <= 0)
			break;
		if (poll(&pfd, 1, (int)left) > 0)
			drain_signals(L->sigfd);
	}
	flush_status(c);
}

static void run_subreaper(struct launch *L, struct outcome *out)
{
	const struct plan *p = L->plan;
	struct prog c;
	int stop = 0;

	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
		report_applied("subreaper");
	else
		report_refused("subreaper", errno, explain(W_SUBREAPER, errno));
	/* no mount namespace: the work dir is --chdir, the environment says so */
	mounts_settle(L);
	/* a launch started ahead whose PID namespace the kernel refused: the launcher waits for its
	 * run itself, as the init would have (the code is not in place before the byte) */
	if (subreaper_prestart_wait(L) != 0 || workspace_in(L) != 0 || prog_start(L, &c) != 0) {
		out->kind = OUTCOME_EXIT;
		out->value = EXIT_SETUP;
		return;
	}
	null_stdio();

	while (!c.reaped && !stop) {
		struct pollfd fds[2] = {
			{ L->sigfd, POLLIN, 0 },
			{ c.errfd, POLLIN, 0 },         /* -1 after EOF: ignored */
		};

		report_flush();
		if (poll(fds, 2, budget_wait_ms(L)) < 0 && errno != EINTR)
			stop = 1;       /* cannot wait properly: end the run rather than spin */
		if (fds[1].revents && c.errfd >= 0)
			prog_read(&c);
		if ((fds[0].revents & POLLIN) && drain_signals(L->sigfd))
			stop = 2;
		budget_observe_exit(L, c.pid);
		while (reap_one(&c) > 0)
			;
		if (!c.reaped && !stop && budget_check(L))
			stop = 1;       /* over a budget: end the run as on SIGTERM */
		if (!stop && budget_stopped(L))
			stop = 2;       /* heard during the tick */
		if (!stop && !c.reaped)
			budget_running(L, c.shown);
	}
	/* The run is being ended: what it used so far first (the host may kill us during the
	 * sweep), then the program may flush its output (a stop). */
	if (stop)
		prog_report_so_far(L, &c);
	if (stop == 2 && !c.reaped && p->flush_signal)
		flush_program(L, &c);
	/* The program has ended, or the run is being ended: nothing else may survive it. */
	sweep_tree(p, L->sigfd, c.pid, &c.reaped, &c.wstatus);
	while (c.errfd >= 0)
		prog_read(&c);  /* every writer is dead: does not block */
	prog_finish(L, &c, out);
	workspace_collect(L);
}

void supervise_run(struct launch *L, struct outcome *out)
{
	if (L->pidns)
		run_pidns(L, out);
	else
		run_subreaper(L, out);
	budget_cleanup(L);
}

/* Exit as the program did: its code, or its signal on ourselves (no core dump). */
NORETURN void outcome_exit(const struct outcome *out)
{
	report_flush();
	if (out->kind == OUTCOME_SIGNAL) {
		int sig = out->value;
		struct rlimit zero = { 0, 0 };
		sigset_t set;

		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
		setrlimit(RLIMIT_CORE, &zero);
		signal(sig, SIG_DFL);
		sigemptyset(&set);
		sigaddset(&set, sig);
		sigprocmask(SIG_UNBLOCK, &set, NULL);
		kill(getpid(), sig);
		_exit(128 + sig);       /* a signal whose default is not to terminate */
	}
	_exit(out->value & 0xff);
}
