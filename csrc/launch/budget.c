/* budget.c: whole-run budgets of CPU time and memory, enforced by the supervisor.
 *
 * The rlimits (child.c) bound each process; a budget bounds the run as a whole: every process
 * of it together, those already gone included. Two modes:
 *
 * Polling (always available). The supervisor (the init, the init of a PID namespace, or the
 * launcher, the subreaper) wakes every --budget-poll-ms and walks the run: its own descendants,
 * which are exactly the run because orphans are re-parented to it in both modes. The walk starts at
 * /proc/thread-self/children and goes breadth-first through /proc/PID/task/TID/children (never a
 * listing of /proc: without a PID namespace that would be the host's processes). It sums
 *   CPU     the larger of two lower bounds:
 *           exact: getrusage(RUSAGE_CHILDREN) of the supervisor (every process of the run it
 *             reaped, with what they had reaped themselves) + utime+stime+cutime+cstime of
 *             every live or zombie process (/proc/PID/stat; cutime covers the children it
 *             reaped itself): each process is counted once, by whoever holds its times now.
 *             Parents are read before their children, so a reap during the walk can only hide
 *             a process for one tick, never count it twice; a pid seen twice in one walk (a
 *             thread exiting moves its children to another thread) is skipped. It misses the
 *             processes the kernel reaps itself (their parent ignores SIGCHLD): their times go
 *             to nobody;
 *           integral: every process's own utime+stime as the ticks saw it grow, keyed by pid
 *             and start time against the previous tick's walk. It misses what a process spent
 *             after the last tick that saw it.
 *   memory  resident pages of every live process (field 24 of /proc/PID/stat, the same
 *           get_mm_rss() as field 2 of /proc/PID/statm, read in the same open), summed, plus
 *           what the kernel holds for the run outside them (held.c: its tmpfs mounts, its SysV
 *           IPC); the peak is kept.
 * Over a budget: one line "exceeded cpu USED_MS LIMIT_MS" or "exceeded memory USED_KB
 * LIMIT_KB", and the supervisor ends the run as on SIGTERM. The walk reads at most WALK_MAX
 * tasks (processes, and the extra threads of multi-threaded ones, whose children lists are read
 * one by one) per tick: a run with more cannot be measured whole, so it is ended as over a
 * budget, "exceeded tasks N WALK_MAX". Per tick: no allocation (static tables for the walk and
 * the previous tick's view, stack buffers for the files); the next tick is poll_ms after the end
 * of this one, so a large tree cannot keep the supervisor busy all the time. Without a budget
 * none of this runs.
 *
 * While memory climbs, sooner (tick_after): a run overshoots its memory budget by what it
 * allocates between the tick before the limit and the tick after. The next tick comes before
 * the charge, at twice the rate it grew since the last one, could pass the limit and a quarter
 * (at least 1 ms after this one); a run whose memory holds still is polled every poll_ms.
 *
 * cgroup v2 (--cgroup DIR, a delegated directory whose cgroup.subtree_control enables memory and
 * pids). Before the namespaces, the launcher makes DIR/corral-<the launcher's pid>, writes
 * memory.max (the memory budget), memory.swap.max 0, memory.oom.group 1 and pids.max (--rlimit
 * nproc), opens its cgroup.procs, and checks with a throwaway child that a process can be moved in
 * (that needs write access to the cgroup.procs of the common ancestor of the launcher's cgroup and
 * DIR: the launcher must run inside the delegated subtree). The program joins it by writing "0" to
 * that fd, before it changes uid and before execve (budget_join): nothing of the program runs
 * outside it. The kernel then enforces memory.max (an OOM kill inside the cgroup, which
 * memory.events counts: "exceeded memory"); the tick reads cpu.stat usage_usec for the CPU budget.
 * At the end: cgroup.kill, the totals from cpu.stat and memory.peak, memory.events, rmdir. A cgroup
 * that cannot be used is "refused cgroup ERRNO DIR (what): how to delegate", and the budgets are
 * polled; with --cgroup-require it is "fatal cgroup" and nothing runs.
 *
 * A stop of the run (SIGTERM SIGINT SIGHUP: the host's timeout, through the launcher) waits for no
 * tick. A tick of a large run is long (a PSS read of each of hundreds of processes, on a CPU the
 * run competes for), and the host kills the supervisor a grace after its stop: the walks take a
 * stop off the signal queue between two reads (stop_heard), and the tick ends there, its partial
 * sums dropped. The supervisor's wait then sees budget_stopped(). The init drops a stop from
 * inside its namespace (budget_stop_from_outside), as its own wait does.
 *
 * Observations. The walks also keep the most tasks of the run seen at once and the largest
 * address space of one process (field 23 of the same stat); one more walk is made when the
 * program has exited and is not reaped yet (budget_observe_exit), so that a short run that forked
 * up to RLIMIT_NPROC is seen there. With RLIMIT_FSIZE, the largest file the run left
 * (mounts_largest_file). They are written "observed NAME N" after "total": the policy names a
 * limit as the run's end only when they show it was reached.
 *
 * The state is the run's (struct budget_state, L->bud): the launcher makes it, the init and program
 * inherit it with fork().
 */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

#define WALK_MAX 4096           /* tasks read per tick; more: the run is ended */
#define WALK_SLOTS 8192         /* pids seen in a tick: open addressing, a power of 2 > 2 * max */
#define CG_END_MS 1000          /* at the end, how long the run cgroup may take to empty */
#define CG_NAME_TRIES 8
#define STOP_EVERY 16           /* tasks read between two looks for a stop */

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void report_exceeded(struct budget_state *bud, const char *what, unsigned long long used,
			    unsigned long long limit)
{
	struct line l;

	if (bud->over)
		return;
	bud->over = 1;
	line_start(&l, "exceeded ");
	line_add(&l, what);
	line_add(&l, " ");
	line_num(&l, used);
	line_add(&l, " ");
	line_num(&l, limit);
	line_send(&l, report_get_fd());
}

/* ---- polling: the walk ---- */

/* One process as a tick saw it. */
struct seen {
	pid_t pid;
	int read;                       /* its stat was read (else: gone before) */
	unsigned long long start;       /* starttime: tells a reused pid apart */
	unsigned long long own;         /* utime+stime, ticks */
	unsigned long long rss_kb;      /* resident size */
};

/* The walk of one tick, and what the previous tick saw (for the integral, below): two
 * generations of the same tables, static so that no tick allocates and nothing big sits on the
 * stack. gen[cur] is the last complete tick. Kept out of struct launch for its size: only a run's
 * supervisor walks, in memory no earlier run walked in (corral-launch, the spawner's launcher,
 * corral-init), so a run's first walk finds the previous generation empty. */
static struct walk {
	size_t n;                       /* pids queued */
	size_t tasks;                   /* pids queued + the extra threads of those read */
	int full;                       /* more than WALK_MAX tasks */
	unsigned long long full_ticks;  /* utime+stime+cutime+cstime of the live and zombies */
	unsigned long long own_new;     /* own CPU the previous tick had not seen, ticks */
	unsigned long long pages;       /* resident pages */
	unsigned long long vm_kb;       /* the largest address space of one process */
	int cur;
	unsigned long long boot[2];     /* CLOCK_BOOTTIME at the start of the walk, clock ticks */
	size_t count[2];
	struct seen gen[2][WALK_MAX];   /* gen[g][0..count[g]): the queue of that tick */
	unsigned short slot[2][WALK_SLOTS];     /* pid hash: index + 1 into gen[g]; 0 empty */
} W;


/* Adds to ru what the program would add to getrusage(RUSAGE_CHILDREN) once reaped: its CPU times
 * with those of the children it reaped (fields 14-17 of /proc/PID/stat, in clock ticks) and its
 * peak resident set (VmHWM of /proc/PID/status). Nothing when it cannot be read. */
void budget_add_prog_usage(pid_t pid, struct rusage *ru)
{
	char buf[4096];
	unsigned long long f[18] = { 0 }, user_us, sys_us;
	long tck = sysconf(_SC_CLK_TCK);
	const char *p;
	int field = 3;

	if (pid <= 0 || tck <= 0 || read_proc(pid, "stat", buf, sizeof buf) != 0)
		return;
	p = strrchr(buf, ')');          /* comm may hold spaces and parens */
	if (!p || p[1] != ' ' || !p[2])
		return;
	for (p += 3; *p && field < 17;) {
		unsigned long long v = 0;

		while (*p == ' ')
			p++;
		field++;
		for (; *p >= '0' && *p <= '9'; p++)
			v = v * 10 + (unsigned long long)(*p - '0');
		while (*p && *p != ' ')
			p++;
		f[field] = v;
	}
	if (field < 17)
		return;
	user_us = (f[14] + f[16]) * 1000000ULL / (unsigned long long)tck;
	sys_us = (f[15] + f[17]) * 1000000ULL / (unsigned long long)tck;
	ru->ru_utime.tv_sec += (time_t)(user_us / 1000000ULL);
	ru->ru_utime.tv_usec += (suseconds_t)(user_us % 1000000ULL);
	ru->ru_stime.tv_sec += (time_t)(sys_us / 1000000ULL);
	ru->ru_stime.tv_usec += (suseconds_t)(sys_us % 1000000ULL);
	if (read_proc(pid, "status", buf, sizeof buf) == 0 &&
	    (p = strstr(buf, "\nVmHWM:")) != NULL) {
		long kb = strtol(p + 7, NULL, 10);

		if (kb > ru->ru_maxrss)
			ru->ru_maxrss = kb;
	}
}

/* While a run with a budget goes on: "usage" and "total" as they stand, now and then, lower
 * bounds that the next ones replace (the host keeps the last). At a stop the supervisor may not get
 * a CPU within the host's grace (a fork bomb's hundreds of runnable processes share it with us), and
 * is killed: these are then what the run reports. Spaced a 32nd of the run so far apart, at least
 * RUNNING_MIN_MS, and only while the report is under RUNNING_MAX_BYTES: the host keeps the first
 * 64 KiB of it, and the lines of the end must fit. Told between ticks and during them (from
 * stop_heard), with the last complete tick's measure. */
#define RUNNING_MIN_MS 100
#define RUNNING_MAX_BYTES ((size_t)16 * 1024)

static void report_total(const struct budget_state *bud, const struct rusage *ru);

static int tell_on(const struct budget_state *bud)
{
	return bud->tell_pid && !bud->over && !bud->stopped && report_sent() <= RUNNING_MAX_BYTES;
}

static long long tell_gap(const struct budget_state *bud, long long now)
{
	long long gap = (now - bud->started_ms) / 32;

	return gap < RUNNING_MIN_MS ? RUNNING_MIN_MS : gap;
}

static void tell_running(struct budget_state *bud)
{
	struct rusage ru, with_c;
	long long now;

	if (!tell_on(bud))
		return;
	now = now_ms();
	if (now - bud->told_ms < tell_gap(bud, now))
		return;
	bud->told_ms = now;
	if (getrusage(RUSAGE_CHILDREN, &ru) != 0)
		return;
	with_c = ru;
	budget_add_prog_usage(bud->tell_pid, &with_c);
	report_usage(&with_c);
	report_total(bud, &ru);         /* the last walk counts the program among the live */
	report_flush();
}

/* During a tick: 1 when a stop of the run has come (taken off the queue: the caller's wait will
 * not see it, budget_stopped() tells). Outside a tick the stop stays queued for that wait. */
static int stop_heard(struct budget_state *bud)
{
	static const struct timespec now = { 0, 0 };
	sigset_t set;
	siginfo_t si;

	if (!bud->ticking || bud->stopped)
		return bud->stopped;
	tell_running(bud);      /* a tick of a large run on a busy machine can last seconds */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	while (sigtimedwait(&set, &si, &now) > 0)
		if (!bud->init || budget_stop_from_outside(&si))
			bud->stopped = 1;
	return bud->stopped;
}

int budget_stop_from_outside(const siginfo_t *si)
{
	/* A signal from another PID namespace shows si_pid 0; but a sender may write its own siginfo
	 * (rt_sigqueueinfo, pidfd_send_signal), si_pid 0 included, and the kernel takes one for
	 * another process only with a negative si_code (SI_QUEUE and the like): kill()'s is SI_USER
	 * (0), the kernel's SI_KERNEL. */
	return si->si_pid == 0 && si->si_code >= 0;
}

static size_t pid_hash(pid_t pid)
{
	return ((unsigned long)pid * 2654435761UL) & (WALK_SLOTS - 1);
}

/* The entry of pid in generation g, or NULL. */
static const struct seen *walk_find(int g, pid_t pid)
{
	size_t h = pid_hash(pid);

	while (W.slot[g][h]) {
		const struct seen *e = &W.gen[g][W.slot[g][h] - 1];

		if (e->pid == pid)
			return e;
		h = (h + 1) & (WALK_SLOTS - 1);
	}
	return NULL;
}

/* Queues pid in the generation being walked, once. */
static void walk_add(long pid)
{
	int g = !W.cur;
	size_t h;

	if (pid <= 0 || pid > INT_MAX)
		return;
	h = pid_hash((pid_t)pid);
	while (W.slot[g][h]) {
		if (W.gen[g][W.slot[g][h] - 1].pid == (pid_t)pid)
			return;
		h = (h + 1) & (WALK_SLOTS - 1);
	}
	W.tasks++;
	if (W.n == WALK_MAX || W.tasks > WALK_MAX) {
		W.full = 1;
		return;
	}
	W.gen[g][W.n].pid = (pid_t)pid;
	W.gen[g][W.n].read = 0;
	W.slot[g][h] = (unsigned short)(W.n + 1);
	W.n++;
}

static void walk_add_pid(long pid, void *unused)
{
	(void)unused;
	walk_add(pid);
}

/* Queues the pids of a children file. */
static void read_children(int dfd, const char *path)
{
	int fd = openat(dfd, path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;         /* gone */
	pids_read(fd, walk_add_pid, NULL);
	close(fd);
}

struct pstat {
	char state;
	unsigned long long own;         /* utime+stime, ticks */
	unsigned long long children;    /* cutime+cstime, ticks */
	unsigned long long threads;
	unsigned long long start;       /* starttime */
	unsigned long long vsize;       /* address space, bytes */
	unsigned long long rss;         /* pages */
};

/* The start of /proc/PID/NAME, NUL-terminated, in buf: one read (these files are generated
 * whole on the first read). 0, or -1 when it cannot be read (the process is gone). */
int read_proc(pid_t pid, const char *name, char *buf, size_t len)
{
	char path[48];
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	do
		n = read(fd, buf, len - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return 0;
}

/* /proc/PID/stat: "pid (comm) S ppid ..." (comm may hold spaces and parens): 0, or -1 when the
 * process is gone. Fields are numbered from 1; negative values count as 0. */
static int read_stat(pid_t pid, struct pstat *s)
{
	char buf[1024];
	unsigned long long f[25] = { 0 };
	const char *p;
	int field = 3;

	if (read_proc(pid, "stat", buf, sizeof buf) != 0)
		return -1;
	p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || !p[2])
		return -1;
	s->state = p[2];
	for (p += 3; *p && field < 24;) {
		unsigned long long v = 0;
		int neg = 0;

		while (*p == ' ')
			p++;
		field++;
		if (*p == '-') {
			neg = 1;
			p++;
		}
		for (; *p >= '0' && *p <= '9'; p++)
			v = v * 10 + (unsigned long long)(*p - '0');
		while (*p && *p != ' ')
			p++;
		f[field] = neg ? 0 : v;
	}
	if (field < 24)
		return -1;
	s->own = f[14] + f[15];
	s->children = f[16] + f[17];
	s->threads = f[20];
	s->start = f[22];
	s->vsize = f[23];
	s->rss = f[24];
	return 0;
}

/* The children of every thread of a multi-threaded process. */
static void read_thread_children(pid_t pid)
{
	char path[32], buf[2048];
	int dfd;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return;
	while (!W.full) {
		long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
		long off;

		if (n <= 0)
			break;
		for (off = 0; off < n && !W.full;) {
			struct dirent64 *d = (struct dirent64 *)(void *)(buf + off);
			char sub[48];

			off += d->d_reclen;
			if (d->d_name[0] < '0' || d->d_name[0] > '9')
				continue;
			snprintf(sub, sizeof sub, "%.20s/children", d->d_name);
			read_children(dfd, sub);
		}
	}
	close(dfd);
}

static unsigned long long boot_ticks(const struct budget_state *bud)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0)
		return 0;
	return ((unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec) /
	       (1000000000ULL / (unsigned long long)bud->clk_tck);
}

/* Own CPU of a process that the previous walk did not see, as far as it is new: all of it when
 * it started after that walk (or there was none); else the walk missed it (its parent died
 * while we walked, and it was on its way to us), and what it spent before was counted then: at
 * most what it could spend since. */
static unsigned long long own_unseen(const struct pstat *s, unsigned long long now)
{
	unsigned long long prev = W.boot[W.cur], bound;

	if (!prev || s->start + 1 >= prev)
		return s->own;
	bound = (now - prev + 1) * (s->threads ? s->threads : 1);
	return s->own < bound ? s->own : bound;
}

/* One walk of the run, breadth-first from our own children; fills W. 0, or -1 when a stop cut it
 * short: W's sums are partial, and the generation walked is not kept. */
static int walk_run(struct budget_state *bud)
{
	int g = !W.cur;
	size_t i;

	W.n = 0;
	W.tasks = 0;
	W.full = 0;
	W.full_ticks = 0;
	W.own_new = 0;
	W.pages = 0;
	W.vm_kb = 0;
	memset(W.slot[g], 0, sizeof W.slot[g]);
	W.boot[g] = boot_ticks(bud);
	read_children(AT_FDCWD, "/proc/thread-self/children");
	for (i = 0; i < W.n && !W.full; i++) {
		char path[48];
		struct pstat s;
		struct seen *e = &W.gen[g][i];
		const struct seen *before;

		if (i % STOP_EVERY == STOP_EVERY - 1 && stop_heard(bud))
			return -1;
		if (read_stat(e->pid, &s) != 0)
			continue;       /* reaped since it was listed: its times are with its
					 * reaper */
		e->read = 1;
		e->start = s.start;
		e->own = s.own;
		e->rss_kb = s.rss * bud->page_kb;
		W.full_ticks += s.own + s.children;
		W.pages += s.rss;
		if (s.vsize / 1024 > W.vm_kb)
			W.vm_kb = s.vsize / 1024;
		before = walk_find(W.cur, e->pid);
		if (before && before->read && before->start == s.start)
			W.own_new += s.own > before->own ? s.own - before->own : 0;
		else
			W.own_new += own_unseen(&s, W.boot[g]);
		if (s.state == 'Z' || s.state == 'X')
			continue;       /* its children went to us (or its other threads) */
		if (s.threads > 1) {
			W.tasks += s.threads - 1;
			if (W.tasks > WALK_MAX) {
				W.full = 1;
				break;
			}
			read_thread_children(e->pid);
		} else {
			snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)e->pid,
				 (int)e->pid);
			read_children(AT_FDCWD, path);
		}
	}
	W.count[g] = W.n;
	W.cur = g;
	return 0;
}

static unsigned long long tv_us(const struct timeval *tv)
{
	return (unsigned long long)tv->tv_sec * 1000000ULL + (unsigned long long)tv->tv_usec;
}

static unsigned long long ticks_us(const struct budget_state *bud, unsigned long long ticks)
{
	return ticks * 1000000ULL / (unsigned long long)bud->clk_tck;
}

/* One measurement of the run (see the top of the file); the CPU total is the larger of
 *   exact     RUSAGE_CHILDREN + the full times of the processes alive now, and
 *   integral  every process's own CPU as the ticks saw it grow,
 * both lower bounds: the first misses the processes the kernel reaped with no trace (their
 * parent ignores SIGCHLD), the second what a process spent after the last tick that saw it. */
static void measure_walk(struct budget_state *bud, int walk)
{
	struct rusage ru;
	unsigned long long reaped = 0, cpu;

	/* Before the walk: what we reaped is in here, what we did not yet is still in /proc. */
	if (getrusage(RUSAGE_CHILDREN, &ru) == 0)
		reaped = tv_us(&ru.ru_utime) + tv_us(&ru.ru_stime);
	if (walk) {
		if (walk_run(bud) != 0)
			return;
		bud->integral_ticks += W.own_new;
		bud->live_us = ticks_us(bud, W.full_ticks);
		if (W.tasks > bud->peak_tasks)
			bud->peak_tasks = W.tasks;
		if (W.vm_kb > bud->peak_vm_kb)
			bud->peak_vm_kb = W.vm_kb;
	} else {
		bud->live_us = 0;       /* all reaped: nothing left to walk */
	}
	cpu = reaped + bud->live_us;
	if (ticks_us(bud, bud->integral_ticks) > cpu)
		cpu = ticks_us(bud, bud->integral_ticks);
	if (cpu > bud->cpu_us)
		bud->cpu_us = cpu;
}

/* Proportional set size of a process, KiB ("Pss:" of /proc/PID/smaps_rollup: each shared
 * page counted as its share); -1 when it cannot be read (gone, or no access). */
static long long read_pss_kb(pid_t pid)
{
	char buf[1024];
	const char *p;

	if (read_proc(pid, "smaps_rollup", buf, sizeof buf) != 0)
		return -1;
	p = strstr(buf, "\nPss:");
	if (!p)
		return -1;
	for (p += 5; *p == ' '; p++)
		;
	return *p >= '0' && *p <= '9' ? (long long)strtoull(p, NULL, 10) : -1;
}

/* The memory the run is charged, KiB. The summed resident sizes count a page shared by forked
 * processes (the interpreter, its imports) once per process: cheap, and an upper bound. Only
 * when that sum is over the budget is the run measured again by proportional set size, which
 * counts each shared page once in all; a process whose PSS cannot be read keeps its RSS (never
 * an undercount). held_kb, what the kernel holds outside the processes, is added to either.
 * Over the budget, the run ends at this tick: the sum still goes on to its last process, so that
 * the peak is what the run held, and the init of the run's PID namespace first stops every
 * process of it (they are killed next), so that they hold still meanwhile. */
static unsigned long long charged_kb(struct launch *L, unsigned long long rss_kb,
				     unsigned long long held_kb)
{
	struct budget_state *bud = &L->bud;
	unsigned long long kb = held_kb;
	int over = 0;
	size_t i;

	rss_kb += held_kb;
	if (!bud->mem_limit_kb || rss_kb <= bud->mem_limit_kb)
		return rss_kb;
	for (i = 0; i < W.count[W.cur]; i++) {
		const struct seen *e = &W.gen[W.cur][i];
		long long pss;

		if (!e->read)
			continue;
		if (stop_heard(bud))
			return rss_kb;  /* not charged: the tick ends */
		pss = read_pss_kb(e->pid);
		kb += pss >= 0 ? (unsigned long long)pss : e->rss_kb;
		if (kb > bud->mem_limit_kb && !over && held_is_init(L))
			kill(-1, SIGSTOP);      /* the run's namespace: every process but us */
		over = kb > bud->mem_limit_kb;
	}
	return kb < rss_kb ? kb : rss_kb;
}

/* ms to the next tick after a memory charge of kb (see the top of the file). */
static long long tick_after(struct budget_state *bud, unsigned long long kb)
{
	long long now = now_ms(), dt = now - bud->mem_ms, ms = bud->poll_ms;
	unsigned long long margin = bud->mem_limit_kb + bud->mem_limit_kb / 4, grew;

	if (bud->mem_ms && kb > bud->mem_kb && kb < margin) {
		grew = kb - bud->mem_kb;        /* in dt (at least 1) ms: at twice that rate, */
		ms = (long long)((margin - kb) * (unsigned long long)(dt > 0 ? dt : 1) / (2 * grew));
		if (ms > bud->poll_ms)
			ms = bud->poll_ms;
		if (ms < 1)
			ms = 1;
	}
	bud->mem_ms = now;
	bud->mem_kb = kb;
	return ms;
}

/* The tick in polling mode: 1 when the run is over a budget (the line is written). */
static int measure_poll(struct launch *L)
{
	struct budget_state *bud = &L->bud;
	unsigned long long kb;

	measure_walk(bud, 1);
	if (bud->stopped)
		return 0;       /* the run ends on the stop */
	kb = charged_kb(L, W.pages * bud->page_kb, bud->mem_limit_kb ? held_kb(L) : 0);
	if (bud->stopped)
		return 0;
	if (kb > bud->peak_kb)
		bud->peak_kb = kb;
	bud->after_ms = bud->mem_limit_kb ? tick_after(bud, kb) : bud->poll_ms;
	if (W.full) {
		report_exceeded(bud, "tasks", W.tasks, WALK_MAX);
		return 1;
	}
	if (bud->cpu_limit_us && bud->cpu_us > bud->cpu_limit_us) {
		report_exceeded(bud, "cpu", (bud->cpu_us + 999) / 1000, bud->cpu_limit_us / 1000);
		return 1;
	}
	if (bud->mem_limit_kb && kb > bud->mem_limit_kb) {
		report_exceeded(bud, "memory", kb, bud->mem_limit_kb);
		return 1;
	}
	return 0;
}

/* ---- cgroup v2 ---- */

/* The value of "KEY N" in a flat-keyed cgroup file (read again from offset 0); -1: absent. */
static long long cg_key(int fd, const char *key)
{
	char buf[1024];
	size_t klen = strlen(key);
	ssize_t n;
	char *p;

	if (fd < 0)
		return -1;
	do
		n = pread(fd, buf, sizeof buf - 1, 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	for (p = buf; *p;) {
		if (strncmp(p, key, klen) == 0 && p[klen] == ' ') {
			long long v = 0;

			for (p += klen + 1; *p >= '0' && *p <= '9'; p++)
				v = v * 10 + (*p - '0');
			return v;
		}
		p = strchr(p, '\n');
		if (!p)
			break;
		p++;
	}
	return -1;
}

/* A single-valued file: its number, -1 when unreadable. */
static long long cg_value(int fd)
{
	char buf[32];
	long long v = 0;
	ssize_t n, i;

	if (fd < 0)
		return -1;
	do
		n = pread(fd, buf, sizeof buf - 1, 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -1;
	for (i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
		v = v * 10 + (buf[i] - '0');
	return i > 0 ? v : -1;
}

static int cg_write(int dfd, const char *file, const char *value)
{
	int fd = openat(dfd, file, O_WRONLY | O_CLOEXEC);
	size_t len = strlen(value);
	ssize_t n;

	if (fd < 0)
		return -1;
	do
		n = write(fd, value, len);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)len) {
		int err = n < 0 ? errno : EIO;

		close(fd);
		errno = err;
		return -1;
	}
	close(fd);
	return 0;
}

/* 1 when the whitespace-separated word is in the file dfd/file; 0 when not; -1 unreadable. */
static int cg_has(int dfd, const char *file, const char *word)
{
	char buf[512];
	size_t wlen = strlen(word);
	int fd = openat(dfd, file, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	char *p;

	if (fd < 0)
		return -1;
	do
		n = read(fd, buf, sizeof buf - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	for (p = buf; (p = strstr(p, word)) != NULL; p += wlen)
		if ((p == buf || p[-1] == ' ') &&
		    (p[wlen] == ' ' || p[wlen] == '\n' || p[wlen] == '\0'))
			return 1;
	return 0;
}

static void cg_kill_now(const struct budget_state *bud)
{
	ssize_t n;

	if (bud->cg_kill < 0)
		return;
	do
		n = pwrite(bud->cg_kill, "1", 1, 0);
	while (n < 0 && errno == EINTR);
}

/* 1 when DIR/NAME is still the cgroup we made (the init may have removed it, and a launcher of the
 * same pid in another PID namespace sharing DIR may have made one of that name since). */
static int cg_ours(const struct budget_state *bud)
{
	struct stat a, b;

	return fstat(bud->cg_dir, &a) == 0 &&
	       fstatat(bud->cg_parent, bud->cg_name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Empties and removes the run cgroup; once. */
static void cg_remove(struct budget_state *bud)
{
	long long deadline = now_ms() + CG_END_MS;

	if (bud->cg_parent < 0)
		return;
	close_fd(&bud->cg_procs);
	close_fd(&bud->cg_cpu);
	close_fd(&bud->cg_events);
	close_fd(&bud->cg_peak);
	while (cg_ours(bud) && unlinkat(bud->cg_parent, bud->cg_name, AT_REMOVEDIR) != 0 &&
	       errno == EBUSY && now_ms() < deadline) {
		cg_kill_now(bud);       /* still has processes: again, and wait a little */
		poll(NULL, 0, 10);
	}
	close_fd(&bud->cg_kill);
	close_fd(&bud->cg_dir);
	close_fd(&bud->cg_parent);
	bud->cg = 0;
}

/* The tick in cgroup mode. */
static int measure_cgroup(struct budget_state *bud)
{
	long long v;

	if (bud->mem_limit_kb) {
		v = cg_value(bud->cg_peak);
		if (v >= 0 && (unsigned long long)v / 1024 > bud->peak_kb)
			bud->peak_kb = (unsigned long long)v / 1024;
		if (cg_key(bud->cg_events, "oom_kill") > 0) {
			report_exceeded(bud, "memory", bud->peak_kb, bud->mem_limit_kb);
			return 1;
		}
	}
	if (bud->cpu_limit_us) {
		v = cg_key(bud->cg_cpu, "usage_usec");
		if (v >= 0 && (unsigned long long)v > bud->cpu_us)
			bud->cpu_us = (unsigned long long)v;
		if (bud->cpu_us > bud->cpu_limit_us) {
			report_exceeded(bud, "cpu", (bud->cpu_us + 999) / 1000,
					bud->cpu_limit_us / 1000);
			return 1;
		}
	}
	return 0;
}

/* Undoes what cg_setup() did so far; detail gets "DIR (what is wrong)". Returns err. */
static int cg_fail(struct budget_state *bud, int err, char *detail, size_t len, const char *dir,
		   const char *what)
{
	snprintf(detail, len, "%s (%s)", dir, what);
	close_fd(&bud->cg_procs);
	close_fd(&bud->cg_cpu);
	close_fd(&bud->cg_events);
	close_fd(&bud->cg_peak);
	close_fd(&bud->cg_kill);
	if (bud->cg_dir >= 0) {
		close_fd(&bud->cg_dir);
		unlinkat(bud->cg_parent, bud->cg_name, AT_REMOVEDIR);
	}
	close_fd(&bud->cg_parent);
	return err;
}

/* A throwaway child moves itself in as the program will (same creds, same cgroup, same fd): 0 or
 * errno. */
static int cg_try_join(const struct budget_state *bud)
{
	int st;
	pid_t h = fork();

	if (h < 0)
		return errno;
	if (h == 0) {
		ssize_t n = write(bud->cg_procs, "0", 1);

		_exit(n == 1 ? 0 : (errno > 0 && errno < 256 ? errno : EIO));
	}
	while (waitpid(h, &st, 0) < 0)
		if (errno != EINTR)
			return errno;
	return WIFEXITED(st) ? WEXITSTATUS(st) : EIO;
}

static int cg_open(const struct budget_state *bud, const char *file, int flags)
{
	return openat(bud->cg_dir, file, flags | O_CLOEXEC);
}

/* Makes and configures the run cgroup: 0, or an errno with detail filled. */
static int cg_setup(struct budget_state *bud, const struct plan *p, char *detail, size_t len)
{
	const char *dir = p->cgroup;
	static const char *const need[] = { "memory", "pids" };
	struct statfs sf;
	char num[32];
	int i, err;

	bud->cg_parent = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (bud->cg_parent < 0)
		return cg_fail(bud, errno, detail, len, dir, errno == ENOENT ? "no such directory" :
			       "cannot open the directory");
	if (fstatfs(bud->cg_parent, &sf) != 0)
		return cg_fail(bud, errno, detail, len, dir, "statfs failed");
	if (sf.f_type != CGROUP2_SUPER_MAGIC)
		return cg_fail(bud, EINVAL, detail, len, dir, "not in a cgroup2 file system");
	for (i = 0; i < 2; i++) {
		char what[96];
		int r = cg_has(bud->cg_parent, "cgroup.controllers", need[i]);

		if (r < 0)
			return cg_fail(bud, errno, detail, len, dir,
				       "cannot read cgroup.controllers");
		if (r == 0) {
			snprintf(what, sizeof what, "the %s controller is not in its cgroup.controllers",
				 need[i]);
			return cg_fail(bud, EOPNOTSUPP, detail, len, dir, what);
		}
		if (cg_has(bud->cg_parent, "cgroup.subtree_control", need[i]) != 1) {
			snprintf(what, sizeof what,
				 "the %s controller is not enabled in its cgroup.subtree_control",
				 need[i]);
			return cg_fail(bud, EOPNOTSUPP, detail, len, dir, what);
		}
	}
	/* corral-PID, or a suffixed name if a launcher of the same pid (another PID namespace, or
	 * one killed before it could clean up) left that one: never remove what is not ours. */
	for (i = 0; i < CG_NAME_TRIES; i++) {
		if (i == 0)
			snprintf(bud->cg_name, sizeof bud->cg_name, "corral-%d", (int)getpid());
		else
			snprintf(bud->cg_name, sizeof bud->cg_name, "corral-%d-%lld", (int)getpid(),
				 (long long)(now_ms() * 7 + i) % 1000000);
		if (mkdirat(bud->cg_parent, bud->cg_name, 0755) == 0)
			break;
		if (errno != EEXIST)
			return cg_fail(bud, errno, detail, len, dir,
				       "cannot make the run cgroup in it");
	}
	if (i == CG_NAME_TRIES)
		return cg_fail(bud, EEXIST, detail, len, dir, "no free name for the run cgroup");
	bud->cg_dir = openat(bud->cg_parent, bud->cg_name, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (bud->cg_dir < 0) {
		err = errno;
		unlinkat(bud->cg_parent, bud->cg_name, AT_REMOVEDIR);
		return cg_fail(bud, err, detail, len, dir, "cannot open the run cgroup");
	}
	if (p->budget_memory_kb) {
		snprintf(num, sizeof num, "%llu", p->budget_memory_kb * 1024ULL);
		if (cg_write(bud->cg_dir, "memory.max", num) != 0)
			return cg_fail(bud, errno, detail, len, dir, "cannot write memory.max");
	}
	/* No swap: memory.max must bound what the run holds. Without swap accounting the file is
	 * absent, and there is nothing to bound. */
	if (cg_write(bud->cg_dir, "memory.swap.max", "0") != 0 && errno != ENOENT)
		return cg_fail(bud, errno, detail, len, dir, "cannot write memory.swap.max");
	/* An OOM kill takes the whole run, as the polling mode ends it. */
	cg_write(bud->cg_dir, "memory.oom.group", "1");
	if (p->rlimit[PLAN_RL_NPROC].set) {
		snprintf(num, sizeof num, "%llu", p->rlimit[PLAN_RL_NPROC].value);
		if (cg_write(bud->cg_dir, "pids.max", num) != 0)
			return cg_fail(bud, errno, detail, len, dir, "cannot write pids.max");
	}
	bud->cg_procs = cg_open(bud, "cgroup.procs", O_WRONLY);
	if (bud->cg_procs < 0)
		return cg_fail(bud, errno, detail, len, dir,
			       "cannot open the run cgroup's cgroup.procs");
	err = cg_try_join(bud);
	if (err)
		return cg_fail(bud, err, detail, len, dir,
			       "cannot move a process into the run cgroup: the launcher's own cgroup "
			       "is not in the same delegated subtree");
	bud->cg_cpu = cg_open(bud, "cpu.stat", O_RDONLY);
	if (bud->cg_cpu < 0)
		return cg_fail(bud, errno, detail, len, dir,
			       "cannot open the run cgroup's cpu.stat");
	bud->cg_events = cg_open(bud, "memory.events", O_RDONLY);
	if (bud->cg_events < 0)
		return cg_fail(bud, errno, detail, len, dir,
			       "cannot open the run cgroup's memory.events");
	bud->cg_peak = cg_open(bud, "memory.peak", O_RDONLY);
	if (bud->cg_peak < 0)
		bud->cg_peak = cg_open(bud, "memory.current", O_RDONLY);
	if (bud->cg_peak < 0)
		return cg_fail(bud, errno, detail, len, dir,
			       "cannot open the run cgroup's memory.current");
	/* before Linux 5.14: the kill(2)s do */
	bud->cg_kill = cg_open(bud, "cgroup.kill", O_WRONLY);
	bud->cg = 1;
	bud->cg_made = 1;
	return 0;
}

/* ---- the supervisor's side ---- */

int budget_prepare(struct launch *L)
{
	struct budget_state *bud = &L->bud;
	const struct plan *p = L->plan;
	long pagesize;

	bud->plan = p;
	if (!p->cgroup && !p->budget_cpu_ms && !p->budget_memory_kb)
		return 0;
	bud->clk_tck = sysconf(_SC_CLK_TCK);
	if (bud->clk_tck <= 0)
		bud->clk_tck = 100;
	pagesize = sysconf(_SC_PAGESIZE);
	bud->page_kb = pagesize >= 1024 ? (unsigned long long)pagesize / 1024 : 4;
	if (p->cgroup) {
		char detail[PATH_MAX + 160];
		int err = cg_setup(bud, p, detail, sizeof detail);

		if (err && p->cgroup_require) {
			report_fatal(W_CGROUP, err, detail);
			return -1;
		}
		if (err)
			report_refused_at("cgroup", err, detail, explain(W_CGROUP, err));
		else
			report_applied("cgroup");
	}
	bud->cpu_limit_us = p->budget_cpu_ms * 1000ULL;
	bud->mem_limit_kb = p->budget_memory_kb;
	bud->poll_ms = p->budget_poll_ms ? p->budget_poll_ms : PLAN_POLL_MS_DEFAULT;
	if (p->budget_cpu_ms)
		report_applied_num("budget-cpu", p->budget_cpu_ms);
	if (p->budget_memory_kb)
		report_applied_num("budget-memory", p->budget_memory_kb);
	if (p->budget_cpu_ms || p->budget_memory_kb) {
		report_applied_num("budget-poll", (unsigned long long)bud->poll_ms);
		bud->on = 1;
		bud->next_ms = now_ms() + bud->poll_ms;
		bud->after_ms = bud->poll_ms;
	}
	return 0;
}

int budget_join(const struct launch *L)
{
	const struct budget_state *bud = &L->bud;
	ssize_t n;

	if (bud->cg_procs < 0)
		return 0;
	do
		n = write(bud->cg_procs, "0", 1);
	while (n < 0 && errno == EINTR);
	if (n == 1)
		return 0;
	if (n >= 0)
		errno = EIO;
	return -1;
}

int budget_join_fd(const struct launch *L)
{
	const struct budget_state *bud = &L->bud;
	return bud->cg_procs;
}

void budget_set_join_fd(struct launch *L, int fd)
{
	struct budget_state *bud = &L->bud;
	bud->cg_procs = fd;
}

int budget_active(const struct launch *L)
{
	const struct budget_state *bud = &L->bud;
	return bud->on || bud->cg_made;
}

int budget_wait_ms(const struct launch *L)
{
	const struct budget_state *bud = &L->bud;
	long long left;

	if (!bud->on || bud->over)
		return -1;
	left = bud->next_ms - now_ms();
	if (tell_on(bud)) {             /* the running report (budget_running) is due sooner */
		long long now = now_ms(), tell = tell_gap(bud, now) - (now - bud->told_ms);

		if (tell < left)
			left = tell;
	}
	if (left <= 0)
		return 0;
	return left > INT_MAX ? INT_MAX : (int)left;
}

int budget_check(struct launch *L)
{
	struct budget_state *bud = &L->bud;
	int over;

	if (!bud->on || bud->over || bud->stopped || now_ms() < bud->next_ms)
		return 0;
	bud->ticking = 1;
	over = bud->cg ? measure_cgroup(bud) : measure_poll(L);
	bud->ticking = 0;
	if (over)
		cg_kill_now(bud);       /* cgroup mode: the whole run at once, before the sweep */
	bud->next_ms = now_ms() + (bud->cg ? bud->poll_ms : bud->after_ms);
	return over;
}

int budget_stopped(const struct launch *L)
{
	return L->bud.stopped;
}

/* The run cgroup's CPU and peak memory into the highest seen. */
static void cg_measure(struct budget_state *bud)
{
	long long v = cg_key(bud->cg_cpu, "usage_usec");

	if (v >= 0 && (unsigned long long)v > bud->cpu_us)
		bud->cpu_us = (unsigned long long)v;
	v = cg_value(bud->cg_peak);
	if (v >= 0 && (unsigned long long)v / 1024 > bud->peak_kb)
		bud->peak_kb = (unsigned long long)v / 1024;
}


void budget_finish(struct launch *L, int empty)
{
	struct budget_state *bud = &L->bud;

	if (bud->cg) {
		long long deadline = now_ms() + CG_END_MS;
		int events = cg_open(bud, "cgroup.events", O_RDONLY);

		/* Normally already empty (the supervisor killed and reaped the run): zombies do not
		 * count as populated. */
		cg_kill_now(bud);
		while (cg_key(events, "populated") > 0 && now_ms() < deadline)
			poll(NULL, 0, 5);
		if (events >= 0)
			close(events);
		cg_measure(bud);
		if (bud->mem_limit_kb && cg_key(bud->cg_events, "oom_kill") > 0)
			report_exceeded(bud, "memory", bud->peak_kb, bud->mem_limit_kb);
		bud->live_us = 0;
		cg_remove(bud);
	} else if (bud->on) {
		/* what is still alive: normally nothing, the run was reaped */
		measure_walk(bud, !empty);
	}
}

/* Before the run is torn down (which the host may cut short): a measure of everything alive
 * now, for the total written ahead of the teardown. No exceeded line: the run is ending anyway. */
void budget_measure_now(struct launch *L)
{
	struct budget_state *bud = &L->bud;

	if (bud->cg) {
		cg_measure(bud);
		bud->live_us = 0;       /* usage_usec counts the live processes too */
	} else if (bud->on) {
		measure_walk(bud, 1);   /* the CPU; the memory peak is the ticks' (charging
					 * the memory may take a PSS read of every process) */
	}
}

static void report_total(const struct budget_state *bud, const struct rusage *ru)
{
	struct line l;
	unsigned long long cpu, peak = bud->peak_kb;

	if (!bud->on && !bud->cg_made)
		return;
	cpu = tv_us(&ru->ru_utime) + tv_us(&ru->ru_stime) + bud->live_us;
	if (bud->cpu_us > cpu)
		cpu = bud->cpu_us;
	if (ru->ru_maxrss > 0 && (unsigned long long)ru->ru_maxrss > peak)
		peak = (unsigned long long)ru->ru_maxrss;
	line_start(&l, "total ");
	line_num(&l, cpu);
	line_add(&l, " ");
	line_num(&l, peak);
	line_send(&l, report_get_fd());
}

void budget_report_total(const struct launch *L, const struct rusage *ru)
{
	report_total(&L->bud, ru);
}

/* The supervisor's wait, between ticks: prog is the program, still running. */
void budget_running(struct launch *L, pid_t prog)
{
	struct budget_state *bud = &L->bud;

	if (!bud->on || prog <= 0)
		return;
	if (!bud->tell_pid) {
		bud->started_ms = bud->told_ms = now_ms();
		bud->tell_pid = prog;
		return;
	}
	bud->tell_pid = prog;
	tell_running(bud);
}

/* The program has exited and is not reaped yet: one more walk, so that the tasks it leaves (its
 * zombie and its children, which the kernel still counts against RLIMIT_NPROC) are seen however
 * short the run was. Once; one waitid() per call until then. Not after an exit 0, where the count
 * decides nothing: a run that succeeded pays the waitid() calls alone (about 1.5 us each). */
void budget_observe_exit(struct launch *L, pid_t pid)
{
	struct budget_state *bud = &L->bud;
	siginfo_t si;

	if (!bud->on || bud->over || bud->end_seen)
		return;
	si.si_pid = 0;
	if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != pid)
		return;
	bud->end_seen = 1;
	if (si.si_code != CLD_EXITED || si.si_status != 0)
		measure_walk(bud, 1);
}

static void report_observed(const char *what, unsigned long long v)
{
	struct line l;

	line_start(&l, "observed ");
	line_add(&l, what);
	line_add(&l, " ");
	line_num(&l, v);
	line_send(&l, report_get_fd());
}

/* "observed tasks N" and "observed vm KB" (the walks: with a budget only), "observed file
 * BYTES" (the largest file left in the run's own directories, looked for only when RLIMIT_FSIZE
 * was set and the program did not exit 0: the one case where a file at the limit can decide the
 * reason). */
void budget_report_observed(const struct launch *L, int wstatus)
{
	const struct budget_state *bud = &L->bud;
	if (bud->on) {
		/* the program's tasks alone: --rlimit nproc bounds them, the run's other
		 * processes being added to RLIMIT_NPROC (child.c) */
		report_observed("tasks", bud->peak_tasks);
		report_observed("vm", bud->peak_vm_kb);
	}
	if (bud->plan && bud->plan->rlimit[PLAN_RL_FSIZE].set &&
	    !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0))
		report_observed("file", mounts_largest_file(L));
}

void budget_cleanup(struct launch *L)
{
	struct budget_state *bud = &L->bud;
	cg_kill_now(bud);
	cg_remove(bud);
}
