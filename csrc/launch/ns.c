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
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* "A A 1" and, when B differs, "B B 1" (ascending: the kernel wants no overlap). */
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
static int write_own_maps(const struct launch *L)
{
	char map[64];
	int sg, um, gm, err;

	if (L->euid != 0)
		prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
	sg = open("/proc/self/setgroups", O_WRONLY | O_CLOEXEC);  /* absent before Linux 3.19 */
	err = errno;
	um = open("/proc/self/uid_map", O_WRONLY | O_CLOEXEC);
	if (um < 0)
		err = errno;
	gm = open("/proc/self/gid_map", O_WRONLY | O_CLOEXEC);
	if (gm < 0)
		err = errno;
	if (L->euid != 0)
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
	snprintf(map, sizeof map, "%u %u 1\n", (unsigned)L->euid, (unsigned)L->euid);
	if (write_close(um, map) != 0) {
		err = errno;
		close(gm);
		errno = err;
		return -1;
	}
	snprintf(map, sizeof map, "%u %u 1\n", (unsigned)L->egid, (unsigned)L->egid);
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
	if (write_own_maps(L) != 0) {
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
	int r;

	L->euid = s ? s->euid : geteuid();
	L->egid = s ? s->egid : getegid();
	if (s) {
		/* corral-zygote: this run is already in the network namespace (and the user namespace
		 * it needed) that the zygote made once; only the PID namespace is made here. */
		L->userns = s->userns;
		net.got = s->net_got;
		net.direct_err = s->net_direct_err;
		net.user_err = s->net_user_err;
	} else if (p->net != PLAN_NET_HOST) {
		all.flags |= CLONE_NEWNET;
	}
	/* The IPC namespace comes with the PID namespace: SysV shared memory, semaphores, message
	 * queues and POSIX message queues made by the run are private to it and go with it. */
	if (p->pidns)
		all.flags |= CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC;
	if (!all.flags && !s) {
		refuse_mounts(p, &pid);
		return 0;
	}
	pid.flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC;
	net.flags = CLONE_NEWNET;
	/* corral-zygote without root: its runs share its user namespace; each gets one of its own
	 * inside it, as a launcher's run does, so that RLIMIT_NPROC counts the run's processes
	 * alone, not the zygote's nor other runs' (refused: they share the count). */
	if (s && s->userns && (all.flags & CLONE_NEWPID) && unshare(CLONE_NEWUSER) == 0 &&
	    write_own_maps(L) != 0) {
		report_fatal(W_IDMAP, errno, NULL);
		return -1;
	}

	if (all.flags) {
		r = try_unshare(L, &all);
		if (r < 0)
			return -1;
		if (r == 0) {
			pid.got = (all.flags & CLONE_NEWPID) != 0;
			if (all.flags & CLONE_NEWNET)
				net.got = 1;
		} else {
			/* Both refused together: each alone (a user namespace made by the first serves
			 * the second). */
			if (p->pidns && try_unshare(L, &pid) < 0)
				return -1;
			if ((all.flags & CLONE_NEWNET) && try_unshare(L, &net) < 0)
				return -1;
		}
	}

	/* A user namespace changes credentials; keep the parent-death signal for sure. */
	if (L->userns)
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
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
	if (p->net == PLAN_NET_HOST)
		return 0;       /* nothing to make once: each run makes its own (user and) PID one */
	if (try_unshare(L, &net) < 0)
		return -1;
	if (L->userns)
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	s->userns = L->userns;
	s->net_got = net.got;
	s->net_direct_err = net.direct_err;
	s->net_user_err = net.user_err;
	L->netns = net.got;
	return report_user_net(L, &net, net.user_err);
}
