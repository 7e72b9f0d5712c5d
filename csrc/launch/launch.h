/* launch.h: private header joining the launcher's files.
 *
 *   main.c       corral-launch: the command line, the inherited fds
 *   run.c        the flat list of the launcher's steps for a run (shared with corral-zygote)
 *   plan.c       command line -> struct plan (pure)
 *   state.c      a run's state, new: launch_init()
 *   report.c     report lines (async-signal-safe), errno names, actionable messages
 *   ns.c         unshare, user namespace id maps; joining a shared network namespace, and its
 *                holder (--net-join, --hold-net)
 *   mounts.c     the init's mount namespace: private /proc, --tmpfs, --ro-bind, --work-tmpfs,
 *                --work-at, --code-at
 *   supervise.c  init (PID namespace) or subreaper loops, exit mirroring
 *   sweep.c      without a PID namespace: the tree kill, the uid sweep, --kill-uid
 *   budget.c     whole-run CPU and memory budgets: polling, or a cgroup v2 (--cgroup)
 *   held.c       what the kernel holds for the run besides its pages (tmpfs, SysV IPC)
 *   child.c      the program's steps between fork and execve
 *   seccomp.c    the program's seccomp filter: built by the launcher before any fork, loaded by the
 *                program last
 *   landlock.c   Landlock for the program: --fs-ro, --fs-rw, --deny-tcp, --scope
 *   workspace.c  the program's files: --files-in before it starts, --collect after the run
 *   probe.c      --probe
 *   relay.c      --relay: a wrapper's program, whose death by a signal it passes on
 *
 * Processes, by role (docs/internals.md has the table of who forks whom): the launcher is
 * corral-launch's own process (or, in corral-zygote, the one the spawner starts per run); the
 * init is pid 1 of the run's PID namespace, forked by the launcher; the program is the process
 * that becomes python3, forked by the init (or by the launcher without a PID namespace). The
 * supervisor is whichever of the init and the launcher waits for the program.
 */
#ifndef CORRAL_LAUNCH_H
#define CORRAL_LAUNCH_H

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "plan.h"

#define NORETURN __attribute__((noreturn))

/* Exit codes of the launcher (besides the program's own). */
enum {
	EXIT_USAGE = 2,
	EXIT_SETUP = 125,
	EXIT_EXEC = 126,
	EXIT_NOENT = 127,
};

/* What failed or was refused: selects the step name and the actionable message. */
enum what {
	W_SIGNALS,
	W_SESSION,
	W_DEATHSIG,
	W_PARENT,
	W_USERNS,
	W_NETNS,
	W_PIDNS,
	W_IDMAP,
	W_IDMAP_ROOT,
	W_SUBREAPER,
	W_PIPE,
	W_FORK,
	W_RLIMIT,
	W_SETGROUPS,
	W_SETGID,
	W_SETUID,
	W_IDS_USERNS,
	W_NO_NEW_PRIVS,
	W_CHDIR,
	W_FDS,
	W_EXEC,
	W_ROBIND,
	W_KILL_UID,
	W_LANDLOCK,             /* landlock.c */
	W_LANDLOCK_NET,         /* landlock.c: --deny-tcp under --landlock require */
	W_LANDLOCK_SCOPE,       /* landlock.c: --scope under --landlock require */
	W_SECCOMP,              /* seccomp.c */
	W_CGROUP,               /* budget.c */
	W_SHARED_NET,           /* landlock.c, seccomp.c: a wall a shared netns needs is missing */
	W_WARM,                 /* supervise.c: corral-zygote could not fork the program */
	W_FILES_IN,             /* workspace.c */
	W_COLLECT,              /* workspace.c */
	W_SEPARATE,             /* child.c: --separate require, and no wall applied */
	W_COUNT
};

/* What corral-zygote made once for all its runs, before any of them (ns_apply_shared): each run
 * is already in these namespaces, and ns_apply() reports them as if it had made them. */
struct ns_shared {
	uid_t euid;             /* before the namespaces */
	gid_t egid;
	int userns;             /* 1: a user namespace was made */
	int net_got;            /* 1: a network namespace was made */
	int net_direct_err;     /* why it was refused without a user namespace (0: not) ... */
	int net_user_err;       /* ... and with one */
};

/* ---- the state of one run ----
 *
 * What the launcher's files keep for a run is in struct launch, each file's part in a struct of
 * its own, all of it set by launch_init() (state.c), the one place that makes a run's state new.
 * A process that forks the next one of the run (the launcher its init, the init its program)
 * passes it on with its memory; a process that takes up a run afresh (corral-init, corral-zygote's
 * program) makes its own. The files keep in static variables only what is not one run's: scratch
 * tables too big for it, filled by one process of a run (budget.c's walk, held.c's socket inodes),
 * the seccomp filter (seccomp.c: corral-zygote keeps it for many runs), the command line's area
 * (steps.c: the process's own), the stack the program is started on (supervise.c), and the
 * pointer to the process's report (report.c). */

/* report.c: the report fd and the lines gathered for it, not yet written */
struct report_state {
	int fd;                 /* -1: no report */
	pid_t owner;            /* the process the pending lines belong to */
	size_t len;
	size_t sent;            /* bytes written so far, a forked process's parent's included */
	char buf[PIPE_BUF];
};

/* budget.c: the whole-run budgets and the run cgroup */
struct budget_state {
	int on;                 /* a budget is set: the supervisor ticks */
	int over;               /* the exceeded line was written */
	unsigned long long cpu_limit_us;        /* 0: no CPU budget */
	unsigned long long mem_limit_kb;        /* 0: no memory budget */
	long long poll_ms, next_ms;
	long long mem_ms;               /* when the last memory charge was taken */
	unsigned long long mem_kb;      /* ... and what it was */
	long long after_ms;             /* the next tick, this long after the end of this one */
	long clk_tck;
	unsigned long long page_kb;
	unsigned long long cpu_us;      /* the highest CPU total measured */
	unsigned long long live_us;     /* at the last measurement: CPU of the processes alive */
	unsigned long long integral_ticks;      /* own CPU of every process the ticks saw */
	unsigned long long peak_kb;     /* the highest memory charged (polling: charged_kb()) or
					 * memory.peak */
	/* What the walks saw, for the report's "observed" lines (the reason of the run's end is
	 * decided from them, never from what the program prints) */
	const struct plan *plan;
	int end_seen;                   /* the walk at the program's exit was made */
	unsigned long long peak_tasks;  /* the most tasks of the run in one walk */
	unsigned long long peak_vm_kb;  /* the largest address space of one process */
	/* A stop of the run heard during a tick (stop_heard() in budget.c) */
	int init;               /* 1: we are the init, which takes a stop only from outside the
				 * namespace (si_pid 0); 0: the launcher, which takes any */
	int ticking;            /* 1 during a tick, which a stop cuts short */
	int stopped;            /* 1: a stop was taken off the queue during a tick */
	/* The running report (budget_running) */
	pid_t tell_pid;         /* the program, while it runs; 0: nothing to tell */
	long long started_ms;   /* the first call */
	long long told_ms;      /* the last lines written */
	/* cgroup mode */
	int cg;                 /* 1: the run cgroup exists and is in use */
	int cg_made;            /* 1: it was made (stays set once it is removed) */
	int cg_parent;          /* DIR (O_PATH) */
	int cg_dir;             /* DIR/NAME (O_PATH) */
	int cg_procs;           /* DIR/NAME/cgroup.procs, for the program */
	int cg_cpu;             /* cpu.stat */
	int cg_events;          /* memory.events */
	int cg_peak;            /* memory.peak, or memory.current before Linux 5.19 */
	int cg_kill;            /* cgroup.kill (Linux 5.14) */
	char cg_name[48];
};

#define HELD_MOUNTS (PLAN_MOUNTS_MAX + 1)       /* every --tmpfs and the work tmpfs */

/* held.c: what of the kernel's memory the init counts for the run */
struct held_state {
	int init;                       /* 1: this is the init of the run's PID namespace */
	int ipc;                        /* 1: /proc/sysvipc is the run's */
	size_t n;
	int fd[HELD_MOUNTS];            /* O_PATH roots of the run's tmpfs mounts */
	int diag;                       /* NETLINK_SOCK_DIAG socket, or -1: unix buffers not
					 * counted */
	int by_uid;                     /* count only the sockets of uid */
	int by_fd;                      /* ... and past a sixteenth of the budget, those in fds */
	unsigned long long budget_kb;
	uid_t uid;
};

/* mounts.c: which --tmpfs were mounted, whether /proc is the run's own, and where the work dir
 * and the code dir are. The init sets them before it starts the program, which inherits them
 * (landlock.c asks); corral-zygote's program gets them as a string (mounts_state). The program's
 * environment and arguments follow from them (mounts_settle): the plan's, unless --work-at or
 * --code-at could not be made. */
struct mounts_state {
	unsigned char tmpfs_made[PLAN_MOUNTS_MAX];
	int proc_made;
	int work_at;            /* 1: the work tmpfs is at --work-at */
	int code_at;            /* 1: the code dir (--ro-bind 0) is at --code-at */
	int settled;            /* 1: env and args are the program's */
	char **env;             /* NULL: the plan's --env as given */
	char **args;            /* NULL: the plan's program arguments as given */
};

/* A ruleset made before the program changes its uid, enforced after PR_SET_NO_NEW_PRIVS. */
struct landlock {
	int fd;                 /* the ruleset; -1: nothing to enforce */
	int abi;                /* the ABI used (the kernel's, capped at the newest known) */
	unsigned long long handled_fs;  /* filesystem rights the ruleset handles */
	int net;                /* 1: TCP bind and connect handled (--deny-tcp) */
	int scope;              /* 1: abstract unix sockets and signals scoped (--scope) */
	int applied;            /* 1: the ruleset was enforced (landlock_enforce) */
	int net_shared;         /* 1: the run shares its network namespace (L->net_shared): the
				 * scope is required */
	enum what what;         /* after -1: the fatal step ... */
	int err;                /* ... and its errno, for die() */
};

/* workspace.c: the run's files */
struct workspace_state {
	/* --files-in and --collect-to, opened while the host's paths are in sight; -1: none */
	int in_fd;
	int collect_fd;
	/* with a collection: the files unpacked by path, sorted, and where their bytes are in
	 * --files-in (in_fd is kept open for it), so that a file collected with the same bytes
	 * goes back as given; with --collect-all, the inode and ctime each had once made (made 0:
	 * none noted), to tell at collection the files the run left alone */
	struct workspace_given {
		char *path;
		unsigned long long off, size;
		ino_t ino;
		struct timespec ctime;
		int made;
	} *given;
	size_t ngiven, given_cap;
	/* --files-wait-fd: the pipe the program reads to its EOF before it runs its code, while the
	 * init unpacks; -1: none */
	int wait_rfd, wait_wfd;
};

/* child.c: what the program's parent prepared for it */
struct child_state {
	/* the Landlock ruleset, made before the program exists (child_prepare), or not yet */
	struct {
		int done;
		int rc;                 /* landlock_prepare()'s */
		struct landlock ll;
	} prepared;
	/* the dispositions not default that the program would inherit through execve (execve
	 * resets a handler, not SIG_IGN): noted once, in the launcher (signals_note) */
	struct {
		int noted;
		unsigned long long ignored;     /* bit s-1: signal s (glibc's sigaddset refuses 32,
						 * 33) */
	} sigs;
	int status_wfd;         /* --status-fd: the write end of the status pipe, which the
				 * program puts at fd N; -1: none */
};

/* Shared state of the launcher, filled by its steps, and the state of the run (above). Made by
 * launch_init() alone. */
struct launch {
	const struct plan *plan;
	int sigfd;              /* signalfd for SIGTERM SIGINT SIGHUP SIGCHLD (blocked) */
	uid_t euid;             /* before any namespace */
	gid_t egid;
	int userns;             /* 1: a user namespace was made */
	int netns;              /* 1: a network namespace was made */
	int net_shared;         /* 1: it is shared with other runs: a --net-join holder's, or
				 * corral-zygote's */
	int pidns;              /* 1: a PID namespace was made: fork an init */
	/* Set by the caller of launch_run(): */
	pid_t parent;           /* the pid getppid() must be (0: not checked) */
	const struct ns_shared *shared;         /* corral-zygote: namespaces made once, or NULL */
	int seccomp_ready;      /* corral-zygote: the filter was prepared before the launcher was
				 * forked */
	/* corral-zygote: what the program does instead of execve (child.c), with the pipe to its
	 * supervisor (child_die); NULL: execve */
	void (*run_program)(const struct launch *L, int errfd) __attribute__((noreturn));
	/* corral-zygote: the program is forked by the zygote from its warm interpreter into this
	 * run's namespaces, not by the init (which holds no interpreter); it becomes the init's
	 * child (its parent exits at once: the namespace's init inherits it). start_program asks
	 * for it, wfd being the program's end of the pipe to the init: the program's pid in the
	 * namespace, or -1 with errno. NULL: the init forks the program itself. */
	pid_t (*start_program)(struct launch *L, int wfd);
	/* corral-zygote: what the init does for start_program ahead of the run (before --prestart's
	 * wait); NULL: nothing */
	void (*prepare_program)(struct launch *L);
	/* corral-zygote's direct run (csrc/zygote/direct.c): the zygote's clone made the run's new
	 * PID, mount and IPC namespaces (and a user namespace without root), whose init corral-init
	 * takes these steps: ns_apply() reports them as made. In the program: its parent shared the
	 * zygote's memory. */
	int direct;
	int direct_maps_err;    /* why the direct init could not write the user namespace's maps (0:
				 * it did) */
	int direct_own_net;     /* 1: the clone made the run a network namespace of its own, since
				 * the zygote's may not be shared (ns_share_unsafe) */
	/* Processes of the run other than the program's that RLIMIT_NPROC counts with the
	 * program's: the kernel counts every task of a uid in a user namespace (and in each
	 * namespace below it) against the limit of the process that forks, so without --uid the
	 * supervisor the launcher and the init, which keep the program's uid in its user namespace,
	 * take slots of --rlimit nproc. The program sets RLIMIT_NPROC to the plan's value plus
	 * these. */
	int nproc_beside;
	/* each file's part of the run */
	struct report_state report;
	struct budget_state bud;
	struct held_state held;
	struct mounts_state mounts;
	struct child_state child;
	struct workspace_state ws;
};

/* What a run without --separate's walls is open to: its refusal's message and its fatal's. */
#define SEPARATE_LOST "the program would have the controller's uid without both Landlock's " \
	"filesystem rules and a PID namespace, which puts the controller's files or processes and " \
	"other runs' directories in its reach; run the controller as root (a uid per run), or allow " \
	"user namespaces on a kernel with Landlock"

/* ---- report.c: every function here is async-signal-safe ---- */

#define REPORT_LINE_MAX 1024    /* well under PIPE_BUF: one write() is atomic */

struct line {
	size_t len;
	char buf[REPORT_LINE_MAX];
};

void line_start(struct line *l, const char *word);
void line_add(struct line *l, const char *s);   /* control characters become '?' */
void line_num(struct line *l, unsigned long long v);
void line_errname(struct line *l, int err);     /* "EPERM", or "E123" */
void line_send(struct line *l, int fd);         /* appends '\n', one write(), fd < 0: nothing */

/* The report of this process from now on: L's, on fd (L->report.fd); NULL: none. Lines are
 * written to the report of the last call (the one file-level pointer of report.c: every file
 * reports, from deep callees and from the program between fork and execve). */
void report_open(struct launch *L, int fd);
int report_get_fd(void);        /* -1: none */
void report_header(void);
void report_applied(const char *name);
void report_applied_num(const char *name, unsigned long long v);
void report_refused(const char *name, int err, const char *msg);
/* "refused NAME ERRNO what: why" (what may be NULL) */
void report_refused_at(const char *name, int err, const char *what, const char *why);
void report_fatal(enum what w, int err, const char *detail);   /* message from explain() */
void report_pid(pid_t pid);
void report_status(int wstatus);
void report_usage(const struct rusage *ru);
/* Lines to the report fd are gathered and written together (fewer wakeups of the host): at the
 * latest here, which the launcher's processes call before a fork, a wait, an execve and an exit
 * (report_fatal and report_pid flush by themselves). Lines a process inherited through fork()
 * are its parent's to write: dropped. Async-signal-safe. */
void report_flush(void);
size_t report_sent(void);                       /* bytes of the report so far, pending ones included */

const char *errno_name(int err);                /* NULL when unknown */
const char *explain(enum what w, int err);      /* never NULL */
const char *what_step(enum what w);             /* the STEP of a fatal line */

/* ---- run.c ---- */

/* The steps of one run after the command line (run.c): sets L->plan and exits as the program did.
 * The caller makes L with launch_init() and sets its parent, shared, seccomp_ready and
 * run_program. */
NORETURN void launch_run(struct launch *L, struct plan *plan);
/* The steps after the report's header and the supervisor's signals (steps.c): session,
 * die-with-parent, budgets, namespaces. 0, or -1 after a fatal line. */
int launch_steps(struct launch *L);

/* The command line, hidden from the run (steps.c). args_copy() returns a copy of argv (one
 * allocation, never freed: the options point into it) and notes where the kernel keeps the
 * original, which /proc/PID/cmdline shows; NULL when out of memory. args_hide() overwrites that
 * area with argv[0]'s base name and NUL bytes (async-signal-safe; nothing noted: nothing done). */
char **args_copy(int argc, char **argv);
void args_hide(void);
/* A new run's state in L (state.c): everything zero but the fds, -1; no report yet. Every struct
 * launch is made by it. */
void launch_init(struct launch *L);
/* close_range(from, to) (to -1: no end), with a /proc/self/fd loop before Linux 5.9. */
void close_fds(int from, int to);

/* ---- child.c ---- */

void signals_reset(void);                      /* every disposition default, nothing blocked */

/* ---- ns.c ---- */

int ns_apply(struct launch *L);                 /* 0, or -1 after a fatal line */
/* In a new user namespace: our ids (euid, egid) mapped to themselves. 0, or -1 with errno. */
int ns_write_own_maps(uid_t euid, gid_t egid);
/* corral-zygote at start-up: the network namespace of the plan (with the user namespace it needs),
 * once for all runs, and its report lines. 0, or -1 after a fatal line (--net require). */
int ns_apply_shared(struct launch *L, struct ns_shared *s);
/* Why runs of this plan may not share a network namespace (their walls: the seccomp socket filter,
 * Landlock's scope), with *err; or NULL when they may. */
const char *ns_share_unsafe(const struct plan *p, int *err);
/* --hold-net: make the namespaces, say "ready", keep them; the exit code. */
int ns_hold(const struct plan *p);

/* ---- mounts.c ---- */

int mounts_apply(struct launch *L);             /* in the init, before it forks the program: 0, or
						 * -1 after a fatal line */
/* corral-zygote: what the init mounted (L->mounts), as a string of MOUNTS_STATE_LEN - 1
 * characters (and the NUL), for a program that did not inherit it from the init; and the
 * program's end of it (then, with L->plan set, mounts_settle). */
#define MOUNTS_STATE_LEN (PLAN_MOUNTS_MAX + 4)
void mounts_state(const struct launch *L, char *buf, size_t len);
void mounts_state_set(struct launch *L, const char *s);
/* "refused private-tmp" / "refused work-tmpfs" / "refused work-at" / "refused code-at" for what
 * the plan asked, when there is no mount namespace to make them in; why completes the message. */
void mounts_refuse(const struct plan *p, int err, const char *why);
/* Once the mounts are made (or refused), before the program is started: its environment, where
 * every --env value naming --work-at, or a path beneath it, names the same under --chdir when the
 * work dir stayed there; and its arguments, where each naming --code-at or a path beneath it
 * names the same under the code dir's own path when the code stayed there. Idempotent; out of
 * memory, the plan's as given. */
void mounts_settle(struct launch *L);
/* The program's work dir: --work-at when its tmpfs was mounted there, else --chdir (NULL: none). */
const char *mounts_work_dir(const struct launch *L);
/* The path the program sees the code dir at: --code-at when it was bound there, else its own
 * (NULL: no --ro-bind). */
const char *mounts_code_dir(const struct launch *L);
/* The program's environment and arguments (mounts_settle's, or the plan's). */
char **mounts_env(const struct launch *L);
char **mounts_args(const struct launch *L);
/* The size of the largest regular file in the work dir and the --tmpfs the init mounted (a
 * bounded walk). */
unsigned long long mounts_largest_file(const struct launch *L);

/* ---- child.c: the program, between fork and execve ---- */

/* Messages from the program to its supervisor over the close-on-exec pipe; EOF alone: execve
 * worked. */
enum { MSG_PID = 1, MSG_FATAL = 2 };

struct child_msg {
	int kind;
	int what;               /* MSG_FATAL: enum what */
	int value;              /* MSG_PID: pid in /proc's namespace; MSG_FATAL: errno */
};

/* In the launcher, once its own dispositions are set: which signals are ignored, for the program to
 * reset. */
void signals_note(struct launch *L);
/* In the program's parent, before the program is started: the Landlock ruleset, which the program
 * then only enforces. */
void child_prepare(struct launch *L);
void child_prepared_close(struct launch *L);    /* once the program is started */
/* parent: the supervisor's getpid() before fork; errfd: write end of the pipe. */
NORETURN void child_run(const struct launch *L, pid_t parent, int errfd);
/* The program's failure: {MSG_FATAL, w, err} to the supervisor (the fatal line), and the exit
 * code. */
NORETURN void child_die(int errfd, enum what w, int err);

/* ---- landlock.c: in the program, called by child_run() (struct landlock: above) ---- */

/* Asks the ABI, makes the ruleset, opens each --fs-ro/--fs-rw path (O_PATH) and adds its rule
 * (what the init mounted: L->mounts); writes the refused lines. 0, or -1 when --landlock require
 * cannot be met. */
int landlock_prepare(const struct launch *L, struct landlock *ll);
/* landlock_restrict_self and the applied lines. 0, or -1 under --landlock require. */
int landlock_enforce(const struct plan *p, struct landlock *ll);
/* The kernel's Landlock ABI version, or -errno (ENOSYS, EOPNOTSUPP: disabled at boot). */
int landlock_abi(void);

/* ---- seccomp.c ---- */

void seccomp_prepare(const struct launch *L);     /* in the launcher, before any fork: builds the
						   * filter */
/* corral-zygote keeps the filters it built: what seccomp_prepare() left, copied out and back. */
size_t seccomp_state_size(void);
void seccomp_state_save(void *buf);
void seccomp_state_load(const void *buf);
int seccomp_apply(const struct launch *L);      /* in the program, last before execve: loads it and
						 * reports; -1 with errno: fatal (require) */
/* In the init, before the program is started (and before --prestart's wait): loads the filter on
 * the init itself, which the program inherits, when nothing the init and program still do is
 * denied; seccomp_apply then only reports. Failing, it leaves the load to the program. */
void seccomp_load_early(const struct plan *p);
int seccomp_probe(void);                        /* in a forked child: 0 or an errno */

/* ---- supervise.c ---- */

enum { OUTCOME_EXIT = 1, OUTCOME_SIGNAL = 2 };

struct outcome {
	int kind;
	int value;              /* exit code or signal number */
};

/* ---- reap.c: the program, seen from the process that waits for it ---- */

struct prog {
	pid_t pid;              /* fork()'s value (namespace-local under the init) */
	pid_t shown;            /* as /proc names it, from MSG_PID */
	int errfd;              /* read end of the program's close-on-exec pipe; -1 after EOF */
	int statusfd;           /* --status-fd: read end (non-blocking) of the pipe the relay
				 * writes the wrapped program's wait status on; -1: none */
	int have_fatal;
	int fatal_what;
	int fatal_err;
	int reaped;
	int wstatus;
	int empty;              /* the namespace's init reaped all it had (ECHILD): nothing of the
				 * run is left but itself */
};

/* One read of the program's pipe (blocks when nothing is there); at EOF, the program's pid line
 * unless a fatal one came. */
void prog_read(struct prog *c);
/* The program is gone (or was killed): the fatal line, or status, usage and total; the outcome to
 * mirror. */
void prog_finish(struct launch *L, struct prog *c, struct outcome *out);
int reap_one(struct prog *c);           /* 1 reaped a child, 0 none ready, -1 no child left */
/* The run is being ended before the program was reaped: usage and total so far, flushed (see
 * reap.c). */
void prog_report_so_far(struct launch *L, const struct prog *c);
/* The init of the program's PID namespace: reaps every process until the program; 1 when asked to
 * end the run (a stop signal from outside the namespace, or over a budget), 0 when the program has
 * ended. */
int init_wait(struct launch *L, struct prog *c);
void init_kill_all(struct prog *c);     /* kills and reaps the whole namespace */
/* The init, first thing: every signal blocked (see reap.c) */
void init_block_signals(void);
/* The signal the prelude (lua/corral/prelude.lua) flushes the program's output on; a stopped run's
 * program gets --flush-ms at most to do it before it is killed. */
#define FLUSH_SIGNAL 63
void init_flush(struct prog *c, unsigned ms);
/* budget.c: the start of /proc/PID/NAME in buf, NUL-terminated; 0, or -1 (gone) */
int read_proc(pid_t pid, const char *name, char *buf, size_t len);
void flush_status(struct prog *c);
/* The init once the program is started: the program's pipe, the wait, the end in the report; the
 * program's outcome in o. */
void init_watch(struct launch *L, struct prog *c, struct outcome *o);
/* The init's end: the report flushed, the outcome written on outfd, exit 0. */
NORETURN void init_end(int outfd, const struct outcome *o);

int supervise_prepare(struct launch *L);        /* signals; 0 or -1 after a fatal line */
void supervise_run(struct launch *L, struct outcome *out);
NORETURN void outcome_exit(const struct outcome *out);

/* ---- sweep.c: without a PID namespace ---- */

/* Kills and reaps every descendant of the caller (a subreaper), and first, with p->has_ids and
 * p->sweep_uid, every process of p->uid. Records the status of prog when it reaps it. */
void sweep_tree(const struct plan *p, int sigfd, pid_t prog, int *prog_reaped, int *prog_status);

/* Calls add(pid, arg) for each decimal number read from fd to its end (a /proc children file:
 * numbers may run on from one read into the next). Async-signal-safe. */
void pids_read(int fd, void (*add)(long pid, void *arg), void *arg);

/* --kill-uid: the exit code (0, or 125 after a line on stderr). */
int sweep_kill_uid(uid_t uid);

long long now_ms(void);                         /* CLOCK_MONOTONIC */

/* ---- held.c: memory the kernel holds for the run, for the polled memory budget ---- */

void held_watch_mount(struct launch *L, const char *path);      /* the init: a tmpfs it mounted */
void held_ipc(struct launch *L);        /* the init, in the run's IPC namespace: bounds, watch */
void held_watch_net(struct launch *L);  /* the init, in the run's network namespace */
unsigned long long held_kb(const struct launch *L);    /* KiB held now (0 when nothing is
							 * watched) */
int held_is_init(const struct launch *L);      /* 1: in the init of the run's PID namespace
						 * (held_ipc ran) */

/* ---- budget.c: whole-run budgets (--budget-*, --cgroup) ---- */

/* The launcher, before the namespaces: the run cgroup, the applied/refused lines. 0, or -1 after a
 * fatal line (--cgroup-require). Without budgets and --cgroup: nothing. */
int budget_prepare(struct launch *L);
/* The program, before it changes uid: joins the run cgroup (async-signal-safe). 0, or -1 with
 * errno. */
int budget_join(const struct launch *L);
/* The supervisor (the init or launcher): */
/* corral-zygote: the run cgroup's cgroup.procs for the program, or -1 */
int budget_join_fd(const struct launch *L);
/* ... in a program that did not inherit it from the init */
void budget_set_join_fd(struct launch *L, int fd);
/* 1: a budget or a run cgroup (the run is killed before the final report, and a total line
 * follows usage) */
int budget_active(const struct launch *L);
/* ms to the next tick (0: due), or -1: no budget, wait forever */
int budget_wait_ms(const struct launch *L);
/* when the tick is due, measure: 1 when over a budget (the exceeded line is written): end the
 * run */
int budget_check(struct launch *L);
/* 1: a stop of the run came during a tick, which took it off the queue: end the run as on it */
int budget_stopped(const struct launch *L);
/* Whether a stop signal the init took came from outside its namespace (the launcher, for the host):
 * si_pid 0, and sent by kill() or the kernel, not with a siginfo the sender wrote. */
int budget_stop_from_outside(const siginfo_t *si);
/* the run is over, before status: final measure (no walk of /proc when empty: the caller reaped
 * every process of the run), the run cgroup emptied and removed */
void budget_finish(struct launch *L, int empty);
/* the run is about to be torn down: measure it as it is */
void budget_measure_now(struct launch *L);
void budget_running(struct launch *L, pid_t prog);
void budget_add_prog_usage(pid_t pid, struct rusage *ru);
/* "total", after usage */
void budget_report_total(const struct launch *L, const struct rusage *ru);
/* before reaping: the program exited? then a last walk */
void budget_observe_exit(struct launch *L, pid_t pid);
/* the "observed" lines, after total */
void budget_report_observed(const struct launch *L, int wstatus);
/* the launcher at the end, whatever happened: the run cgroup is removed */
void budget_cleanup(struct launch *L);

/* ---- workspace.c ---- */

int workspace_open(struct launch *L);   /* --files-in and --collect-to, before the mounts */
int workspace_in(struct launch *L);     /* the files into the work dir, before the program; -1:
					 * fatal, reported */
/* --files-wait-fd, for the init: 1 when the program is to start before the files are in (the pipe
 * made), 0 when not, -1 when the pipe cannot be made (fatal, reported) */
int workspace_wait_open(struct launch *L);
/* the pipe closed; with go, after the byte WORKSPACE_GO that says every file is made: EOF without
 * it (an init killed while it made them, whose exit closes the pipe before the namespace's end
 * kills the program) is no go */
#define WORKSPACE_GO 'y'
void workspace_wait_close(struct launch *L, int go);
void workspace_collect(struct launch *L);       /* after every process of the run is dead */

/* ---- probe.c ---- */

int probe_run(void);

/* ---- relay.c ---- */
int relay_run(const struct plan *p);   /* exit status of --relay */

#endif
