/* plan.c: parse the command line into a struct plan (pure: no system calls, no output). */
#include "plan.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const rlimit_names[PLAN_RL_COUNT] = {
	[PLAN_RL_CPU] = "cpu",
	[PLAN_RL_AS] = "as",
	[PLAN_RL_FSIZE] = "fsize",
	[PLAN_RL_CORE] = "core",
	[PLAN_RL_NOFILE] = "nofile",
	[PLAN_RL_NPROC] = "nproc",
	[PLAN_RL_SIGPENDING] = "sigpending",
	[PLAN_RL_MSGQUEUE] = "msgqueue",
};

static const char help_text[] =
	"usage: corral-launch [OPTIONS] -- PROGRAM [ARGS...]\n"
	"       corral-launch --probe\n"
	"       corral-launch --kill-uid U\n"
	"       corral-launch --hold-net [--userns MODE] [--parent-pid PID]\n"
	"       corral-launch --relay --status-fd N -- PROGRAM [ARGS...]\n"
	"       corral-launch --help\n"
	"\n"
	"Runs PROGRAM in a new process under a confinement plan: a new session, death\n"
	"with the parent, optional network and PID namespaces (with a user namespace\n"
	"when needed), rlimits, uid/gid, no_new_privs, a working directory, every fd\n"
	"above 2 closed, exactly the given environment. Kills every descendant when the\n"
	"program ends, and reports what it applied (see docs/internals.md).\n"
	"\n"
	"options:\n"
	"  --report-fd N         write the report to fd N (the host passes 3);\n"
	"                        default: no report\n"
	"  --parent-pid PID      exit 125 at once unless the parent's pid is PID\n"
	"  --net new|require|host\n"
	"                        new: an empty network namespace (only lo), or\n"
	"                        run without one when refused; require: refusal\n"
	"                        is fatal (exit 125); default host\n"
	"  --net-join PID        with --net new|require: join the network namespace\n"
	"                        (and its user namespace) that the --hold-net\n"
	"                        process PID, a child of our parent, keeps; a new\n"
	"                        one when that cannot be done safely\n"
	"  --pidns               a new PID namespace, under an init, with its own\n"
	"                        /proc (in a new mount namespace) when allowed\n"
	"  --no-pidns            no PID namespace: a subreaper kills the\n"
	"                        descendants (default)\n"
	"  --userns auto|never|always\n"
	"                        auto (default): add a user namespace only when\n"
	"                        the namespaces are refused without one\n"
	"  --uid U --gid G       run the program as U:G (both; needs root)\n"
	"  --sweep-uid           after the run, kill every process of uid U\n"
	"                        (default with --uid, without a PID namespace)\n"
	"  --no-sweep-uid        do not\n"
	"  --rlimit NAME=VALUE   repeatable; soft = hard = VALUE (cpu: hard is\n"
	"                        VALUE + 1, so SIGXCPU comes first); NAME: cpu\n"
	"                        (seconds), as, fsize (bytes), core, nofile, nproc,\n"
	"                        sigpending, msgqueue (bytes)\n"
	"  --user-max NAME=VALUE repeatable (at most 16); in the run's own user\n"
	"                        namespace, /proc/sys/user/max_NAME = VALUE (e.g.\n"
	"                        inotify_instances): a quota of the run alone\n"
	"  --env NAME=VALUE      repeatable; the program's whole environment\n"
	"  --chdir DIR           the program's working directory\n"
	"  --tmpfs PATH=BYTES    repeatable (at most 16); with a PID namespace, a\n"
	"                        fresh tmpfs of BYTES at PATH (mode 1777, nosuid,\n"
	"                        nodev), private to the run and gone with it\n"
	"  --ro-bind PATH        repeatable (at most 16); the host directory PATH\n"
	"                        stays visible, read-only, over the --tmpfs mounts\n"
	"  --work-tmpfs BYTES    with a PID namespace, a tmpfs of BYTES on the\n"
	"                        --chdir directory (absolute), mode 0700, owned by\n"
	"                        the program's uid and gid\n"
	"  --work-at PATH        with --work-tmpfs: the work tmpfs at PATH (its\n"
	"                        parent inside a --tmpfs the run mounted), the\n"
	"                        program's cwd; where it cannot be, the work dir\n"
	"                        stays on --chdir and --env values naming PATH\n"
	"                        name --chdir\n"
	"  --code-at PATH        with --ro-bind: the first --ro-bind directory (the\n"
	"                        code's) bound read-only at PATH instead of its own\n"
	"                        path (PATH's parent inside a --tmpfs the run\n"
	"                        mounted); where it cannot be, it stays at its own\n"
	"                        path and program arguments naming PATH name it\n"
	"  --files-in FILE       records PATH\\0MODE\\0SIZE\\0 and SIZE bytes: files\n"
	"                        made in --chdir (relative paths) before the\n"
	"                        program starts, with its uid and gid\n"
	"  --files-wait-fd N     the program reads fd N to its end before it runs\n"
	"                        its code: the init starts it first and makes the\n"
	"                        files of --files-in meanwhile, then closes N's\n"
	"                        other end\n"
	"  --collect GLOB        repeatable (at most 64); after the run, the files\n"
	"                        under --chdir whose relative path matches GLOB\n"
	"                        (\"**\" matches any number of directories) are\n"
	"                        written to --collect-to (docs/internals.md)\n"
	"  --collect-all         every file the run made or changed\n"
	"  --collect-to FILE     where the collected files go (an existing file)\n"
	"  --unlink-files        remove the names of --files-in and --collect-to once\n"
	"                        they are open, before the program exists (the host\n"
	"                        keeps fds of its own)\n"
	"  --collect-max N,FILE,TOTAL\n"
	"                        at most N files, FILE bytes of each and TOTAL\n"
	"                        bytes in all (default 100,8388608,16777216)\n"
	"  --landlock off|auto|require\n"
	"                        Landlock for the program (default off); auto:\n"
	"                        what the kernel offers, the rest reported as\n"
	"                        refused; require: no Landlock is fatal\n"
	"  --fs-ro PATH          repeatable (at most 64); read and execute\n"
	"                        beneath PATH; everything not listed is denied\n"
	"  --fs-rw PATH          repeatable (at most 64); full access beneath PATH\n"
	"  --deny-tcp            no TCP bind or connect (Landlock ABI 4+)\n"
	"  --scope               no abstract unix socket or signal outside the\n"
	"                        run (Landlock ABI 6+)\n"
	"  --separate off|auto|require\n"
	"                        the program is walled off from the controller\n"
	"                        and other runs: a uid of its own (--uid), or\n"
	"                        Landlock's filesystem rules with a PID namespace;\n"
	"                        auto: reported as refused when not; require:\n"
	"                        fatal (default off)\n"
	"  --seccomp off|auto|require\n"
	"                        a seccomp filter for the program (default off)\n"
	"  --deny-syscall NAME   repeatable (at most 256); NAME fails with EPERM\n"
	"  --deny-sockets        socket() of every family but AF_UNIX, and bind(),\n"
	"                        fail with EPERM\n"
	"  --deny-sockets-without-netns\n"
	"                        the same, only when the run has no network\n"
	"                        namespace of its own (none, or a shared one)\n"
	"  --unix-pairs-only     socket(AF_UNIX) and datagram socket pairs fail\n"
	"                        with EPERM: no socket can address another\n"
	"  --deny-pipe-growth    fcntl F_SETPIPE_SZ above 64 KiB fails with EPERM\n"
	"  --flush-signal        before a stop (SIGTERM, SIGINT, SIGHUP) kills the\n"
	"                        run, and when the program ends with processes left,\n"
	"                        signal 63 to them (to the program only without\n"
	"                        --pidns), and until they are gone or --flush-ms\n"
	"                        has passed: corral's prelude flushes its output on it\n"
	"  --flush-ms N          the most the flush may take, 1..10000 (default 50)\n"
	"  --seccomp-cache DIR   keep the built filter in DIR (owned by us, mode\n"
	"                        0700) and load it from there when the same filter\n"
	"                        is asked again\n"
	"  --budget-cpu-ms N     the whole run (every process) may use N ms of CPU\n"
	"  --budget-memory-kb N  the run's processes together may hold N KiB\n"
	"  --budget-poll-ms N    how often the budgets are checked (1..1000,\n"
	"                        default 10)\n"
	"  --cgroup DIR          enforce the budgets with a cgroup made in the\n"
	"                        delegated cgroup v2 directory DIR; polling when\n"
	"                        that is refused\n"
	"  --cgroup-require      no run cgroup is fatal\n"
	"  --prestart            started ahead of its run: everything up to the\n"
	"                        program is done, then the init waits until one\n"
	"                        byte can be read from the report fd (a socket);\n"
	"                        EOF ends the launch without a program\n"
	"  --probe               print what this host allows, one line each\n"
	"  --kill-uid U          kill every process of uid U (not 0) and exit;\n"
	"                        root only\n"
	"  --hold-net            make an empty network namespace (in a user\n"
	"                        namespace when needed, as --userns says), print\n"
	"                        \"ready\" and keep it until the parent dies, a\n"
	"                        signal, or EOF on a pipe or socket stdin\n"
	"  --status-fd N         give PROGRAM (a wrapper such as bwrap, which reports\n"
	"                        a death by signal N as exit 128+N) a pipe at fd N\n"
	"                        (3..1023, not the report fd) on which its --relay\n"
	"                        tells how the wrapped program ended\n"
	"  --relay               inside such a wrapper, with --status-fd N (the fd\n"
	"                        it inherited): run PROGRAM without fd N, write its\n"
	"                        wait status on fd N, exit as it exits (128+N for\n"
	"                        signal N)\n"
	"  --help                this text\n"
	"\n"
	"Options also take the --opt=VALUE form. PROGRAM is used as given (no PATH\n"
	"search). --probe, --kill-uid and --help take no other option; --hold-net\n"
	"takes only --userns, --parent-pid and --held (the holder re-executes\n"
	"itself with it once its namespaces are made).\n"
	"\n"
	"exit status: the program's exit code, or its terminating signal re-raised on\n"
	"the launcher (no core dump); a run ended by SIGTERM, SIGINT or SIGHUP to the\n"
	"launcher ends by SIGKILL; 125 setup failed; 126 execve refused; 127 PROGRAM\n"
	"not found; 2 bad usage. --kill-uid: 0 done, 125 failed.\n";

int plan_tmpfs_index(const struct plan *p, const char *path)
{
	size_t i, n = strlen(path);

	for (i = 0; i < p->ntmpfs; i++)
		if (p->tmpfs[i].path_len == n && memcmp(p->tmpfs[i].path, path, n) == 0)
			return (int)i;
	return -1;
}

const char *plan_help(void)
{
	return help_text;
}

const char *plan_rlimit_name(enum plan_rlimit r)
{
	return (r >= 0 && r < PLAN_RL_COUNT) ? rlimit_names[r] : "?";
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The message quotes arguments as given; a control character in one (a newline) would break the
 * one-line "corral-launch: ..." usage error the host reads from stderr: each becomes '?'. */
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	char *c;

	if (err && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
		for (c = err; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
	}
	return -1;
}

/* Decimal digits only (no sign, no spaces), at most max. */
static int parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
	unsigned long long v = 0;

	if (!s || !*s)
		return -1;
	for (; *s; s++) {
		unsigned d;

		if (*s < '0' || *s > '9')
			return -1;
		d = (unsigned)(*s - '0');
		if (v > (max - d) / 10)
			return -2;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

static int number(const char *opt, const char *s, unsigned long long min, unsigned long long max,
		  unsigned long long *out, char *err, size_t errlen)
{
	int r = parse_u64(s, max, out);

	if (r == -1)
		return fail(err, errlen, "%s: '%s' is not a number", opt, s);
	if (r == -2 || *out < min)
		return fail(err, errlen, "%s: %s is out of range (%llu..%llu)", opt, s, min, max);
	return 0;
}

static int parse_rlimit(struct plan *p, const char *s, char *err, size_t errlen)
{
	const char *eq = strchr(s, '=');
	size_t n;
	int i;
	unsigned long long v;

	if (!eq)
		return fail(err, errlen, "--rlimit: '%s' is not NAME=VALUE", s);
	n = (size_t)(eq - s);
	for (i = 0; i < PLAN_RL_COUNT; i++)
		if (strlen(rlimit_names[i]) == n && memcmp(rlimit_names[i], s, n) == 0)
			break;
	if (i == PLAN_RL_COUNT)
		return fail(err, errlen,
			    "--rlimit: unknown name '%.*s' (expected cpu as fsize core nofile nproc "
			    "sigpending msgqueue)",
			    (int)(n > 64 ? 64 : n), s);
	/* RLIM_INFINITY is ~0ULL; cpu needs room for hard = value + 1. */
	if (number("--rlimit", eq + 1, 0, ~0ULL - 2, &v, err, errlen))
		return -1;
	p->rlimit[i].set = 1;
	p->rlimit[i].value = v;
	return 0;
}

/* NAME=VALUE, NAME of [a-z_] (a file name under /proc/sys/user, never a path). */
static int parse_user_max(struct plan *p, const char *s, char *err, size_t errlen)
{
	const char *eq = strchr(s, '=');
	const char *c;
	struct plan_user_max *u;

	if (!eq || eq == s || eq - s > 32)
		return fail(err, errlen, "--user-max: '%.64s' is not NAME=VALUE", s);
	for (c = s; c < eq; c++)
		if (!((*c >= 'a' && *c <= 'z') || *c == '_'))
			return fail(err, errlen, "--user-max: '%.*s' is not a name of [a-z_]",
				    (int)(eq - s), s);
	if (p->nuser_max == PLAN_USER_MAX)
		return fail(err, errlen, "--user-max given more than %d times", PLAN_USER_MAX);
	u = &p->user_max[p->nuser_max];
	if (number("--user-max", eq + 1, 0, INT_MAX, &u->value, err, errlen))
		return -1;
	u->name = s;
	u->name_len = (size_t)(eq - s);
	p->nuser_max++;
	return 0;
}

static int parse_env(struct plan *p, const char *s, char *err, size_t errlen)
{
	const char *eq = strchr(s, '=');

	if (!eq || eq == s)
		return fail(err, errlen, "--env: '%s' is not NAME=VALUE", s);
	p->env[p->nenv++] = (char *)s;
	return 0;
}

/* An absolute path other than "/", shorter than PATH_MAX. */
static int check_path(const char *opt, const char *s, size_t len, char *err, size_t errlen)
{
	if (len == 0 || s[0] != '/')
		return fail(err, errlen, "%s: '%.*s' is not an absolute path", opt,
			    (int)(len > 64 ? 64 : len), s);
	if (len == 1)
		return fail(err, errlen, "%s: '/' would hide the whole file system", opt);
	if (len >= PATH_MAX)
		return fail(err, errlen, "%s: the path is longer than %d bytes", opt, PATH_MAX - 1);
	return 0;
}

/* tmpfs sizes: at least one byte (size=0 would mean no limit to the kernel). */
#define TMPFS_MAX (1ULL << 62)

static int parse_tmpfs(struct plan *p, const char *s, char *err, size_t errlen)
{
	const char *eq = strrchr(s, '=');       /* a path may hold '=', a size does not */
	struct plan_tmpfs *t;

	if (!eq)
		return fail(err, errlen, "--tmpfs: '%s' is not PATH=BYTES", s);
	if (p->ntmpfs == PLAN_MOUNTS_MAX)
		return fail(err, errlen, "--tmpfs given more than %d times", PLAN_MOUNTS_MAX);
	if (check_path("--tmpfs", s, (size_t)(eq - s), err, errlen))
		return -1;
	t = &p->tmpfs[p->ntmpfs];
	if (number("--tmpfs", eq + 1, 1, TMPFS_MAX, &t->size, err, errlen))
		return -1;
	t->path = s;
	t->path_len = (size_t)(eq - s);
	p->ntmpfs++;
	return 0;
}

static int parse_ro_bind(struct plan *p, const char *s, char *err, size_t errlen)
{
	if (p->nro_bind == PLAN_MOUNTS_MAX)
		return fail(err, errlen, "--ro-bind given more than %d times", PLAN_MOUNTS_MAX);
	if (check_path("--ro-bind", s, strlen(s), err, errlen))
		return -1;
	p->ro_bind[p->nro_bind++] = s;
	return 0;
}

/* A path the launcher makes directories along (inside a tmpfs of the run), --work-at's or
 * --code-at's: every segment a name, none empty, "." or "..", so that the path says where it is
 * without a lookup. */
static int parse_place(const char *opt, const char *s, const char **out, char *err, size_t errlen)
{
	const char *seg;

	if (check_path(opt, s, strlen(s), err, errlen))
		return -1;
	for (seg = s + 1;; seg = strchr(seg, '/') + 1) {
		size_t n = strcspn(seg, "/");

		if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
			return fail(err, errlen, "%s: '%s' has an empty, '.' or '..' segment", opt,
				    s);
		if (!seg[n])
			break;
	}
	*out = s;
	return 0;
}

/* Whether path a is b or lies beneath it. */
static int within(const char *a, const char *b)
{
	size_t n = strlen(b);

	return strncmp(a, b, n) == 0 && (a[n] == '\0' || a[n] == '/');
}

static int parse_mech(const char *opt, const char *v, enum plan_mech *out, char *err,
		      size_t errlen)
{
	if (strcmp(v, "off") == 0)
		*out = PLAN_MECH_OFF;
	else if (strcmp(v, "auto") == 0)
		*out = PLAN_MECH_AUTO;
	else if (strcmp(v, "require") == 0)
		*out = PLAN_MECH_REQUIRE;
	else
		return fail(err, errlen, "%s: '%s' is not off, auto or require", opt, v);
	return 0;
}

/* --fs-ro, --fs-rw: absolute paths ("/" allowed: an operator may mean it). */
static int parse_fs(const char *opt, const char *v, const char **list, size_t *n, char *err,
		    size_t errlen)
{
	size_t len = strlen(v);

	if (*n == PLAN_FS_MAX)
		return fail(err, errlen, "%s given more than %d times", opt, PLAN_FS_MAX);
	if (len == 0 || v[0] != '/')
		return fail(err, errlen, "%s: '%.*s' is not an absolute path", opt,
			    (int)(len > 64 ? 64 : len), v);
	if (len >= PATH_MAX)
		return fail(err, errlen, "%s: the path is longer than %d bytes", opt, PATH_MAX - 1);
	list[(*n)++] = v;
	return 0;
}

static int parse_syscall(struct plan *p, const char *v, char *err, size_t errlen)
{
	const char *c;

	if (p->ndeny_syscall == PLAN_SYSCALLS_MAX)
		return fail(err, errlen, "--deny-syscall given more than %d times", PLAN_SYSCALLS_MAX);
	if (!*v || strlen(v) > 64)
		return fail(err, errlen, "--deny-syscall: '%.64s' is not a system call name", v);
	for (c = v; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
			return fail(err, errlen, "--deny-syscall: '%.64s' is not a system call name", v);
	p->deny_syscall[p->ndeny_syscall++] = v;
	return 0;
}

/* Options that take a value; the rest are flags. */
enum opt {
	O_REPORT_FD, O_PARENT_PID, O_NET, O_USERNS, O_UID, O_GID, O_RLIMIT, O_ENV, O_CHDIR,
	O_TMPFS, O_RO_BIND, O_WORK_TMPFS, O_WORK_AT, O_CODE_AT, O_KILL_UID,
	O_LANDLOCK, O_FS_RO, O_FS_RW, O_SECCOMP, O_DENY_SYSCALL, O_BUDGET_CPU, O_BUDGET_MEM,
	O_BUDGET_POLL, O_CGROUP, O_NET_JOIN, O_SECCOMP_CACHE, O_USER_MAX, O_DENY_PIPE_GROWTH, O_FLUSH_SIGNAL,
	O_FLUSH_MS,
	O_DENY_TCP, O_SCOPE, O_DENY_SOCKETS, O_DENY_SOCKETS_NONS, O_UNIX_PAIRS, O_CGROUP_REQUIRE,
	O_PIDNS, O_NO_PIDNS, O_SWEEP_UID, O_NO_SWEEP_UID, O_PROBE, O_HELP, O_HOLD_NET, O_HELD, O_RELAY,
	O_STATUS_FD,
	O_PRESTART, O_FILES_IN, O_FILES_WAIT_FD, O_COLLECT, O_COLLECT_ALL, O_COLLECT_TO, O_COLLECT_MAX,
	O_UNLINK_FILES, O_SEPARATE, O_COUNT
};

static const struct {
	const char *name;
	int has_value;
	int repeatable;
} opts[O_COUNT] = {
	[O_REPORT_FD] = { "--report-fd", 1, 0 },
	[O_PARENT_PID] = { "--parent-pid", 1, 0 },
	[O_NET] = { "--net", 1, 0 },
	[O_USERNS] = { "--userns", 1, 0 },
	[O_UID] = { "--uid", 1, 0 },
	[O_GID] = { "--gid", 1, 0 },
	[O_RLIMIT] = { "--rlimit", 1, 1 },
	[O_ENV] = { "--env", 1, 1 },
	[O_CHDIR] = { "--chdir", 1, 0 },
	[O_TMPFS] = { "--tmpfs", 1, 1 },
	[O_RO_BIND] = { "--ro-bind", 1, 1 },
	[O_WORK_TMPFS] = { "--work-tmpfs", 1, 0 },
	[O_WORK_AT] = { "--work-at", 1, 0 },
	[O_CODE_AT] = { "--code-at", 1, 0 },
	[O_KILL_UID] = { "--kill-uid", 1, 0 },
	[O_LANDLOCK] = { "--landlock", 1, 0 },
	[O_FS_RO] = { "--fs-ro", 1, 1 },
	[O_FS_RW] = { "--fs-rw", 1, 1 },
	[O_SECCOMP] = { "--seccomp", 1, 0 },
	[O_DENY_SYSCALL] = { "--deny-syscall", 1, 1 },
	[O_BUDGET_CPU] = { "--budget-cpu-ms", 1, 0 },
	[O_BUDGET_MEM] = { "--budget-memory-kb", 1, 0 },
	[O_BUDGET_POLL] = { "--budget-poll-ms", 1, 0 },
	[O_CGROUP] = { "--cgroup", 1, 0 },
	[O_NET_JOIN] = { "--net-join", 1, 0 },
	[O_SECCOMP_CACHE] = { "--seccomp-cache", 1, 0 },
	[O_USER_MAX] = { "--user-max", 1, 1 },
	[O_DENY_PIPE_GROWTH] = { "--deny-pipe-growth", 0, 0 },
	[O_FLUSH_SIGNAL] = { "--flush-signal", 0, 0 },
	[O_FLUSH_MS] = { "--flush-ms", 1, 0 },
	[O_DENY_TCP] = { "--deny-tcp", 0, 0 },
	[O_SCOPE] = { "--scope", 0, 0 },
	[O_SEPARATE] = { "--separate", 1, 0 },
	[O_DENY_SOCKETS] = { "--deny-sockets", 0, 0 },
	[O_DENY_SOCKETS_NONS] = { "--deny-sockets-without-netns", 0, 0 },
	[O_UNIX_PAIRS] = { "--unix-pairs-only", 0, 0 },
	[O_CGROUP_REQUIRE] = { "--cgroup-require", 0, 0 },
	[O_PIDNS] = { "--pidns", 0, 0 },
	[O_NO_PIDNS] = { "--no-pidns", 0, 0 },
	[O_SWEEP_UID] = { "--sweep-uid", 0, 0 },
	[O_NO_SWEEP_UID] = { "--no-sweep-uid", 0, 0 },
	[O_PROBE] = { "--probe", 0, 0 },
	[O_HELP] = { "--help", 0, 0 },
	[O_HOLD_NET] = { "--hold-net", 0, 0 },
	[O_RELAY] = { "--relay", 0, 0 },
	[O_STATUS_FD] = { "--status-fd", 1, 0 },
	[O_HELD] = { "--held", 0, 0 },
	[O_PRESTART] = { "--prestart", 0, 0 },
	[O_FILES_IN] = { "--files-in", 1, 0 },
	[O_FILES_WAIT_FD] = { "--files-wait-fd", 1, 0 },
	[O_COLLECT] = { "--collect", 1, 1 },
	[O_COLLECT_ALL] = { "--collect-all", 0, 0 },
	[O_COLLECT_TO] = { "--collect-to", 1, 0 },
	[O_COLLECT_MAX] = { "--collect-max", 1, 0 },
	[O_UNLINK_FILES] = { "--unlink-files", 0, 0 },
};

/* A glob relative to --chdir: no empty, "." or ".." segment, at most two "**". */
static int parse_collect(struct plan *p, const char *v, char *err, size_t errlen)
{
	const char *s = v;
	int stars = 0;

	if (p->ncollect >= PLAN_COLLECT_MAX)
		return fail(err, errlen, "--collect: more than %d", PLAN_COLLECT_MAX);
	if (!*v || v[0] == '/' || strlen(v) >= PATH_MAX)
		return fail(err, errlen, "--collect: '%.64s' is not a relative path", v);
	for (;;) {
		size_t n = strcspn(s, "/");

		if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return fail(err, errlen, "--collect: '%.64s' has an empty, . or .. segment", v);
		if (n == 2 && s[0] == '*' && s[1] == '*' && ++stars > 2)
			return fail(err, errlen, "--collect: '%.64s' has more than two **", v);
		if (!s[n])
			break;
		s += n + 1;
	}
	p->collect[p->ncollect++] = v;
	return 0;
}

static int parse_collect_max(struct plan *p, const char *v, char *err, size_t errlen)
{
	unsigned long long n[3];
	const char *s = v;
	char *end;
	int i;

	for (i = 0; i < 3; i++) {
		if (*s < '0' || *s > '9')
			goto bad;
		errno = 0;
		n[i] = strtoull(s, &end, 10);
		if (errno || *end != (i < 2 ? ',' : '\0') || n[i] > (1ULL << 40))
			goto bad;
		s = end + 1;
	}
	p->collect_files = n[0];
	p->collect_file_bytes = n[1];
	p->collect_bytes = n[2];
	return 0;
bad:
	return fail(err, errlen, "--collect-max: '%.64s' is not N,FILE,TOTAL (whole numbers)", v);
}

static int apply_opt(struct plan *p, enum opt o, const char *v, char *err, size_t errlen)
{
	unsigned long long n;

	switch (o) {
	case O_REPORT_FD:
		if (number("--report-fd", v, 0, INT_MAX, &n, err, errlen))
			return -1;
		p->report_fd = (int)n;
		return 0;
	case O_STATUS_FD:
		if (number("--status-fd", v, 3, 1023, &n, err, errlen))
			return -1;
		p->status_fd = (int)n;
		return 0;
	case O_PARENT_PID:
		if (number("--parent-pid", v, 1, INT_MAX, &n, err, errlen))
			return -1;
		p->parent_pid = (pid_t)n;
		return 0;
	case O_NET:
		if (strcmp(v, "new") == 0)
			p->net = PLAN_NET_NEW;
		else if (strcmp(v, "require") == 0)
			p->net = PLAN_NET_REQUIRE;
		else if (strcmp(v, "host") == 0)
			p->net = PLAN_NET_HOST;
		else
			return fail(err, errlen, "--net: '%s' is not new, require or host", v);
		return 0;
	case O_USERNS:
		if (strcmp(v, "auto") == 0)
			p->userns = PLAN_USERNS_AUTO;
		else if (strcmp(v, "never") == 0)
			p->userns = PLAN_USERNS_NEVER;
		else if (strcmp(v, "always") == 0)
			p->userns = PLAN_USERNS_ALWAYS;
		else
			return fail(err, errlen, "--userns: '%s' is not auto, never or always", v);
		return 0;
	case O_UID:
		/* (uid_t)-1 means "unchanged" to setresuid: not a uid. */
		if (number("--uid", v, 0, 4294967294ULL, &n, err, errlen))
			return -1;
		p->uid = (uid_t)n;
		return 0;
	case O_GID:
		if (number("--gid", v, 0, 4294967294ULL, &n, err, errlen))
			return -1;
		p->gid = (gid_t)n;
		return 0;
	case O_RLIMIT:
		return parse_rlimit(p, v, err, errlen);
	case O_ENV:
		return parse_env(p, v, err, errlen);
	case O_CHDIR:
		if (!*v)
			return fail(err, errlen, "--chdir: empty directory");
		p->chdir = v;
		return 0;
	case O_TMPFS:
		return parse_tmpfs(p, v, err, errlen);
	case O_RO_BIND:
		return parse_ro_bind(p, v, err, errlen);
	case O_WORK_TMPFS:
		return number("--work-tmpfs", v, 1, TMPFS_MAX, &p->work_tmpfs, err, errlen);
	case O_WORK_AT:
		return parse_place("--work-at", v, &p->work_at, err, errlen);
	case O_CODE_AT:
		return parse_place("--code-at", v, &p->code_at, err, errlen);
	case O_KILL_UID:
		/* kill(-1) as uid 0 would kill the host; (uid_t)-1 is not a uid. */
		if (strcmp(v, "0") == 0)
			return fail(err, errlen, "--kill-uid: uid 0 is root: that would kill every process");
		if (number("--kill-uid", v, 1, 4294967294ULL, &n, err, errlen))
			return -1;
		p->mode = PLAN_KILL_UID;
		p->kill_uid = (uid_t)n;
		return 0;
	case O_LANDLOCK:
		return parse_mech("--landlock", v, &p->landlock, err, errlen);
	case O_FS_RO:
		return parse_fs("--fs-ro", v, p->fs_ro, &p->nfs_ro, err, errlen);
	case O_FS_RW:
		return parse_fs("--fs-rw", v, p->fs_rw, &p->nfs_rw, err, errlen);
	case O_SECCOMP:
		return parse_mech("--seccomp", v, &p->seccomp, err, errlen);
	case O_DENY_SYSCALL:
		return parse_syscall(p, v, err, errlen);
	case O_BUDGET_CPU:
		/* a week: far above any run, far below overflow in microseconds */
		return number("--budget-cpu-ms", v, 1, 604800000ULL, &p->budget_cpu_ms, err, errlen);
	case O_BUDGET_MEM:
		return number("--budget-memory-kb", v, 1, 1ULL << 40, &p->budget_memory_kb, err,
			      errlen);
	case O_BUDGET_POLL:
		if (number("--budget-poll-ms", v, 1, PLAN_POLL_MS_MAX, &n, err, errlen))
			return -1;
		p->budget_poll_ms = (unsigned)n;
		return 0;
	case O_CGROUP:
		if (!*v || v[0] != '/')
			return fail(err, errlen, "--cgroup: '%.64s' is not an absolute path", v);
		if (strlen(v) >= PATH_MAX - 64)
			return fail(err, errlen, "--cgroup: the path is too long");
		p->cgroup = v;
		return 0;
	case O_NET_JOIN:
		if (number("--net-join", v, 1, INT_MAX, &n, err, errlen))
			return -1;
		p->net_join = (pid_t)n;
		return 0;
	case O_SECCOMP_CACHE:
		if (!*v || v[0] != '/')
			return fail(err, errlen, "--seccomp-cache: '%.64s' is not an absolute path", v);
		if (strlen(v) >= PATH_MAX - 64)
			return fail(err, errlen, "--seccomp-cache: the path is too long");
		p->seccomp_cache = v;
		return 0;
	case O_USER_MAX:
		return parse_user_max(p, v, err, errlen);
	case O_DENY_PIPE_GROWTH:
		p->deny_pipe_growth = 1;
		return 0;
	case O_FLUSH_SIGNAL:
		p->flush_signal = 1;
		return 0;
	case O_FLUSH_MS:
		if (number("--flush-ms", v, 1, PLAN_FLUSH_MS_MAX, &n, err, errlen))
			return -1;
		p->flush_ms = (unsigned)n;
		return 0;
	case O_DENY_TCP:
		p->deny_tcp = 1;
		return 0;
	case O_SCOPE:
		p->scope = 1;
		return 0;
	case O_SEPARATE:
		return parse_mech("--separate", v, &p->separate, err, errlen);
	case O_DENY_SOCKETS:
		p->deny_sockets = 1;
		return 0;
	case O_DENY_SOCKETS_NONS:
		p->deny_sockets = 2;
		return 0;
	case O_UNIX_PAIRS:
		p->unix_pairs = 1;
		return 0;
	case O_CGROUP_REQUIRE:
		p->cgroup_require = 1;
		return 0;
	case O_PIDNS:
		p->pidns = 1;
		return 0;
	case O_NO_PIDNS:
		p->pidns = 0;
		return 0;
	case O_SWEEP_UID:
		p->sweep_uid = 1;
		return 0;
	case O_NO_SWEEP_UID:
		p->sweep_uid = 0;
		return 0;
	case O_PROBE:
		p->mode = PLAN_PROBE;
		return 0;
	case O_HELP:
		p->mode = PLAN_HELP;
		return 0;
	case O_HOLD_NET:
		p->mode = PLAN_HOLD_NET;
		return 0;
	case O_HELD:
		p->held = 1;
		return 0;
	case O_RELAY:
		p->mode = PLAN_RELAY;
		return 0;
	case O_PRESTART:
		p->prestart = 1;
		return 0;
	case O_FILES_IN:
	case O_COLLECT_TO:
		if (!*v || v[0] != '/' || strlen(v) >= PATH_MAX)
			return fail(err, errlen, "%s: '%.64s' is not an absolute path",
				    o == O_FILES_IN ? "--files-in" : "--collect-to", v);
		if (o == O_FILES_IN)
			p->files_in = v;
		else
			p->collect_to = v;
		return 0;
	case O_FILES_WAIT_FD:
		if (number("--files-wait-fd", v, 3, 1023, &n, err, errlen))
			return -1;
		p->files_wait_fd = (int)n;
		return 0;
	case O_COLLECT:
		return parse_collect(p, v, err, errlen);
	case O_COLLECT_ALL:
		p->collect_all = 1;
		return 0;
	case O_COLLECT_MAX:
		return parse_collect_max(p, v, err, errlen);
	case O_UNLINK_FILES:
		p->unlink_files = 1;
		return 0;
	case O_COUNT:
		break;
	}
	return 0;
}

int plan_parse(struct plan *p, int argc, char **argv, char *err, size_t errlen)
{
	int seen[O_COUNT] = { 0 };
	int nopts = 0;
	int alone = -1;         /* the first of --probe, --kill-uid, --help, --hold-net: a mode of
				 * its own, with no PROGRAM */
	int dashdash = 0;
	int i;
	size_t n;

	memset(p, 0, sizeof *p);
	p->report_fd = -1;
	p->status_fd = -1;
	p->files_wait_fd = -1;
	p->sweep_uid = 1;
	p->budget_poll_ms = PLAN_POLL_MS_DEFAULT;
	p->flush_ms = PLAN_FLUSH_MS_DEFAULT;
	p->collect_files = 100;
	p->collect_file_bytes = 8ULL << 20;
	p->collect_bytes = 16ULL << 20;
	if (err && errlen > 0)
		err[0] = '\0';
	if (argc < 1)
		argc = 1;       /* no argv[0]: treated as no arguments at all */

	/* One vector holds env then args; neither can have more entries than argc. */
	n = (size_t)argc + 1;
	p->vec_ = calloc(2 * n, sizeof *p->vec_);
	if (!p->vec_)
		return fail(err, errlen, "out of memory");
	p->env = p->vec_;
	p->args = p->vec_ + n;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = NULL;
		size_t len;
		int o;

		if (!a)
			goto bad_null;
		if (strcmp(a, "--") == 0) {
			dashdash = 1;
			i++;
			break;
		}
		if (strncmp(a, "--", 2) != 0)
			break;          /* PROGRAM */
		len = strcspn(a, "=");
		for (o = 0; o < O_COUNT; o++)
			if (strlen(opts[o].name) == len && memcmp(opts[o].name, a, len) == 0)
				break;
		if (o == O_COUNT) {
			fail(err, errlen, "unknown option %.*s (see --help)", (int)(len > 64 ? 64 : len), a);
			goto bad;
		}
		if (opts[o].has_value) {
			if (a[len] == '=') {
				v = a + len + 1;
			} else if (i + 1 < argc && argv[i + 1]) {
				v = argv[++i];
			} else {
				fail(err, errlen, "%s needs a value", opts[o].name);
				goto bad;
			}
		} else if (a[len] == '=') {
			fail(err, errlen, "%s takes no value", opts[o].name);
			goto bad;
		}
		if (seen[o] && !opts[o].repeatable) {
			fail(err, errlen, "%s given twice", opts[o].name);
			goto bad;
		}
		seen[o] = 1;
		nopts++;
		if (alone < 0 && (o == O_PROBE || o == O_KILL_UID || o == O_HELP || o == O_HOLD_NET))
			alone = o;
		if (apply_opt(p, (enum opt)o, v, err, errlen))
			goto bad;
	}

	if (seen[O_PIDNS] && seen[O_NO_PIDNS]) {
		fail(err, errlen, "--pidns and --no-pidns conflict");
		goto bad;
	}
	if (seen[O_SWEEP_UID] && seen[O_NO_SWEEP_UID]) {
		fail(err, errlen, "--sweep-uid and --no-sweep-uid conflict");
		goto bad;
	}
	/* --help does not win over a bad or conflicting option: every option was checked above. */
	if (alone == O_HOLD_NET) {
		/* the holder takes how to make its namespaces, and its parent */
		if (nopts != 1 + seen[O_USERNS] + seen[O_PARENT_PID] + seen[O_HELD] || dashdash ||
		    i < argc) {
			fail(err, errlen, "--hold-net takes only --userns, --parent-pid and --held, and "
			     "no PROGRAM");
			goto bad;
		}
		p->mode = PLAN_HOLD_NET;
		return 0;
	}
	if (alone >= 0) {
		if (nopts != 1 || dashdash || i < argc) {
			fail(err, errlen, "%s takes no other option and no PROGRAM", opts[alone].name);
			goto bad;
		}
		return 0;
	}
	if (seen[O_RELAY] && (nopts != 2 || !seen[O_STATUS_FD])) {
		fail(err, errlen, "--relay takes --status-fd N and no other option, then -- PROGRAM "
		     "[ARGS...]");
		goto bad;
	}
	if (p->status_fd >= 0 && p->status_fd == p->report_fd) {
		fail(err, errlen, "--status-fd %d is the report fd", p->status_fd);
		goto bad;
	}
	if (seen[O_HELD]) {
		fail(err, errlen, "--held goes with --hold-net");
		goto bad;
	}
	if (seen[O_UID] != seen[O_GID]) {
		fail(err, errlen, "--uid and --gid go together");
		goto bad;
	}
	if (p->prestart && (!p->pidns || p->report_fd < 0)) {
		fail(err, errlen, "--prestart needs --pidns and --report-fd (the init waits on it)");
		goto bad;
	}
	p->has_ids = seen[O_UID];
	if (p->work_tmpfs && (!p->chdir || p->chdir[0] != '/')) {
		fail(err, errlen, "--work-tmpfs needs an absolute --chdir (the directory it covers)");
		goto bad;
	}
	if (p->work_at && !p->work_tmpfs) {
		fail(err, errlen, "--work-at needs --work-tmpfs (the work dir it places)");
		goto bad;
	}
	if (p->code_at && !p->nro_bind) {
		fail(err, errlen, "--code-at needs --ro-bind (the first one is the code dir it places)");
		goto bad;
	}
	/* the work tmpfs, mounted after the code, would hide it; or the code, the work dir */
	if (p->code_at && p->work_at && (within(p->code_at, p->work_at) || within(p->work_at, p->code_at))) {
		fail(err, errlen, "--code-at '%s' and --work-at '%s' overlap", p->code_at, p->work_at);
		goto bad;
	}
	if ((p->files_in || p->collect_to) && (!p->chdir || p->chdir[0] != '/')) {
		fail(err, errlen, "--files-in and --collect-to need an absolute --chdir (the work dir)");
		goto bad;
	}
	if (p->files_wait_fd >= 0 && (!p->files_in || p->status_fd >= 0 ||
				       p->files_wait_fd == p->report_fd)) {
		fail(err, errlen, "--files-wait-fd %d needs --files-in, goes without --status-fd, and "
		     "is not the report fd", p->files_wait_fd);
		goto bad;
	}
	if (!p->collect_to != !(p->ncollect || p->collect_all)) {
		fail(err, errlen, "--collect-to goes with --collect GLOB or --collect-all");
		goto bad;
	}
	if (p->unlink_files && !p->files_in && !p->collect_to) {
		fail(err, errlen, "--unlink-files needs --files-in or --collect-to");
		goto bad;
	}
	if (p->collect_all && p->ncollect) {
		fail(err, errlen, "--collect and --collect-all conflict");
		goto bad;
	}
	if (p->landlock == PLAN_MECH_OFF &&
	    (seen[O_FS_RO] || seen[O_FS_RW] || p->deny_tcp || p->scope)) {
		fail(err, errlen, "--fs-ro, --fs-rw, --deny-tcp and --scope need --landlock auto|require");
		goto bad;
	}
	if (p->seccomp == PLAN_MECH_OFF &&
	    (seen[O_DENY_SYSCALL] || p->deny_sockets || p->unix_pairs || p->deny_pipe_growth)) {
		fail(err, errlen, "--deny-syscall, --deny-sockets, --unix-pairs-only and "
			     "--deny-pipe-growth need --seccomp auto|require");
		goto bad;
	}
	if (seen[O_DENY_SOCKETS] && seen[O_DENY_SOCKETS_NONS]) {
		fail(err, errlen, "--deny-sockets and --deny-sockets-without-netns conflict");
		goto bad;
	}
	if (p->net_join && p->net == PLAN_NET_HOST) {
		fail(err, errlen, "--net-join needs --net new|require (what to do when it cannot join)");
		goto bad;
	}
	if (p->seccomp_cache && p->seccomp == PLAN_MECH_OFF) {
		fail(err, errlen, "--seccomp-cache needs --seccomp auto|require");
		goto bad;
	}
	if (p->cgroup_require && !p->cgroup) {
		fail(err, errlen, "--cgroup-require needs --cgroup DIR");
		goto bad;
	}
	if (i >= argc) {
		fail(err, errlen, "no PROGRAM (usage: corral-launch [OPTIONS] -- PROGRAM [ARGS...])");
		goto bad;
	}
	if (!argv[i])
		goto bad_null;
	if (!*argv[i]) {
		fail(err, errlen, "PROGRAM is an empty string");
		goto bad;
	}
	p->program = argv[i];
	for (; i < argc; i++) {
		if (!argv[i])
			goto bad_null;
		p->args[p->nargs++] = argv[i];
	}
	p->mode = seen[O_RELAY] ? PLAN_RELAY : PLAN_RUN;
	return 0;

bad_null:
	fail(err, errlen, "argument %d is NULL", i);
bad:
	plan_free(p);
	return -1;
}

void plan_free(struct plan *p)
{
	free(p->vec_);
	p->vec_ = NULL;
	p->env = NULL;
	p->args = NULL;
	p->nenv = 0;
	p->nargs = 0;
}
