/*
 * corral.core: private header shared by the files of the host module.
 *
 * core.c     luaopen_corral_core, the loop userdata, core.run, small calls
 * bind.c     what every binding uses: the loop, errors, protected calls, option tables
 * process.c  core.spawn: pipes with capped reads, timers, the kill sequence, the result
 * fs.c       mkdtemp, rmtree, write_file, chown, chmod, exists
 * records.c  records_read, records_unpack: a run's collected files into Lua tables
 * utf8.c     utf8_repair, json_raw_control, json_separators (pure functions plus their bindings)
 * lock.c     core.lock
 * http.c     core.http_listen: an HTTP/1.1 server (http-parser) and its corral.http_res
 * watch.c    core.signal, core.timer, core.reader: small handles that call a Lua function
 * zygote.c   core.zygote: a warm interpreter (corral-zygote) that forks runs on request
 *
 * There is no process-wide state: every luaopen makes its own corral_loop, reached through the
 * first upvalue of the module's functions (busted loads the module afresh per spec file).
 */
#ifndef CORRAL_CORE_H
#define CORRAL_CORE_H

#include <stddef.h>
#include <stdint.h>

#include <lua.h>
#include <lauxlib.h>
#include <uv.h>

#define CORRAL_LOOP_MT "corral.loop"
#define CORRAL_PROC_MT "corral.proc"
#define CORRAL_LOCK_MT "corral.lock"
#define CORRAL_FILE_MT "corral.file"
#define CORRAL_DIR_MT  "corral.dirguard"
#define CORRAL_SERVER_MT "corral.http_server"
#define CORRAL_RES_MT    "corral.http_res"
#define CORRAL_SIGNAL_MT "corral.signal"
#define CORRAL_TIMER_MT  "corral.timer"
#define CORRAL_READER_MT "corral.reader"
#define CORRAL_ZYGOTE_MT "corral.zygote"

/* One read buffer per loop: libuv reads into it, process.c copies what fits under the caps;
 * http.c reads input it drops (after a closing response) into it. */
#define CORRAL_SCRATCH_SIZE (64 * 1024)

struct corral_run;
struct corral_http_server;
struct corral_watch;
struct corral_zygote;
struct corral_zlink;

typedef struct corral_loop {
  uv_loop_t loop;
  lua_State *L;               /* the main Lua thread: callbacks run on it */
  struct corral_run *runs;    /* every run whose handles are not all closed yet */
  struct corral_http_server *servers; /* every server whose handles are not all closed yet */
  struct corral_watch *watches;       /* every signal watcher, timer and reader not closed yet */
  struct corral_zygote *zygotes;      /* every zygote whose handles are not all closed yet */
  int running;                /* inside uv_run (core.run is not re-entrant) */
  int closing;                /* the loop is being torn down: no Lua from callbacks */
  int err_ref;                /* first error raised by a callback, re-raised by core.run */
  int have_pidfd;             /* process.c: 1 the kernel has pidfds, -1 not, 0 not asked yet */
  char scratch[CORRAL_SCRATCH_SIZE];
} corral_loop;

/* ---- bind.c ---- */

/* The loop of the module function being called (upvalue 1); raises if it was closed. */
corral_loop *corral_loop_up(lua_State *L);

/* Push nil, "ENAME: <what>: <strerror>", "ENAME" for an errno value; returns 3. */
int corral_fail_errno(lua_State *L, int err, const char *fmt, ...);
/* The same for a libuv error code (negative). */
int corral_fail_uv(lua_State *L, int uverr, const char *fmt, ...);

/* Call the function below nargs arguments on L (the main thread) with a traceback handler.
 * A failure is kept (the first one) in cl->err_ref and stops the loop so that core.run re-raises
 * it; returns the lua_pcall status. */
int corral_pcall(corral_loop *cl, lua_State *L, int nargs);
/* The same protected call with a traceback, but a failure is only left on the stack (the error
 * message replaces the function and its arguments); for callers that handle it themselves. */
int corral_pcall_keep(lua_State *L, int nargs);

/* Strict option tables: raise naming the first key of table idx that is not in known. */
void corral_check_keys(lua_State *L, int idx, const char *const known[]);
/* Field readers: absent (nil) gives def; a wrong type or an out-of-range value raises. */
lua_Integer corral_opt_integer(lua_State *L, int idx, const char *key, lua_Integer def,
                               lua_Integer min, lua_Integer max);
double corral_opt_number(lua_State *L, int idx, const char *key, double def, double min,
                         double max);
int corral_opt_boolean(lua_State *L, int idx, const char *key, int def);
/* Always leaves one value on the stack: the string, or nil when absent (then returns NULL). */
const char *corral_opt_string(lua_State *L, int idx, const char *key, size_t *len);

/* ---- process.c ---- */
int corral_spawn(lua_State *L);
void corral_proc_open(lua_State *L);          /* registers the corral.proc metatable */
/* Loop teardown: SIGKILL and reap every running child, then uv_close every handle (their close
 * callbacks free the runs without calling Lua; the caller runs the loop to let them fire). */
void corral_runs_shutdown(corral_loop *cl);

/* ---- zygote.c ---- */
int corral_zygote_start(lua_State *L);
void corral_zygote_open(lua_State *L);        /* registers corral.zygote */
/* The open zygote of the userdata at idx; raises if it is not one, or closed. */
struct corral_zygote *corral_zygote_check(lua_State *L, int idx);
/* What a zygote tells a run started through it: the caller's functions, so that zygote.c
 * knows nothing of a run but this. */
struct corral_zlink_ops {
  void (*pid)(struct corral_run *r, int pid, int pidfd); /* pidfd: the run's to close, or -1 */
  void (*ended)(struct corral_run *r, int exit_status, int term_signal);
  void (*exit)(struct corral_run *r, int exit_status, int term_signal);
  void (*failed)(struct corral_run *r, const char *why);
};
/* Send a run's request (args: NULL-terminated launcher arguments; fds: the child's stdin,
 * stdout, stderr and report ends, always taken over). 0 and the link in *out, or -errno. */
int corral_zygote_submit(struct corral_zygote *z, struct corral_run *r,
                         const struct corral_zlink_ops *ops, char *const *args, int fds[4],
                         struct corral_zlink **out);
void corral_zlink_free(struct corral_zlink *k);  /* the run is done with it (NULL: nothing) */
/* A launch started ahead (held: 1) does not keep core.run("default") going until it is let go
 * or told to go (held: 0). NULL: nothing. */
void corral_zlink_hold(struct corral_zlink *k, int held);
/* Loop teardown, before corral_runs_shutdown: kill and reap the zygotes, close their handles. */
void corral_zygote_shutdown(corral_loop *cl);

/* ---- http.c ---- */
int corral_http_listen(lua_State *L);
int corral_resolve(lua_State *L);             /* core.resolve(host) */
void corral_http_open(lua_State *L);          /* registers corral.http_server, corral.http_res */
/* Loop teardown: close every listener and connection without calling Lua (unix socket paths
 * are unlinked); the caller runs the loop to let the close callbacks free them. */
void corral_http_shutdown(corral_loop *cl);

/* ---- watch.c ---- */
int corral_signal(lua_State *L);
int corral_timer(lua_State *L);
int corral_reader(lua_State *L);
void corral_watch_open(lua_State *L);         /* registers corral.signal, corral.timer, corral.reader */
void corral_watch_shutdown(corral_loop *cl);  /* loop teardown: close them, no Lua */

/* ---- fs.c ---- */
int corral_mkdtemp(lua_State *L);
int corral_rmtree(lua_State *L);
int corral_write_file(lua_State *L);
int corral_append_file(lua_State *L);
int corral_create_file(lua_State *L);
void corral_file_open(lua_State *L);          /* registers the corral.file metatable */
int corral_file_fd(lua_State *L, int idx);    /* an open file's fd; raises when closed */
int corral_read_file(lua_State *L);
int corral_chown(lua_State *L);
int corral_chmod(lua_State *L);
int corral_exists(lua_State *L);
int corral_mkdir(lua_State *L);
int corral_symlink(lua_State *L);
int corral_readlink(lua_State *L);
int corral_lstat(lua_State *L);
int corral_access(lua_State *L);
int corral_realpath(lua_State *L);
int corral_listdir(lua_State *L);

/* ---- records.c ---- */
int corral_records_read(lua_State *L);
int corral_records_unpack(lua_State *L);
void corral_records_open(lua_State *L);       /* registers the corral.records metatable */

/* ---- utf8.c ---- */
/* Replace every maximal invalid subsequence of in[0..n) by U+FFFD, as Python's
 * bytes.decode("utf-8", "replace") does. Writes to out when it is not NULL (out needs at most
 * 3 * n bytes; the return value is the exact length); *valid is set to 1 when the input was
 * valid UTF-8 (then the output equals the input). */
size_t utf8_repair(const unsigned char *in, size_t n, unsigned char *out, int *valid);
int corral_utf8_repair(lua_State *L);
long json_raw_control(const unsigned char *s, size_t n);
int corral_json_raw_control(lua_State *L);
size_t json_separators(const unsigned char *s, size_t n);
int corral_json_separators(lua_State *L);
/* Base64, standard alphabet, padded: out needs (n + 2) / 3 * 4 bytes; b64_decode's out n / 4 * 3,
 * and it returns the length or -1 - the offset of the first wrong byte (strict: RFC 4648). */
size_t b64_encode(const unsigned char *in, size_t n, char *out);
long b64_decode(const unsigned char *s, size_t n, unsigned char *out);
int corral_b64encode(lua_State *L);
int corral_b64decode(lua_State *L);

/* ---- lock.c ---- */
int corral_lock(lua_State *L);
void corral_lock_open(lua_State *L);          /* registers the corral.lock metatable */
int corral_lock_fd(lua_State *L, int idx);    /* a lock's fd; -1 once closed */

#endif
