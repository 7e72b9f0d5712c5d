/* plan.h: the launcher's command line, parsed into a plan.
 *
 * plan_parse() is pure: it makes no system call, writes nothing, and only reads argv[0..argc-1]
 * (argv need not be NULL-terminated), so a fuzz harness can call it directly. Strings in the
 * plan point into argv; the two vectors (env, args) are allocated and released by plan_free().
 */
#ifndef CORRAL_PLAN_H
#define CORRAL_PLAN_H

#include <stddef.h>
#include <sys/types.h>

enum plan_mode { PLAN_RUN, PLAN_PROBE, PLAN_HELP, PLAN_KILL_UID, PLAN_HOLD_NET, PLAN_RELAY };
enum plan_net { PLAN_NET_HOST, PLAN_NET_NEW, PLAN_NET_REQUIRE };
enum plan_userns { PLAN_USERNS_AUTO, PLAN_USERNS_NEVER, PLAN_USERNS_ALWAYS };
/* --landlock, --seccomp: off (default), auto (what the kernel offers; the rest is reported as
 * refused and the run goes on), require (a refusal is fatal: nothing runs). */
enum plan_mech { PLAN_MECH_OFF, PLAN_MECH_AUTO, PLAN_MECH_REQUIRE };

/* In the order the program child applies and reports them. */
enum plan_rlimit {
	PLAN_RL_CPU,
	PLAN_RL_AS,
	PLAN_RL_FSIZE,
	PLAN_RL_CORE,
	PLAN_RL_NOFILE,
	PLAN_RL_NPROC,
	PLAN_RL_SIGPENDING,
	PLAN_RL_MSGQUEUE,
	PLAN_RL_COUNT
};

/* At most this many --tmpfs, and as many --ro-bind. */
#define PLAN_MOUNTS_MAX 16
/* At most this many --fs-ro, and as many --fs-rw. */
#define PLAN_FS_MAX 64
/* At most this many --user-max. */
#define PLAN_USER_MAX 16
/* At most this many --deny-syscall. */
#define PLAN_SYSCALLS_MAX 256
/* At most this many --collect. */
#define PLAN_COLLECT_MAX 64
/* --budget-poll-ms: default and range. */
#define PLAN_POLL_MS_DEFAULT 10
#define PLAN_POLL_MS_MAX 1000
#define PLAN_FLUSH_MS_DEFAULT 50
#define PLAN_FLUSH_MS_MAX 10000

struct plan_tmpfs {
	const char *path;           /* into argv: the PATH of PATH=SIZE, NOT NUL-terminated */
	size_t path_len;            /* 2..PATH_MAX-1 */
	unsigned long long size;    /* bytes, >= 1 */
};

/* --user-max NAME=VALUE: /proc/sys/user/max_NAME of the run's own user namespace. */
struct plan_user_max {
	const char *name;           /* into argv: the NAME of NAME=VALUE, NOT NUL-terminated */
	size_t name_len;            /* 1..32, [a-z_] */
	unsigned long long value;   /* 0..INT_MAX */
};

struct plan_limit {
	int set;                    /* 1 when --rlimit NAME=... was given (the last one wins) */
	unsigned long long value;   /* below RLIM_INFINITY */
};

struct plan {
	enum plan_mode mode;
	int report_fd;              /* -1: no report */
	int status_fd;              /* --status-fd N: a run gives its program (a wrapper) the write
				     * end of a pipe at fd N, whose read end the supervisor keeps;
				     * --relay writes its program's wait status there. -1: none */
	pid_t parent_pid;           /* 0: not checked */
	enum plan_net net;
	pid_t net_join;             /* --net-join PID: join the namespace that holder keeps; 0:
				     * no */
	int held;                   /* PLAN_HOLD_NET with --held: the namespaces are made (ns.c) */
	int pidns;                  /* 1: --pidns */
	int prestart;               /* --prestart: the init waits for a byte on report_fd
				     * (supervise.c) */
	enum plan_userns userns;
	int has_ids;                /* 1: --uid and --gid were given */
	uid_t uid;
	gid_t gid;
	int sweep_uid;              /* kill(-1) as the uid after the run (subreaper mode) */
	struct plan_limit rlimit[PLAN_RL_COUNT];
	struct plan_user_max user_max[PLAN_USER_MAX];  /* --user-max, in order */
	size_t nuser_max;
	const char *chdir;          /* NULL: stay */
	struct plan_tmpfs tmpfs[PLAN_MOUNTS_MAX];   /* --tmpfs, in order */
	size_t ntmpfs;
	const char *ro_bind[PLAN_MOUNTS_MAX];       /* --ro-bind, absolute, in order */
	size_t nro_bind;
	unsigned long long work_tmpfs;              /* --work-tmpfs bytes; 0: none */
	const char *work_at;        /* --work-at PATH: where the work tmpfs goes instead of
				     * --chdir, or NULL (mounts.c) */
	const char *code_at;        /* --code-at PATH: where ro_bind[0], the code dir, goes
				     * instead of its own path, or NULL (mounts.c) */
	/* The program's files (workspace.c): into --chdir before it starts, out after the run. */
	const char *files_in;       /* --files-in FILE, or NULL */
	int files_wait_fd;          /* --files-wait-fd N: the program reads fd N to its EOF before
				     * it runs its code, so the init may start it first and unpack
				     * meanwhile (workspace.c). -1: none */
	const char *collect_to;     /* --collect-to FILE, or NULL */
	int unlink_files;           /* --unlink-files: both names removed once open (workspace.c) */
	const char *collect[PLAN_COLLECT_MAX];      /* --collect GLOB, relative to --chdir */
	size_t ncollect;
	int collect_all;            /* --collect-all */
	unsigned long long collect_files;           /* --collect-max N,FILE,TOTAL */
	unsigned long long collect_file_bytes;
	unsigned long long collect_bytes;
	/* Landlock (landlock.c), applied by the program after no_new_privs. */
	enum plan_mech landlock;
	const char *fs_ro[PLAN_FS_MAX];             /* --fs-ro: read and execute beneath */
	size_t nfs_ro;
	const char *fs_rw[PLAN_FS_MAX];             /* --fs-rw: everything beneath */
	size_t nfs_rw;
	int deny_tcp;               /* --deny-tcp: Landlock ABI 4+, no TCP bind or connect */
	int scope;                  /* --scope: Landlock ABI 6+, abstract unix sockets, signals */
	enum plan_mech separate;    /* --separate: walled off from the controller and other runs */
	/* seccomp (seccomp.c), applied by the program last before execve. */
	enum plan_mech seccomp;
	const char *deny_syscall[PLAN_SYSCALLS_MAX];  /* names, [a-z0-9_], answered EPERM */
	size_t ndeny_syscall;
	int deny_sockets;           /* socket() of any family but AF_UNIX: EPERM; 1: --deny-sockets,
				 * 2: --deny-sockets-without-netns (only when the run has no
				 * network namespace of its own: none, or a shared one); and
				 * bind(): no socket of the run has a name */
	int unix_pairs;             /* --unix-pairs-only: no unix socket but a connected pair */
	int deny_pipe_growth;       /* --deny-pipe-growth: F_SETPIPE_SZ above 64 KiB: EPERM */
	int flush_signal;           /* --flush-signal: FLUSH_SIGNAL before a stop's kill */
	unsigned flush_ms;          /* --flush-ms: the most the flush may take, 1..PLAN_FLUSH_MS_MAX */
	const char *seccomp_cache;  /* --seccomp-cache DIR: the built filter is kept there; NULL */
	/* Whole-run budgets (budget.c), enforced by the supervisor; 0: none. */
	unsigned long long budget_cpu_ms;       /* CPU time of every process of the run */
	unsigned long long budget_memory_kb;    /* resident memory of the run's processes, summed */
	unsigned budget_poll_ms;                /* polling interval, 1..PLAN_POLL_MS_MAX */
	const char *cgroup;         /* --cgroup DIR: a delegated cgroup v2 directory, or NULL */
	int cgroup_require;         /* --cgroup-require: no run cgroup is fatal */
	uid_t kill_uid;             /* PLAN_KILL_UID: the uid to sweep (never 0) */
	char **env;                 /* NULL-terminated, exactly the --env values */
	size_t nenv;
	const char *program;        /* used as given, no PATH search */
	char **args;                /* NULL-terminated; args[0] == program */
	size_t nargs;
	char **vec_;                /* the one allocation behind env and args */
};

/* Fills *p from the command line. Returns 0, or -1 with a one-line description of what is wrong
 * in err (no "corral-launch:" prefix, no newline); on -1 nothing is left allocated. */
int plan_parse(struct plan *p, int argc, char **argv, char *err, size_t errlen);

/* Releases what plan_parse() allocated; safe on a zeroed plan and safe to call twice. */
void plan_free(struct plan *p);

/* Which --tmpfs PATH is (its index in p->tmpfs), or -1: not a --tmpfs path. Async-signal-safe. */
int plan_tmpfs_index(const struct plan *p, const char *path);

/* The --help text. */
const char *plan_help(void);

/* "cpu", "as"... for an enum plan_rlimit. */
const char *plan_rlimit_name(enum plan_rlimit r);

#endif
