/* steps.c: the launcher's own steps before its supervisor forks, after the report's header.
 *
 * launch_run() (run.c) takes them in corral-launch and in the zygote's process A; corral-init
 * takes them for a direct warm run (csrc/init/main.c), which is why they are apart from run.c:
 * corral-init is built from a few of the launcher's files and must not need the rest.
 */
#include "launch.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

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

/* 2. Die with the parent (the host, or the zygote); make sure it did not die before the prctl. */
static int step_die_with_parent(const struct launch *L)
{
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
		report_fatal(W_DEATHSIG, errno, NULL);
		return -1;
	}
	if (L->parent && getppid() != L->parent) {
		report_fatal(W_PARENT, ESRCH, NULL);
		return -1;
	}
	report_applied("die-with-parent");
	return 0;
}

int launch_steps(struct launch *L)
{
	return step_session() != 0 ||           /* 1. setsid */
	       step_die_with_parent(L) != 0 ||  /* 2. PR_SET_PDEATHSIG, the parent's pid */
	       budget_prepare(L) != 0 ||        /* 2b. budgets: the run cgroup (budget.c) */
	       ns_apply(L) != 0 ? -1 : 0;       /* 3. namespaces */
}
