/* program.c: the program, forked by the zygote from the warm interpreter into a run's namespaces.
 *
 * The launcher and init are small (spawner.c): the init, the init of the run's PID namespace, holds
 * no interpreter. When the launcher's flow reaches the program (supervise.c, L->start_program), the
 * init sends the zygote over the run's socket
 *     fork\0MASK\0RFD\0CG\0MOUNTS\0ID\0ARGS...
 * with the fds: the init's stdin, stdout, stderr, the program's end of the init's pipe, the init's
 * /proc/self/ns files of its user, mount, IPC and PID namespaces (MASK: those four CLONE_NEW*
 * flags; the zygote finds which are not its own: all but the user one as root), then the report fd
 * (RFD: its number, -1 none) and the run cgroup's cgroup.procs (CG: 1, or 0 none). MOUNTS: what the
 * init mounted (mounts_state: landlock.c grants only what is the run's own). Namespace files, not a
 * pidfd: setns() through a pidfd also asks for ptrace access to the init, which is not dumpable,
 * and without root the zygote has no CAP_SYS_PTRACE where the init's memory belongs. The zygote
 * parses ID ARGS again as the plan, loads its seccomp filter (request.c keeps them), enters the
 * init's PID namespace for its children (setns(CLONE_NEWPID)) and vforks the joiner there, which
 * forks the program and exits: the program, orphaned in the init's namespace, becomes the child of
 * its init, as the launcher's program is (getppid() 1; the init reaps it, counts its usage,
 * detaches a PTRACE_TRACEME). The zygote reaps the joiner, comes back to its own PID namespace and
 * answers "forked\0PID" (the program's pid in the namespace) or "failed\0ERRNO". The program enters
 * the init's other namespaces (the user one first), puts its fds in place and follows child_run()
 * as the launcher's program does. The joiner shares the zygote's memory (vfork) until it exits: the
 * program is the one copy of it.
 */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/rseq.h>
#include <sys/wait.h>
#include <linux/nsfs.h>
#include <unistd.h>


/* the fds of a fork request, in order; then the report fd and cgroup.procs when there */
enum { F_STDIN, F_STDOUT, F_STDERR, F_PIPE, F_FIXED };

static const struct {
	const char *name;
	int flag;
} nstypes[] = {
	{ "user", CLONE_NEWUSER }, { "mnt", CLONE_NEWNS }, { "ipc", CLONE_NEWIPC },
	{ "pid", CLONE_NEWPID },
};
/* the namespaces the init sends: all four, always (the zygote finds which differ from its own) */
#define NS_SENT (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID)
#define NNS (sizeof nstypes / sizeof nstypes[0])
#define F_MAX (F_FIXED + NNS + 2)

/* Where in a fork request's fds the file of namespace flag is (the init sends all four, in
 * nstypes[] order); flag 0: where the fds after them start. */
static int ns_fd_index(int flag)
{
	size_t i;

	for (i = 0; i < NNS && nstypes[i].flag != flag; i++)
		;
	return F_FIXED + (int)i;
}

/* ---- the init's end (and the launcher's, which sets it up) ---- */

static struct {
	int sock;
	char **args;            /* ID ARGS..., in the launcher's copy of the spawner's request */
	size_t nargs;
	int ns[NNS];            /* the init's namespace files, opened ahead (init_open_ns); -1: not */
	int ns_err;             /* why one could not be opened */
} init_side = { -1, NULL, 0, { -1, -1, -1, -1 }, 0 };

/* The init, after its mounts and before --prestart's wait: its namespace files, so that opening
 * them is not on the run's path. */
static void init_open_ns(struct launch *L)
{
	size_t i;

	(void)L;
	for (i = 0; i < NNS && !init_side.ns_err; i++) {
		char path[48];

		snprintf(path, sizeof path, "/proc/self/ns/%s", nstypes[i].name);
		init_side.ns[i] = open(path, O_RDONLY | O_CLOEXEC);
		if (init_side.ns[i] < 0)
			init_side.ns_err = errno;
	}
}

static int send_fields(int sock, const char *const *f, size_t nf, const int *fds, int nfds)
{
	size_t i, len = 0, off = 0;
	char *buf;
	int r;

	for (i = 0; i < nf; i++)
		len += strlen(f[i]) + 1;
	buf = malloc(len);
	if (!buf)
		return -1;
	for (i = 0; i < nf; i++) {
		size_t l = strlen(f[i]) + 1;

		memcpy(buf + off, f[i], l);
		off += l;
	}
	r = msg_send(sock, buf, len, fds, nfds);
	free(buf);
	return r;
}

static pid_t init_start_program(struct launch *L, int wfd)
{
	const char **f = malloc((init_side.nargs + 5) * sizeof *f);
	char mask[16], rfd[16], reply[32], mounts[MOUNTS_STATE_LEN];
	int fds[F_MAX], nfds = F_FIXED, nsend, err = 0;
	size_t i, w;
	ssize_t n;
	long v;

	if (!f)
		return -1;
	fds[F_STDIN] = STDIN_FILENO;
	fds[F_STDOUT] = STDOUT_FILENO;
	fds[F_STDERR] = STDERR_FILENO;
	fds[F_PIPE] = wfd;
	if (init_side.ns[0] < 0 && !init_side.ns_err)
		init_open_ns(L);
	err = init_side.ns_err;
	for (i = 0; i < NNS && init_side.ns[i] >= 0; i++)
		fds[nfds++] = init_side.ns[i];
	nsend = nfds;           /* the namespace files opened: ours to close */
	snprintf(mask, sizeof mask, "%d", NS_SENT);
	snprintf(rfd, sizeof rfd, "%d", report_get_fd());
	if (report_get_fd() >= 0)
		fds[nfds++] = report_get_fd();
	if (budget_join_fd(L) >= 0)
		fds[nfds++] = budget_join_fd(L);
	mounts_state(L, mounts, sizeof mounts);
	f[0] = ZP_FORK;
	f[1] = mask;
	f[2] = rfd;
	f[3] = budget_join_fd(L) >= 0 ? "1" : "0";
	f[4] = mounts;
	for (i = 0; i < init_side.nargs; i++)
		f[5 + i] = init_side.args[i];
	if (!err && send_fields(init_side.sock, f, init_side.nargs + 5, fds, nfds) != 0)
		err = errno;
	free(f);
	for (i = F_FIXED; i < (size_t)nsend; i++)
		close(fds[i]);
	for (i = 0; i < NNS; i++)
		init_side.ns[i] = -1;
	if (err) {
		errno = err;
		return -1;
	}
	do
		n = recv(init_side.sock, reply, sizeof reply - 1, 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0) {
		errno = n == 0 ? EPIPE : errno;
		return -1;
	}
	reply[n] = '\0';
	w = strlen(reply) + 1;  /* the word, then its number */
	v = (size_t)n > w ? strtol(reply + w, NULL, 10) : 0;
	if (strcmp(reply, ZP_FORKED) == 0 && v > 0)
		return (pid_t)v;
	errno = strcmp(reply, ZP_FAILED) == 0 && v > 0 ? (int)v : EPROTO;
	return -1;
}

void program_prepare(struct launch *L, int sock, char **args, size_t nargs)
{
	init_side.sock = sock;
	init_side.args = args;
	init_side.nargs = nargs;
	L->start_program = init_start_program;
	L->prepare_program = init_open_ns;
}

/* ---- the program ---- */

/* fds[] to their places: 0-2, the report fd, the pipe and cgroup.procs above; nothing else
 * (the namespace files neither). */
static void program_fds(const int *fds, int nfds, int rfd, int cg, int *pipe_out, int *cg_out)
{
	int hi[F_MAX], i, top = rfd > 2 ? rfd : 2, n = ns_fd_index(0);

	for (i = 0; i < nfds; i++) {
		hi[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, top + 3);
		if (hi[i] < 0)
			_exit(EXIT_SETUP);
	}
	for (i = 0; i < 3; i++)
		if (dup2(hi[F_STDIN + i], i) < 0)
			_exit(EXIT_SETUP);
	if (rfd >= 0 && dup3(hi[n++], rfd, O_CLOEXEC) < 0)
		_exit(EXIT_SETUP);
	*pipe_out = top + 1;
	if (dup3(hi[F_PIPE], *pipe_out, O_CLOEXEC) < 0)
		_exit(EXIT_SETUP);
	*cg_out = -1;
	if (cg) {
		*cg_out = top + 2;
		if (dup3(hi[n], *cg_out, O_CLOEXEC) < 0)
			_exit(EXIT_SETUP);
	}
	for (i = 3; i < top + 1; i++)
		if (i != rfd)
			close(i);
	close_fds(top + (cg ? 3 : 2), -1);
}

/* Until the joiner has exited and the init of the namespace is our parent: the zygote says so
 * on a pipe once it has reaped the joiner (child_run checks that the parent is the init, and sets
 * the parent-death signal only then: the kernel sends it at a re-parenting). */
static void await_init(const int *sync)
{
	char c;

	close(sync[1]);
	while (read(sync[0], &c, 1) < 0 && errno == EINTR)
		;
	close(sync[0]);
}

static NORETURN void program_main(const struct zygote *z, struct plan *p, int mask, const int *fds,
			    int nfds, int rfd, int cg, const char *mounts, const int *sync)
{
	struct launch L;
	int errfd, cgfd;
	size_t i;

	await_init(sync);
	exec_rseq_again();
	/* The rest of the init's namespaces (the PID one is ours since the fork), the user
	 * namespace first: it gives the capabilities the others ask for. */
	for (i = 0; i < NNS; i++) {
		int flag = nstypes[i].flag;
		int k = ns_fd_index(flag);

		if ((mask & flag) && flag != CLONE_NEWPID && setns(fds[k], flag) != 0) {
			int err = errno;

			program_fds(fds, nfds, rfd, cg, &errfd, &cgfd);
			child_die(errfd, W_WARM, err);
		}
	}
	program_fds(fds, nfds, rfd, cg, &errfd, &cgfd);
	setsid();               /* not in the zygote's session and group */
	launch_init(&L);
	report_open(&L, rfd);
	mounts_state_set(&L, mounts);
	if (cgfd >= 0)
		budget_set_join_fd(&L, cgfd);
	L.plan = p;
	mounts_settle(&L);
	L.userns = (mask & CLONE_NEWUSER) || z->ns.userns;
	L.euid = z->ns.euid;
	L.pidns = 1;            /* the init's, which it joined */
	L.net_shared = z->ns.net_got;   /* every run shares the zygote's */
	L.run_program = py_run_program;
	L.nproc_beside = p->has_ids ? 0 : 2;   /* the launcher and init, in the run's user
					        * namespace */
	child_run(&L, 1, errfd);        /* the joiner is gone: the init is our parent */
}

/* ---- the zygote's end ---- */

/* The init's request is checked against the host's: its ID and ARGS must be the bytes the host sent
 * (a keyed hash of them is kept per run, not the bytes: a run's program must not find another run's
 * arguments in the zygote's memory), its namespaces exactly the ones a run has, each of its type
 * and owned by the run's user namespace (or the zygote's, as root), whose parent is the zygote's.
 * The key is drawn after the spawner was forked: neither spawner nor any launcher or init has
 * it. */
static uint64_t key[2];
static struct stat own_ns[NNS];        /* the zygote's, in nstypes[] order */
#define own_userns own_ns[0]
static int own_ns_known;               /* 0: a file of ours is missing, every request is refused */

int program_key(void)
{
	size_t i;

	if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key)
		return -1;
	/* A kernel without a namespace's file (gVisor has none for mnt and ipc) cannot take an
	 * init's request on this path at all; the direct path does not need them. */
	own_ns_known = 1;
	for (i = 0; i < NNS; i++) {
		char path[48];

		snprintf(path, sizeof path, "/proc/self/ns/%s", nstypes[i].name);
		if (stat(path, &own_ns[i]) != 0)
			own_ns_known = 0;
	}
	return 0;
}

/* SipHash-2-4 of len bytes at m, under key */
#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND do { \
		v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); \
		v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2; \
		v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0; \
		v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32); \
	} while (0)

uint64_t program_digest(const char *m, size_t len)
{
	uint64_t v0 = 0x736f6d6570736575ULL ^ key[0], v1 = 0x646f72616e646f6dULL ^ key[1];
	uint64_t v2 = 0x6c7967656e657261ULL ^ key[0], v3 = 0x7465646279746573ULL ^ key[1];
	uint64_t w, last = (uint64_t)len << 56;
	size_t i, full = len & ~(size_t)7;

	for (i = 0; i < full; i += 8) {
		memcpy(&w, m + i, 8);   /* little-endian hosts: the reference's byte order */
		v3 ^= w;
		SIPROUND;
		SIPROUND;
		v0 ^= w;
	}
	for (i = 0; i < (len & 7); i++)
		last |= (uint64_t)(unsigned char)m[full + i] << (8 * i);
	v3 ^= last;
	SIPROUND;
	SIPROUND;
	v0 ^= last;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

static int same_file(int fd, const struct stat *st)
{
	struct stat f;

	return fstat(fd, &f) == 0 && f.st_dev == st->st_dev && f.st_ino == st->st_ino;
}

/* The namespaces of the init's request, as a run of this zygote has them: the CLONE_NEW* set of
 * those that are not the zygote's own, or -1. */
static int check_namespaces_of(const struct zygote *z, const int *fds)
{
	int want = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC, owner = -1, ok = 1, mask = 0;
	struct stat ust;
	size_t i;

	if (!own_ns_known)
		return -1;
	for (i = 0; i < NNS; i++)
		if (!same_file(fds[ns_fd_index(nstypes[i].flag)], &own_ns[i]))
			mask |= nstypes[i].flag;
	/* a user namespace of the run's own whenever the zygote has one (or --userns always) */
	if (z->ns.userns || z->userns == PLAN_USERNS_ALWAYS)
		want |= CLONE_NEWUSER;
	if (mask != want)
		return -1;
	for (i = 0; i < NNS; i++) {
		int k = ns_fd_index(nstypes[i].flag);

		if (ioctl(fds[k], NS_GET_NSTYPE) != nstypes[i].flag)
			return -1;
	}
	if (mask & CLONE_NEWUSER) {
		int u = fds[ns_fd_index(CLONE_NEWUSER)];
		int parent = ioctl(u, NS_GET_PARENT);

		ok = parent >= 0 && same_file(parent, &own_userns) && fstat(u, &ust) == 0;
		if (parent >= 0)
			close(parent);
	} else {
		ust = own_userns;
	}
	for (i = 0; ok && i < NNS; i++) {
		int k = ns_fd_index(nstypes[i].flag);

		if (nstypes[i].flag == CLONE_NEWUSER)
			continue;
		owner = ioctl(fds[k], NS_GET_USERNS);
		ok = owner >= 0 && same_file(owner, &ust);
		if (owner >= 0)
			close(owner);
	}
	return ok ? mask : -1;
}

static int answer(int sock, const char *what, long v)
{
	char buf[32];
	int len = snprintf(buf, sizeof buf, "%s%c%ld", what, '\0', v);
	ssize_t n;

	do
		n = send(sock, buf, (size_t)len + 1, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : 0;
}

/* The joiner, sharing our memory, enters the init's PID namespace for its children (setns: ours is
 * not changed, so the direct runs' clones still make their PID namespaces as children of ours,
 * which a zygote without root could not come back to) and vforks the midwife there, which forks the
 * program and exits: the program, orphaned in the namespace, becomes the child of its init. The
 * program's pid in the namespace, or -1 with errno. */
static pid_t fork_orphan(const struct zygote *z, struct plan *p, int mask, const int *fds,
			 int nfds, int rfd, int cg, const char *mounts)
{
	static volatile pid_t cpid;     /* written by the midwife, in our memory */
	static volatile int cerr;
	static int sync[2];             /* the program waits on it until the joiner is reaped */
	pid_t i;
	int st, err;

	if (pipe2(sync, O_CLOEXEC) != 0)
		return -1;
	cpid = -1;
	cerr = 0;
	i = vfork();
	if (i == 0) {
		pid_t i2;
		int st2;

		if (setns(fds[ns_fd_index(CLONE_NEWPID)], CLONE_NEWPID) != 0) {
			cerr = errno;
			_exit(0);
		}
		i2 = vfork();
		if (i2 == 0) {
			pid_t c = fork();

			if (c == 0)
				program_main(z, p, mask, fds, nfds, rfd, cg, mounts, sync);
			cpid = c;
			cerr = errno;
			_exit(0);
		}
		if (i2 < 0)
			cerr = errno;
		else
			while (waitpid(i2, &st2, 0) < 0 && errno == EINTR)
				;
		_exit(0);
	}
	err = errno;
	if (i > 0) {
		while (waitpid(i, &st, 0) < 0 && errno == EINTR)
			;
		err = cerr;
	}
	if (cpid > 0)
		(void)!write(sync[1], "", 1);
	close(sync[0]);
	close(sync[1]);
	errno = err;
	return i > 0 ? cpid : -1;
}

pid_t program_fork(const struct zygote *z, int sock, char *msg, size_t len, int *fds, int nfds,
		   uint64_t digest, int *mntns)
{
	static char *argv[ARGS_MAX + 1];
	struct plan plan;
	char perr[256];
	size_t nf = 0, off = 0;
	int mask, rfd, cg, err = 0;
	pid_t pid = -1;

	while (off < len && nf < ARGS_MAX) {
		argv[nf++] = msg + off;
		off += strlen(msg + off) + 1;
	}
	argv[nf] = NULL;
	if (nf < 6 || len == 0 || msg[len - 1] != '\0' || strcmp(argv[0], ZP_FORK) != 0) {
		err = EPROTO;
		goto out;
	}
	mask = atoi(argv[1]);
	rfd = atoi(argv[2]);
	cg = strcmp(argv[3], "1") == 0;
	if (mask != NS_SENT || nfds != ns_fd_index(0) + (rfd >= 0) + cg ||
	    program_digest(argv[5], (size_t)(msg + len - argv[5])) != digest ||
	    (mask = check_namespaces_of(z, fds)) < 0) {
		err = EPROTO;
		goto out;
	}
	if (plan_parse(&plan, (int)(nf - 5), argv + 5, perr, sizeof perr) != 0) {
		err = EPROTO;
		goto out;
	}
	if (plan.seccomp != PLAN_MECH_OFF)
		filters_load(z, &plan, 0);
	pid = fork_orphan(z, &plan, mask, fds, nfds, rfd, cg, argv[4]);
	err = pid < 0 ? errno : 0;
	plan_free(&plan);
out:
	*mntns = -1;
	if (pid > 0) {
		*mntns = fds[ns_fd_index(CLONE_NEWNS)];
		fds[ns_fd_index(CLONE_NEWNS)] = -1;
	}
	if (pid > 0)
		answer(sock, ZP_FORKED, (long)pid);
	else
		answer(sock, ZP_FAILED, err > 0 ? err : EPROTO);
	return pid > 0 ? pid : -1;
}
