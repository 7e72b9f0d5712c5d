/* corral-zygote: a warm interpreter that forks one fully confined run per request.
 *
 *   corral-zygote --control-fd N [--parent-pid PID] [--net new|require|host] [--userns MODE]
 *                 [--python PATH] [--preload MOD,MOD...] [--command TEXT] [--flush-handlers]
 *                 [--env NAME=VALUE]...
 *
 * main() is the flat list of the zygote's own steps, in order; then the loop serves the control
 * socket (request.c). The protocol is docs/internals.md, section "corral-zygote".
 */
#include "zygote.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define ENV_MAX 1024

static const char help_text[] =
	"usage: corral-zygote --control-fd N [OPTIONS]\n"
	"\n"
	"A warm Python interpreter that forks one run per request on the control socket\n"
	"N (a SOCK_SEQPACKET unix socket), each confined exactly as corral-launch would\n"
	"confine it (see docs/internals.md, \"corral-zygote\").\n"
	"\n"
	"options:\n"
	"  --control-fd N        the control socket (required)\n"
	"  --parent-pid PID      exit at once unless the parent's pid is PID\n"
	"  --net new|require|host\n"
	"                        the network namespace made once for all runs (off is\n"
	"                        host); require: refusal is fatal; default host\n"
	"  --userns auto|never|always\n"
	"                        as corral-launch's; default auto\n"
	"  --python PATH         the interpreter runs ask for, sys.executable\n"
	"                        (default /usr/bin/python3)\n"
	"  --preload MOD,...     modules imported once, before any run\n"
	"  --command TEXT        a `-c TEXT` of the runs (corral's prelude), compiled\n"
	"                        once: runs with that command do not compile it\n"
	"  --flush-handlers      every program has the handlers of corral's prelude:\n"
	"                        stdout and stderr flushed on SIGXCPU (then death by\n"
	"                        it) and on signal 63 (then death by SIGKILL)\n"
	"  --env NAME=VALUE      repeatable: the environment Python starts in (its\n"
	"                        locale: runs must have the same LC_ALL, LC_CTYPE, LANG)\n"
	"  --help                this text\n";

static struct zygote z;
static char *env_store[ENV_MAX + 1];

/* ---- the command line ---- */

static int number(const char *s, long long max, long long *out)
{
	char *end;
	long long v;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (*end || errno || v > max)
		return -1;
	*out = v;
	return 0;
}

/* 0, 1 for --help, or -1 with err. */
static int parse_args(int argc, char **argv, char *err, size_t len)
{
	int i, seen_net = 0, seen_userns = 0, seen_python = 0, seen_preload = 0, seen_parent = 0;
	long long n;

	z.ctl = -1;
	z.spawner = -1;
	z.closer = -1;
	z.net = PLAN_NET_HOST;
	z.userns = PLAN_USERNS_AUTO;
	z.python = "/usr/bin/python3";
	z.env = env_store;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = NULL;
		size_t k = strcspn(a, "=");

		if (strcmp(a, "--help") == 0)
			return 1;
		if (k == strlen("--flush-handlers") && strncmp(a, "--flush-handlers", k) == 0) {
			/* the one without a value */
			if (a[k] == '=') {
				snprintf(err, len, "--flush-handlers takes no value");
				return -1;
			}
			if (z.flush_handlers++) {
				snprintf(err, len, "--flush-handlers given twice");
				return -1;
			}
			continue;
		}
		if (strncmp(a, "--", 2) != 0) {
			snprintf(err, len, "unexpected argument '%.64s' (see --help)", a);
			return -1;
		}
		if (a[k] == '=')
			v = a + k + 1;
		else if (i + 1 < argc)
			v = argv[++i];
		if (!v) {
			snprintf(err, len, "%.64s needs a value", a);
			return -1;
		}
#define IS(name) (k == strlen(name) && strncmp(a, name, k) == 0)
		if (IS("--control-fd")) {
			if (z.ctl >= 0 || number(v, INT_MAX, &n) != 0) {
				snprintf(err, len, "--control-fd: '%.64s' is not a file descriptor (or "
					 "given twice)", v);
				return -1;
			}
			z.ctl = (int)n;
		} else if (IS("--parent-pid")) {
			if (seen_parent++ || number(v, INT_MAX, &n) != 0 || n < 1) {
				snprintf(err, len, "--parent-pid: '%.64s' is not a pid (or given twice)", v);
				return -1;
			}
			z.parent = (pid_t)n;
		} else if (IS("--net")) {
			if (seen_net++)
				goto twice;
			if (strcmp(v, "new") == 0)
				z.net = PLAN_NET_NEW;
			else if (strcmp(v, "require") == 0)
				z.net = PLAN_NET_REQUIRE;
			else if (strcmp(v, "host") == 0 || strcmp(v, "off") == 0)
				z.net = PLAN_NET_HOST;
			else {
				snprintf(err, len, "--net: '%.64s' is not new, require or host", v);
				return -1;
			}
		} else if (IS("--userns")) {
			if (seen_userns++)
				goto twice;
			if (strcmp(v, "auto") == 0)
				z.userns = PLAN_USERNS_AUTO;
			else if (strcmp(v, "never") == 0)
				z.userns = PLAN_USERNS_NEVER;
			else if (strcmp(v, "always") == 0)
				z.userns = PLAN_USERNS_ALWAYS;
			else {
				snprintf(err, len, "--userns: '%.64s' is not auto, never or always", v);
				return -1;
			}
		} else if (IS("--python")) {
			if (seen_python++)
				goto twice;
			if (v[0] != '/') {
				snprintf(err, len, "--python: '%.64s' is not an absolute path", v);
				return -1;
			}
			z.python = v;
		} else if (IS("--preload")) {
			if (seen_preload++)
				goto twice;
			z.preload = v;
		} else if (IS("--command")) {
			if (z.command)
				goto twice;
			z.command = v;
		} else if (IS("--env")) {
			if (!strchr(v, '=') || v[0] == '=') {
				snprintf(err, len, "--env: '%.64s' is not NAME=VALUE", v);
				return -1;
			}
			if (z.nenv == ENV_MAX) {
				snprintf(err, len, "--env given more than %d times", ENV_MAX);
				return -1;
			}
			env_store[z.nenv++] = (char *)v;
		} else {
			snprintf(err, len, "unknown option %.*s (see --help)", (int)(k > 64 ? 64 : k), a);
			return -1;
		}
#undef IS
	}
	if (z.ctl < 0) {
		snprintf(err, len, "--control-fd is required");
		return -1;
	}
	return 0;
twice:
	snprintf(err, len, "%.64s given twice", argv[i - 1]);
	return -1;
}

/* ---- steps ---- */

static NORETURN void failed(const char *msg)
{
	const char *f[2] = { ZP_FAILED, msg };

	ctl_send(z.ctl, f, 2);
	_exit(ZYGOTE_FAILED);
}

/* 1. The control socket is what the protocol needs. */
static int step_control(char *err, size_t len)
{
	int type = 0;
	socklen_t l = sizeof type;

	if (getsockopt(z.ctl, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_SEQPACKET) {
		snprintf(err, len, "--control-fd %d is not a SOCK_SEQPACKET socket", z.ctl);
		return -1;
	}
	fcntl(z.ctl, F_SETFD, FD_CLOEXEC);
	return 0;
}

/* 2. Nothing inherited but 0-2 and the control socket; 0-2 open (on /dev/null where they are
 * not), so that Python makes all three standard streams at start-up, as for a run. */
static void step_fds(void)
{
	int fd;

	if (z.ctl > 3)
		close_fds(3, z.ctl - 1);
	close_fds(z.ctl >= 3 ? z.ctl + 1 : 3, -1);
	for (fd = 0; fd <= 2; fd++) {
		if (fcntl(fd, F_GETFD) >= 0)
			continue;
		if (open("/dev/null", O_RDWR) != fd)
			failed("cannot open /dev/null");
	}
}

/* 3. Die with the host; with --parent-pid, make sure it did not die before the prctl. */
static void step_die_with_parent(void)
{
	pid_t before = getppid();

	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
		failed("prctl(PR_SET_PDEATHSIG) failed");
	if (getppid() != (z.parent ? z.parent : before))
		failed("the parent exited before the zygote could tie itself to it (or "
		       "--parent-pid is not the parent)");
	z.parent = getppid();
}

/* 4. A session of its own: the host's signals to its group do not reach it by accident. Each
 * launcher makes its own. */
static void step_session(void)
{
	setsid();
}


/* The report lines written on fd in, as separate strings. */
static int read_lines(int in, struct strv *lines)
{
	char buf[8192], *s, *nl;
	size_t have = 0;
	ssize_t n;

	while ((n = read(in, buf + have, sizeof buf - 1 - have)) > 0)
		have += (size_t)n;
	buf[have] = '\0';
	for (s = buf; (nl = strchr(s, '\n')) != NULL; s = nl + 1) {
		*nl = '\0';
		if (*s && strv_add(lines, s) != 0)
			return -1;
	}
	return 0;
}

/* 6. The network namespace, and the user namespace it needs, once for all runs (ns.c): the
 * same lines as a launcher's, collected for the ready message. */
static void step_namespaces(struct strv *lines)
{
	struct plan plan;
	struct launch L;
	int p[2], r;

	memset(&plan, 0, sizeof plan);
	plan.net = z.net;
	plan.userns = z.userns;
	plan.report_fd = -1;
	launch_init(&L);
	L.plan = &plan;
	if (pipe2(p, O_CLOEXEC) != 0)
		failed("cannot make a pipe");
	report_open(&L, p[1]);
	r = ns_apply_shared(&L, &z.ns);
	report_flush();         /* the lines are buffered (report.c) */
	report_open(NULL, -1);  /* L goes with this frame */
	close(p[1]);
	if (read_lines(p[0], lines) != 0)
		failed("out of memory");
	close(p[0]);
	if (r != 0)
		failed(lines->n ? lines->v[lines->n - 1] : "the namespaces could not be made");
}

/* 6b. the spawner, which starts each run's launcher (spawner.c), and the closer, which closes the
 * runs' mount namespaces (closer.c): forked now, while we are small, inside the namespaces just
 * made. */
static void step_spawner(void)
{
	if (spawner_start(&z) != 0)
		failed("cannot start the spawner process");
	closer_start(&z);       /* without it, the zygote closes the runs' namespaces itself */
	if (program_key() != 0)
		failed("cannot draw the key that checks the runs' requests (getrandom)");
}

/* 6c. corral-init, next to our executable, for the direct runs (direct.c); without it every run
 * goes by the spawner. */
static void step_init(void)
{
	char self[4096], *slash;
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);

	if (n <= 0)
		return;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (!slash)
		return;
	*slash = '\0';
	direct_open(self);
}

/* 6d. glibc's unwinder, loaded once for every run. pthread_exit (and a cancellation) unwinds the
 * thread with libgcc_s, which glibc dlopens at the first of them in a process; when that fails it
 * aborts the whole process. In a run it can fail: the program may have used up its fds or its
 * address space (CPython calls pthread_exit for a daemon thread that wakes during finalization).
 * A thread that exits here makes glibc load it now, and its handle is inherited by every fork.
 * Without libgcc_s on the host nothing is done: a thread's exit aborts everywhere there. */
static void *exit_at_once(void *arg)
{
	pthread_exit(arg);
}

static void step_unwinder(void)
{
	pthread_attr_t attr;
	pthread_t t;
	int e;

	if (!dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NODELETE))
		return;
	/* a small stack: glibc keeps a joined thread's stack for reuse, and every run inherits it
	 * in its address space */
	if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, 256 * 1024) != 0)
		failed("cannot set up a thread to load glibc's unwinder");
	e = pthread_create(&t, &attr, exit_at_once, NULL);
	pthread_attr_destroy(&attr);
	if (e != 0 || pthread_join(t, NULL) != 0)
		failed("cannot start a thread to load glibc's unwinder");
}

/* 7. (python.c) The interpreter, the preloaded modules. */
static void step_python(struct strv *lines)
{
	char err[1024];

	exec_prepare();                 /* the memory layout the runs share (exec.c) */
	if (py_start(&z, lines, err, sizeof err) != 0)
		failed(err);
}

/* 8. Nothing of the interpreter's may be forked into the runs but memory: no thread (a fork
 * copies only the calling one, and a lock held by another stays held), no fd besides 0-2, the
 * control socket, the spawner's and corral-init's (each program closes those). */
static void step_check_inherited(void)
{
	char err[256], path[64], target[128];
	struct dirent *e;
	DIR *d;
	ssize_t n;
	int fd, tasks = 0;
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];

	while (f && fgets(line, sizeof line, f))
		if (strncmp(line, "Threads:", 8) == 0)
			tasks = atoi(line + 8);
	if (f)
		fclose(f);
	if (tasks > 1) {
		snprintf(err, sizeof err, "a preloaded module started %d threads: a fork would copy "
			 "only one of them", tasks - 1);
		failed(err);
	}
	d = opendir("/proc/self/fd");
	while (d && (e = readdir(d)) != NULL) {
		fd = atoi(e->d_name);
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd <= 2 || fd == z.ctl ||
		    fd == z.spawner || fd == z.closer || fd == direct_fd() || fd == dirfd(d))
			continue;
		snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		n = readlink(path, target, sizeof target - 1);
		target[n > 0 ? n : 0] = '\0';
		snprintf(err, sizeof err, "the interpreter or a preloaded module left fd %d open "
			 "(%s): the runs would inherit it", fd, target);
		failed(err);
	}
	if (d)
		closedir(d);
}

/* 9. SIGCHLD read from a signalfd: the launcher's end is seen in the loop; SIGTERM, SIGINT and
 * SIGHUP too: they end the zygote as EOF does, its runs first. */
static void step_signals_read(void)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
		failed("cannot block SIGCHLD, SIGTERM, SIGINT and SIGHUP");
	z.sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (z.sigfd < 0)
		failed("cannot make a signalfd");
}

/* 10. ready, what was set up, what could not be preloaded. */
static void step_ready(struct strv *lines)
{
	const char **f = malloc((lines->n + 1) * sizeof *f);
	size_t i;

	if (!f)
		failed("out of memory");
	f[0] = ZP_READY;
	for (i = 0; i < lines->n; i++)
		f[i + 1] = lines->v[i];
	if (ctl_send(z.ctl, f, lines->n + 1) != 0)
		_exit(ZYGOTE_FAILED);
	free(f);
	strv_free(lines);
}

/* ---- the loop ---- */

/* After a read of nothing: whether that was the host's EOF rather than an empty record. Linux
 * flags the peer's shutdown in poll (POLLRDHUP); gVisor does not, but then every read returns
 * nothing again, where after an empty record the next one has bytes or is not there yet. (Two
 * empty records in a row, which the host never sends, are taken for EOF there.) */
static int ctl_eof(int fd, short revents)
{
	char c;
	ssize_t n;

	if (revents & (POLLRDHUP | POLLHUP | POLLERR))
		return 1;
	do
		n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n == 0;
}

static NORETURN void serve(void)
{
	char *buf = malloc(MSG_MAX);
	int fds[RUN_NFDS + 1];
	size_t cap = 16, npf;
	struct pollfd *pf = malloc(cap * sizeof *pf);

	if (!buf || !pf)
		failed("out of memory");
	for (;;) {
		int nfds, cut;
		ssize_t n;

		pf[0].fd = z.ctl;
		pf[0].events = POLLIN | POLLRDHUP | (ctl_queued() ? POLLOUT : 0);
		pf[1].fd = z.sigfd;
		pf[1].events = POLLIN;
		pf[0].revents = pf[1].revents = 0;
		npf = request_poll(&z, &pf, &cap, 2);       /* the runs' sockets: the init's
							     * requests */
		if (poll(pf, (nfds_t)npf, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		request_polled(&z, pf, 2, npf);
		/* Without the spawner no run can start: once the last one is done, the host sees
		 * EOF and starts another zygote (corral.warm replaces one that exited). */
		if (z.broken && request_idle())
			break;
		if (pf[1].revents & POLLIN) {
			struct signalfd_siginfo si;
			int stop = 0;

			while (read(z.sigfd, &si, sizeof si) == (ssize_t)sizeof si)
				if (si.ssi_signo != SIGCHLD)
					stop = 1;
			request_reap(&z);
			if (stop)
				break;
		}
		if ((pf[0].revents & POLLOUT) && ctl_flush(z.ctl) != 0)
			break;
		if (!(pf[0].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
			continue;
		n = ctl_recv(z.ctl, buf, MSG_MAX, fds, RUN_NFDS + 1, &nfds, &cut);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			continue;
		/* A record may be empty: EOF is a read of nothing once the host shut its end. */
		if (n < 0 || (n == 0 && nfds == 0 && ctl_eof(z.ctl, pf[0].revents)))
			break;          /* EOF: the host is done */
		request_handle(&z, buf, (size_t)n, fds, nfds, cut);
		/* The next run is forked from this memory: nothing of this request may be in it
		 * (its environment may hold a caller's secret). */
		memset(buf, 0, (size_t)(n > 0 ? n : 0));
	}
	request_stop_all(&z);
	spawner_stop(&z);
	closer_stop(&z);
	_exit(0);
}

int main(int argc, char **argv)
{
	struct strv lines = { 0 };
	char err[256];
	int r;

	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);     /* 0. as the launcher: no ptrace, no fd theft */
	/* the options point into a copy: a run's init forked from us (the spawner, launcher, init)
	 * hides the original, which holds the controller's pid (steps.c); we keep ours for the
	 * host's tools */
	argv = args_copy(argc, argv);
	if (!argv) {
		fprintf(stderr, "corral-zygote: out of memory\n");
		return EXIT_USAGE;
	}
	r = parse_args(argc, argv, err, sizeof err);
	if (r == 1) {
		fputs(help_text, stdout);
		return 0;
	}
	if (r != 0) {
		char ignore[8];
		const char *f[2] = { ZP_FAILED, err };

		fprintf(stderr, "corral-zygote: %s\n", err);
		/* The host may be waiting for ready: tell it, when the socket is usable. */
		if (z.ctl >= 0 && step_control(ignore, sizeof ignore) == 0)
			ctl_send(z.ctl, f, 2);
		return EXIT_USAGE;
	}
	if (step_control(err, sizeof err) != 0) {       /* 1. */
		fprintf(stderr, "corral-zygote: %s\n", err);
		return EXIT_USAGE;
	}
	z.self = getpid();
	step_fds();                     /* 2. nothing inherited */
	step_die_with_parent();         /* 3. PR_SET_PDEATHSIG, the parent's pid */
	step_session();                 /* 4. setsid */
	signals_reset();                 /* 5. default dispositions */
	step_namespaces(&lines);        /* 6. network (and user) namespace (ns.c) */
	step_spawner();                 /* 6b. The spawner, which starts the runs' launcher
					 * (spawner.c); the closer (closer.c) */
	step_init();                    /* 6c. corral-init, for the direct runs (direct.c) */
	step_unwinder();                /* 6d. libgcc_s, which a thread's exit needs */
	step_python(&lines);            /* 7. the interpreter (python.c) */
	step_check_inherited();         /* 8. one thread, no extra fd */
	step_signals_read();            /* 9. SIGCHLD, and the ones that end the zygote */
	step_ready(&lines);             /* 10. */
	serve();
}
