/* corral-init: the init of a direct warm run's PID namespace, from the program's fork to the
 * run's end.
 *
 *   corral-init --pid PID --pipe FD --out FD --report-fd FD
 *               [--budget-cpu-ms N] [--budget-memory-kb N] [--budget-poll-ms N]
 *
 * corral-zygote starts a direct run (csrc/zygote/direct.c) in a process P cloned into the run's
 * new namespaces that shares the zygote's memory: P takes the launcher's steps, makes the init's
 * mounts, forks the program C from that memory (a copy of the warm interpreter) and then execs
 * this, which lets the zygote go on. From here it is the launcher's init B after B started C
 * (reap.c): C's pipe (FD: its pid line or its fatal line), every process of the namespace reaped
 * until C, the budgets polled, the stop signals from outside the namespace obeyed, the rest of
 * the namespace killed, C's status and the run's usage reported. Then the outcome (struct
 * outcome: C's exit code or signal) goes to the zygote on --out, because an init cannot end by a
 * signal of its own to mirror C's, and the exit ends the namespace.
 *
 * It is started on every warm run: built from reap.c, report.c, budget.c and sweep.c alone,
 * statically, against musl libc where musl-gcc is installed, its execve and exit cost about a
 * tenth of a static glibc program's. Bad arguments: a line on stderr and exit 125 (EXIT_SETUP),
 * nothing on --out: the zygote then reports the exit status.
 */
#include "../launch/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static int number(const char *s, unsigned long long max, unsigned long long *out)
{
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end || *out > max ? -1 : 0;
}

int main(int argc, char **argv)
{
	unsigned long long pid = 0, pipefd = 0, out = 0, rfd = 0, v;
	int have = 0, i;
	struct plan plan;
	struct launch L;
	struct prog c;
	struct outcome o = { OUTCOME_EXIT, EXIT_SETUP };
	sigset_t set;
	ssize_t n;

	memset(&plan, 0, sizeof plan);
	for (i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i];

		if (number(argv[i + 1], 1ULL << 40, &v) != 0)
			break;
		if (strcmp(k, "--pid") == 0 && v > 0 && v <= 0x7fffffff)
			pid = v, have |= 1;
		else if (strcmp(k, "--pipe") == 0 && v <= 0x7fffffff)
			pipefd = v, have |= 2;
		else if (strcmp(k, "--out") == 0 && v <= 0x7fffffff)
			out = v, have |= 4;
		else if (strcmp(k, "--report-fd") == 0 && v <= 0x7fffffff)
			rfd = v, have |= 8;
		else if (strcmp(k, "--budget-cpu-ms") == 0)
			plan.budget_cpu_ms = v;
		else if (strcmp(k, "--budget-memory-kb") == 0)
			plan.budget_memory_kb = v;
		else if (strcmp(k, "--budget-poll-ms") == 0 && v >= 1 && v <= PLAN_POLL_MS_MAX)
			plan.budget_poll_ms = (unsigned)v;
		else
			break;
	}
	if (i != argc || have != 15) {
		fprintf(stderr, "corral-init: bad arguments (it is started by corral-zygote, with "
			"--pid --pipe --out --report-fd and the run's budgets)\n");
		return EXIT_SETUP;
	}

	/* As B: no process of the run's uid may ptrace us or take our fds (the report fd). */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	/* What the zygote's P left blocked stays blocked (read with sigtimedwait, reap.c). */
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);

	/* The budgets as P set them up: its applied lines are in the report already. */
	plan.report_fd = -1;
	memset(&L, 0, sizeof L);
	L.plan = &plan;
	report_set_fd(-1);
	budget_prepare(&L);
	plan.report_fd = (int)rfd;
	report_set_fd((int)rfd);

	memset(&c, 0, sizeof c);
	c.pid = c.shown = (pid_t)pid;
	c.errfd = (int)pipefd;
	while (c.errfd >= 0)
		prog_read(&c);
	/* As B: with a budget, the rest of the namespace is killed and reaped before the report,
	 * so that usage and total count it. */
	if (init_wait(&c) || budget_active())
		init_kill_all(&c);
	prog_finish(&c, &o);
	report_flush();
	do
		n = write((int)out, &o, sizeof o);
	while (n < 0 && errno == EINTR);
	_exit(0);
}
