/* corral-init: the init of a direct warm run's PID namespace.
 *
 *   corral-init --pid PID [--fork-errno E] [--maps-errno E] [--own-net 1] --pipe FD --out FD
 *               --go FD --shared USERNS,NET,NET_ERR,NET_USER_ERR,EUID,EGID --plan ID ARGS...
 *
 * corral-zygote starts a direct run (csrc/zygote/direct.c) in a direct init that it clones into the
 * run's new namespaces and that shares its memory: the direct init forks the program from that
 * memory (a copy of the warm interpreter), and execs this, which lets the zygote go on. This is
 * then the launcher and the init of the run in one process, pid 1 of the run's PID namespace:
 *
 *   1. the report's header and the launcher's steps (steps.c): session, die-with-parent, the
 *      budgets, the namespaces the clone made, reported as the launcher reports them (ns.c, with
 *      --shared: what the zygote made once, as struct ns_shared), and the user namespace's maps;
 *   2. the init's mounts (mounts.c); their state goes to the program on --go, which waits for it
 *      before its own steps (the program's end of that pipe sees EOF when a step here failed: the
 *      program exits, nothing runs);
 *   3. what the init does once the program is started (reap.c): the program's pipe (--pipe: its pid
 *      line or its fatal line), every process of the namespace reaped until the program, the
 *      budgets polled, the stop signals from outside the namespace obeyed, the rest killed when
 *      asked or with a budget, the program's status and the run's usage reported;
 *   4. the program's outcome (struct outcome: exit code or signal) on --out for the zygote, which
 *      reports it as the run's status (an init cannot end by a signal of its own, as the launcher
 *      mirrors the program's), and the exit, which ends the namespace.
 *
 * ARGS are the launcher's arguments for the run (the request's), ID the request's. It runs on
 * every warm run: built from the few launcher files it needs, statically, against musl libc
 * where musl-gcc is installed, so that its execve and exit are cheap. Bad arguments: a line on
 * stderr (/dev/null, started by the zygote) and exit 125, nothing on --out.
 */
#include "../launch/launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif

/* ns.c asks it why a direct run has a network namespace of its own (--own-net: its refused line);
 * landlock.c (the program's, with the kernel's headers) is not built in. */
int landlock_abi(void)
{
	long r = syscall(SYS_landlock_create_ruleset, NULL, 0UL, 1U);  /* ..._VERSION */

	return r >= 0 ? (int)r : -errno;
}

static int number(const char *s, unsigned long long max, unsigned long long *out)
{
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || *end || *out > max ? -1 : 0;
}

static NORETURN void usage(const char *why)
{
	fprintf(stderr, "corral-init: %s (it is started by corral-zygote for a direct run)\n", why);
	_exit(EXIT_SETUP);
}

int main(int argc, char **argv)
{
	unsigned long long pid = 0, pipefd = 0, out = 0, go = 0, forkerr = 0, v;
	int have = 0, i, sh[4], mapserr = 0, ownnet = 0;
	unsigned euid, egid;
	struct ns_shared shared;
	struct plan plan;
	struct launch L;
	struct prog c;
	struct outcome o = { OUTCOME_EXIT, EXIT_SETUP };
	char perr[256], mounts[MOUNTS_STATE_LEN];
	ssize_t n;

	/* the plan points into a copy; the original, our /proc/1/cmdline, is hidden (steps.c) */
	argv = args_copy(argc, argv);
	if (!argv)
		usage("out of memory");
	args_hide();
	memset(&shared, 0, sizeof shared);
	for (i = 1; i + 1 < argc && strcmp(argv[i], "--plan") != 0; i += 2) {
		const char *k = argv[i];

		if (strcmp(k, "--shared") == 0) {
			if (sscanf(argv[i + 1], "%d,%d,%d,%d,%u,%u", &sh[0], &sh[1], &sh[2], &sh[3],
				   &euid, &egid) != 6)
				usage("bad --shared");
			shared.userns = sh[0];
			shared.net_got = sh[1];
			shared.net_direct_err = sh[2];
			shared.net_user_err = sh[3];
			shared.euid = euid;
			shared.egid = egid;
			have |= 1;
			continue;
		}
		if (number(argv[i + 1], 0x7fffffff, &v) != 0)
			usage("bad number");
		if (strcmp(k, "--pid") == 0)
			pid = v, have |= 2;
		else if (strcmp(k, "--fork-errno") == 0)
			forkerr = v;
		else if (strcmp(k, "--maps-errno") == 0)
			mapserr = (int)v;
		else if (strcmp(k, "--own-net") == 0)
			ownnet = v != 0;
		else if (strcmp(k, "--pipe") == 0)
			pipefd = v, have |= 4;
		else if (strcmp(k, "--out") == 0)
			out = v, have |= 8;
		else if (strcmp(k, "--go") == 0)
			go = v, have |= 16;
		else
			usage("unknown option");
	}
	if (have != 31 || i + 1 >= argc)
		usage("missing arguments");
	/* argv[i + 1], the ID, is plan_parse's argv[0]: the arguments follow */
	if (plan_parse(&plan, argc - i - 1, argv + i + 1, perr, sizeof perr) != 0)
		usage(perr);

	/* As the init: no process of the run's uid may ptrace us or take our fds (the report
	 * fd). */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	/* As the launcher's init: every signal blocked, the stop signals and SIGCHLD read with
	 * sigtimedwait (reap.c); report writes to a closed pipe fail instead of killing us. */
	init_block_signals();
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);

	launch_init(&L);
	L.plan = &plan;
	L.shared = &shared;
	L.direct = 1;
	L.direct_maps_err = mapserr;
	L.direct_own_net = ownnet;
	report_open(&L, plan.report_fd);
	report_header();
	if (workspace_open(&L) != 0 || launch_steps(&L) != 0 || mounts_apply(&L) != 0 ||
	    workspace_in(&L) != 0)
		goto setup_failed;
	if (!pid) {
		report_fatal(W_WARM, (int)forkerr, NULL);
		goto setup_failed;
	}
	report_flush();         /* our lines before the program's */
	mounts_state(&L, mounts, sizeof mounts);
	do
		n = write((int)go, mounts, sizeof mounts);
	while (n < 0 && errno == EINTR);
	close((int)go);

	memset(&c, 0, sizeof c);
	c.pid = c.shown = (pid_t)pid;
	c.errfd = (int)pipefd;
	c.statusfd = -1;
	init_watch(&L, &c, &o);     /* as the init */
	init_end((int)out, &o);

setup_failed:
	budget_cleanup(&L);
	report_flush();
	_exit(EXIT_SETUP);      /* the program, waiting for its mounts, dies with the namespace */
}
