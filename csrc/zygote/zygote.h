/* zygote.h: private header joining corral-zygote's files, by process and by path.
 *
 * The processes, by role (docs/internals.md has the table: who forks whom, with which flags, in
 * which namespaces, what each execs):
 *   zygote       the warm interpreter; the host's peer on the control socket
 *   spawner      small, forked by the zygote before the interpreter: starts each launcher
 *   closer       small, forked likewise: closes the runs' mount namespaces
 *   direct init  cloned by the zygote into a direct run's namespaces; execs corral-init
 *   launcher     per run on the spawner path: the launcher's own flow (launch_run)
 *   init         the init of the run's PID namespace (the launcher's child, or corral-init)
 *   joiner       vforked by the zygote: enters the init's PID namespace for its children
 *   midwife      vforked by the joiner there: forks the program and exits, so the init adopts it
 *   program      forked from the warm interpreter; runs the program instead of an execve
 *
 * Shared by both paths:
 *   main.c     the zygote's start-up: the command line, the flat list of its steps, the loop
 *   control.c  the control socket: messages in (with their fds) and out (queued, never blocking)
 *   protocol.h the protocol's words, shared with the host (csrc/core/zygote.c)
 *   request.c  the zygote: a run request, the runs going on, reaping, the end
 *   filters.c  the zygote: the seccomp filters kept, one per distinct deny list
 *   closer.c   the closer
 *   pystart.c  the zygote: the interpreter's start-up (python.h joins the py*.c files)
 *   pycheck.c  whether the interpreter can run what a run asks for
 *   pyrun.c    the program: the run's state, then the program as python3's main runs it
 *   pyend.c    the program: its end, as python3 ends
 *   pygc.c     the program: whether the run froze objects (CPython's internal headers)
 *   pyflush.c  the program: the flush handlers, which the zygote sets once
 *   exec.c     the program: what execve() would have done to it
 * The direct path (a run without a run cgroup):
 *   direct.c   the direct init, and the program it forks
 * The spawner path (a run cgroup, or a kernel that refuses the direct clone):
 *   spawner.c  the spawner, and each launcher it starts
 *   program.c  the init's request for its program, and the zygote's fork of it (joiner, midwife)
 *
 * corral-zygote is built from these and the launcher's step archive (csrc/launch but main.c).
 * The protocol is in docs/internals.md, section "corral-zygote".
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
	pid_t self;             /* the zygote's pid: each launcher's parent */
	pid_t parent;           /* --parent-pid (0: the parent found at start) */
	enum plan_net net;      /* --net */
	enum plan_userns userns;        /* --userns */
	struct ns_shared ns;    /* the namespaces made once */
	const char *python;     /* --python: the interpreter runs ask for (sys.executable) */
	const char *preload;    /* --preload: module names, comma-separated, or NULL */
	const char *command;    /* --command: a -c COMMAND compiled once, or NULL */
	int flush_handlers;     /* --flush-handlers: the prelude's handlers in every program */
	char **env;             /* --env, NULL-terminated: the environment Python starts in */
	size_t nenv;
	int spawner;            /* the socket to the spawner */
	pid_t spawner_pid;
	int closer;             /* the socket to the closer; -1: none (the zygote closes the files
				 * itself) */
	pid_t closer_pid;
	int broken;             /* the spawner is gone: no new run can start; exit once the runs are
				 * done */
};

/* A growing list of strings (the ready message's lines). */
struct strv {
	char **v;
	size_t n, cap;
};

int strv_add(struct strv *s, const char *str);          /* a copy; 0, or -1: out of memory */
void strv_free(struct strv *s);

/* ---- direct.c: a run without the spawner, launcher and init ---- */

/* At start-up: corral-init, next to the zygote's executable (O_PATH); -1 when it is not there
 * (every run then goes by the spawner). */
int direct_open(const char *self_dir);
int direct_fd(void);
/* A run request's message (run\0ID\0ARGS...) and its 4 fds, started directly: the direct init's pid
 * (the run's), the read end of its outcome pipe and its mount namespace (or -1). -1 with errno
 * ENOTSUP: this run goes by the spawner. */
pid_t direct_start(const struct zygote *z, char *msg, size_t len, const int *fds, int *outr,
		   int *mntns);
int direct_outcome(int outr, int *status);      /* the program's outcome: 1 and the run's status */

/* ---- control.c ---- */

/* Sends one message of n NUL-terminated fields; queued when the socket is full (sent by
 * ctl_flush). 0, or -1 with errno: the socket is unusable (the host is gone). */
int ctl_send(int fd, const char *const *fields, size_t n);
/* The same with an fd (SCM_RIGHTS; -1: none), which it owns from then on and closes once sent. */
int ctl_send_fd(int fd, const char *const *fields, size_t n, int passfd);
int ctl_queued(void);                   /* 1: messages wait for POLLOUT */
int ctl_flush(int fd);                  /* 0, or -1 with errno (as ctl_send) */

/* One whole message with nfds fds (SCM_RIGHTS, MSG_FDS_MAX at most), blocking: between the
 * zygote's own processes (the spawner, init), not to the host. 0, or -1 with errno. */
#define MSG_FDS_MAX 16
int msg_send(int fd, const void *buf, size_t len, const int *fds, int nfds);

/* One message into buf (len bytes at most) and up to maxfds fds (close-on-exec). Returns its
 * length, 0 at EOF, or -1 with errno. *nfds: how many fds came; *cut: 1 when the message or its
 * fds did not fit (what came is returned all the same, to be refused). */
ssize_t ctl_recv(int fd, char *buf, size_t len, int *fds, int maxfds, int *nfds, int *cut);

/* ---- request.c ---- */

/* A message from the host; closes the fds it came with (the launcher has its own copies). */
void request_handle(struct zygote *z, char *msg, size_t len, int *fds, int nfds, int cut);
/* Reaps every launcher that has ended and sends its exit message. 0, or -1: no child is left. */
int request_reap(struct zygote *z);
/* 1: no run is going on. */
int request_idle(void);
/* The runs' sockets to poll, at (*pf)[base...] (grown as needed), and the closer's when files wait
 * for it: returns base + how many. */
size_t request_poll(const struct zygote *z, struct pollfd **pf, size_t *cap, size_t base);
/* What poll() said of them: the init's requests for its program. */
void request_polled(struct zygote *z, const struct pollfd *pf, size_t base, size_t n);

/* ---- filters.c ---- */

/* In the zygote, before forking a program: the plan's seccomp filter in seccomp.c's state (built
 * once). own_net: the run has a network namespace of its own, not the zygote's. */
void filters_load(const struct zygote *z, const struct plan *p, int own_net);

/* ---- spawner.c ---- */

/* In the zygote at start-up, before the interpreter: forks the spawner. 0, or -1 with errno. */
int helper_fork(struct zygote *z, void (*child_main)(const struct zygote *z, int sock), int *sock,
		pid_t *pid);                    /* control.c: the spawner and closer */
int spawner_start(struct zygote *z);
void spawner_stop(struct zygote *z);             /* at the zygote's end: EOF to the spawner, which
						  * is waited for */
/* A request (checked: "run\0ID\0ARGS...", its four fds) and the run's socket to the spawner: the
 * launcher's pid, or -1 with errno. */
pid_t spawner_fork(const struct zygote *z, const char *msg, size_t len, const int *fds,
		   int runsock);

/* ---- closer.c ---- */

/* In the zygote at start-up, before the interpreter: forks the closer. 0, or -1 (then z->closer is
 * -1). */
int closer_start(struct zygote *z);
/* A run's mount namespace file, to be closed by the closer (never blocks; without the closer,
 * closed here). */
void closer_give(struct zygote *z, int fd);
void closer_flush(struct zygote *z);            /* what the closer could not take before, at
						 * POLLOUT */
int closer_waiting(const struct zygote *z);     /* 1: files wait for the closer's socket to take
						 * them */
void closer_gone(struct zygote *z);             /* the closer was reaped */
void closer_stop(struct zygote *z);             /* at the zygote's end: EOF to the closer, which is
						 * waited for */

/* ---- program.c ---- */

/* In the launcher: the hooks by which the init gets its program from the zygote over sock (ARGS:
 * the run's ID and arguments, which the zygote parses again). */
void program_prepare(struct launch *L, int sock, char **args, size_t nargs);
/* In the zygote, after the spawner was forked: the key of program_digest(). 0, or -1. */
int program_key(void);
/* The keyed hash of a request's ID and ARGS, kept per run to check the init's request against. */
uint64_t program_digest(const char *bytes, size_t len);
/* In the zygote: the init's request on sock, with its fds (closed by the caller): forks the program
 * into the init's namespaces and answers the init. The program's pid there, or -1 (the init was
 * told why). digest: the host's request's. When the program is forked, *mntns takes the run's mount
 * namespace file out of fds[] (-1 there): the caller's to close. */
pid_t program_fork(const struct zygote *z, int sock, char *msg, size_t len, int *fds, int nfds,
		   uint64_t digest, int *mntns);
/* The host closed the control socket: ends the runs still going (as SIGTERM ends a launcher's),
 * waits for them, and says nothing more. */
void request_stop_all(struct zygote *z);

/* ---- python.c ---- */

/* In the zygote: initialises the interpreter as `python3 -I` started with z->env for environment,
 * imports the preloaded modules (a failure adds "preload-failed MODULE REASON" to lines) and
 * readies it for forking. 0, or -1 with a message in err. */
int py_start(const struct zygote *z, struct strv *lines, char *err, size_t errlen);
/* In the launcher: whether the interpreter can run what the plan's PROGRAM ARGS ask for: 0, or -1
 * with the usage error in err. */
int py_check_run(const struct zygote *z, const struct plan *p, char *err, size_t errlen);
/* In the program, instead of execve: runs the program in the interpreter and exits as python3 does.
 * errfd: the pipe to the supervisor (child_die) until the program starts. */
NORETURN void py_run_program(const struct launch *L, int errfd);

/* ---- pygc.c ---- */

int py_frozen_mark(void);       /* in the zygote, after gc.freeze(): 0, or -1 (no Python error
				 * set) */
int py_frozen_grew(void);       /* in the program: 1 when the run may have frozen objects of its
				 * own */

/* ---- exec.c ---- */

void exec_prepare(void);                /* in the zygote: its memory layout, for exec_like() */
/* In the program: what execve() does to the process (capabilities, cmdline, environ, comm); 0, or
 * -1 with errno when the capabilities could not be dropped. */
int exec_like(const struct plan *p);
void exec_dumpable(void);               /* in the program, last: dumpable, as after execve() */
/* In the program: the rseq registration again (dropped by the kernel for a CLONE_VM parent). */
void exec_rseq_again(void);

#endif
