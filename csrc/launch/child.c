/* child.c: the program, between fork and execve.
 *
 * Only async-signal-safe calls: no malloc, no stdio. Each step is a small function; child_run()
 * calls them in one flat list. A failure goes to the supervisor as {MSG_FATAL, what, errno} over
 * the close-on-exec pipe, and the supervisor writes the fatal line; rlimits that cannot be set
 * are reported here as refused and the run goes on (the policy decides).
 */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

static void send_msg(int errfd, int kind, int what, int value)
{
	struct child_msg m = { kind, what, value };
	ssize_t n;

	do
		n = write(errfd, &m, sizeof m);
	while (n < 0 && errno == EINTR);
}

static NORETURN void die(int errfd, enum what w, int err)
{
	report_flush();
	send_msg(errfd, MSG_FATAL, (int)w, err);
	if (w == W_EXEC)
		_exit(err == ENOENT ? EXIT_NOENT : EXIT_EXEC);
	_exit(EXIT_SETUP);
}

NORETURN void child_die(int errfd, enum what w, int err)
{
	die(errfd, w, err);
}

/* ---- steps ---- */

static int step_die_with_parent(pid_t parent)
{
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
		return -1;
	/* The supervisor may have died before the prctl: then nobody would kill us. */
	if (getppid() != parent) {
		errno = ESRCH;
		return -1;
	}
	return 0;
}

/* Our pid as /proc (the host's view) names it: readlink("/proc/self"). */
static void step_send_pid(int errfd)
{
	char buf[24];
	ssize_t n = readlink("/proc/self", buf, sizeof buf);
	long pid = 0;
	ssize_t i;

	for (i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
		pid = pid * 10 + (buf[i] - '0');
	if (n <= 0 || i != n || pid <= 0)
		pid = getpid();
	send_msg(errfd, MSG_PID, 0, (int)pid);
}

static const struct {
	int resource;
	const char *name;       /* applied/refused name */
} rlimits[PLAN_RL_COUNT] = {
	[PLAN_RL_CPU] = { RLIMIT_CPU, "cpu" },
	[PLAN_RL_AS] = { RLIMIT_AS, "memory" },
	[PLAN_RL_FSIZE] = { RLIMIT_FSIZE, "file-size" },
	[PLAN_RL_CORE] = { RLIMIT_CORE, "core-size" },          /* "no-core" when 0 */
	[PLAN_RL_NOFILE] = { RLIMIT_NOFILE, "open-files" },
	[PLAN_RL_NPROC] = { RLIMIT_NPROC, "processes" },
	/* counted per user namespace and uid (ucounts): per run, with the run's own user namespace
	 * or uid; pending signals also bound POSIX timers (timer_create takes one each) */
	[PLAN_RL_SIGPENDING] = { RLIMIT_SIGPENDING, "pending-signals" },
	/* bytes of POSIX message queues, charged at mq_open: memory no process maps */
	[PLAN_RL_MSGQUEUE] = { RLIMIT_MSGQUEUE, "message-queues" },
};

/* value: what was asked; extra: what the launcher added to it (RLIMIT_NPROC) */
static void refuse_rlimit(const char *name, int err, unsigned long long value,
			  unsigned long long extra, const struct rlimit *cur)
{
	struct line l;

	line_start(&l, "refused ");
	line_add(&l, name);
	line_add(&l, " ");
	line_errname(&l, err);
	if (err == EPERM && cur->rlim_max != RLIM_INFINITY && value + extra > cur->rlim_max) {
		line_add(&l, " asked for ");
		line_num(&l, value);
		if (extra) {
			line_add(&l, " (");
			line_num(&l, value + extra);
			line_add(&l, " with the run's own processes)");
		}
		line_add(&l, " but the hard limit is ");
		line_num(&l, cur->rlim_max);
		line_add(&l, " and raising it needs CAP_SYS_RESOURCE; ask for at most ");
		line_num(&l, cur->rlim_max > extra ? cur->rlim_max - extra : 0);
	} else if (err == EINVAL) {
		line_add(&l, " the kernel rejected the value (nofile above fs.nr_open?)");
	} else {
		line_add(&l, " setrlimit failed");
	}
	line_send(&l, report_get_fd());
}

/* soft = hard = VALUE, except cpu: hard = VALUE + 1. With soft == hard the kernel sends SIGKILL
 * at the limit; one more second lets SIGXCPU arrive first (and still kills a program that
 * ignores it). nproc: VALUE is what the program may hold, and the run's processes that the
 * kernel counts with it are added (launch.h, nproc_beside); the report says VALUE. Refused
 * limits are reported and left as they are. */
static void step_rlimits(const struct launch *L)
{
	const struct plan *p = L->plan;
	int i;

	for (i = 0; i < PLAN_RL_COUNT; i++) {
		struct rlimit cur, want;
		unsigned long long v = p->rlimit[i].value;
		unsigned long long extra = 0;

		if (!p->rlimit[i].set)
			continue;
		if (i == PLAN_RL_NPROC && L->nproc_beside > 0 && v < RLIM_INFINITY - 16)
			extra = (unsigned long long)L->nproc_beside;
		if (getrlimit(rlimits[i].resource, &cur) != 0)
			cur.rlim_cur = cur.rlim_max = RLIM_INFINITY;
		want.rlim_cur = v + extra;
		want.rlim_max = v + extra;
		if (i == PLAN_RL_CPU) {
			want.rlim_max = v + 1;
			if (cur.rlim_max != RLIM_INFINITY && want.rlim_max > cur.rlim_max &&
			    v <= cur.rlim_max)
				want.rlim_max = cur.rlim_max;
		}
		if (setrlimit(rlimits[i].resource, &want) != 0) {
			refuse_rlimit(rlimits[i].name, errno, v, extra, &cur);
			continue;
		}
		if (i == PLAN_RL_CORE && v == 0) {
			report_applied("no-core");
		} else if (i == PLAN_RL_NPROC &&
			   (p->has_ids ? p->uid : getuid()) == 0) {
			/* Set, but the kernel does not count processes of uid 0 against it. */
			report_refused("processes", EPERM,
				       "RLIMIT_NPROC is not enforced for uid 0: run the program with "
				       "--uid and --gid");
		} else {
			report_applied_num(rlimits[i].name, v);
		}
	}
}

/* In a user namespace the ids are those of its maps (ns.c): a refusal there has its own cause. */
static int step_ids(const struct launch *L, int errfd, pid_t parent)
{
	const struct plan *p = L->plan;

	if (!p->has_ids)
		return 0;
	if (setgroups(0, NULL) != 0)
		die(errfd, L->userns ? W_IDS_USERNS : W_SETGROUPS, errno);
	if (setresgid(p->gid, p->gid, p->gid) != 0)
		die(errfd, L->userns ? W_IDS_USERNS : W_SETGID, errno);
	if (setresuid(p->uid, p->uid, p->uid) != 0)
		die(errfd, L->userns && errno != EAGAIN ? W_IDS_USERNS : W_SETUID, errno);
	/* A change of euid clears the parent-death signal: set it again, and re-check. */
	if (step_die_with_parent(parent) != 0)
		_exit(EXIT_SETUP);
	report_applied_num("uid", p->uid);
	report_applied_num("gid", p->gid);
	return 0;
}

static void step_no_new_privs(void)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
		report_applied("no-new-privs");
	else
		report_refused("no-new-privs", errno, explain(W_NO_NEW_PRIVS, errno));
}

/* The work dir: --work-at when its tmpfs was mounted there, else --chdir (mounts.c). */
static int step_chdir(const struct launch *L)
{
	const char *dir = mounts_work_dir(L);

	if (!dir)
		return 0;
	if (chdir(dir) != 0)
		return -1;
	report_applied("workdir");
	return 0;
}

/* Fallback without close_range: mark every fd above 2 listed in /proc/self/fd close-on-exec.
 * getdents64 into a stack buffer: opendir() would malloc. */
static int cloexec_proc_fds(void)
{
	char buf[4096];
	int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0)
		return -1;
	for (;;) {
		long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
		long off;

		if (n < 0) {
			int err = errno;

			close(dfd);
			errno = err;
			return -1;
		}
		if (n == 0)
			break;
		for (off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);
			const char *s = d->d_name;
			int fd = 0;

			off += d->d_reclen;
			if (*s < '0' || *s > '9')
				continue;
			for (; *s >= '0' && *s <= '9'; s++)
				fd = fd * 10 + (*s - '0');
			if (fd > 2 && fd != dfd)
				fcntl(fd, F_SETFD, FD_CLOEXEC);
		}
	}
	close(dfd);
	return 0;
}

/* Every fd above 2 is closed at execve: marked close-on-exec, so the report fd and the error pipe
 * still work until then. */
static int step_close_fds(void)
{
#ifdef SYS_close_range
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) {
		report_applied("closed-fds");
		return 0;
	}
#endif
	if (cloexec_proc_fds() != 0)
		return -1;
	report_applied("closed-fds");
	return 0;
}

/* --status-fd N: the one exception to the step above. A wrapper (bwrap) keeps the write end of
 * the supervisor's status pipe at fd N through execve, for its --relay (relay.c), which makes it
 * close-on-exec before it starts the wrapped program. N is never the report fd (plan.c); the
 * error pipe is moved off N, as it is still needed until execve. dup2 leaves N without
 * close-on-exec; the original stays marked. */
static int step_status_fd(const struct launch *L, int *errfd)
{
	int n = L->plan->status_fd, w = L->child.status_wfd;

	if (n < 0 || w < 0)
		return 0;
	if (*errfd == n) {
		int moved = fcntl(n, F_DUPFD_CLOEXEC, n + 1);

		if (moved < 0)
			return -1;
		*errfd = moved;
	}
	if (w == n)
		return fcntl(n, F_SETFD, 0);
	return dup2(w, n) < 0 ? -1 : 0;
}

/* --files-wait-fd N: the read end of the pipe the init closes once the program's files are in,
 * kept at fd N through execve as --status-fd's write end is (the two do not go together:
 * plan.c); the error pipe is moved off N. */
static int step_files_wait_fd(const struct launch *L, int *errfd)
{
	int n = L->plan->files_wait_fd, r = L->ws.wait_rfd;

	if (n < 0 || r < 0)
		return 0;
	if (*errfd == n) {
		int moved = fcntl(n, F_DUPFD_CLOEXEC, n + 1);

		if (moved < 0)
			return -1;
		*errfd = moved;
	}
	if (r == n)
		return fcntl(n, F_SETFD, 0);
	return dup2(r, n) < 0 ? -1 : 0;
}

/* In the init, before it starts the program: with --prestart, before the wait, so that the
 * ruleset's paths are opened and its rules added while no run waits. The program enforces it. The
 * paths are opened as the launcher's user, after the mounts, as the program would open them.
 * Without a PID namespace (no init), and for corral-zygote's program (not the init's child), the
 * program makes it itself. */
void child_prepare(struct launch *L)
{
	if (L->child.prepared.done)
		return;
	L->child.prepared.rc = landlock_prepare(L, &L->child.prepared.ll);
	L->child.prepared.done = 1;
}

/* After the program is started: the parent's copy of the ruleset fd is not needed. */
void child_prepared_close(struct launch *L)
{
	if (L->child.prepared.done && L->child.prepared.ll.fd >= 0) {
		close(L->child.prepared.ll.fd);
		L->child.prepared.ll.fd = -1;
	}
}

/* sigaction() on the kernel's own terms: glibc answers EINVAL for the real-time signals it keeps
 * for itself (32 and 33), which an ignoring parent still passes on. The kernel's struct, where it
 * is known. */
#if defined(__x86_64__) || defined(__aarch64__)
struct ksigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	unsigned long mask;
};

static int ksig_ignored(int s)
{
	struct ksigaction old;

	return syscall(SYS_rt_sigaction, s, NULL, &old, sizeof old.mask) == 0 &&
	       old.handler == SIG_IGN;
}

static void ksig_default(int s)
{
	struct ksigaction sa = { SIG_DFL, 0, NULL, 0 };

	syscall(SYS_rt_sigaction, s, &sa, NULL, sizeof sa.mask);
}
#else
static int ksig_ignored(int s)
{
	struct sigaction old;

	return sigaction(s, NULL, &old) == 0 && old.sa_handler == SIG_IGN;
}

static void ksig_default(int s)
{
	struct sigaction sa = { 0 };

	sa.sa_handler = SIG_DFL;
	sigemptyset(&sa.sa_mask);
	sigaction(s, &sa, NULL);
}
#endif

/* Every disposition default, nothing blocked. The program's last step before the seccomp filter and
 * execve (a default SIGPIPE could kill us on a report write to a closed pipe); corral-zygote's
 * too, before its interpreter starts and in each run it forks. */
void signals_reset(void)
{
	struct sigaction sa = { 0 };
	sigset_t none;
	int s;

	sa.sa_handler = SIG_DFL;
	sigemptyset(&sa.sa_mask);
	for (s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			/* EINVAL for glibc's reserved 32 and 33: a process that goes on running
			 * glibc (the warm interpreter) keeps its handlers for them */
			sigaction(s, &sa, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The dispositions a program would inherit through execve that are not the default (L->child.sigs):
 * noted in the launcher after it ignored SIGPIPE and SIGXFSZ itself, those and what whoever
 * started the launcher left ignored (nohup's SIGHUP). The launcher installs no handler. */
void signals_note(struct launch *L)
{
	int s;

	L->child.sigs.ignored = 0;
	for (s = 1; s < NSIG && s <= 64; s++)
		if (s != SIGKILL && s != SIGSTOP && ksig_ignored(s))
			L->child.sigs.ignored |= 1ULL << (s - 1);
	L->child.sigs.noted = 1;
}

/* The program before execve: what was noted ignored back to the default, nothing blocked. One
 * system call per such signal (two, as a rule) instead of one per signal; without a note,
 * signals_reset(). Before execve 32 and 33 are reset too: the program's own libc sets them up
 * again. */
static void signals_reset_exec(const struct launch *L)
{
	sigset_t none;
	int s;

	if (!L->child.sigs.noted) {
		signals_reset();
		return;
	}
	for (s = 1; s < NSIG && s <= 64; s++)
		if (L->child.sigs.ignored & (1ULL << (s - 1)))
			ksig_default(s);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* --separate: the program is walled off from the controller and from other runs by a uid of its
 * own (their files and processes are another user's: --uid as root), or by Landlock's filesystem
 * rules with a PID namespace (no file and no process of theirs in its reach). Landlock's signal
 * scope is not enough without the namespace: prlimit(), setpriority() and sched_setaffinity()
 * reach any process of the same uid by its pid. Every user namespace map the launcher and the
 * zygote write is the identity, so the uid the program has inside is the one the host sees:
 * without --uid, the controller's. */
static int step_separate(const struct launch *L, const struct landlock *ll)
{
	const struct plan *p = L->plan;

	if (p->separate == PLAN_MECH_OFF)
		return 0;
	if (getuid() != L->euid || (ll->applied && L->pidns)) {
		report_applied("separation");
		return 0;
	}
	if (p->separate == PLAN_MECH_REQUIRE)
		return -1;
	report_refused("separation", EOPNOTSUPP, SEPARATE_LOST);
	return 0;
}

NORETURN void child_run(const struct launch *L, pid_t parent, int errfd)
{
	const struct plan *p = L->plan;
	struct landlock ll;

	if (step_die_with_parent(parent) != 0)
		_exit(EXIT_SETUP);      /* the supervisor is gone: nobody to tell */
	/* With a PID namespace the program leads a session of its own: the scheduler's autogroups
	 * are per session, so the run's processes then share one group's CPU against the
	 * supervisor's, instead of the supervisor being one task among a fork bomb's hundreds. The
	 * namespace's end reaches every process, whatever its session. */
	if (L->pidns && getsid(0) != getpid())
		setsid();
	step_send_pid(errfd);
	if (budget_join(L) != 0)                /* the run cgroup, while we have our uid */
		die(errfd, W_CGROUP, errno);
	/* Landlock's paths are opened as the launcher's user, and before a small nofile limit. The
	 * program may share its parent's memory until execve: it works on a copy of the prepared
	 * ruleset. */
	if (L->child.prepared.done) {
		ll = L->child.prepared.ll;
		if (L->child.prepared.rc != 0)
			die(errfd, ll.what, ll.err);
	} else if (landlock_prepare(L, &ll) != 0) {
		die(errfd, ll.what, ll.err);
	}
	step_rlimits(L);
	step_ids(L, errfd, parent);
	step_no_new_privs();
	if (landlock_enforce(p, &ll) != 0)      /* needs no_new_privs without CAP_SYS_ADMIN */
		die(errfd, ll.what, ll.err);
	if (step_separate(L, &ll) != 0)
		die(errfd, W_SEPARATE, EOPNOTSUPP);
	if (step_chdir(L) != 0)
		die(errfd, W_CHDIR, errno);
	if (step_close_fds() != 0)
		die(errfd, W_FDS, errno);
	if (step_status_fd(L, &errfd) != 0 || step_files_wait_fd(L, &errfd) != 0)
		die(errfd, W_FDS, errno);
	report_applied("empty-env");
	if (L->run_program)
		signals_reset();        /* the warm interpreter's handlers too */
	else
		signals_reset_exec(L);
	if (seccomp_apply(L) != 0)              /* last: nothing of ours is filtered */
		die(errfd, W_SECCOMP, errno);
	report_flush();
	if (L->run_program)
		L->run_program(L, errfd);       /* corral-zygote: the warm interpreter runs it */
	execve(p->program, mounts_args(L), mounts_env(L));      /* settled before the fork */
	die(errfd, W_EXEC, errno);
}
