/* ns.c: the namespaces, with one unshare() when possible.
 *
 * --userns auto: try the namespaces alone (works as root with CAP_SYS_ADMIN); on EPERM try again
 * with CLONE_NEWUSER and write the id maps. When both are refused, try the PID and the network
 * namespace separately, so one refused namespace does not cost the other.
 *
 * Id maps: without root, the launcher maps its own uid and gid to themselves and denies
 * setgroups, as the kernel requires. As root with --uid/--gid, a helper forked before the
 * unshare (so still in the parent user namespace, where it holds CAP_SETUID and CAP_SETGID)
 * maps the launcher's ids and the program's (0 0 1 and U U 1) and leaves setgroups allowed, so
 * the program child can drop its groups and take U:G inside: a process cannot write such a map
 * for its own new namespace.
 *
 * corral-zygote makes the network namespace (and the user namespace it needs) once, at start-up
 * (ns_apply_shared), and each of its runs only the PID, mount and IPC namespaces, inside them;
 * ns_apply() then reports the shared ones exactly as if it had made them.
 *
 * A shared network namespace (--net-join PID, --hold-net): making a network namespace costs about
 * half a millisecond, and its teardown runs later in a kernel worker that competes with the next
 * runs for the CPU. A holder process (corral-launch --hold-net, a child of the host) makes one
 * empty network namespace, in a user namespace of its own when not root, and keeps it; each run
 * joins it with setns() (microseconds) and still makes its own PID, mount and IPC namespaces.
 * Runs in it share its loopback and its abstract unix sockets, so a run may join only when its
 * program will have no socket but AF_UNIX (the seccomp filter: --deny-sockets, or
 * --deny-sockets-without-netns, which counts a shared namespace as none of its own) and abstract
 * unix sockets scoped to its own Landlock domain (--scope, Landlock ABI 6); the program child is
 * ended if either cannot be applied (landlock.c, seccomp.c). When a join is unsafe or fails (the
 * holder is gone, not ready, or not ours), the run makes a network namespace of its own and says
 * why: "refused shared-netns ERRNO ...".
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

/* One write() of data to fd, then close(fd). */
static int write_close(int fd, const char *data)
{
	size_t len = strlen(data);
	ssize_t n;
	int err;

	do
		n = write(fd, data, len);
	while (n < 0 && errno == EINTR);
	err = errno;
	close(fd);
	if (n == (ssize_t)len)
		return 0;
	errno = n < 0 ? err : EIO;
	return -1;
}

/* "A A 1" and, when the init differs, "B B 1" (ascending: the kernel wants no overlap). */
static void format_map(char *buf, size_t len, unsigned a, unsigned b)
{
	if (a == b)
		snprintf(buf, len, "%u %u 1\n", a, a);
	else
		snprintf(buf, len, "%u %u 1\n%u %u 1\n", a < b ? a : b, a < b ? a : b,
			 a < b ? b : a, a < b ? b : a);
}

/* Without root, in our new user namespace: our ids map to themselves, so the program sees its
 * usual ids and, being non-zero inside, loses every capability at execve. The launcher is not
 * dumpable (main.c), and the kernel then lets only root open its /proc/self files for writing:
 * dumpable for the three open() calls only, before any program exists. */
int ns_write_own_maps(uid_t euid, gid_t egid)
{
	char map[64];
	int sg, um, gm, err;

	if (euid != 0)
		prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
	sg = open("/proc/self/setgroups", O_WRONLY | O_CLOEXEC);  /* absent before Linux 3.19 */
	err = errno;
	um = open("/proc/self/uid_map", O_WRONLY | O_CLOEXEC);
	if (um < 0)
		err = errno;
	gm = open("/proc/self/gid_map", O_WRONLY | O_CLOEXEC);
	if (gm < 0)
		err = errno;
	if (euid != 0)
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if ((sg < 0 && err != ENOENT) || um < 0 || gm < 0) {
		if (sg >= 0)
			close(sg);
		if (um >= 0)
			close(um);
		if (gm >= 0)
			close(gm);
		errno = err;
		return -1;
	}
	/* Unprivileged gid_map writes need setgroups denied. */
	if (sg >= 0 && write_close(sg, "deny") != 0) {
		err = errno;
		close(um);
		close(gm);
		errno = err;
		return -1;
	}
	snprintf(map, sizeof map, "%u %u 1\n", (unsigned)euid, (unsigned)euid);
	if (write_close(um, map) != 0) {
		err = errno;
		close(gm);
		errno = err;
		return -1;
	}
	snprintf(map, sizeof map, "%u %u 1\n", (unsigned)egid, (unsigned)egid);
	return write_close(gm, map);
}

/* The privileged map writer: forked before unshare(CLONE_NEWUSER), it waits on a pipe for the
 * launcher's go (EOF: the unshare failed, nothing to do), then writes the launcher's uid_map and
 * gid_map and exits with 0 or the errno. */
struct mapper {
	pid_t pid;              /* 0: none */
	int go;                 /* write end of the pipe */
};

static NORETURN void mapper_main(const struct launch *L, pid_t target, int rfd)
{
	char path[64], map[64];
	char c;
	ssize_t n;
	int fd;

	do
		n = read(rfd, &c, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		_exit(0);
	snprintf(path, sizeof path, "/proc/%d/uid_map", (int)target);
	format_map(map, sizeof map, (unsigned)L->euid, (unsigned)L->plan->uid);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write_close(fd, map) != 0)
		_exit(errno & 0xff ? errno & 0xff : EIO);
	snprintf(path, sizeof path, "/proc/%d/gid_map", (int)target);
	format_map(map, sizeof map, (unsigned)L->egid, (unsigned)L->plan->gid);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write_close(fd, map) != 0)
		_exit(errno & 0xff ? errno & 0xff : EIO);
	_exit(0);
}

static int mapper_start(const struct launch *L, struct mapper *m)
{
	int fds[2];
	pid_t self = getpid();

	m->pid = 0;
	m->go = -1;
	if (pipe2(fds, O_CLOEXEC) != 0)
		return -1;
	m->pid = fork();
	if (m->pid == 0) {
		close(fds[1]);
		mapper_main(L, self, fds[0]);
	}
	close(fds[0]);
	if (m->pid < 0) {
		int err = errno;

		close(fds[1]);
		m->pid = 0;
		errno = err;
		return -1;
	}
	m->go = fds[1];
	return 0;
}

/* go: the unshare worked, write the maps. 0, or -1 with errno (the mapper's). */
static int mapper_finish(struct mapper *m, int go)
{
	int st, err = 0;
	ssize_t n;

	if (go) {
		do
			n = write(m->go, "g", 1);
		while (n < 0 && errno == EINTR);
	}
	close(m->go);
	while (waitpid(m->pid, &st, 0) < 0)
		if (errno != EINTR) {
			err = errno;
			break;
		}
	if (!err && go)
		err = WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
	m->pid = 0;
	m->go = -1;
	errno = err;
	return err ? -1 : 0;
}

/* Root running the program as another uid needs both ids mapped (see the top of the file). */
static int privileged_maps(const struct launch *L)
{
	return L->euid == 0 && L->plan->has_ids;
}

struct attempt {
	int flags;              /* CLONE_NEWNET / CLONE_NEWPID */
	int direct_err;         /* errno of unshare() without a user namespace, 0: not tried/ok */
	int user_err;           /* errno of unshare() with CLONE_NEWUSER, 0: not tried/ok */
	int got;
};

/* unshare(flags), adding CLONE_NEWUSER as the mode allows. 0, 1 (refused: see a) or -1 (fatal:
 * a user namespace was made but its id maps could not be written). */
static int try_unshare(struct launch *L, struct attempt *a)
{
	enum plan_userns mode = L->plan->userns;

	if (L->userns || mode != PLAN_USERNS_ALWAYS) {
		/* Already in our user namespace: we hold every capability there. */
		if (unshare(a->flags) == 0) {
			a->got = 1;
			return 0;
		}
		a->direct_err = errno;
		if (L->userns || mode == PLAN_USERNS_NEVER || a->direct_err != EPERM)
			return 1;
	}
	if (privileged_maps(L)) {
		struct mapper m;
		int err;

		if (mapper_start(L, &m) != 0) {
			report_fatal(W_FORK, errno, NULL);
			return -1;
		}
		if (unshare(a->flags | CLONE_NEWUSER) != 0) {
			a->user_err = errno;
			mapper_finish(&m, 0);
			return 1;
		}
		L->userns = 1;
		if (mapper_finish(&m, 1) != 0) {
			err = errno;
			report_fatal(W_IDMAP_ROOT, err, NULL);
			return -1;
		}
		a->got = 1;
		return 0;
	}
	if (unshare(a->flags | CLONE_NEWUSER) != 0) {
		a->user_err = errno;
		return 1;
	}
	L->userns = 1;
	if (ns_write_own_maps(L->euid, L->egid) != 0) {
		report_fatal(W_IDMAP, errno, NULL);
		return -1;
	}
	a->got = 1;
	return 0;
}

static void report_refusal(const struct launch *L, const struct attempt *a, enum what w)
{
	struct line l;
	int err = a->direct_err ? a->direct_err : a->user_err;

	line_start(&l, "refused ");
	line_add(&l, what_step(w));
	line_add(&l, " ");
	line_errname(&l, err);
	line_add(&l, " ");
	if (a->direct_err) {
		line_add(&l, explain(w, a->direct_err));
		if (a->user_err) {
			line_add(&l, "; with a user namespace: ");
			line_errname(&l, a->user_err);
			line_add(&l, " ");
			line_add(&l, explain(W_USERNS, a->user_err));
		} else if (a->direct_err == EPERM && L->plan->userns == PLAN_USERNS_NEVER) {
			line_add(&l, "; --userns never forbids the user namespace that would allow it");
		}
	} else {
		line_add(&l, "with a user namespace: ");
		line_add(&l, explain(W_USERNS, a->user_err));
	}
	line_send(&l, report_get_fd());
}

/* ---- a shared network namespace ---- */

/* Why this run may not share a network namespace, or NULL: see the top of the file. */
const char *ns_share_unsafe(const struct plan *p, int *err)
{
	int abi;

	*err = EINVAL;
	if (p->seccomp == PLAN_MECH_OFF || !p->deny_sockets)
		return "a shared network namespace needs the seccomp socket filter (--seccomp with "
		       "--deny-sockets or --deny-sockets-without-netns)";
	if (p->landlock == PLAN_MECH_OFF || !p->scope)
		return "a shared network namespace needs abstract unix sockets scoped (--landlock "
		       "with --scope)";
	abi = landlock_abi();
	if (abi < 6) {
		*err = abi < 0 ? -abi : EOPNOTSUPP;
		return "a shared network namespace needs abstract unix sockets scoped, and this "
		       "kernel's Landlock cannot (ABI 6, Linux 6.12)";
	}
	return NULL;
}

/* Up to len - 1 bytes of a small /proc file, NUL-terminated; the length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	do
		n = read(fd, buf, len - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return n;
}

/* PID is a holder of ours: a child of our parent (the host), started as "corral-launch
 * --hold-net". As root, a pid that was reused by another process could otherwise put the run
 * in anybody's network namespace. 0, or -1 with errno ESRCH. */
static int holder_check(pid_t pid)
{
	char path[64], buf[512];
	const char *p;
	ssize_t n;
	long ppid;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if (read_small(path, buf, sizeof buf) < 0)
		goto not_ours;
	p = strrchr(buf, ')');          /* the name in parentheses may hold anything */
	if (!p || p[1] != ' ' || !p[2] || p[3] != ' ')
		goto not_ours;
	ppid = strtol(p + 4, NULL, 10);
	if (ppid != (long)getppid())
		goto not_ours;
	snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
	n = read_small(path, buf, sizeof buf);
	p = n > 0 ? memchr(buf, '\0', (size_t)n) : NULL;       /* past argv[0] */
	if (!p || (size_t)(p - buf) + 1 + sizeof "--hold-net" > (size_t)n + 1 ||
	    strcmp(p + 1, "--hold-net") != 0)
		goto not_ours;
	return 0;
not_ours:
	errno = ESRCH;
	return -1;
}

static int same_ns(int fd, const char *own)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && stat(own, &b) == 0 && a.st_dev == b.st_dev &&
	       a.st_ino == b.st_ino;
}

/* Joins the user (when it differs from ours) and network namespaces of holder PID. 0, or -1
 * with errno: ESRCH the holder is gone or not ours, EAGAIN it has not made its namespace yet,
 * ENOSYS no pidfd (Linux 5.3), or setns()'s. */
static int join_holder(struct launch *L, pid_t pid)
{
	char path[64];
	int pidfd, userfd = -1, netfd = -1, err = 0;

	pidfd = (int)syscall(SYS_pidfd_open, pid, 0U);
	if (pidfd < 0)
		return -1;
	if (holder_check(pid) != 0)
		goto fail;
	snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
	userfd = open(path, O_RDONLY | O_CLOEXEC);
	if (userfd >= 0) {
		snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
		netfd = open(path, O_RDONLY | O_CLOEXEC);
	}
	if (userfd < 0 || netfd < 0) {
		if (errno == ENOENT)
			errno = ESRCH;  /* gone, or a zombie */
		goto fail;
	}
	/* Still the process checked above: had it died, and its pid been reused, the pidfd's
	 * process would be gone. The namespaces are held by our fds from here. */
	if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0U) != 0) {
		errno = ESRCH;
		goto fail;
	}
	if (same_ns(netfd, "/proc/self/ns/net")) {
		errno = EAGAIN;         /* the host's: the holder has not unshared yet */
		goto fail;
	}
	if (!same_ns(userfd, "/proc/self/ns/user")) {
		/* Root's run uid must be mapped there: the holder makes no user namespace as
		 * root. */
		if (L->euid == 0) {
			errno = EPERM;
			goto fail;
		}
		if (setns(userfd, CLONE_NEWUSER) != 0)
			goto fail;
		L->userns = 1;
	}
	if (setns(netfd, CLONE_NEWNET) != 0)
		goto fail;
	L->net_shared = 1;
	goto done;
fail:
	err = errno;
done:
	close(pidfd);
	if (userfd >= 0)
		close(userfd);
	if (netfd >= 0)
		close(netfd);
	errno = err;
	return err ? -1 : 0;
}

/* --net-join: 1 when the run joined, 0 when it must make its own network namespace (the
 * refused line is written). */
static int try_join(struct launch *L)
{
	const struct plan *p = L->plan;
	const char *why;
	int err;

	why = ns_share_unsafe(p, &err);
	if (!why && join_holder(L, p->net_join) == 0)
		return 1;
	if (!why) {
		err = errno;
		switch (err) {
		case ESRCH:
			why = "the holder is gone or is not this host's";
			break;
		case EAGAIN:
			why = "the holder has not made its namespace yet";
			break;
		case ENOSYS:
			why = "no pidfd_open (Linux 5.3) to join it safely";
			break;
		default:
			why = "setns() refused to join it";
		}
	}
	report_refused_at("shared-netns", err, why, "the run has a network namespace of its own");
	return 0;
}

/* --hold-net: the namespaces of a shared network namespace. As root only a network namespace
 * (the run uids need no map); otherwise as --userns says, like a run, with the user namespace
 * made and mapped first, so that the network namespace appears (and a run can join it) only
 * when the maps are written. 0, or an errno. */
static int hold_unshare(const struct plan *p, struct launch *L)
{
	int err = 0;

	if (p->userns != PLAN_USERNS_ALWAYS || L->euid == 0) {
		if (unshare(CLONE_NEWNET) == 0)
			return 0;
		err = errno;
		if (L->euid == 0 || p->userns == PLAN_USERNS_NEVER || err != EPERM)
			return err;
	}
	if (unshare(CLONE_NEWUSER) != 0)
		return errno;
	L->userns = 1;
	if (ns_write_own_maps(L->euid, L->egid) != 0 || unshare(CLONE_NEWNET) != 0)
		return errno;
	return 0;
}

/* The holder, not dumpable (main.c), in a user namespace of its own: a run's launcher may open
 * its /proc/PID/ns files only with CAP_SYS_PTRACE over the user namespace its memory belongs to,
 * which is the one it was exec()ed in. So it executes itself again (--held) inside the new one,
 * where the launchers of its uid, outside, hold every capability, and the runs' programs, inside,
 * none. */
static int hold_reexec(const struct plan *p)
{
	char ppid[24], *argv[6];
	char *envp[1] = { NULL };
	int n = 0;

	argv[n++] = (char *)"corral-launch";
	argv[n++] = (char *)"--hold-net";
	argv[n++] = (char *)"--held";
	if (p->parent_pid) {
		snprintf(ppid, sizeof ppid, "%d", (int)p->parent_pid);
		argv[n++] = (char *)"--parent-pid";
		argv[n++] = ppid;
	}
	argv[n] = NULL;
	execve("/proc/self/exe", argv, envp);
	return errno;
}

int ns_hold(const struct plan *p)
{
	struct launch L;
	struct stat st;
	struct line l;
	int err = 0, reexec = 0, fd;

	launch_init(&L);
	L.plan = p;
	L.euid = geteuid();
	L.egid = getegid();
	/* (again after the user namespace: the kernel may clear it with the credentials) */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 ||
	    (p->parent_pid && getppid() != p->parent_pid))
		return EXIT_SETUP;      /* the parent is already gone */
	if (!p->held) {
		setsid();       /* its own group: a kill of the host's group spares it */
		err = hold_unshare(p, &L);
		if (!err && L.userns) {
			err = hold_reexec(p);
			reexec = 1;
		}
	}
	if (err) {
		line_start(&l, "fatal no-network ");
		line_errname(&l, err);
		line_add(&l, " ");
		line_add(&l, reexec ? "the holder cannot execute itself again in its user namespace"
				    : explain(L.userns ? W_IDMAP : W_NETNS, err));
		line_send(&l, STDOUT_FILENO);
		return EXIT_SETUP;
	}
	line_start(&l, "ready");
	line_send(&l, STDOUT_FILENO);
	/* stdout and stderr to /dev/null: the host's pipes reach EOF and hold nothing */
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
	}
	/* Until the parent dies (PR_SET_PDEATHSIG), a signal, or EOF on a pipe or socket stdin. */
	if (fstat(STDIN_FILENO, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
		for (;;) {
			struct pollfd pfd = { STDIN_FILENO, POLLIN, 0 };
			char buf[256];
			ssize_t n;

			if (poll(&pfd, 1, -1) < 0 && errno == EINTR)
				continue;
			n = read(STDIN_FILENO, buf, sizeof buf);
			if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
				return 0;
		}
	}
	for (;;)
		pause();
}

/* The mounts of --tmpfs and --work-tmpfs are made by the init, in the mount namespace that comes
 * with the PID namespace: without one, say so. */
static void refuse_mounts(const struct plan *p, const struct attempt *pid)
{
	if (!p->pidns)
		mounts_refuse(p, EINVAL, "needs --pidns: the mounts are made in the mount namespace "
			      "that comes with the PID namespace");
	else if (!pid->got)
		mounts_refuse(p, pid->direct_err ? pid->direct_err : pid->user_err,
			      "the PID namespace, and the mount namespace that comes with it, "
			      "was refused");
}

/* --user-max: the run's quotas, in the run's own user namespace. The kernel counts inotify
 * instances and watches (and fanotify groups and marks, namespaces) per user namespace and uid
 * (ucounts), at every level up to the first: a run's count is charged in its own namespace
 * against its /proc/sys/user/max_*, and in each parent against the parent's. Without root every
 * run has the controller's uid, so in the controller's namespace all runs share one count
 * against the host's limit (fs.inotify.max_user_instances, 128): one run could take them all.
 * A fresh namespace's limits are INT_MAX; lowered here, each run can take only its share. The
 * file of the current task's user namespace is written, whatever /proc is mounted; writing it
 * needs CAP_SYS_RESOURCE in that namespace, which we hold in a namespace we made (corral-init:
 * as ambient capabilities) and the program never has (its uid there is not 0). */
static void user_quotas(const struct plan *p)
{
	char path[64], num[24];
	size_t i;

	for (i = 0; i < p->nuser_max; i++) {
		const struct plan_user_max *u = &p->user_max[i];
		int fd;

		snprintf(path, sizeof path, "/proc/sys/user/max_%.*s", (int)u->name_len, u->name);
		snprintf(num, sizeof num, "%llu", u->value);
		fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write_close(fd, num) != 0) {
			int err = errno;
			struct line l;

			line_start(&l, "refused user-quotas ");
			line_errname(&l, err);
			line_add(&l, " cannot write ");
			line_add(&l, path);
			line_send(&l, report_get_fd());
			return;
		}
	}
	report_applied("user-quotas");
}

/* The user and network namespace lines, in this order; -1 after the fatal line of --net require.
 * user_err: why --userns always got no user namespace. */
static int report_user_net(const struct launch *L, const struct attempt *net, int user_err)
{
	const struct plan *p = L->plan;

	if (L->userns)
		report_applied("user-namespace");
	else if (p->userns == PLAN_USERNS_ALWAYS)
		report_refused("user-namespace", user_err, explain(W_USERNS, user_err));
	if (p->net != PLAN_NET_HOST) {
		if (net->got) {
			report_applied("no-network");
			if (L->net_shared)
				report_applied("shared-netns");
		} else if (p->net == PLAN_NET_REQUIRE) {
			report_fatal(W_NETNS, net->direct_err ? net->direct_err : net->user_err, NULL);
			return -1;
		} else {
			report_refusal(L, net, W_NETNS);
		}
	}
	return 0;
}

int ns_apply(struct launch *L)
{
	const struct plan *p = L->plan;
	const struct ns_shared *s = L->shared;
	struct attempt all = { 0 }, pid = { 0 }, net = { 0 };
	int r, nested, inherited;

	L->euid = s ? s->euid : geteuid();
	L->egid = s ? s->egid : getegid();
	if (s) {
		/* corral-zygote: this run is already in the network namespace (and the user
		 * namespace it needed) that the zygote made once; only the PID namespace is made
		 * here. */
		L->userns = s->userns;
		net.got = s->net_got;
		/* runs of one zygote share its namespace as runs joined to a holder share the
		 * holder's: the same walls apply (the socket filter, Landlock's scope) */
		L->net_shared = s->net_got;
		net.direct_err = s->net_direct_err;
		net.user_err = s->net_user_err;
		if (L->direct_own_net) {
			/* walls missing: the direct init's clone made one of the run's own inside
			 * the zygote's, as a launcher does where it may not join a holder */
			int err;
			const char *why = ns_share_unsafe(p, &err);

			report_refused_at("shared-netns", why ? err : EINVAL, why ? why :
					  "corral-zygote found its walls missing",
					  "the run has a network namespace of its own");
			L->net_shared = 0;
			net.got = 1;
		}
	} else if (p->net != PLAN_NET_HOST && !(p->net_join && try_join(L))) {
		all.flags |= CLONE_NEWNET;
	}
	if (L->net_shared)
		net.got = 1;
	/* The IPC namespace comes with the PID namespace: SysV shared memory, semaphores, message
	 * queues and POSIX message queues made by the run are private to it and go with it. */
	if (p->pidns)
		all.flags |= CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC;
	if (!all.flags && !s && !L->net_shared) {
		/* no user namespace of the run's: the launcher has the program's uid where the
		 * kernel counts it, as does everything else of that uid on the host */
		if (!p->has_ids)
			L->nproc_beside = 1;
		refuse_mounts(p, &pid);
		return 0;
	}
	pid.flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC;
	net.flags = CLONE_NEWNET;
	/* Without root, runs of a zygote share its user namespace, and runs joined to a holder
	 * share the holder's; each gets one of its own inside it, as a launcher's run does, so
	 * that RLIMIT_NPROC counts the run's processes alone, not the zygote's nor other runs'
	 * (refused: they share the count). */
	inherited = L->userns;  /* the zygote's or the holder's, shared: none of the run's own */
	nested = ((s && s->userns) || (!s && L->net_shared && L->userns)) &&
		 (all.flags & CLONE_NEWPID) != 0;
	if (nested) {
		int err = 0;

		/* a direct run's maps were written by the direct init, which had the capabilities
		 * (corral-init lost them at its execve but for the ambient ones) */
		if (L->direct)
			err = L->direct_maps_err;
		else if (unshare(CLONE_NEWUSER) != 0)
			nested = 0;     /* refused: the run stays in the shared one */
		else if (ns_write_own_maps(L->euid, L->egid) != 0)
			err = errno;
		if (err) {
			report_fatal(W_IDMAP, err, NULL);
			return -1;
		}
	}

	if (all.flags) {
		/* a direct run: the clone that started us made them (and the user namespace) */
		r = L->direct ? 0 : try_unshare(L, &all);
		if (r < 0)
			return -1;
		if (r == 0) {
			pid.got = (all.flags & CLONE_NEWPID) != 0;
			if (all.flags & CLONE_NEWNET)
				net.got = 1;
		} else {
			/* Both refused together: each alone (a user namespace made by the first
			 * serves the second). */
			if (p->pidns && try_unshare(L, &pid) < 0)
				return -1;
			if ((all.flags & CLONE_NEWNET) && try_unshare(L, &net) < 0)
				return -1;
		}
	}

	/* A user namespace changes credentials; keep the parent-death signal for sure. */
	if (L->userns)
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	if (p->nuser_max && (nested || (!inherited && L->userns)))
		user_quotas(p);
	else if (p->nuser_max && !p->has_ids)
		report_refused("user-quotas", EPERM, "the run has no user namespace of its own: its "
			       "inotify instances and watches count with every process of its uid");
	if (report_user_net(L, &net, all.user_err ? all.user_err :
			    pid.user_err ? pid.user_err : net.user_err) != 0)
		return -1;
	if (p->pidns) {
		if (pid.got) {
			report_applied("pid-namespace");
			report_applied("private-ipc");
		}
		else
			report_refusal(L, &pid, W_PIDNS);
	}
	L->netns = net.got;
	L->pidns = pid.got;
	/* The launcher, and init with a PID namespace (corral-init is both); a holder's user
	 * namespace joined without one of the run's own inside it also holds the holder, and every
	 * concurrent run joined to it: that count is shared, and not exact */
	if (!p->has_ids)
		L->nproc_beside = (L->direct ? 1 : 1 + L->pidns) + (inherited && !nested && !s ? 1 : 0);
	refuse_mounts(p, &pid);
	return 0;
}

int ns_apply_shared(struct launch *L, struct ns_shared *s)
{
	const struct plan *p = L->plan;
	struct attempt net = { CLONE_NEWNET, 0, 0, 0 };

	memset(s, 0, sizeof *s);
	L->euid = s->euid = geteuid();
	L->egid = s->egid = getegid();
	if (p->net == PLAN_NET_HOST) {
		/* No network namespace to make once. Each run makes its own (user and) PID one, and
		 * the zygote forks each program into it (setns: CAP_SYS_ADMIN in its own user
		 * namespace), so without root it needs a user namespace of its own all the same. */
		if (L->euid != 0 && p->userns != PLAN_USERNS_NEVER && unshare(CLONE_NEWUSER) == 0) {
			if (ns_write_own_maps(L->euid, L->egid) != 0) {
				report_fatal(W_IDMAP, errno, NULL);
				return -1;
			}
			L->userns = s->userns = 1;
			prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
			report_applied("user-namespace");
		}
		return 0;
	}
	if (try_unshare(L, &net) < 0)
		return -1;
	if (L->userns)
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	s->userns = L->userns;
	s->net_got = net.got;
	L->net_shared = net.got;        /* its runs share it (s->net_got): see ns_apply */
	s->net_direct_err = net.direct_err;
	s->net_user_err = net.user_err;
	L->netns = net.got;
	return report_user_net(L, &net, net.user_err);
}
