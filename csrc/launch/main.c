/* corral-launch: applies a confinement plan inside a new process, runs the program, reports.
 *
 * The contract is docs/internals.md, section "corral-launch". main() is the flat list of the
 * launcher's steps, in order; the program's own steps are in child.c (child_run).
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <dirent.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static NORETURN void usage_error(const char *what)
{
	dprintf(STDERR_FILENO, "corral-launch: %s\n", what);
	_exit(EXIT_USAGE);
}

static void write_all(int fd, const char *s)
{
	size_t len = strlen(s);

	while (len > 0) {
		ssize_t n = write(fd, s, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		s += n;
		len -= (size_t)n;
	}
}

/* 0a. First of all: not dumpable, so that a process of our uid (the program, when there is no
 * user namespace and no --uid) cannot ptrace us, take our fds with pidfd_getfd (the report fd:
 * it could forge lines), or read our /proc/PID/environ, fd and mem. Kept across fork (B, C
 * until its execve). */
static void step_not_dumpable(void)
{
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);     /* cannot fail with these arguments */
}

static void close_range_loop(int from, int to_or_neg)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);

		if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd >= from &&
		    (to_or_neg < 0 || fd <= to_or_neg) && fd != dirfd(d))
			close(fd);
	}
	closedir(d);
}

/* close_range(from, to) (to -1: no end), with a /proc/self/fd loop before Linux 5.9. */
static void close_fds(int from, int to)
{
#ifdef SYS_close_range
	if (syscall(SYS_close_range, (unsigned)from, to < 0 ? ~0U : (unsigned)to, 0U) == 0)
		return;
#endif
	close_range_loop(from, to);
}

/* 0b. Every inherited fd but 0-2 and the report fd is closed: whatever the host leaked into
 * the launcher reaches neither the program nor anything that could get at the launcher. */
static void step_close_inherited(int report_fd)
{
	if (report_fd > 3)
		close_fds(3, report_fd - 1);
	close_fds(report_fd >= 3 ? report_fd + 1 : 3, -1);
}

/* 1. A new session and process group, so the host can kill the group. */
static int step_session(void)
{
	if (setsid() >= 0 || getsid(0) == getpid()) {
		report_applied("session");
		return 0;
	}
	/* A process-group leader cannot make a session; the PID namespace or the subreaper still
	 * contain the tree. */
	report_refused("session", errno, explain(W_SESSION, errno));
	return 0;
}

/* 2. Die with the host; with --parent-pid, make sure the host did not die before the prctl. */
static int step_die_with_parent(const struct plan *p)
{
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
		report_fatal(W_DEATHSIG, errno, NULL);
		return -1;
	}
	if (p->parent_pid && getppid() != p->parent_pid) {
		report_fatal(W_PARENT, ESRCH, NULL);
		return -1;
	}
	report_applied("die-with-parent");
	return 0;
}

int main(int argc, char **argv)
{
	struct plan plan;
	struct launch L;
	struct outcome out;
	char err[256];

	step_not_dumpable();                    /* 0a. */
	if (plan_parse(&plan, argc, argv, err, sizeof err) != 0)
		usage_error(err);
	if (plan.mode == PLAN_HELP) {
		write_all(STDOUT_FILENO, plan_help());
		plan_free(&plan);
		return 0;
	}
	if (plan.mode == PLAN_PROBE) {
		plan_free(&plan);
		return probe_run();
	}
	if (plan.mode == PLAN_HOLD_NET) {
		int code;

		step_close_inherited(-1);
		code = ns_hold(&plan);          /* returns only when its work is over */
		plan_free(&plan);
		return code;
	}
	if (plan.mode == PLAN_KILL_UID) {
		uid_t uid = plan.kill_uid;

		plan_free(&plan);
		if (geteuid() != 0)
			usage_error("--kill-uid needs root (it takes the uid to kill as that uid)");
		return sweep_kill_uid(uid);
	}
	if (plan.report_fd >= 0 && fcntl(plan.report_fd, F_GETFD) < 0) {
		snprintf(err, sizeof err, "--report-fd %d is not an open file descriptor",
			 plan.report_fd);
		plan_free(&plan);
		usage_error(err);
	}
	step_close_inherited(plan.report_fd);   /* 0b. */

	memset(&L, 0, sizeof L);
	L.plan = &plan;
	L.sigfd = -1;
	report_set_fd(plan.report_fd);
	report_header();

	if (supervise_prepare(&L) != 0 ||       /* signals: blocked, read from a signalfd */
	    step_session() != 0 ||              /* 1. setsid */
	    step_die_with_parent(&plan) != 0 || /* 2. PR_SET_PDEATHSIG, --parent-pid */
	    budget_prepare(&L) != 0 ||          /* 2b. budgets: the run cgroup (budget.c) */
	    ns_apply(&L) != 0) {                /* 3. namespaces */
		budget_cleanup();
		plan_free(&plan);
		_exit(EXIT_SETUP);
	}
	seccomp_prepare(&L);                 /* the filter C loads last (seccomp.c) */
	supervise_run(&L, &out);                /* 4. init or subreaper; 5. in child_run() */
	if (L.sigfd >= 0)
		close(L.sigfd);
	plan_free(&plan);
	outcome_exit(&out);                     /* 6. exit as the program did */
}
