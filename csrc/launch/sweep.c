/* sweep.c: kill what a run leaves behind when there is no PID namespace; and --kill-uid.
 *
 * The tree: every descendant of the launcher (orphans come to the launcher, the subreaper). First,
 * when there is one, the launcher stops its whole process group with one kill(0, SIGSTOP): every
 * descendant that did not leave the group (a plain fork bomb) stops at once, atomically, instead of
 * competing with the launcher for the CPU during the walk (1000 busy processes leave the launcher a
 * thousandth of it: 7 s for the walk). The launcher is in the group too, so the stop comes from a
 * vfork()ed helper that moves to a group of its own and then sends the launcher SIGCONT, which
 * drops the launcher's pending SIGSTOP: the launcher, suspended by the vfork meanwhile, never
 * stops. (A process of the tree that shares the launcher's uid could kill the helper between its
 * two calls and leave the launcher stopped; it could as well stop the launcher with kill(). With
 * --uid the helper is root.) Only the launcher's descendants can be in the group, the launcher having made the
 * session; when setsid was refused this is skipped. Then, in rounds:
 *   1. freeze: walk the launcher's children that are not already being killed, breadth-first,
 *      sending each process SIGSTOP before reading its children (/proc/PID/task/TID/children, every
 *      thread): a stopped process cannot fork, so the walk catches up with a fork bomb and sees a
 *      tree that no longer grows, at any depth;
 *   2. first round, with --uid: the uid sweep below, while the tree cannot touch the helper;
 *   3. SIGKILL everything the walk found, at once: the deaths run in parallel;
 *   4. reap with waitpid(-1, WNOHANG) whatever has died, then wait for the next SIGCHLD on the
 *      signalfd (at most SWEEP_POLL_MS) and go back to 1: a process forked while its parent was
 *      being stopped comes to the launcher when that parent dies, and is frozen and killed then.
 * Until waitpid() says ECHILD (nothing is left), or SWEEP_MS after the last round that found a
 * process to kill: then everything left has SIGKILL pending, and one stuck in the kernel dies when
 * it leaves it. A round that finds something always runs, however slow (a starved launcher).
 *
 * The CPU: a dying process runs its exit in the kernel, where a kernel built without preemption
 * (PREEMPT_NONE) does not interrupt it, and a deep tree of forked processes takes long to tear
 * down: each SIGKILL of step 3 woke a process that could then hold the launcher's CPU for a long
 * time (a 1500-deep chain of Python processes: 0.8 to 1.4 s for the SIGKILLs alone; the launcher
 * cannot raise its own priority, and SCHED_IDLE victims did no better). So with two CPUs or more,
 * the launcher pins itself to the CPU it runs on and the walk moves every thread it stops to the
 * other CPUs it may use: the SIGKILLs then take a few ms. They die on fewer CPUs, but none runs
 * user code again, and the launcher's CPU stays free for the host (given back all CPUs, the dying
 * chain held both CPUs of a 2-CPU host for seconds).
 *
 * Reaping at once is safe: a zombie holds a slot of RLIMIT_NPROC, but what a round reaps was
 * stopped before it was killed, so no process of the tree is running to refill the slot, except
 * one forked during the walk, which the next round catches.
 *
 * Without CONFIG_PROC_CHILDREN the children come from an index of /proc/PID/stat by parent pid,
 * built once per round (a process forked after it is caught in the next round).
 *
 * The uid sweep: a helper takes the run's uid and calls kill(-1, SIGKILL), which reaches every
 * process of that uid, descendant or not, atomically against forks. A process of that uid can
 * kill or stop the helper once it has the uid: then it is killed after UID_HELPER_MS and tried
 * again, UID_HELPER_TRIES times.
 */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SWEEP_MS 2000
#define SWEEP_POLL_MS 10
#define UID_HELPER_MS 100
#define UID_HELPER_TRIES 5

long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits up to ms for a signal on the signalfd (SIGCHLD, normally) and reads all that came. */
static void wait_signal(int sigfd, long long ms)
{
	struct pollfd p = { sigfd, POLLIN, 0 };
	struct signalfd_siginfo si;

	if (poll(&p, 1, (int)ms) > 0)
		while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
			;
}

/* ---- pid lists, and sorted pid sets ---- */

struct pids {
	pid_t *v;
	size_t n, cap;
};

static int pids_add(struct pids *s, pid_t pid)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 256;
		pid_t *v = realloc(s->v, cap * sizeof *v);

		if (!v)
			return -1;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = pid;
	return 0;
}

/* A pid that does not fit in the list cannot be walked: kill it now. */
static void add_or_kill(struct pids *s, long pid)
{
	if (pid > 0 && pids_add(s, (pid_t)pid) != 0)
		kill((pid_t)pid, SIGKILL);
}

/* Index of pid in the sorted set, or where it would go. */
static size_t set_find(const struct pids *s, pid_t pid, int *found)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->v[mid] < pid)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = lo < s->n && s->v[lo] == pid;
	return lo;
}

static int set_has(const struct pids *s, pid_t pid)
{
	int found;

	set_find(s, pid, &found);
	return found;
}

/* Out of memory: the pid stays out, and is walked (and killed) again next round. */
static void set_add(struct pids *s, pid_t pid)
{
	int found;
	size_t at = set_find(s, pid, &found);

	if (found || pids_add(s, pid) != 0)
		return;
	memmove(&s->v[at + 1], &s->v[at], (s->n - 1 - at) * sizeof *s->v);
	s->v[at] = pid;
}

static void set_del(struct pids *s, pid_t pid)
{
	int found;
	size_t at = set_find(s, pid, &found);

	if (!found)
		return;
	memmove(&s->v[at], &s->v[at + 1], (s->n - at - 1) * sizeof *s->v);
	s->n--;
}

/* ---- children ---- */

void pids_read(int fd, void (*add)(long pid, void *arg), void *arg)
{
	char buf[4096];
	long pid = 0;
	int in = 0;
	ssize_t n, i;

	while ((n = read(fd, buf, sizeof buf)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (i = 0; i < n; i++) {
			/* A number may continue into the next chunk: only a separator ends it. */
			if (buf[i] >= '0' && buf[i] <= '9') {
				if (pid < INT_MAX)
					pid = pid * 10 + (buf[i] - '0');
				in = 1;
			} else if (in) {
				add(pid, arg);
				pid = 0;
				in = 0;
			}
		}
	}
	if (in)
		add(pid, arg);
}

static void add_pid(long pid, void *out)
{
	add_or_kill(out, pid);
}

/* The children of every thread of pid, from /proc/PID/task/TID/children; with away, each thread
 * is moved to those CPUs. */
static void children_proc(pid_t pid, struct pids *out, const cpu_set_t *away)
{
	char path[48], buf[2048];
	int dfd;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return;         /* gone */
	for (;;) {
		long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
		long off;

		if (n <= 0)
			break;
		for (off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);
			int fd;

			off += d->d_reclen;
			if (d->d_name[0] < '0' || d->d_name[0] > '9')
				continue;
			if (away)
				sched_setaffinity((pid_t)atoi(d->d_name), sizeof *away, away);
			snprintf(path, sizeof path, "%.20s/children", d->d_name);
			fd = openat(dfd, path, O_RDONLY | O_CLOEXEC);
			if (fd >= 0) {
				pids_read(fd, add_pid, out);
				close(fd);
			}
		}
	}
	close(dfd);
}

/* Without CONFIG_PROC_CHILDREN: every process's parent, sorted by parent. */
struct index {
	struct parent_of {
		pid_t ppid;
		pid_t pid;
	} *v;
	size_t n, cap;
};

static int by_ppid(const void *a, const void *b)
{
	const struct parent_of *x = a, *y = b;

	return x->ppid < y->ppid ? -1 : x->ppid > y->ppid;
}

/* ppid of /proc/PID/stat ("pid (comm) S ppid ...", comm may hold spaces and parens); 0 when
 * unreadable. */
static pid_t proc_ppid(const char *pid)
{
	char path[48], buf[512];
	const char *p;
	char state;
	long ppid = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%.20s/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2)
		return 0;
	return (pid_t)ppid;
}

static struct index *index_build(struct index *ix)
{
	DIR *d = opendir("/proc");
	struct dirent *e;

	ix->n = 0;
	if (!d)
		return ix;
	while ((e = readdir(d)) != NULL) {
		pid_t ppid;

		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		ppid = proc_ppid(e->d_name);
		if (ppid <= 0)
			continue;
		if (ix->n == ix->cap) {
			size_t cap = ix->cap ? ix->cap * 2 : 1024;
			struct parent_of *v = realloc(ix->v, cap * sizeof *v);

			if (!v)
				break;
			ix->v = v;
			ix->cap = cap;
		}
		ix->v[ix->n].ppid = ppid;
		ix->v[ix->n].pid = (pid_t)atol(e->d_name);
		ix->n++;
	}
	closedir(d);
	qsort(ix->v, ix->n, sizeof *ix->v, by_ppid);
	return ix;
}

static void children_index(const struct index *ix, pid_t pid, struct pids *out)
{
	size_t lo = 0, hi = ix->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ix->v[mid].ppid < pid)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < ix->n && ix->v[lo].ppid == pid; lo++)
		add_or_kill(out, ix->v[lo].pid);
}

static void children_of(pid_t pid, struct pids *out, const struct index *ix,
			const cpu_set_t *away)
{
	if (!ix) {
		children_proc(pid, out, away);
		return;
	}
	if (away)
		sched_setaffinity(pid, sizeof *away, away);     /* its main thread only */
	children_index(ix, pid, out);
}

/* With two CPUs or more: pins us to the one we run on and fills away with the others we may
 * use; NULL otherwise. */
static const cpu_set_t *split_cpus(cpu_set_t *away)
{
	cpu_set_t here;
	int cpu = sched_getcpu();

	if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof *away, away) != 0 ||
	    !CPU_ISSET(cpu, away) || CPU_COUNT(away) < 2)
		return NULL;
	CPU_CLR(cpu, away);
	CPU_ZERO(&here);
	CPU_SET(cpu, &here);
	if (sched_setaffinity(0, sizeof here, &here) != 0)
		return NULL;
	return away;
}

/* 1. SIGSTOP root and everything below it, breadth-first, each before its children are read
 * (and its threads moved away); appends them all to walk. */
static void freeze(pid_t root, struct pids *walk, const struct index *ix, const cpu_set_t *away)
{
	size_t i = walk->n, j;

	if (pids_add(walk, root) != 0) {
		kill(root, SIGKILL);
		return;
	}
	kill(root, SIGSTOP);
	for (; i < walk->n; i++) {
		size_t from = walk->n;

		children_of(walk->v[i], walk, ix, away);
		for (j = from; j < walk->n; j++)
			kill(walk->v[j], SIGSTOP);
	}
}

/* ---- the uid sweep ---- */

/* waitpid(pid) until deadline: 0 (reaped, *st set), or -1 (still there, or cannot wait). */
static int wait_child(pid_t pid, int sigfd, long long deadline, int *st)
{
	for (;;) {
		pid_t r = waitpid(pid, st, WNOHANG);
		long long left;

		if (r == pid)
			return 0;
		if (r < 0 && errno != EINTR)
			return -1;
		left = deadline - now_ms();
		if (left <= 0)
			return -1;
		wait_signal(sigfd, left);
	}
}

/* 0, or an errno: the helper's (EPERM: cannot take the uid), ETIMEDOUT (it was killed or stopped
 * every time), or fork's. */
static int uid_kill(uid_t uid, gid_t gid, int sigfd)
{
	int tries;

	for (tries = 0; tries < UID_HELPER_TRIES; tries++) {
		int st;
		pid_t h = fork();

		if (h < 0)
			return errno;
		if (h == 0) {
			if (setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0)
				_exit(errno > 0 && errno < 256 ? errno : EPERM);
			kill(-1, SIGKILL);      /* ESRCH: nothing of that uid was left */
			_exit(0);
		}
		if (wait_child(h, sigfd, now_ms() + UID_HELPER_MS, &st) != 0) {
			kill(h, SIGKILL);
			while (waitpid(h, &st, 0) < 0 && errno == EINTR)
				;
			continue;
		}
		if (WIFEXITED(st))
			return WEXITSTATUS(st);
		/* killed by a process of that uid: again */
	}
	return ETIMEDOUT;
}


/* ---- the tree ---- */

/* SIGSTOP to our process group but us: see the top of the file. */
static void stop_group(void)
{
	pid_t self = getpid(), h;
	int st;

	if (getsid(0) != self)
		return;         /* not our session: the group may hold the caller's processes */
	h = vfork();
	if (h == 0) {
		/* On our memory, until _exit: system calls only. */
		if (setpgid(0, 0) == 0 && kill(-self, SIGSTOP) == 0)
			kill(self, SIGCONT);
		_exit(0);
	}
	if (h > 0)
		while (waitpid(h, &st, 0) < 0 && errno == EINTR)
			;
}

void sweep_tree(const struct plan *p, int sigfd, pid_t prog, int *prog_reaped, int *prog_status)
{
	struct pids killing = { 0 }, walk = { 0 }, mine = { 0 };
	struct index ix = { 0 };
	long long deadline = now_ms() + SWEEP_MS;     /* moved on by every round that kills */
	pid_t self = getpid();
	char path[64];
	int use_index, round, uid_done = !(p->has_ids && p->sweep_uid);
	cpu_set_t cpus;
	const cpu_set_t *away = split_cpus(&cpus);

	snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)self);
	use_index = access(path, R_OK) != 0;
	for (round = 0;; round++) {
		const struct index *ixp = use_index ? index_build(&ix) : NULL;
		long long left;
		size_t i;
		pid_t r;
		int st;

		/* 1. what is new among our children, with everything below it */
		mine.n = 0;
		walk.n = 0;
		children_of(self, &mine, ixp, NULL);
		if (round == 0 && mine.n > 0)
			stop_group();
		for (i = 0; i < mine.n; i++)
			if (!set_has(&killing, mine.v[i]))
				freeze(mine.v[i], &walk, ixp, away);
		/* 2. */
		if (!uid_done) {
			uid_kill(p->uid, p->gid, sigfd);
			uid_done = 1;
		}
		/* 3. */
		for (i = 0; i < walk.n; i++) {
			kill(walk.v[i], SIGKILL);
			set_add(&killing, walk.v[i]);
		}
		if (walk.n > 0)
			deadline = now_ms() + SWEEP_MS;
		/* 4. */
		while ((r = waitpid(-1, &st, WNOHANG)) > 0) {
			if (WIFSTOPPED(st))
				continue;       /* a tracee of ours (PTRACE_TRACEME): being
						 * killed */
			if (r == prog && !*prog_reaped) {
				*prog_reaped = 1;
				*prog_status = st;
			}
			set_del(&killing, r);
		}
		if (r < 0 && errno != EINTR)
			break;          /* ECHILD: nothing is left */
		left = deadline - now_ms();
		if (left <= 0)
			break;
		wait_signal(sigfd, left < SWEEP_POLL_MS ? left : SWEEP_POLL_MS);
	}
	free(killing.v);
	free(walk.v);
	free(mine.v);
	free(ix.v);
}

/* ---- --kill-uid ---- */

int sweep_kill_uid(uid_t uid)
{
	sigset_t set;
	int sigfd, err;
	const char *name;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	signal(SIGCHLD, SIG_DFL);       /* an inherited SIG_IGN would reap the helper for us */
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0 ||
	    (sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
		err = errno;
	} else {
		err = uid_kill(uid, (gid_t)uid, sigfd);
		close(sigfd);
	}
	if (!err)
		return 0;
	name = errno_name(err);
	if (name)
		dprintf(STDERR_FILENO, "corral-launch: --kill-uid %u: %s %s\n", (unsigned)uid, name,
			explain(W_KILL_UID, err));
	else
		dprintf(STDERR_FILENO, "corral-launch: --kill-uid %u: E%d %s\n", (unsigned)uid, err,
			explain(W_KILL_UID, err));
	return EXIT_SETUP;
}
