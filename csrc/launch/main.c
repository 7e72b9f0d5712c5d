/* corral-launch: applies a confinement plan inside a new process, runs the program, reports.
 *
 * The contract is docs/internals.md, section "corral-launch". main() parses the command line and
 * closes the inherited fds; the steps of the run itself are the flat list of launch_run() (run.c,
 * shared with corral-zygote), the program's own steps are in child.c (child_run).
 */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
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

/* 0a. First of all: not dumpable, so that a process of our uid (the program, when there is no user
 * namespace and no --uid) cannot ptrace us, take our fds with pidfd_getfd (the report fd: it could
 * forge lines), or read our /proc/PID/environ, fd and mem. Kept across fork (the init, program
 * until its execve). */
static void step_not_dumpable(void)
{
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);     /* cannot fail with these arguments */
}

/* 0b. Every inherited fd but 0-2 and the one to keep (the report fd; the relay's status fd) is
 * closed: whatever the host leaked into the launcher reaches neither the program nor anything
 * that could get at the launcher. */
static void step_close_inherited(int keep)
{
	if (keep > 3)
		close_fds(3, keep - 1);
	close_fds(keep >= 3 ? keep + 1 : 3, -1);
}

int main(int argc, char **argv)
{
	struct plan plan;
	struct launch L;
	char err[256];

	step_not_dumpable();                    /* 0a. */
	/* the plan points into a copy: the init, the run's pid 1, hides the original (steps.c) */
	argv = args_copy(argc, argv);
	if (!argv)
		usage_error("out of memory");
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
	if (plan.mode == PLAN_RELAY) {
		step_close_inherited(plan.status_fd);
		if (fcntl(plan.status_fd, F_GETFD) < 0) {
			snprintf(err, sizeof err, "--relay: --status-fd %d is not an open file "
				 "descriptor", plan.status_fd);
			plan_free(&plan);
			usage_error(err);
		}
		return relay_run(&plan);        /* relay.c */
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

	launch_init(&L);
	L.parent = plan.parent_pid;
	launch_run(&L, &plan);                 /* 1.-6. (run.c) */
}
