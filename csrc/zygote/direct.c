/* direct.c: a warm run without the spawner, launcher and init.
 *
 * The zygote clones the direct init, which shares its memory (CLONE_VM) and stops it until the
 * direct init's execve (CLONE_VFORK), straight into the run's new PID, mount and IPC namespaces
 * (and, without root, a user namespace of the run's own inside the zygote's). The direct init is
 * the namespaces' init (pid 1), running on the zygote's own stack below the zygote's frames, as a
 * vfork child does. It does only what needs the zygote's memory, since the zygote waits meanwhile:
 * the run's fds in place, the fork of the program (a copy of the warm interpreter, as the helper
 * the joiner's fork is on the other path), and the execve of corral-init (csrc/init), which takes
 * the launcher's steps and the init's mounts, lets the program go on with the mounts' state, waits
 * for the run as the launcher's init does and writes the program's outcome on a pipe to the zygote.
 * The direct init's pid is the run's pid for the host. The outcome is the run's status (an init
 * cannot end by the program's signal on itself, as the launcher did): the zygote sends it as soon
 * as it is on the pipe (request.c), and the host ends the run once the direct init has exited,
 * which the direct init's exit does not complete before the kernel has killed and reaped the rest
 * of its namespace; if the direct init ends without an outcome, the direct init's own wait status
 * once it is reaped.
 *
 * The direct init writes into the zygote's memory, so it keeps nothing of the run there: what the
 * launcher's files keep for a run is in a struct launch of the program's own (launch_init), the
 * plan is the zygote's (parsed here, freed after the execve), and the stack area the direct init
 * used is zeroed once it is gone, so that the next run's program does not inherit this run's
 * arguments. Not direct, on the spawner path (request.c): a run with a cgroup (the run cgroup's
 * state would have to cross the execve), a request that is not a run the zygote serves (the
 * spawner and the launcher write the usage error), and every run once a clone of the direct init
 * was refused (a kernel or container that forbids these namespaces with CLONE_VM).
 */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* How far below the zygote's stack pointer the direct init's stack starts, and how much of it is
 * zeroed after the direct init is gone (the direct init's path, its fds, the maps, the fork and the
 * execve, uses a few kB; the program goes on from there on its own copy). */
#define P_GAP (16 * 1024)
#define P_ZERO (64 * 1024)

static int init_fd = -1;        /* corral-init, opened at start-up (O_PATH) */
static int refused;             /* a clone of the direct init failed: every run goes by the
				 * spawner */

struct job {
	const struct zygote *z;
	struct plan *plan;
	char **args;                    /* the request's ID and ARGS, for corral-init's plan */
	size_t nargs;
	const int *fds;                 /* the run's stdin, stdout, stderr, report */
	int out;                        /* the outcome pipe's write end */
	int own_net;                    /* the clone makes the run a network namespace */
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

/* The run's fds on 0, 1, 2 and the report fd, the others (corral-init, the outcome pipe...) just
 * above in the order given, close-on-exec, and nothing else: the direct init has a copy of the
 * zygote's fd table. */
static int dinit_fds(const int *fds, int rfd, int *more, int nmore)
{
	int hi[RUN_NFDS + 8], i, base = rfd >= 3 ? rfd + 1 : 3, top = base + nmore;

	for (i = 0; i < RUN_NFDS + nmore; i++) {
		hi[i] = fcntl(i < RUN_NFDS ? fds[i] : more[i - RUN_NFDS], F_DUPFD_CLOEXEC, top);
		if (hi[i] < 0)
			return -1;
	}
	for (i = 0; i < 3; i++)
		if (dup2(hi[i], i) < 0)
			return -1;
	if (rfd >= 0 && dup2(hi[RUN_REPORT], rfd) < 0)
		return -1;
	for (i = 0; i < nmore; i++) {
		if (dup3(hi[RUN_NFDS + i], base + i, O_CLOEXEC) < 0)
			return -1;
		more[i] = base + i;
	}
	if (rfd > 3)
		close_fds(3, rfd - 1);
	close_fds(top, -1);
	return 0;
}

/* The program: waits until corral-init has made the mounts (their state comes on the pipe: what
 * Landlock may grant), then follows child_run() and runs the program. EOF: the init failed, and
 * the namespace goes with it. */
static NORETURN void program_main(const struct job *j, int errfd, int go)
{
	const struct zygote *z = j->z;
	struct launch L;
	char mounts[MOUNTS_STATE_LEN];
	ssize_t n;

	do
		n = read(go, mounts, sizeof mounts);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof mounts || mounts[sizeof mounts - 1] != '\0')
		_exit(EXIT_SETUP);
	close(go);
	launch_init(&L);
	mounts_state_set(&L, mounts);
	report_open(&L, j->plan->report_fd);
	L.plan = j->plan;
	mounts_settle(&L);
	L.shared = &z->ns;
	L.userns = z->ns.userns;
	L.euid = z->ns.euid;
	/* the zygote's, shared by its runs, unless the walls sharing needs are missing */
	L.netns = z->ns.net_got || j->own_net;
	L.net_shared = z->ns.net_got && !j->own_net;
	L.pidns = 1;
	L.seccomp_ready = 1;            /* the filter is in memory (filters_load) */
	L.run_program = py_run_program;
	L.direct = 1;
	L.nproc_beside = j->plan->has_ids ? 0 : 1;      /* corral-init, in the run's user
							 * namespace */
	child_run(&L, 1, errfd);        /* our parent: the namespace's init */
}

/* Every permitted capability inheritable and ambient, so that it survives the execve of a
 * program whose uid is not 0 in its user namespace. */
static void keep_caps(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	int cap;

	if (syscall(SYS_capget, &h, d) != 0)
		return;
	d[0].inheritable = d[0].permitted;
	d[1].inheritable = d[1].permitted;
	if (syscall(SYS_capset, &h, d) != 0)
		return;
	for (cap = 0; cap < 64; cap++)
		if (d[cap / 32].permitted & (1U << (cap % 32)))
			prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0);
}

/* Why the direct init ended before its execve (0: it did not), for the zygote, which goes on once
 * the direct init has exec'd or exited: the run then takes the spawner path. */
static volatile int dinit_failed;

static NORETURN void dinit_fail(int err)
{
	dinit_failed = err > 0 ? err : EIO;
	_exit(EXIT_SETUP);
}

/* The read end's holder (the zygote) is gone: POLLERR on the write end. */
static int pipe_gone(int wfd)
{
	struct pollfd pf = { wfd, POLLOUT, 0 };

	return poll(&pf, 1, 0) == 1 && (pf.revents & (POLLERR | POLLHUP));
}

static void dinit_arg(char **v, int *n, char (*num)[24], int *k, const char *name, long long x)
{
	snprintf(num[*k], sizeof num[0], "%lld", x);
	v[(*n)++] = (char *)name;
	v[(*n)++] = num[(*k)++];
}

/* The direct init: only what needs the zygote's memory (the program's fork) while the zygote waits;
 * the launcher's steps and the mounts are corral-init's, once the zygote goes on. */
static int dinit_main(void *arg)
{
	const struct job *j = arg;
	const struct ns_shared *s = &j->z->ns;
	static char *v[ARGS_MAX + 24];
	char num[8][24], shared[128];
	char *envp[1] = { NULL };
	int more[2] = { init_fd, j->out }, errp[2], gop[2], n = 0, k = 0, i, devnull, err;
	int maps_err = 0;
	pid_t c;

	dinit_failed = 0;
	/* dies with the zygote, which waits for us: gone already, the outcome pipe's read end is
	 * closed (POLLERR on ours) */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || pipe_gone(j->out))
		dinit_fail(ESRCH);
	if (dinit_fds(j->fds, j->plan->report_fd, more, 2) != 0 || pipe2(errp, O_CLOEXEC) != 0 ||
	    pipe2(gop, O_CLOEXEC) != 0)
		dinit_fail(errno);
	/* a session and process group of our own (only ours: the zygote's is not changed), which
	 * the program joins: the host's kill of the run's group reaches it, and a kill(0) of the
	 * program's reaches neither the zygote nor another run */
	setsid();
	if (s->userns) {
		/* the run's user namespace, made by the clone: its maps now, while we hold its
		 * capabilities (corral-init, whose uid is not 0 there, loses them at execve) */
		maps_err = ns_write_own_maps(s->euid, s->egid) != 0 ? errno : 0;
	}
	c = fork();
	err = errno;
	if (c == 0) {
		close(more[0]);
		close(more[1]);
		close(errp[0]);
		close(gop[1]);
		program_main(j, errp[1], gop[0]);
	}
	close(errp[1]);
	close(gop[0]);
	/* corral-init needs no stdio: the host sees EOF once the program's tree is gone */
	devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	for (i = 0; i < 3; i++)
		if (i != j->plan->report_fd && devnull >= 0)
			dup2(devnull, i);
	v[n++] = "corral-init";
	dinit_arg(v, &n, num, &k, "--pid", c > 0 ? c : 0);
	if (c < 0)
		dinit_arg(v, &n, num, &k, "--fork-errno", err);
	if (maps_err)
		dinit_arg(v, &n, num, &k, "--maps-errno", maps_err);
	if (j->own_net)
		dinit_arg(v, &n, num, &k, "--own-net", 1);
	/* corral-init makes the mounts: our capabilities in the run's user namespace go with the
	 * execve as ambient ones (the program, forked before, has none of them ambient) */
	if (s->userns)
		keep_caps();
	dinit_arg(v, &n, num, &k, "--pipe", errp[0]);
	dinit_arg(v, &n, num, &k, "--out", more[1]);
	dinit_arg(v, &n, num, &k, "--go", gop[1]);
	snprintf(shared, sizeof shared, "%d,%d,%d,%d,%u,%u", s->userns, s->net_got,
		 s->net_direct_err, s->net_user_err, (unsigned)s->euid, (unsigned)s->egid);
	v[n++] = "--shared";
	v[n++] = shared;
	v[n++] = "--plan";
	for (i = 0; i < (int)j->nargs && n < ARGS_MAX + 23; i++)
		v[n++] = j->args[i];
	v[n] = NULL;
	fcntl(errp[0], F_SETFD, 0);
	fcntl(gop[1], F_SETFD, 0);
	fcntl(more[1], F_SETFD, 0);
	syscall(SYS_execveat, more[0], "", v, envp, AT_EMPTY_PATH);
	dinit_fail(errno);          /* we are the init: the program dies with the namespace */
}

/* Whether this request can be a direct run: a run the zygote serves, without a cgroup. */
static int direct_fits(const struct zygote *z, const struct plan *p)
{
	char err[512];

	/* --userns always where the zygote has no user namespace (root, --net host): the clone
	 * would make the run none, where the launcher makes one */
	return p->mode == PLAN_RUN && !p->cgroup && p->pidns &&
	       (p->net == PLAN_NET_HOST) == (z->net == PLAN_NET_HOST) && p->userns == z->userns &&
	       (z->ns.userns || p->userns != PLAN_USERNS_ALWAYS) &&
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
	int flags, out[2], err, own_net;
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
	/* Runs share the zygote's network namespace only behind the walls that keep them apart
	 * there (the seccomp socket filter, Landlock's scope); where this kernel cannot build them
	 * (no Landlock under gVisor, ABI < 6) the clone makes the run one of its own, as a cold
	 * run makes one where it may not join the holder's. */
	own_net = z->ns.net_got && ns_share_unsafe(&plan, &err) != NULL;
	if (plan.seccomp != PLAN_MECH_OFF)
		filters_load(z, &plan, own_net);
	j.z = z;
	j.plan = &plan;
	j.args = argv + 1;
	j.nargs = nf - 1;
	j.fds = fds;
	j.out = out[1];
	j.own_net = own_net;
	flags = CLONE_VM | CLONE_VFORK | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | SIGCHLD;
	if (own_net)
		flags |= CLONE_NEWNET;
	if (z->ns.userns)
		flags |= CLONE_NEWUSER;
	/* The direct init runs below our frames on our own stack, as a vfork child: the program,
	 * its fork, keeps the stack's growth room for the program */
	top = (char *)((uintptr_t)((char *)__builtin_frame_address(0) - P_GAP) & ~(uintptr_t)63);
	dinit_failed = 0;
	pid = clone(dinit_main, top, flags, &j);
	err = pid < 0 ? errno : dinit_failed;
	close(out[1]);
	/* what the direct init wrote there (this run's paths and lines) is not the next run's
	 * program's to see */
	memset(top - P_ZERO, 0, P_ZERO);
	plan_free(&plan);
	if (pid > 0 && err) {
		/* The direct init ended before its execve (the program, if forked, with its
		 * namespace): this run by the spawner */
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		pid = -1;
	}
	if (pid < 0) {
		close(out[0]);
		/* this kernel or container refuses the clone, or corral-init cannot be executed:
		 * the spawner path from now on (a namespace count at its limit, or arguments too big
		 * for an execve, only this run) */
		if (err == EINVAL || err == EPERM || err == EACCES || err == ENOEXEC || err == ENOENT)
			refused = 1;
		errno = ENOTSUP;
		return -1;
	}
	/* the run's mount namespace, held until its exit message (request.c) */
	snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
	*mntns = open(path, O_RDONLY | O_CLOEXEC);
	*outr = out[0];
	return pid;
}

/* The program's outcome as corral-init wrote it on the run's outcome pipe (read once the pipe is
 * readable, or once the direct init is reaped), as a wait status in *status: 1; or 0 when there is
 * none, because the direct init ended without writing it (killed; or it ended before the program,
 * after a fatal line). */
int direct_outcome(int outr, int *status)
{
	struct outcome o;
	ssize_t n;

	do
		n = read(outr, &o, sizeof o);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof o)
		return 0;
	if (o.kind == OUTCOME_SIGNAL && o.value > 0 && o.value < 128)
		*status = o.value;      /* as a process killed by that signal, without a core */
	else
		*status = (o.value & 0xff) << 8;
	return 1;
}
