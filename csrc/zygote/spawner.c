/* spawner.c: the spawner, the small process that starts each run's launcher.
 *
 * The zygote forks the spawner at start-up, before the interpreter exists, so the spawner holds a
 * few hundred kB of memory where the zygote holds the interpreter's tens of MB. For each run the
 * zygote sends the spawner the host's request with its four fds and one end of the run's own
 * socket; the spawner parses it (plan.c) and starts the launcher with clone(CLONE_PARENT): the
 * launcher is a copy of the spawner (cheap to make, cheap to tear down) but the zygote's child, so
 * that the zygote reaps it and the launcher's pid is the run's for the host; the spawner answers
 * with that pid. The launcher follows the launcher's flow (launch_run) with the init forked from it
 * as small; the program alone is forked from the zygote's warm interpreter, on the init's request
 * over the run's socket (program.c).
 *
 * clone() without glibc's fork() leaves glibc's cached thread id of the launcher at the spawner's:
 * the launcher and init call nothing that uses it (raise, abort, pthread_kill).
 *
 * The spawner, launcher and init run nothing of the interpreter's, so the spawner unmaps libpython
 * first: the dynamic loader relocated it when the zygote started, and its 1.2 MB of data, written
 * by the relocations, would be copied into the spawner and from there page by page into every
 * launcher and init, and torn down with each. The zygote is linked with -z now, so no lazy symbol
 * lookup walks the unmapped library's tables later; the spawner, launcher and the init end with
 * _exit(), so none of its destructors runs either.
 */
#include "zygote.h"

#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* the fds of a request to the spawner: the run's four, then the run's socket */
enum { SPAWN_RUNSOCK = RUN_NFDS, SPAWN_NFDS };

/* ---- the launcher ---- */

static NORETURN void usage_error(const char *what)
{
	dprintf(STDERR_FILENO, "corral-zygote: %s\n", what);
	_exit(EXIT_USAGE);
}

/* The run's fds on 0, 1, 2 and the report fd, the run's socket just above, and nothing else
 * open: the spawner's socket to the zygote stays with the spawner. Returns the run socket's fd. */
static int step_fds(const int *fds, int rfd)
{
	int hi[SPAWN_NFDS], i, base = rfd >= 3 ? rfd + 1 : 3, sock = base;

	/* Above every target first, so that no dup2() below overwrites a source. */
	for (i = 0; i < SPAWN_NFDS; i++) {
		hi[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, base + 1);
		if (hi[i] < 0)
			_exit(EXIT_SETUP);
	}
	for (i = 0; i < 3; i++)
		if (dup2(hi[i], i) < 0)
			_exit(EXIT_SETUP);
	if (rfd >= 0 && dup2(hi[RUN_REPORT], rfd) < 0)
		_exit(EXIT_SETUP);
	if (dup3(hi[SPAWN_RUNSOCK], sock, O_CLOEXEC) < 0)
		_exit(EXIT_SETUP);
	if (rfd > 3)
		close_fds(3, rfd - 1);
	close_fds(sock + 1, -1);
	return sock;
}

static const char *net_name(enum plan_net n)
{
	return n == PLAN_NET_HOST ? "host" : n == PLAN_NET_NEW ? "new" : "require";
}

static const char *userns_name(enum plan_userns u)
{
	return u == PLAN_USERNS_AUTO ? "auto" : u == PLAN_USERNS_NEVER ? "never" : "always";
}

/* The network namespace (or none) and the way namespaces are made are the zygote's, for all its
 * runs. --net new and require differ only when the namespace was refused: then this run gets
 * the launcher's answer (refused, or fatal for require) from ns.c. */
static int check_namespaces(const struct zygote *z, const struct plan *p, char *err, size_t len)
{
	if ((p->net == PLAN_NET_HOST) != (z->net == PLAN_NET_HOST)) {
		snprintf(err, len, "the run asks for --net %s but this zygote was started with --net "
			 "%s: the network namespace is made once for all its runs", net_name(p->net),
			 net_name(z->net));
		return -1;
	}
	if (p->userns != z->userns) {
		snprintf(err, len, "the run asks for --userns %s but this zygote was started with "
			 "--userns %s", userns_name(p->userns), userns_name(z->userns));
		return -1;
	}
	if (!p->pidns) {
		snprintf(err, len, "the run asks for no --pidns, but the zygote forks each program "
			 "into its run's PID namespace (run it with corral-launch)");
		return -1;
	}
	return 0;
}

static NORETURN void run_a(const struct zygote *z, struct plan *p, const char *perr,
			   const int *fds, char **args, size_t nargs)
{
	struct launch L;
	char err[768];
	int sock;

	sock = step_fds(fds, perr ? -1 : p->report_fd);
	/* every disposition default and nothing blocked: the spawner's, which it set once */
	if (perr)
		usage_error(perr);
	if (p->mode != PLAN_RUN)
		usage_error("--probe, --kill-uid and --help are not runs");
	if (check_namespaces(z, p, err, sizeof err) != 0 ||
	    py_check_run(z, p, err, sizeof err) != 0)
		usage_error(err);
	launch_init(&L);
	L.parent = z->self;             /* the launcher's parent is the zygote, not --parent-pid's
					 * host */
	L.shared = &z->ns;
	L.seccomp_ready = 1;            /* the program gets the filter from the zygote */
	program_prepare(&L, sock, args, nargs);
	launch_run(&L, p);
}

/* ---- the spawner ---- */

static int reply(int sock, long v)
{
	char num[24];
	ssize_t n;

	snprintf(num, sizeof num, "%ld", v);
	do
		n = send(sock, num, strlen(num) + 1, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : 0;
}

/* One request: "run\0ID\0ARGS..." (checked by the zygote) with SPAWN_NFDS fds. */
static void spawn_one(const struct zygote *z, int sock, char *msg, size_t len, int *fds, int nfds)
{
	static char *argv[ARGS_MAX + 1];
	struct plan plan;
	char perr[256];
	size_t nf = 0, off = 0;
	int i, parsed = 0;
	long pid = -EINVAL;

	while (off < len && nf < ARGS_MAX) {
		argv[nf++] = msg + off;
		off += strlen(msg + off) + 1;
	}
	argv[nf] = NULL;
	if (nfds == SPAWN_NFDS && nf >= 2 && len > 0 && msg[len - 1] == '\0') {
		/* argv[1], the ID, becomes plan_parse's argv[0]: the arguments follow. */
		parsed = plan_parse(&plan, (int)(nf - 1), argv + 1, perr, sizeof perr) == 0;
		pid = syscall(SYS_clone, CLONE_PARENT, NULL, NULL, NULL, 0);
		if (pid == 0)
			run_a(z, &plan, parsed ? NULL : perr, fds, argv + 1, nf - 1);
		if (pid < 0)
			pid = -errno;
		if (parsed)
			plan_free(&plan);
	}
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	if (reply(sock, pid) != 0)
		_exit(0);       /* the zygote is gone */
}

struct span {
	uintptr_t inside;       /* an address in the library */
	uintptr_t start, end;   /* its mappings, from the first to the end of the last */
};

static int find_span(struct dl_phdr_info *info, size_t size, void *data)
{
	struct span *sp = data;
	uintptr_t lo = UINTPTR_MAX, hi = 0, a, b;
	int i, has = 0;

	(void)size;
	for (i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type != PT_LOAD)
			continue;
		a = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
		b = a + info->dlpi_phdr[i].p_memsz;
		has |= sp->inside >= a && sp->inside < b;
		lo = a < lo ? a : lo;
		hi = b > hi ? b : hi;
	}
	if (!has)
		return 0;
	sp->start = lo & ~(uintptr_t)4095;
	sp->end = (hi + 4095) & ~(uintptr_t)4095;
	return 1;
}

/* Unmaps libpython, found by one of its functions. Nothing to do when Python is linked in
 * statically (the function is in the executable's own span, which is left alone). */
static void drop_python(void)
{
#if !defined(__SANITIZE_ADDRESS__)      /* ASan's reports walk every loaded library */
	struct span sp = { (uintptr_t)&Py_IsInitialized, 0, 0 };
	uintptr_t self = (uintptr_t)&drop_python;

	if (dl_iterate_phdr(find_span, &sp) == 1 && !(self >= sp.start && self < sp.end))
		munmap((void *)sp.start, sp.end - sp.start);
#endif
}

static NORETURN void spawner_main(const struct zygote *z, int sock)
{
	char *buf = malloc(MSG_MAX);
	int fds[SPAWN_NFDS + 1];

	prctl(PR_SET_NAME, "corral-spawner", 0, 0, 0);
	if (!buf || prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != z->self)
		_exit(0);
	drop_python();
	/* Each launcher is a copy of the spawner: every disposition default and nothing blocked,
	 * here once rather than in every launcher (64 system calls). The spawner changes none
	 * afterwards. */
	signals_reset();
	for (;;) {
		struct pollfd pf = { sock, POLLIN, 0 };
		int nfds, cut;
		ssize_t n;

		if (poll(&pf, 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			_exit(0);
		}
		n = ctl_recv(sock, buf, MSG_MAX, fds, SPAWN_NFDS + 1, &nfds, &cut);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0 && nfds == 0)
			_exit(0);       /* EOF: the zygote is done */
		spawn_one(z, sock, buf, cut ? 0 : (size_t)n, fds, nfds);    /* cut: refused, fds
									     * closed */
		/* The next launcher is a copy of this memory: nothing of this request may be in
		 * it. */
		memset(buf, 0, (size_t)(n > 0 ? n : 0));
	}
}

int spawner_start(struct zygote *z)
{
	return helper_fork(z, spawner_main, &z->spawner, &z->spawner_pid);
}

pid_t spawner_fork(const struct zygote *z, const char *msg, size_t len, const int *fds,
		   int runsock)
{
	int all[SPAWN_NFDS];
	char num[24];
	ssize_t n;
	long v;

	memcpy(all, fds, RUN_NFDS * sizeof *fds);
	all[SPAWN_RUNSOCK] = runsock;
	if (msg_send(z->spawner, msg, len, all, SPAWN_NFDS) != 0)
		return -1;
	do
		n = recv(z->spawner, num, sizeof num - 1, 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0) {
		errno = n == 0 ? EPIPE : errno;
		return -1;
	}
	num[n] = '\0';
	v = strtol(num, NULL, 10);
	if (v <= 0) {
		errno = v < 0 ? (int)-v : EPROTO;
		return -1;
	}
	return (pid_t)v;
}

/* At the zygote's end: EOF to the spawner, which exits on it, and the spawner waited for, so that
 * it is not left a zombie for whichever process inherits it (a container's pid 1 may never reap
 * it). */
void spawner_stop(struct zygote *z)
{
	int st;

	if (z->spawner >= 0)
		close(z->spawner);
	z->spawner = -1;
	while (z->spawner_pid > 0 && waitpid(z->spawner_pid, &st, 0) < 0 && errno == EINTR)
		;
	z->spawner_pid = 0;
}
