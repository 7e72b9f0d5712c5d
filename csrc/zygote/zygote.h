/* zygote.h: private header joining corral-zygote's files.
 *
 *   main.c     start-up: the command line, the flat list of the zygote's own steps, the loop
 *   control.c  the control socket: messages in (with their fds) and out (queued, never blocking)
 *   request.c  a run request: its plan, the seccomp filters kept, process A, reaping, the end
 *   python.c   the embedded interpreter: start-up, preloading, the program in C, its exit
 *   pygc.c     whether the run froze objects (its one use of CPython's internal headers)
 *   exec.c     what execve() would have done to C: capabilities, cmdline, environ, comm
 *
 *   direct.c   a direct run: P cloned into the run's new namespaces, C forked, corral-init run
 *   spawner.c  S, small, forked before the interpreter: starts each run's A (Z's child), for
 *              the runs that are not direct
 *   closer.c   K, small, forked before the interpreter: closes the runs' mount namespaces,
 *              whose teardown would stall Z
 *   program.c  C, forked by Z into the run's namespaces on B's request, and B's end of that
 *
 * corral-zygote is built from the launcher's files (all of csrc/launch but main.c) and these. A run
 * is direct (direct.c) unless it has a run cgroup. Otherwise, process
 * names as in launch.h: for each run S starts an A (its pid is the run's pid for the host), A
 * follows the launcher's own flow (launch_run) and forks the init B; B asks Z for the program C,
 * which Z forks from the warm interpreter into B's namespaces, and which runs the program in that
 * interpreter instead of an execve. The protocol is in docs/internals.md, section
 * "corral-zygote".
 */
#ifndef CORRAL_ZYGOTE_H
#define CORRAL_ZYGOTE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../launch/launch.h"
#include "protocol.h"

#define MSG_MAX (1 << 20)       /* a run request, at most (its arguments) */
#define ARGS_MAX 65536          /* arguments in one request; plan.c bounds each kind anyway */

struct pollfd;

/* Exit codes of the zygote itself. */
enum { ZYGOTE_FAILED = 1 };

/* File descriptors a run request carries, in this order. */
enum { RUN_STDIN, RUN_STDOUT, RUN_STDERR, RUN_REPORT, RUN_NFDS };

struct zygote {
	int ctl;                /* the control socket (SOCK_SEQPACKET) */
	int sigfd;              /* signalfd for SIGCHLD (blocked) */
	pid_t self;             /* the zygote's pid: each A's parent */
	pid_t parent;           /* --parent-pid (0: the parent found at start) */
	enum plan_net net;      /* --net */
	enum plan_userns userns;        /* --userns */
	struct ns_shared ns;    /* the namespaces made once */
	const char *python;     /* --python: the interpreter runs ask for (sys.executable) */
	const char *preload;    /* --preload: module names, comma-separated, or NULL */
	char **env;             /* --env, NULL-terminated: the environment Python starts in */
	size_t nenv;
	int spawner;            /* the socket to S */
	pid_t spawner_pid;
	int closer;             /* the socket to K; -1: none (Z closes the files itself) */
	pid_t closer_pid;
	int broken;             /* S is gone: no new run can start; exit once the runs are done */
};

/* A growing list of strings (the ready message's lines). */
struct strv {
	char **v;
	size_t n, cap;
};

int strv_add(struct strv *s, const char *str);          /* a copy; 0, or -1: out of memory */
void strv_free(struct strv *s);

/* ---- direct.c: a run without S, A and B ---- */

/* At start-up: corral-init, next to the zygote's executable (O_PATH); -1 when it is not there
 * (every run then goes by S). */
int direct_open(const char *self_dir);
int direct_fd(void);
/* A run request's message (run\0ID\0ARGS...) and its 4 fds, started directly: P's pid (the
 * run's), the read end of its outcome pipe and its mount namespace (or -1). -1 with errno
 * ENOTSUP: this run goes by S. */
pid_t direct_start(const struct zygote *z, char *msg, size_t len, const int *fds, int *outr,
		   int *mntns);
int direct_outcome(int outr, int *status);      /* C's outcome: 1 and the run's status */

/* ---- control.c ---- */

/* Sends one message of n NUL-terminated fields; queued when the socket is full (sent by
 * ctl_flush). 0, or -1 with errno: the socket is unusable (the host is gone). */
int ctl_send(int fd, const char *const *fields, size_t n);
/* The same with an fd (SCM_RIGHTS; -1: none), which it owns from then on and closes once sent. */
int ctl_send_fd(int fd, const char *const *fields, size_t n, int passfd);
int ctl_queued(void);                   /* 1: messages wait for POLLOUT */
int ctl_flush(int fd);                  /* 0, or -1 with errno (as ctl_send) */

/* One whole message with nfds fds (SCM_RIGHTS, MSG_FDS_MAX at most), blocking: between the
 * zygote's own processes (S, B), not to the host. 0, or -1 with errno. */
#define MSG_FDS_MAX 16
int msg_send(int fd, const void *buf, size_t len, const int *fds, int nfds);

/* One message into buf (len bytes at most) and up to maxfds fds (close-on-exec). Returns its
 * length, 0 at EOF, or -1 with errno. *nfds: how many fds came; *cut: 1 when the message or its
 * fds did not fit (what came is returned all the same, to be refused). */
ssize_t ctl_recv(int fd, char *buf, size_t len, int *fds, int maxfds, int *nfds, int *cut);

/* ---- request.c ---- */

/* A message from the host; closes the fds it came with (A has its own copies). */
void request_handle(struct zygote *z, char *msg, size_t len, int *fds, int nfds, int cut);
/* Reaps every A that has ended and sends its exit message. 0, or -1: no child is left. */
int request_reap(struct zygote *z);
/* 1: no run is going on. */
int request_idle(void);
/* The runs' sockets to poll, at (*pf)[base...] (grown as needed), and K's when files wait for
 * it: returns base + how many. */
size_t request_poll(const struct zygote *z, struct pollfd **pf, size_t *cap, size_t base);
/* What poll() said of them: B's requests for its program. */
void request_polled(struct zygote *z, const struct pollfd *pf, size_t base, size_t n);

/* ---- filters.c ---- */

/* In Z, before forking a C: the plan's seccomp filter in seccomp.c's state (built once). */
void filters_load(const struct zygote *z, const struct plan *p);

/* ---- spawner.c ---- */

/* In Z at start-up, before the interpreter: forks S. 0, or -1 with errno. */
int helper_fork(struct zygote *z, void (*child_main)(const struct zygote *z, int sock), int *sock,
		pid_t *pid);                    /* control.c: S and K */
int spawner_start(struct zygote *z);
void spawner_stop(struct zygote *z);             /* at Z's end: EOF to S, which is waited for */
/* A request (checked: "run\0ID\0ARGS...", its four fds) and the run's socket to S: A's pid, or -1
 * with errno. */
pid_t spawner_fork(const struct zygote *z, const char *msg, size_t len, const int *fds,
		   int runsock);

/* ---- closer.c ---- */

/* In Z at start-up, before the interpreter: forks K. 0, or -1 (then z->closer is -1). */
int closer_start(struct zygote *z);
/* A run's mount namespace file, to be closed by K (never blocks; without K, closed here). */
void closer_give(struct zygote *z, int fd);
void closer_flush(struct zygote *z);            /* what K could not take before, at POLLOUT */
int closer_waiting(const struct zygote *z);     /* 1: files wait for K's socket to take them */
void closer_gone(struct zygote *z);             /* K was reaped */
void closer_stop(struct zygote *z);             /* at Z's end: EOF to K, which is waited for */

/* ---- program.c ---- */

/* In A: the hooks by which B gets its program from Z over sock (ARGS: the run's ID and
 * arguments, which Z parses again). */
void program_prepare(struct launch *L, int sock, char **args, size_t nargs);
/* In Z, after S was forked: the key of program_digest(). 0, or -1. */
int program_key(void);
/* The keyed hash of a request's ID and ARGS, kept per run to check B's request against. */
uint64_t program_digest(const char *bytes, size_t len);
/* In Z: B's request on sock, with its fds (closed by the caller): forks C into B's namespaces
 * and answers B. C's pid there, or -1 (B was told why). digest: the host's request's. When C
 * is forked, *mntns takes the run's mount namespace file out of fds[] (-1 there): the caller's
 * to close. */
pid_t program_fork(const struct zygote *z, int sock, char *msg, size_t len, int *fds, int nfds,
		   uint64_t digest, int *mntns);
/* The host closed the control socket: ends the runs still going (as SIGTERM ends a launcher's),
 * waits for them, and says nothing more. */
void request_stop_all(struct zygote *z);

/* ---- python.c ---- */

/* In Z: initialises the interpreter as `python3 -I` started with z->env for environment,
 * imports the preloaded modules (a failure adds "preload-failed MODULE REASON" to lines) and
 * readies it for forking. 0, or -1 with a message in err. */
int py_start(const struct zygote *z, struct strv *lines, char *err, size_t errlen);
/* In A: whether the interpreter can run what the plan's PROGRAM ARGS ask for: 0, or -1 with the
 * usage error in err. */
int py_check_run(const struct zygote *z, const struct plan *p, char *err, size_t errlen);
/* In C, instead of execve: runs the program in the interpreter and exits as python3 does.
 * errfd: the pipe to the supervisor (child_die) until the program starts. */
NORETURN void py_run_program(const struct launch *L, int errfd);

/* ---- pygc.c ---- */

int py_frozen_mark(void);       /* in Z, after gc.freeze(): 0, or -1 (no Python error set) */
int py_frozen_grew(void);       /* in C: 1 when the run may have frozen objects of its own */

/* ---- exec.c ---- */

void exec_prepare(void);                /* in Z: its memory layout, for exec_like() */
/* In C: what execve() does to the process (capabilities, cmdline, environ, comm); 0, or -1
 * with errno when the capabilities could not be dropped. */
int exec_like(const struct plan *p);
void exec_dumpable(void);               /* in C, last: dumpable, as after execve() */
/* In C: the rseq registration again (dropped by the kernel for a CLONE_VM parent). */
void exec_rseq_again(void);

#endif
