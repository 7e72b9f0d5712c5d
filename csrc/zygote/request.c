/* request.c: run requests.
 *
 * `run\0ID\0ARG...` with exactly four fds (stdin, stdout, stderr, report): Z parses the
 * arguments (plan_parse, as the launcher would), prepares the seccomp filter (kept per distinct
 * filter: building one with libseccomp costs more than the rest of A's set-up), forks A, says
 * `pid\0ID\0PID` and goes on with the next message; when A has been reaped it says
 * `exit\0ID\0STATUS` (the raw wait status). A request that cannot start gets `error\0ID\0WHY`
 * and nothing else.
 *
 * A puts the run's fds in place, checks what only the zygote forbids (a network or user
 * namespace other than the zygote's, another interpreter, other interpreter options, another
 * locale), and then follows the launcher's own flow (launch_run): the same report, the same
 * supervision, the same exit status. A usage error is written to the run's stderr as the
 * launcher writes its own ("corral-zygote: ...", exit 2).
 */
#include "zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARGS_MAX 65536          /* arguments in one request; plan.c bounds each kind anyway */
#define FILTERS_MAX 16          /* distinct seccomp filters kept */
#define STOP_MS 2000            /* at the end, how long the runs get to end after SIGTERM (A's
				 * own B gets 1 s: INIT_STOP_MS) */

/* ---- the runs going on: A's pid and the request's ID ---- */

struct run {
	pid_t pid;
	char id[24];
};

static struct run *runs;
static size_t nruns, caprun;

static int runs_add(pid_t pid, const char *id)
{
	if (nruns == caprun) {
		size_t cap = caprun ? 2 * caprun : 64;
		struct run *r = realloc(runs, cap * sizeof *r);

		if (!r)
			return -1;
		runs = r;
		caprun = cap;
	}
	runs[nruns].pid = pid;
	snprintf(runs[nruns].id, sizeof runs[nruns].id, "%s", id);
	nruns++;
	return 0;
}

/* ---- seccomp filters: one per distinct deny list ---- */

struct filter {
	char *key;
	void *state;
};

static struct filter filters[FILTERS_MAX];
static size_t nfilters, next_filter;
static struct filter *loaded;   /* the one in seccomp.c's state now */

/* What seccomp_prepare() builds from: the sockets rule and the names, in order. */
static char *filter_key(const struct plan *p, int sockets)
{
	size_t i, len = 4;
	char *k, *e;

	for (i = 0; i < p->ndeny_syscall; i++)
		len += strlen(p->deny_syscall[i]) + 1;
	k = malloc(len);
	if (!k)
		return NULL;
	e = k + sprintf(k, "%d", sockets);
	for (i = 0; i < p->ndeny_syscall; i++)
		e += sprintf(e, " %s", p->deny_syscall[i]);
	return k;
}

/* In Z, before the fork: the filter of this plan in seccomp.c's state, built once. */
static void filter_prepare(const struct zygote *z, const struct plan *p)
{
	struct launch L;
	struct filter *f;
	char *key;
	size_t i;

	memset(&L, 0, sizeof L);
	L.plan = p;
	L.netns = z->ns.net_got;
	key = filter_key(p, p->deny_sockets == 1 ||
				(p->deny_sockets == 2 && (!L.netns || ns_net_shared())));
	for (i = 0; key && i < nfilters; i++) {
		if (strcmp(filters[i].key, key) == 0) {
			if (loaded != &filters[i])
				seccomp_state_load(filters[i].state);
			loaded = &filters[i];
			free(key);
			return;
		}
	}
	seccomp_prepare(&L);
	loaded = NULL;
	if (!key)
		return;
	f = &filters[next_filter];
	next_filter = (next_filter + 1) % FILTERS_MAX;
	if (f->key) {
		free(f->key);
		free(f->state);
	} else {
		nfilters++;
	}
	f->key = key;
	f->state = malloc(seccomp_state_size());
	if (f->state) {
		seccomp_state_save(f->state);
		loaded = f;
	} else {
		free(f->key);
		f->key = NULL;
		nfilters--;
	}
}

/* ---- A ---- */

static NORETURN void usage_error(const char *what)
{
	dprintf(STDERR_FILENO, "corral-zygote: %s\n", what);
	_exit(EXIT_USAGE);
}

/* The run's fds on 0, 1, 2 and the report fd, and nothing else open: the control socket, the
 * signalfd and other runs' fds stay with the zygote. */
static void step_fds(const int *fds, int rfd)
{
	int hi[RUN_NFDS], i, base = rfd >= 3 ? rfd + 1 : 3;

	/* Above every target first, so that no dup2() below overwrites a source. */
	for (i = 0; i < RUN_NFDS; i++) {
		hi[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, base);
		if (hi[i] < 0)
			_exit(EXIT_SETUP);
	}
	for (i = 0; i < 3; i++)
		if (dup2(hi[i], i) < 0)
			_exit(EXIT_SETUP);
	if (rfd >= 0 && dup2(hi[RUN_REPORT], rfd) < 0)
		_exit(EXIT_SETUP);
	if (rfd > 3)
		close_fds(3, rfd - 1);
	close_fds(rfd >= 3 ? rfd + 1 : 3, -1);
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
	return 0;
}

static NORETURN void run_a(const struct zygote *z, struct plan *p, const char *perr,
			   const int *fds)
{
	struct launch L;
	char err[768];

	step_fds(fds, perr ? -1 : p->report_fd);
	signals_reset();
	if (perr)
		usage_error(perr);
	if (p->mode != PLAN_RUN)
		usage_error("--probe, --kill-uid and --help are not runs");
	if (check_namespaces(z, p, err, sizeof err) != 0 ||
	    py_check_run(z, p, err, sizeof err) != 0)
		usage_error(err);
	memset(&L, 0, sizeof L);
	L.parent = z->self;             /* A's parent is the zygote, not --parent-pid's host */
	L.shared = &z->ns;
	L.seccomp_ready = 1;
	L.run_program = py_run_program;
	launch_run(&L, p);
}

/* ---- Z ---- */

static void send3(const struct zygote *z, const char *a, const char *b, const char *c)
{
	const char *f[3] = { a, b, c };

	ctl_send(z->ctl, f, 3);         /* a gone host: the loop sees EOF */
}

/* The ID as given when it is a decimal u64, else "0". */
static const char *request_id(const char *s)
{
	size_t n = strlen(s), i;

	if (n == 0 || n > 20 || (n == 20 && strcmp(s, "18446744073709551615") > 0))
		return "0";
	for (i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return "0";
	return s;
}

void request_handle(struct zygote *z, char *msg, size_t len, int *fds, int nfds, int cut)
{
	static char *argv[ARGS_MAX + 1];
	struct plan plan;
	char perr[256], num[24];
	const char *id = "0", *why = NULL;
	size_t nf = 0, off = 0;
	int i, parsed;
	pid_t pid;

	/* Split into fields: the last one must end the message. */
	if (len == 0 || msg[len - 1] != '\0')
		why = "bad message: not a sequence of NUL-terminated strings";
	while (!why && off < len) {
		if (nf == ARGS_MAX) {
			why = "too many arguments";
			break;
		}
		argv[nf++] = msg + off;
		off += strlen(msg + off) + 1;
	}
	if (!why && strcmp(argv[0], "run") != 0)
		why = "unknown request (expected run)";
	if (!why && nf < 2)
		why = "bad run request: no ID";
	if (!why)
		id = request_id(argv[1]);
	if (!why && id != argv[1])
		why = "bad run request: the ID is not a decimal number below 2^64";
	if (!why && cut)
		why = "bad run request: the message or its fds were cut short (too long, or more "
		      "than 4 fds)";
	if (!why && nfds != RUN_NFDS)
		why = "bad run request: it must carry exactly 4 fds (stdin, stdout, stderr, report)";
	if (why) {
		send3(z, "error", id, why);
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}

	/* argv[1] becomes plan_parse's argv[0]: the arguments follow. */
	parsed = plan_parse(&plan, (int)(nf - 1), argv + 1, perr, sizeof perr) == 0;
	if (parsed && plan.mode == PLAN_RUN && plan.seccomp != PLAN_MECH_OFF)
		filter_prepare(z, &plan);
	pid = fork();
	if (pid == 0)
		run_a(z, &plan, parsed ? NULL : perr, fds);
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	if (parsed)
		plan_free(&plan);
	if (pid < 0) {
		snprintf(perr, sizeof perr, "fork failed: %s", strerror(errno));
		send3(z, "error", id, perr);
		return;
	}
	if (runs_add(pid, id) != 0) {
		/* Untracked, A could not be reported: end it now. */
		kill(pid, SIGKILL);
		send3(z, "error", id, "out of memory");
		return;
	}
	snprintf(num, sizeof num, "%d", (int)pid);
	send3(z, "pid", id, num);
}

static struct run *find(pid_t pid)
{
	size_t i;

	for (i = 0; i < nruns; i++)
		if (runs[i].pid == pid)
			return &runs[i];
	return NULL;
}

void request_reap(struct zygote *z)
{
	char num[16];
	int st;
	pid_t pid;

	while ((pid = waitpid(-1, &st, WNOHANG)) > 0 || (pid < 0 && errno == EINTR)) {
		struct run *r = pid > 0 ? find(pid) : NULL;

		if (!r)
			continue;
		snprintf(num, sizeof num, "%d", st);
		send3(z, "exit", r->id, num);
		*r = runs[--nruns];
	}
}

void request_stop_all(struct zygote *z)
{
	long long deadline = now_ms() + STOP_MS;
	size_t i;
	int st;
	pid_t pid;

	(void)z;
	for (i = 0; i < nruns; i++)
		kill(runs[i].pid, SIGTERM);     /* A ends its run as a launcher does */
	while (nruns > 0) {
		pid = waitpid(-1, &st, WNOHANG);
		if (pid > 0) {
			struct run *r = find(pid);

			if (r)
				*r = runs[--nruns];
			continue;
		}
		if (pid < 0 && errno != EINTR)
			break;
		if (now_ms() >= deadline) {
			for (i = 0; i < nruns; i++) {
				kill(-runs[i].pid, SIGKILL);
				kill(runs[i].pid, SIGKILL);
			}
			deadline = now_ms() + STOP_MS;
		}
		usleep(1000);
	}
}
