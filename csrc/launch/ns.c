/* ns.c: the namespaces, with one unshare() when possible.
 *
 * --userns auto: try the namespaces alone (works as root); on EPERM try again with
 * CLONE_NEWUSER and map the caller's ids to themselves. When both are refused, try the PID and
 * the network namespace separately, so one refused namespace does not cost the other.
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <unistd.h>

static int write_file(const char *path, const char *data)
{
	size_t len = strlen(data);
	ssize_t n;
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	int err;

	if (fd < 0)
		return -1;
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

/* In a new user namespace: the caller's ids map to themselves, so the program sees its usual
 * ids and, being non-zero inside, loses every capability at execve. */
static int write_id_maps(const struct launch *L)
{
	char map[64];

	/* Unprivileged gid_map writes need setgroups denied; absent before Linux 3.19. */
	if (write_file("/proc/self/setgroups", "deny") != 0 && errno != ENOENT)
		return -1;
	snprintf(map, sizeof map, "%u %u 1\n", (unsigned)L->euid, (unsigned)L->euid);
	if (write_file("/proc/self/uid_map", map) != 0)
		return -1;
	snprintf(map, sizeof map, "%u %u 1\n", (unsigned)L->egid, (unsigned)L->egid);
	if (write_file("/proc/self/gid_map", map) != 0)
		return -1;
	return 0;
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
	if (unshare(a->flags | CLONE_NEWUSER) != 0) {
		a->user_err = errno;
		return 1;
	}
	L->userns = 1;
	if (write_id_maps(L) != 0) {
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

int ns_apply(struct launch *L)
{
	const struct plan *p = L->plan;
	struct attempt all = { 0 }, pid = { 0 }, net = { 0 };
	int r;

	L->euid = geteuid();
	L->egid = getegid();
	if (p->net != PLAN_NET_HOST)
		all.flags |= CLONE_NEWNET;
	if (p->pidns)
		all.flags |= CLONE_NEWPID | CLONE_NEWNS;
	if (!all.flags)
		return 0;
	pid.flags = CLONE_NEWPID | CLONE_NEWNS;
	net.flags = CLONE_NEWNET;

	r = try_unshare(L, &all);
	if (r < 0)
		return -1;
	if (r == 0) {
		pid.got = (all.flags & CLONE_NEWPID) != 0;
		net.got = (all.flags & CLONE_NEWNET) != 0;
	} else {
		/* Both refused together: each alone (a user namespace made by the first serves the
		 * second). */
		if (p->pidns && try_unshare(L, &pid) < 0)
			return -1;
		if (p->net != PLAN_NET_HOST && try_unshare(L, &net) < 0)
			return -1;
	}

	/* A user namespace changes credentials; keep the parent-death signal for sure. */
	if (L->userns) {
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
		report_applied("user-namespace");
	} else if (p->userns == PLAN_USERNS_ALWAYS) {
		int err = all.user_err ? all.user_err : pid.user_err ? pid.user_err : net.user_err;

		report_refused("user-namespace", err, explain(W_USERNS, err));
	}
	if (p->net != PLAN_NET_HOST) {
		if (net.got) {
			report_applied("no-network");
		} else if (p->net == PLAN_NET_REQUIRE) {
			report_fatal(W_NETNS, net.direct_err ? net.direct_err : net.user_err, NULL);
			return -1;
		} else {
			report_refusal(L, &net, W_NETNS);
		}
	}
	if (p->pidns) {
		if (pid.got)
			report_applied("pid-namespace");
		else
			report_refusal(L, &pid, W_PIDNS);
	}
	L->netns = net.got;
	L->pidns = pid.got;
	return 0;
}

/* In the init of a new PID namespace, which also has its own mount namespace: keep mounts from
 * propagating back to the host, then mount a /proc that shows only this namespace's processes
 * (the controller's /proc/PID/environ and the host's process list are out of sight). Refusal is
 * reported and the run goes on with the host's /proc. */
void ns_private_proc(void)
{
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
		report_refused("private-proc", errno,
			       "cannot make the new mount namespace private; the program sees the host's /proc");
		return;
	}
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
		report_refused("private-proc", errno,
			       errno == EPERM ? "mounting proc was refused (in a container, masked /proc paths forbid it); the program sees the host's /proc"
					      : "cannot mount proc; the program sees the host's /proc");
		return;
	}
	report_applied("private-proc");
}
