/* reap.c: the program seen from the process that waits for it (the launcher, init or corral-init):
 * its pipe, its reaping, the wait of a PID namespace's init, and the program's end in the report.
 *
 * corral-init, the small init corral-zygote's direct launches exec into once the program is forked,
 * links this file, report.c, budget.c and sweep.c from the step archive and no more (no
 * libseccomp): nothing here may need more.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* One read of the program's pipe (blocks if nothing is there). At EOF, execve has worked (or the
 * program died): report its pid unless a fatal message came. */
void prog_read(struct prog *c)
{
	struct child_msg m;
	ssize_t n = read(c->errfd, &m, sizeof m);

	if (n < 0 && errno == EINTR)
		return;
	if (n == (ssize_t)sizeof m) {
		if (m.kind == MSG_PID && m.value > 0) {
			c->shown = m.value;
		} else if (m.kind == MSG_FATAL && !c->have_fatal) {
			c->have_fatal = 1;
			c->fatal_what = m.what;
			c->fatal_err = m.value;
		}
		return;
	}
	close(c->errfd);
	c->errfd = -1;
	if (!c->have_fatal)
		report_pid(c->shown);
}

/* --status-fd: the program is a wrapper that reports its own program's death by signal N as exit
 * 128+N, and the relay inside it wrote that program's wait status on the status pipe before it
 * exited (relay.c). Read once every writer is gone or has written (the wrapper has ended): the
 * wrapper's exit 128+N becomes signal N when the relay's one status says signal N, or when the
 * relay wrote nothing (it blocks every signal it can: it was killed itself, and the wrapper
 * reports that as 128+N). Nothing else changes the wrapper's status: the relay's word can only
 * explain a 128+N the wrapper gave, and more than one status (someone else wrote) explains
 * nothing. */
static int relayed_status(const struct launch *L, struct prog *c, int st)
{
	int rs[2], sig;
	ssize_t n;

	if (L->plan->status_fd < 0 || c->statusfd < 0)
		return st;
	do
		n = read(c->statusfd, rs, sizeof rs);
	while (n < 0 && errno == EINTR);
	close(c->statusfd);
	c->statusfd = -1;
	if (!WIFEXITED(st) || WEXITSTATUS(st) <= 128 || WEXITSTATUS(st) >= 128 + 65)
		return st;
	sig = WEXITSTATUS(st) - 128;
	if (n == 0)
		return sig;     /* the wait status of a death by signal sig */
	if (n == (ssize_t)sizeof rs[0] && WIFSIGNALED(rs[0]) && WTERMSIG(rs[0]) == sig)
		return rs[0];
	return st;
}

/* The program is gone (or being killed): the fatal line, or status and usage; and what the launcher
 * must do. */
void prog_finish(struct launch *L, struct prog *c, struct outcome *out)
{
	struct rusage ru;
	int st = c->reaped ? c->wstatus : SIGKILL;  /* never reaped: it died with the tree */

	budget_finish(L, c->empty);
	st = relayed_status(L, c, st);
	if (c->have_fatal) {
		int w = c->fatal_what;

		report_fatal((enum what)w, c->fatal_err, NULL);
		out->kind = OUTCOME_EXIT;
		if (w == W_EXEC)
			out->value = c->fatal_err == ENOENT ? EXIT_NOENT : EXIT_EXEC;
		else
			out->value = EXIT_SETUP;
		return;
	}
	report_status(st);
	if (getrusage(RUSAGE_CHILDREN, &ru) == 0) {
		report_usage(&ru);
		budget_report_total(L, &ru);
	}
	budget_report_observed(L, st);
	if (WIFSIGNALED(st)) {
		out->kind = OUTCOME_SIGNAL;
		out->value = WTERMSIG(st);
	} else {
		out->kind = OUTCOME_EXIT;
		out->value = WEXITSTATUS(st);
	}
}

/* The run is being ended and the program is not reaped. Its teardown (every process killed and
 * reaped) takes a while for a large tree, and the host kills the supervisor once its grace is over:
 * "usage" and "total" as they stand go out first, lower bounds that the lines written after the
 * teardown replace: the last tick's total at once, then a walk's (the walk of a large run is not
 * quick on a busy machine). */
void prog_report_so_far(struct launch *L, const struct prog *c)
{
	struct rusage ru, with_c;

	if (c->reaped || c->have_fatal || getrusage(RUSAGE_CHILDREN, &ru) != 0)
		return;
	with_c = ru;
	budget_add_prog_usage(c->shown, &with_c);
	report_usage(&with_c);
	budget_report_total(L, &ru);
	report_flush();
	budget_measure_now(L);
	budget_report_total(L, &ru);    /* the measure counts the program among the processes
					 * alive */
	report_flush();
}

/* One waitpid(-1, WNOHANG): 1 reaped a child, 0 none ready, -1 no child left. */
int reap_one(struct prog *c)
{
	int st;
	pid_t r = waitpid(-1, &st, WNOHANG);

	if (r > 0 && WIFSTOPPED(st)) {
		/* A child that called PTRACE_TRACEME made us its tracer: each signal it gets stops
		 * it and is reported here. Let it go, with the signal it was stopped by. */
		ptrace(PTRACE_DETACH, r, NULL, (void *)(long)WSTOPSIG(st));
		return 1;
	}
	if (r > 0) {
		if (r == c->pid && !c->reaped) {
			c->reaped = 1;
			c->wstatus = st;
		}
		return 1;
	}
	if (r == 0 || errno == EINTR)
		return 0;
	return -1;
}


/* Linux drops a signal sent to a PID namespace's init from inside the namespace unless the init has
 * a handler for it; gVisor delivers it, and the default action of most is to end the init, and the
 * run with it. The init installs no handler: it blocks every signal, and takes the ones it waits
 * for (SIGCHLD and the stop signals) with sigwaitinfo(); the others stay pending, without effect.
 * SIGKILL and SIGSTOP cannot be blocked: the program's seccomp filter refuses them to pid 1
 * (seccomp.c). The program's fork empties its mask (child.c). */
void init_block_signals(void)
{
	/* Every signal, the C library's own real-time ones too (glibc's 32 and 33, musl's 32 to 34),
	 * which its sigfillset() leaves out and its sigprocmask() would not block: the kernel's
	 * call, whose mask is 64 bits. The init has one thread and cancels none. SIGKILL and SIGSTOP
	 * stay out whatever the mask says. */
	unsigned long long all = ~0ULL;

	syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, NULL, sizeof all);
}

/* The init waits with sigwaitinfo() on SIGCHLD and the stop signals, which stay blocked (inherited
 * from the launcher), so no wakeup is lost. A stop signal counts only from outside the namespace
 * (budget_stop_from_outside): the program may not end its own supervision. With a budget, the
 * wait ends at each tick, and a run over budget is ended as on a stop signal. 0: the program
 * ended; 1: over budget; 2: stopped. */
int init_wait(struct launch *L, struct prog *c)
{
	sigset_t set;
	siginfo_t si;
	int ms;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	L->bud.init = 1;
	for (;;) {
		/* Every process of the namespace is re-parented to us: reap them all, until the
		 * program. */
		budget_observe_exit(L, c->pid);
		while (reap_one(c) > 0)
			;
		if (c->reaped)
			return 0;
		if (budget_check(L))
			return 1;
		if (budget_stopped(L))
			return 2;       /* heard during the tick */
		budget_running(L, c->shown);
		report_flush();
		ms = budget_wait_ms(L);
		if (ms >= 0) {
			struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

			if (sigtimedwait(&set, &si, &ts) < 0)
				continue;       /* EAGAIN: the tick; EINTR */
		} else if (sigwaitinfo(&set, &si) < 0) {
			continue;       /* EINTR */
		}
		if (si.si_signo != SIGCHLD && budget_stop_from_outside(&si))
			return 2;
	}
}

/* A program killed by the flush signal is reported as the kill would have reported it (a
 * program without the prelude's handler dies of the signal itself). */
void flush_status(struct prog *c)
{
	if (c->reaped && WIFSIGNALED(c->wstatus) && WTERMSIG(c->wstatus) == FLUSH_SIGNAL)
		c->wstatus = SIGKILL;   /* the wait status of a death by SIGKILL */
}

/* Before a stop kills the run: FLUSH_SIGNAL to every process of the namespace (the prelude's
 * handler writes out what each buffered, then dies), and until all of them have ended, or ms
 * (--flush-ms) have passed. A process with the prelude dies of it once flushed, one without dies of
 * it at once: the wait lasts longer only for one that blocks or ignores it, or that is slow to
 * run its handler (gVisor: tens of ms on a busy machine). A run over budget gets none: its
 * processes may be stopped, and it must end now. */
void init_flush(struct prog *c, unsigned ms)
{
	long long deadline = now_ms() + ms, left;
	struct timespec ts;
	sigset_t set;
	siginfo_t si;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	kill(-1, FLUSH_SIGNAL);
	kill(-1, SIGCONT);      /* stopped (init_watch): the handler runs once continued */
	for (;;) {
		int r;

		while ((r = reap_one(c)) > 0)
			;
		left = deadline - now_ms();
		if (r < 0 || left <= 0)         /* nothing left in the namespace, or time is up */
			break;
		ts.tv_sec = left / 1000;
		ts.tv_nsec = (long)(left % 1000) * 1000000L;
		sigtimedwait(&set, &si, &ts);
	}
	flush_status(c);
}

/* The launcher asked to end the run: kill everything in the namespace (atomic against forks) and
 * reap it all, so the usage counts it. */
void init_kill_all(struct prog *c)
{
	int st;
	pid_t r;

	kill(-1, SIGKILL);
	while ((r = waitpid(-1, &st, 0)) > 0 || errno == EINTR) {
		if (r == c->pid && !c->reaped && !WIFSTOPPED(st)) {  /* a tracee's stop: SIGKILL
									 * follows */
			c->reaped = 1;
			c->wstatus = st;
		}
	}
	/* An init without children has nothing of its namespace left: every process there is its
	 * descendant, or was re-parented to it. */
	c->empty = errno == ECHILD;
	while (c->errfd >= 0)
		prog_read(c);   /* the program is dead: does not block */
}

void init_watch(struct launch *L, struct prog *c, struct outcome *o)
{
	int flush = L->plan->flush_signal;
	int why;

	while (c->errfd >= 0)
		prog_read(c);
	/* Stopped or over budget: every process of the namespace stops (kill(-1) reaches all but us,
	 * atomically against forks), so that none of them competes with us for the CPU; what the
	 * run used so far is reported (the host may kill us during the teardown), the program may
	 * flush its output (a stop), then the namespace is killed and reaped. The program ended:
	 * what is left of the run may flush its output before it dies with the namespace. With a
	 * budget the rest of the namespace is killed and reaped before the report, so that usage
	 * and total count it. */
	why = init_wait(L, c);
	if (why) {
		kill(-1, SIGSTOP);
		prog_report_so_far(L, c);
		if (why == 2 && flush)
			init_flush(c, L->plan->flush_ms);
		init_kill_all(c);
	} else {
		if (flush)
			init_flush(c, L->plan->flush_ms);
		if (budget_active(L) || L->ws.collect_fd >= 0)
			init_kill_all(c);
	}
	prog_finish(L, c, o);
	/* every process of the run is dead: its files are as it left them */
	workspace_collect(L);
}

NORETURN void init_end(int outfd, const struct outcome *o)
{
	ssize_t n;

	report_flush();
	do
		n = write(outfd, o, sizeof *o);
	while (n < 0 && errno == EINTR);
	_exit(0);       /* the kernel kills what is left in the namespace */
}
