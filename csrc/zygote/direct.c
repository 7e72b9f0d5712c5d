/* direct.c: a warm run without S, A and B.
 *
 * The zygote clones P, which shares its memory (CLONE_VM) and stops it until P's execve
 * (CLONE_VFORK), straight into the run's new PID, mount and IPC namespaces (and, without root,
 * a user namespace of the run's own inside the zygote's). P is the namespaces' init (pid 1),
 * running on the zygote's own stack below the zygote's frames, as a vfork child does. It puts
 * the run's fds in place, follows the launcher's flow (launch_run: the report, session,
 * die-with-parent, budgets, the namespaces reported as made by ns.c), makes the init's mounts,
 * forks C from the shared memory (a copy of the warm interpreter, as the helper I's fork is on
 * the other path), and execs corral-init (csrc/init), which waits for the run as the launcher's
 * init does and writes C's outcome on a pipe to the zygote. The zygote then goes on; P's pid
 * is the run's pid for the host, and when it has been reaped the outcome read from the pipe is
 * the run's status (an init cannot end by C's signal on itself, as A did).
 *
 * Per run this saves the spawner's hand-over, the processes A and B (their fork, copy-on-write
 * faults, namespace steps and exits), the fork request on the run's socket and the zygote's
 * entering and leaving of each run's PID namespace: about a third of a warm run's CPU.
 *
 * P writes into the zygote's memory: what the launcher's files keep for a run is reset first
 * (launch_state_reset), the plan is the zygote's (parsed here, freed after the execve), and the
 * stack area P used is zeroed once it is gone, so that the next run's C does not inherit this
 * run's arguments. Not direct, on the S/A/B path (request.c): a run with a cgroup (the run
 * cgroup's state would have to cross the execve), a request that is not a run the zygote
 * serves (S and A write the usage error), and every run once a clone of P was refused (a kernel
 * or container that forbids these namespaces with CLONE_VM).
 */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How far below the zygote's stack pointer P's stack starts, and how much of it is zeroed after
 * P is gone (P's deepest path, the mounts and Landlock's paths, uses about 20 kB). */
#define P_GAP (16 * 1024)
#define P_ZERO (128 * 1024)

static int init_fd = -1;        /* corral-init, opened at start-up (O_PATH) */
static int refused;             /* a clone of P failed: every run goes by S */

struct job {
	const struct zygote *z;
	struct plan *plan;
	const int *fds;                 /* the run's stdin, stdout, stderr, report */
	int out;                        /* the outcome pipe's write end */
};

int direct_open(const char *self_dir)
{
	char path[4096];

	if (snprintf(path, sizeof path, "%s/corral-init", self_dir) >= (int)sizeof path)
		return -1;
	init_fd = open(path, O_PATH | O_CLOEXEC);
	return init_fd;
}

int direct_fd(void)
{
	return init_fd;
}

/* The run's fds on 0, 1, 2 and the report fd, corral-init and the outcome pipe just above, and
 * nothing else: P has a copy of the zygote's fd table. */
static int p_fds(const int *fds, int rfd, int out, int *init_out, int *out_out)
{
	int hi[RUN_NFDS + 2], i, base = rfd >= 3 ? rfd + 1 : 3;

	for (i = 0; i < RUN_NFDS; i++)
		hi[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, base + 2);
	hi[RUN_NFDS] = fcntl(init_fd, F_DUPFD_CLOEXEC, base + 2);
	hi[RUN_NFDS + 1] = fcntl(out, F_DUPFD_CLOEXEC, base + 2);
	for (i = 0; i < RUN_NFDS + 2; i++)
		if (hi[i] < 0)
			return -1;
	for (i = 0; i < 3; i++)
		if (dup2(hi[i], i) < 0)
			return -1;
	if (rfd >= 0 && dup2(hi[RUN_REPORT], rfd) < 0)
		return -1;
	if (dup3(hi[RUN_NFDS], base, O_CLOEXEC) < 0 || dup3(hi[RUN_NFDS + 1], base + 1, O_CLOEXEC) < 0)
		return -1;
	if (rfd > 3)
		close_fds(3, rfd - 1);
	close_fds(base + 2, -1);
	*init_out = base;
	*out_out = base + 1;
	return 0;
}

static int p_main(void *arg)
{
	const struct job *j = arg;
	struct launch L;

	launch_state_reset();
	memset(&L, 0, sizeof L);
	if (p_fds(j->fds, j->plan->report_fd, j->out, &L.direct_init, &L.direct_out) != 0)
		_exit(EXIT_SETUP);
	L.shared = &j->z->ns;           /* L.parent 0: getppid() is 0 in a new PID namespace */
	L.seccomp_ready = 1;            /* the filter is in memory (request_filter) */
	L.run_program = py_run_program;
	L.direct = 1;
	launch_run(&L, j->plan);
}

/* Whether this request can be a direct run: a run the zygote serves, without a cgroup. */
static int direct_fits(const struct zygote *z, const struct plan *p)
{
	char err[512];

	return p->mode == PLAN_RUN && !p->cgroup && p->pidns &&
	       (p->net == PLAN_NET_HOST) == (z->net == PLAN_NET_HOST) && p->userns == z->userns &&
	       py_check_run(z, p, err, sizeof err) == 0;
}

pid_t direct_start(const struct zygote *z, char *msg, size_t len, const int *fds, int *outr,
		   int *mntns)
{
	static char *argv[ARGS_MAX + 1];
	struct plan plan;
	struct job j;
	char perr[256], path[64], *top;
	size_t nf = 0, off = 0;
	int flags, out[2], err;
	pid_t pid;

	*outr = *mntns = -1;
	if (refused || init_fd < 0) {
		errno = ENOTSUP;
		return -1;
	}
	while (off < len && nf < ARGS_MAX) {
		argv[nf++] = msg + off;
		off += strlen(msg + off) + 1;
	}
	argv[nf] = NULL;
	/* argv[1], the ID, becomes plan_parse's argv[0]: the arguments follow */
	if (nf < 2 || plan_parse(&plan, (int)(nf - 1), argv + 1, perr, sizeof perr) != 0) {
		errno = ENOTSUP;
		return -1;
	}
	if (!direct_fits(z, &plan) || pipe2(out, O_CLOEXEC) != 0) {
		plan_free(&plan);
		errno = ENOTSUP;
		return -1;
	}
	if (plan.seccomp != PLAN_MECH_OFF)
		request_filter(z, &plan);
	j.z = z;
	j.plan = &plan;
	j.fds = fds;
	j.out = out[1];
	flags = CLONE_VM | CLONE_VFORK | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | SIGCHLD;
	if (z->ns.userns)
		flags |= CLONE_NEWUSER;
	/* P runs below our frames on our own stack, as a vfork child: C, its fork, keeps the
	 * stack's growth room for the program */
	top = (char *)((uintptr_t)((char *)__builtin_frame_address(0) - P_GAP) & ~(uintptr_t)63);
	pid = clone(p_main, top, flags, &j);
	err = errno;
	close(out[1]);
	/* what P wrote there (this run's paths and lines) is not the next run's C's to see */
	memset(top - P_ZERO, 0, P_ZERO);
	plan_free(&plan);
	if (pid < 0) {
		close(out[0]);
		if (err == EINVAL || err == EPERM || err == ENOSPC || err == EUSERS)
			refused = 1;    /* this kernel or container: the S/A/B path from now on */
		errno = ENOTSUP;
		return -1;
	}
	/* the run's mount namespace, held until its exit message (request.c) */
	snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
	*mntns = open(path, O_RDONLY | O_CLOEXEC);
	*outr = out[0];
	return pid;
}

/* The run's status once P (corral-init) is reaped: C's outcome when corral-init wrote it, else
 * P's own wait status (killed; or P ended before C, after a fatal line). */
int direct_status(int outr, int wstatus)
{
	struct outcome o;
	ssize_t n;

	do
		n = read(outr, &o, sizeof o);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof o)
		return wstatus;
	if (o.kind == OUTCOME_SIGNAL && o.value > 0 && o.value < 128)
		return o.value;         /* as a process killed by that signal, without a core */
	return (o.value & 0xff) << 8;
}
