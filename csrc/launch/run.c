/* run.c: one run, from the report header to the program's end.
 *
 * launch_run() is the flat list of the launcher's own steps for a run, in order. corral-launch's
 * main() calls it once the command line is parsed and the inherited fds are closed; corral-zygote
 * calls it in each run's launcher, forked from the warm zygote once the run's fds are in place.
 * Nothing else differs: what a zygote made once for all its runs (the user and network
 * namespaces, the seccomp filter) is named in struct launch, and ns.c reports it as if it had been
 * made here, so both report the same lines. The program's own steps are in child.c (child_run).
 */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

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

void close_fds(int from, int to)
{
#ifdef SYS_close_range
	if (syscall(SYS_close_range, (unsigned)from, to < 0 ? ~0U : (unsigned)to, 0U) == 0)
		return;
#endif
	close_range_loop(from, to);
}

NORETURN void launch_run(struct launch *L, struct plan *plan)
{
	struct outcome out;

	L->plan = plan;
	L->sigfd = -1;
	report_open(L, plan->report_fd);
	report_header();

	if (workspace_open(L) != 0 ||            /* the host's paths, before any mount */
	    supervise_prepare(L) != 0 ||       /* signals: blocked, read from a signalfd */
	    launch_steps(L) != 0) {             /* 1-3 (steps.c) */
		budget_cleanup(L);
		plan_free(plan);
		_exit(EXIT_SETUP);
	}
	if (!L->seccomp_ready)
		seccomp_prepare(L);             /* the filter the program loads last (seccomp.c) */
	supervise_run(L, &out);                 /* 4. init or subreaper; 5. in child_run() */
	if (L->sigfd >= 0)
		close(L->sigfd);
	plan_free(plan);
	outcome_exit(&out);                     /* 6. exit as the program did */
}
