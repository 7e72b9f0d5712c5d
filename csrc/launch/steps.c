/* steps.c: the launcher's own steps before its supervisor forks, after the report's header.
 *
 * launch_run() (run.c) takes them in corral-launch and in the zygote's launcher; corral-init
 * takes them for a direct warm run (csrc/init/main.c), which is why they are apart from run.c:
 * corral-init is built from a few of the launcher's files and must not need the rest.
 */
#include "launch.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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

/* The plan on the command line holds the controller's pid, the install path, the private lock
 * directory, the run directory and (corral-init) the request's number. The init of the run's PID
 * namespace (the init, or corral-init) is its pid 1, and /proc/1/cmdline, which every process may
 * read, would show all of it to the program: the init hides its own copy. (the launcher, outside
 * the namespace, keeps its command line for the host's tools.) The kernel keeps the strings of argv
 * one after another in one area. That area is the process's, not a run's: what args_copy() notes
 * stays here, set once by the process's main(). */
static char *args_start;
static size_t args_len;
static char **volatile args_v;  /* the copy, kept for the process's life (the plan points in): */
static char *volatile args_buf; /* volatile, or the stores go, and valgrind calls it lost */
static size_t args_name;        /* the base name of argv[0]: where it starts in the area */

char **args_copy(int argc, char **argv)
{
	size_t len = 0, off = 0, n;
	char **v;
	char *buf;
	int i;

	for (i = 0; i < argc; i++)
		len += strlen(argv[i]) + 1;
	v = malloc(((size_t)argc + 1) * sizeof *v);
	buf = malloc(len ? len : 1);
	if (!v || !buf) {
		free(v);
		free(buf);
		return NULL;
	}
	for (i = 0; i < argc; i++) {
		n = strlen(argv[i]) + 1;
		memcpy(buf + off, argv[i], n);
		v[i] = buf + off;
		off += n;
	}
	v[argc] = NULL;
	args_v = v;
	args_buf = buf;
	if (argc > 0 && argv[argc - 1] + strlen(argv[argc - 1]) + 1 == argv[0] + len) {
		const char *slash = strrchr(v[0], '/');

		args_start = argv[0];
		args_len = len;
		args_name = slash ? (size_t)(slash + 1 - v[0]) : 0;
	}
	return v;
}

void args_hide(void)
{
	size_t n;

	if (!args_start)
		return;
	/* the area ends with argv[0]'s base name, then NUL bytes: the name moves to the front
	 * (memmove: they may overlap) */
	n = strlen(args_start + args_name);
	memmove(args_start, args_start + args_name, n);
	memset(args_start + n, 0, args_len - n);
}

int launch_steps(struct launch *L)
{
	return step_session() != 0 ||           /* 1. setsid */
	       step_die_with_parent(L) != 0 ||  /* 2. PR_SET_PDEATHSIG, the parent's pid */
	       budget_prepare(L) != 0 ||        /* 2b. budgets: the run cgroup (budget.c) */
	       ns_apply(L) != 0 ? -1 : 0;       /* 3. namespaces */
}
