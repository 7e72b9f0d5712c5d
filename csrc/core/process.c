/*
 * corral.core: core.spawn and the corral.proc userdata.
 *
 * A run owns, in C memory freed only when every one of its libuv handles has been closed: the
 * process handle, three timers (timeout, kill grace, drain grace), the stdout/stderr/report pipes
 * and the optional stdin pipe. Reads land in the loop's one scratch buffer; what fits under a
 * stream's cap is copied into its kept buffer, the rest is only counted (and fed to the tail
 * ring). So the memory of a run is bounded by its caps whatever the child prints.
 *
 * Stream mode (`stream`, for a long-lived interpreter fed requests): stdin is always a pipe and
 * stays open; the `stdin` bytes go first, then each proc:write in order, until proc:close_stdin
 * (EOF once the queued writes are out), a write error (EPIPE) or the run's end. Writes are
 * copied and queued, at most STDIN_QUEUE_MAX bytes waiting, so a child that does not read
 * cannot make the host grow. Each stdout/stderr chunk is counted and passed to
 * on_output(name, bytes) straight from the read buffer, never kept: memory stays bounded
 * whatever the child prints. The report is kept as always.
 *
 * Ending a run (timeout, overflow, proc:kill()): SIGTERM to the launcher, which kills its own
 * tree; after `grace`, SIGKILL to the launcher and to its process group (it called setsid, so
 * pgid == pid). When the launcher has been reaped, the pipes get at most `grace` more to reach
 * EOF; then the group is killed and the pipes closed anyway. When every handle is closed, the
 * result is built and on_exit(res) is called, once, through the loop's protected-call helper.
 */
#include "core.h"

#include <errno.h>
#include <poll.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPORT_CAP ((size_t)64 * 1024)
#define DEFAULT_CAP ((lua_Integer)1024 * 1024)
#define MAX_CAP ((lua_Integer)1 << 30)
#define DEFAULT_GRACE 0.2
#define STDIN_QUEUE_MAX ((size_t)16 * 1024 * 1024) /* stream mode: bytes proc:write may queue */
/* A launch started ahead and let go: how long its init may take to end its namespace, after EOF
 * on the report socket, before its group is killed. */
#define LET_GO_MS 2000

enum { ST_UNUSED = 0, ST_OPEN, ST_CLOSED };

typedef struct corral_run corral_run;

/* One output stream of the child. */
typedef struct stream {
  uv_pipe_t pipe; /* first member: read_cb casts the handle back to the stream */
  corral_run *run;
  const char *name;
  int state;
  size_t cap;          /* bytes kept */
  char *keep;
  size_t keep_len, keep_alloc;
  size_t tail_cap;     /* ring of the last tail_cap bytes */
  char *tail;
  size_t tail_len, tail_alloc, tail_pos;
  uint64_t total;      /* bytes the child wrote */
} stream;

typedef struct proc_ud {
  corral_run *run; /* NULL once the result is delivered (or the state is closing) */
  lua_Integer pid;
  int done;
  int stream; /* spawned with `stream`: proc:write and proc:close_stdin apply */
} proc_ud;

/* One proc:write in flight: the bytes are copied, freed by the write callback (libuv calls it
 * for every request, with UV_ECANCELED when the handle is closed first). */
typedef struct in_write {
  uv_write_t req;
  corral_run *run;
  size_t len;
  char data[];
} in_write;

struct corral_run {
  corral_loop *cl;
  corral_run *next, **prevp; /* cl->runs */
  proc_ud *ud;
  int self_ref;    /* registry: the proc userdata, until on_exit ran */
  int on_exit_ref; /* registry: on_exit */
  int on_output_ref; /* registry: on_output (stream mode), or LUA_NOREF */
  int handles;     /* initialised handles whose close callback has not run yet */
  uv_process_t process;
  uv_timer_t t_timeout, t_kill, t_drain;
  stream out, err, rep;
  uv_pipe_t in;
  int in_state;
  uv_write_t wreq;
  uv_shutdown_t sreq;
  char *in_data;
  size_t in_len;
  size_t in_queued; /* stream mode: bytes written with proc:write and not yet taken by libuv */
  uint64_t timeout_ms, grace_ms;
  uint64_t t_start, t_end;
  int pid;
  int64_t exit_status;
  int term_signal;
  const char *overflow;
  struct corral_zlink *zl; /* started through a warm interpreter (zygote.c) */
  uv_poll_t pidpoll;       /* readable once the child exited (posix_spawn), or the zygote's
                            * direct run, which has ended, is gone (zygote_ended) */
  int pidfd;               /* -1: none; for a zygote's direct run, the zygote's pidfd of it */
  char *zerror;            /* ... which could not start it, or went away */
  unsigned pidpoll_init : 1;
  unsigned process_init : 1, spawned : 1, exited : 1, ending : 1, finishing : 1;
  unsigned timed_out : 1, killed : 1, kill_on_overflow : 1, has_timeout : 1, report : 1;
  unsigned kill_sent : 1; /* SIGKILL went out (or is due once a zygote names the pid) */
  unsigned held : 1;      /* `hold`: started ahead, waiting for proc:go() */
  unsigned stream : 1;    /* stdout/stderr go to on_output; stdin stays open for proc:write */
  unsigned in_shut : 1;   /* stdin's shutdown is requested: no more writes */
};

/* ---- closing and freeing --------------------------------------------------------------------- */

static void run_complete(corral_run *r);

static void handle_closed(uv_handle_t *h) {
  corral_run *r = (corral_run *)h->data;
  if (--r->handles == 0) run_complete(r);
}

static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, handle_closed);
}

static void stream_close(stream *st) {
  if (st->state != ST_OPEN) return;
  st->state = ST_CLOSED;
  close_handle((uv_handle_t *)&st->pipe);
}

static void stdin_close(corral_run *r) {
  if (r->in_state != ST_OPEN) return;
  r->in_state = ST_CLOSED;
  close_handle((uv_handle_t *)&r->in);
}

static void close_outputs(corral_run *r) {
  stream_close(&r->out);
  stream_close(&r->err);
  stream_close(&r->rep);
}

/* Close everything (spawn failure, teardown). */
static void close_all(corral_run *r) {
  close_outputs(r);
  stdin_close(r);
  close_handle((uv_handle_t *)&r->t_timeout);
  close_handle((uv_handle_t *)&r->t_kill);
  close_handle((uv_handle_t *)&r->t_drain);
  if (r->process_init) close_handle((uv_handle_t *)&r->process);
  if (r->pidpoll_init) close_handle((uv_handle_t *)&r->pidpoll);
}

static void stream_free(stream *st) {
  free(st->keep);
  free(st->tail);
  st->keep = st->tail = NULL;
}

static void run_free(corral_run *r) {
  if (r->pidfd >= 0) close(r->pidfd); /* its poll handle is closed by now */
  corral_zlink_free(r->zl);
  r->zl = NULL;
  free(r->zerror);
  stream_free(&r->out);
  stream_free(&r->err);
  stream_free(&r->rep);
  free(r->in_data);
  free(r);
}

static void run_unlink(corral_run *r) {
  if (r->prevp == NULL) return;
  *r->prevp = r->next;
  if (r->next) r->next->prevp = r->prevp;
  r->next = NULL;
  r->prevp = NULL;
}

/* ---- signals --------------------------------------------------------------------------------- */

static void signal_pid(corral_run *r, int sig) {
  if (r->pid > 0) kill(r->pid, sig);
}

static void signal_group(corral_run *r, int sig) {
  if (r->pid > 1) kill(-r->pid, sig);
}

static void maybe_finish(corral_run *r) {
  if (!r->exited || r->finishing) return;
  if (r->out.state == ST_OPEN || r->err.state == ST_OPEN || r->rep.state == ST_OPEN) return;
  r->finishing = 1;
  stdin_close(r);
  close_handle((uv_handle_t *)&r->t_timeout);
  close_handle((uv_handle_t *)&r->t_kill);
  close_handle((uv_handle_t *)&r->t_drain);
  /* the process handle was closed in exit_cb; run_complete follows the last close callback */
}

static void kill_cb(uv_timer_t *t) {
  corral_run *r = (corral_run *)t->data;
  if (r->exited) return;
  r->kill_sent = 1;
  signal_pid(r, SIGKILL);
  signal_group(r, SIGKILL);
}

/* End the run now: timeout, overflow, proc:kill(). */
static void end_run(corral_run *r) {
  if (r->exited) { /* the launcher is gone: stop waiting for the pipes */
    signal_group(r, SIGKILL);
    close_outputs(r);
    maybe_finish(r);
    return;
  }
  if (r->ending) return;
  r->ending = 1;
  uv_timer_stop(&r->t_timeout);
  signal_pid(r, SIGTERM);
  if (r->grace_ms == 0) {
    kill_cb(&r->t_kill);
  } else {
    uv_update_time(r->t_kill.loop); /* proc:kill() may come after the loop stood still */
    uv_timer_start(&r->t_kill, kill_cb, r->grace_ms, 0);
  }
}

static void timeout_cb(uv_timer_t *t) {
  corral_run *r = (corral_run *)t->data;
  if (r->exited || r->ending) return;
  r->timed_out = 1;
  end_run(r);
}

static void drain_cb(uv_timer_t *t) {
  corral_run *r = (corral_run *)t->data;
  signal_group(r, SIGKILL);
  close_outputs(r);
  maybe_finish(r);
}

/* The launcher has ended: reaped by libuv, or by the zygote that forked it. */
static void run_exited(corral_run *r, int64_t exit_status, int term_signal) {
  r->t_end = uv_hrtime();
  r->exited = 1;
  r->exit_status = exit_status;
  r->term_signal = term_signal;
  uv_timer_stop(&r->t_timeout);
  uv_timer_stop(&r->t_kill);
  stdin_close(r); /* the program is gone; nobody should still read it */
  if (r->out.state == ST_OPEN || r->err.state == ST_OPEN || r->rep.state == ST_OPEN)
    uv_timer_start(&r->t_drain, drain_cb, r->grace_ms, 0);
  maybe_finish(r);
}

static void exit_cb(uv_process_t *p, int64_t exit_status, int term_signal) {
  corral_run *r = (corral_run *)p->data;
  close_handle((uv_handle_t *)p);
  run_exited(r, exit_status, term_signal);
}

/* The child of a posix_spawn has exited: reap it through its pidfd. */
static void pidfd_cb(uv_poll_t *h, int status, int events) {
  corral_run *r = (corral_run *)h->data;
  siginfo_t si;
  (void)status;
  (void)events;
  memset(&si, 0, sizeof si);
  if (waitid((idtype_t)P_PIDFD, (id_t)r->pidfd, &si, WEXITED | WNOHANG) != 0) {
    if (errno == EINTR) return;
    /* ECHILD: reaped by someone else (an embedder's waitpid(-1)): the status is lost */
    close_handle((uv_handle_t *)&r->pidpoll);
    run_exited(r, -1, 0);
    return;
  }
  if (si.si_pid == 0) return; /* not yet */
  close_handle((uv_handle_t *)&r->pidpoll);
  if (si.si_code == CLD_EXITED)
    run_exited(r, si.si_status, 0);
  else
    run_exited(r, 0, si.si_status);
}

/* ---- runs started by a zygote (zygote.c calls these, through zygote_ops) ---------------------- */

static void zygote_pid(corral_run *r, int pid, int pidfd) {
  if (pidfd >= 0 && (r->pidfd >= 0 || r->exited))
    close(pidfd);
  else if (pidfd >= 0)
    r->pidfd = pidfd;
  r->pid = pid;
  if (r->ud) r->ud->pid = pid;
  if (r->ending) { /* a kill came before the pid: deliver what is due now */
    signal_pid(r, r->kill_sent ? SIGKILL : SIGTERM);
    if (r->kill_sent) signal_group(r, SIGKILL);
  }
}

static void zygote_exit(corral_run *r, int exit_status, int term_signal) {
  if (r->pidpoll_init) close_handle((uv_handle_t *)&r->pidpoll);
  if (!r->exited) run_exited(r, exit_status, term_signal);
}

/* The direct run's init, gone: the run ended with the status the zygote gave before. */
static void zpid_cb(uv_poll_t *h, int status, int events) {
  corral_run *r = (corral_run *)h->data;
  (void)status;
  (void)events;
  close_handle((uv_handle_t *)&r->pidpoll);
  if (!r->exited) run_exited(r, r->exit_status, r->term_signal);
}

/* Watch a direct run's init through its pidfd: zpid_cb ends the run, with this status, once the
 * init has exited. 1: it already has; 0: watched; -1: cannot be watched. */
static int zpid_watch(corral_run *r, int exit_status, int term_signal) {
  struct pollfd p;
  p.fd = r->pidfd;
  p.events = POLLIN;
  p.revents = 0;
  if (poll(&p, 1, 0) == 1) return 1;
  r->exit_status = exit_status; /* kept for zpid_cb: not exited yet */
  r->term_signal = term_signal;
  if (uv_poll_init(&r->cl->loop, &r->pidpoll, r->pidfd) != 0) return -1;
  r->pidpoll.data = r;
  r->pidpoll_init = 1;
  r->handles++;
  if (r->held) uv_unref((uv_handle_t *)&r->pidpoll); /* as its other handles (set_ref) */
  if (uv_poll_start(&r->pidpoll, UV_READABLE, zpid_cb) != 0) {
    close_handle((uv_handle_t *)&r->pidpoll);
    return -1;
  }
  return 0;
}

/* A direct run's program has ended; its init, the run's process, exits next, and the kernel
 * kills and reaps what is left of the namespace before that exit is complete (an init's exit
 * waits until its PID namespace is empty). So with the init's pidfd the run ends once that is
 * readable: nothing of the run is left then. Without one, at the zygote's exit message. */
static void zygote_ended(corral_run *r, int exit_status, int term_signal) {
  if (r->exited || r->pidfd < 0 || r->pidpoll_init) return;
  if (zpid_watch(r, exit_status, term_signal) == 1) run_exited(r, exit_status, term_signal);
  /* -1: then at the exit message */
}

static void zygote_failed(corral_run *r, const char *why) {
  if (r->exited) return; /* ended, and its init is gone: the zygote's end changes nothing */
  if (r->pidpoll_init) {
    /* ended, its init not gone yet: it dies with the zygote, which it would not outlive; the
     * run ends with its status when it is gone */
    signal_pid(r, SIGKILL);
    signal_group(r, SIGKILL);
    return;
  }
  if (r->zerror == NULL) r->zerror = strdup(why ? why : "failed");
  if (r->pid > 0) signal_group(r, SIGKILL); /* the launcher dies with its zygote; its group may not */
  /* A direct run's init: killed too (it would die with the zygote), and waited for, so that
   * nothing of the run is left when it ends */
  if (r->pidfd >= 0) {
    signal_pid(r, SIGKILL);
    if (zpid_watch(r, -1, 0) == 0) return;
  }
  run_exited(r, -1, 0);
  close_outputs(r); /* no process will close them for us */
  maybe_finish(r);
}

static const struct corral_zlink_ops zygote_ops = {
    zygote_pid, zygote_ended, zygote_exit, zygote_failed,
};

/* ---- output ---------------------------------------------------------------------------------- */

/* Grow *buf to hold need bytes (geometrically, at most max). */
static int grow(char **buf, size_t *alloc, size_t need, size_t max) {
  size_t n;
  char *p;
  if (need <= *alloc) return 0;
  n = *alloc ? *alloc * 2 : 4096;
  if (n < need) n = need;
  if (n > max) n = max;
  p = (char *)realloc(*buf, n);
  if (p == NULL) return -1;
  *buf = p;
  *alloc = n;
  return 0;
}

static void tail_push(stream *st, const char *data, size_t n) {
  size_t cap = st->tail_cap, first;
  if (cap == 0) return;
  if (n >= cap) {
    if (grow(&st->tail, &st->tail_alloc, cap, cap) < 0) goto nomem;
    memcpy(st->tail, data + (n - cap), cap);
    st->tail_len = cap;
    st->tail_pos = 0;
    return;
  }
  if (st->tail_len < cap) { /* still filling linearly */
    size_t k = cap - st->tail_len;
    if (k > n) k = n;
    if (grow(&st->tail, &st->tail_alloc, st->tail_len + k, cap) < 0) goto nomem;
    memcpy(st->tail + st->tail_len, data, k);
    st->tail_len += k;
    st->tail_pos = st->tail_len % cap;
    data += k;
    n -= k;
    if (n == 0) return;
  }
  /* full ring: n < cap */
  first = cap - st->tail_pos;
  if (first > n) first = n;
  memcpy(st->tail + st->tail_pos, data, first);
  memcpy(st->tail, data + first, n - first);
  st->tail_pos = (st->tail_pos + n) % cap;
  return;
nomem: /* keep going without a tail rather than fail the run */
  free(st->tail);
  st->tail = NULL;
  st->tail_cap = st->tail_len = st->tail_alloc = st->tail_pos = 0;
}

static void stream_take(stream *st, const char *data, size_t n) {
  if (st->keep_len < st->cap) {
    size_t k = st->cap - st->keep_len;
    if (k > n) k = n;
    if (grow(&st->keep, &st->keep_alloc, st->keep_len + k, st->cap) == 0) {
      memcpy(st->keep + st->keep_len, data, k);
      st->keep_len += k;
    } else {
      st->cap = st->keep_len; /* out of memory: keep what we have */
    }
  }
  st->total += n;
  tail_push(st, data, n);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  corral_run *r = (corral_run *)h->data;
  (void)suggested;
  buf->base = r->cl->scratch;
  buf->len = sizeof r->cl->scratch;
}

/* A chunk for on_output, on the C stack while the call lasts. */
typedef struct chunk {
  corral_run *run;
  const stream *st;
  const char *data;
  size_t len;
} chunk;

/* Run under corral_pcall (pushing the chunk may fail for memory): on_output(name, bytes). */
static int emit(lua_State *L) {
  const chunk *c = (const chunk *)lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->run->on_output_ref);
  lua_pushstring(L, c->st->name);
  lua_pushlstring(L, c->data, c->len);
  lua_call(L, 2, 0);
  return 0;
}

/* Stream mode: the chunk is counted and handed to on_output, never kept. An error in on_output
 * is the loop's to re-raise out of core.run, as on_exit's; the run goes on. on_output may end
 * the run or close this stream: nothing of st is used after it returns. */
static void stream_emit(corral_run *r, stream *st, const char *data, size_t n) {
  corral_loop *cl = r->cl;
  lua_State *L = cl->L;
  chunk c;
  int top;
  st->total += n;
  if (r->on_output_ref == LUA_NOREF || cl->closing || !lua_checkstack(L, 8)) return;
  c.run = r;
  c.st = st;
  c.data = data;
  c.len = n;
  top = lua_gettop(L);
  lua_pushcfunction(L, emit);
  lua_pushlightuserdata(L, &c);
  corral_pcall(cl, L, 1);
  lua_settop(L, top);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  stream *st = (stream *)s;
  corral_run *r = st->run;
  if (nread > 0 && r->stream && st != &r->rep) {
    stream_emit(r, st, buf->base, (size_t)nread);
  } else if (nread > 0) {
    stream_take(st, buf->base, (size_t)nread);
    if (r->kill_on_overflow && st != &r->rep && st->total > st->cap && r->overflow == NULL) {
      r->overflow = st->name;
      end_run(r);
    }
  } else if (nread < 0) { /* EOF, or an error such as ECONNRESET: this stream is over */
    stream_close(st);
    maybe_finish(r);
  }
}

/* ---- stdin ----------------------------------------------------------------------------------- */

static void write_cb(uv_write_t *req, int status) {
  /* EPIPE, ECONNRESET: the child did not read it all, which is its business. */
  if (status < 0) stdin_close((corral_run *)req->data);
}

static void shutdown_cb(uv_shutdown_t *req, int status) {
  (void)status;
  stdin_close((corral_run *)req->data);
}

/* Stream mode: the write callback of one proc:write. An error (EPIPE: the child closed its end)
 * closes stdin, so later writes are refused. */
static void queued_write_cb(uv_write_t *req, int status) {
  in_write *w = (in_write *)req->data;
  corral_run *r = w->run;
  r->in_queued -= w->len;
  free(w);
  if (status < 0) stdin_close(r);
}

/* Stream mode: queue a copy of data[0..n) on stdin, after what is queued. 0, or a libuv error
 * (nothing queued then). */
static int stdin_queue(corral_run *r, const char *data, size_t n) {
  in_write *w;
  uv_buf_t b;
  int rc;
  w = (in_write *)malloc(sizeof *w + n);
  if (w == NULL) return UV_ENOMEM;
  memcpy(w->data, data, n);
  w->run = r;
  w->len = n;
  w->req.data = w;
  b.base = w->data;
  b.len = n;
  rc = uv_write(&w->req, (uv_stream_t *)&r->in, &b, 1, queued_write_cb);
  if (rc != 0) {
    free(w);
    return rc;
  }
  r->in_queued += n;
  return 0;
}

/* Stream mode: EOF for the child once the queued writes are out (libuv's shutdown waits for
 * them); then our end is closed. */
static void stdin_shutdown(corral_run *r) {
  r->in_shut = 1;
  r->sreq.data = r;
  if (uv_shutdown(&r->sreq, (uv_stream_t *)&r->in, shutdown_cb) != 0) stdin_close(r);
}

static void start_stdin(corral_run *r) {
  uv_buf_t b;
  if (r->in_state != ST_OPEN) return;
  if (r->stream) { /* the `stdin` bytes first; the pipe stays open */
    if (r->in_len > 0 && stdin_queue(r, r->in_data, r->in_len) != 0) stdin_close(r);
    free(r->in_data);
    r->in_data = NULL;
    r->in_len = 0;
    return;
  }
  if (r->in_len == 0) {
    stdin_close(r);
    return;
  }
  b.base = r->in_data;
  b.len = r->in_len;
  r->wreq.data = r;
  r->sreq.data = r;
  if (uv_write(&r->wreq, (uv_stream_t *)&r->in, &b, 1, write_cb) != 0) {
    stdin_close(r);
    return;
  }
  if (uv_shutdown(&r->sreq, (uv_stream_t *)&r->in, shutdown_cb) != 0) stdin_close(r);
}

/* ---- the result ------------------------------------------------------------------------------ */

static void push_tail(lua_State *L, const stream *st) {
  if (st->tail_len < st->tail_cap || st->tail_pos == 0) {
    lua_pushlstring(L, st->tail ? st->tail : "", st->tail_len);
  } else {
    lua_pushlstring(L, st->tail + st->tail_pos, st->tail_cap - st->tail_pos);
    lua_pushlstring(L, st->tail, st->tail_pos);
    lua_concat(L, 2);
  }
}

static void push_result(lua_State *L, const corral_run *r) {
  lua_createtable(L, 0, 16);
  lua_pushinteger(L, (lua_Integer)r->exit_status);
  lua_setfield(L, -2, "exit_status");
  lua_pushinteger(L, r->term_signal);
  lua_setfield(L, -2, "term_signal");
  lua_pushlstring(L, r->out.keep ? r->out.keep : "", r->out.keep_len);
  lua_setfield(L, -2, "stdout");
  lua_pushlstring(L, r->err.keep ? r->err.keep : "", r->err.keep_len);
  lua_setfield(L, -2, "stderr");
  lua_pushinteger(L, (lua_Integer)r->out.total);
  lua_setfield(L, -2, "stdout_bytes");
  lua_pushinteger(L, (lua_Integer)r->err.total);
  lua_setfield(L, -2, "stderr_bytes");
  push_tail(L, &r->out);
  lua_setfield(L, -2, "stdout_tail");
  push_tail(L, &r->err);
  lua_setfield(L, -2, "stderr_tail");
  if (r->report) {
    lua_pushlstring(L, r->rep.keep ? r->rep.keep : "", r->rep.keep_len);
    lua_setfield(L, -2, "report");
  }
  lua_pushboolean(L, r->timed_out);
  lua_setfield(L, -2, "timed_out");
  lua_pushboolean(L, r->killed);
  lua_setfield(L, -2, "killed");
  if (r->overflow) {
    lua_pushstring(L, r->overflow);
    lua_setfield(L, -2, "overflow");
  }
  lua_pushnumber(L, (lua_Number)(r->t_end - r->t_start) / 1e9);
  lua_setfield(L, -2, "wall_s");
  lua_pushinteger(L, r->pid);
  lua_setfield(L, -2, "pid");
  if (r->zerror) {
    lua_pushstring(L, r->zerror);
    lua_setfield(L, -2, "launch_error");
  }
}

/* Run under corral_pcall: store the result in the proc, mark it done, call on_exit(res). */
static int deliver(lua_State *L) {
  corral_run *r = (corral_run *)lua_touserdata(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->self_ref); /* 2: the proc */
  push_result(L, r);                              /* 3: res */
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, 2, 2);
  if (r->ud) {
    r->ud->run = NULL;
    r->ud->done = 1;
  }
  if (r->on_exit_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->on_exit_ref);
    lua_pushvalue(L, 3);
    lua_call(L, 1, 0);
  }
  return 0;
}

/* Every handle of the run is closed. Outside a teardown, deliver the result on the main thread;
 * then drop the references and free the C memory. */
static void run_complete(corral_run *r) {
  corral_loop *cl = r->cl;
  lua_State *L = cl->L;
  run_unlink(r);
  if (!cl->closing && r->self_ref != LUA_NOREF) {
    if (lua_checkstack(L, 8)) {
      int top = lua_gettop(L);
      lua_pushcfunction(L, deliver);
      lua_pushlightuserdata(L, r);
      corral_pcall(cl, L, 1);
      lua_settop(L, top);
    }
    luaL_unref(L, LUA_REGISTRYINDEX, r->on_exit_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, r->on_output_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, r->self_ref);
  }
  if (r->ud) {
    r->ud->run = NULL;
    r->ud->done = 1;
  }
  run_free(r);
}

/* ---- teardown -------------------------------------------------------------------------------- */

static void walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  close_handle(h); /* every handle of this loop belongs to a run */
}

void corral_runs_shutdown(corral_loop *cl) {
  corral_run *r;
  for (r = cl->runs; r != NULL; r = r->next) {
    if (r->spawned && !r->exited) {
      int status;
      signal_pid(r, SIGKILL);
      signal_group(r, SIGKILL);
      /* Reap it ourselves: closing the process handle takes it off libuv's list. SIGKILL is
       * not ignorable, so this wait is short. (A zygote's child is its zygote's to reap.) */
      while (!r->zl && r->pid > 0 && waitpid(r->pid, &status, 0) < 0 && errno == EINTR) {
      }
      r->exited = 1;
    }
    close_all(r);
  }
  uv_walk(&cl->loop, walk_close, NULL);
}

/* ---- core.spawn ------------------------------------------------------------------------------ */

static const char *const spawn_keys[] = {
    "file", "args", "env", "stdin", "stdout_cap", "stderr_cap", "tail_bytes",
    "kill_on_overflow", "report", "timeout", "grace", "on_exit", "zygote", "ref", "hold",
    "stream", "on_output", NULL,
};

/* Check that the option at stack index idx is nil or an array of strings without NUL bytes;
 * returns its length. */
static lua_Integer check_string_array(lua_State *L, int idx, const char *key, int need_eq) {
  lua_Integer n, i;
  if (lua_isnil(L, idx)) return 0;
  if (lua_type(L, idx) != LUA_TTABLE)
    luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': table expected, got %s", key,
                                        luaL_typename(L, idx)));
  n = (lua_Integer)lua_rawlen(L, idx);
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
      luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': item %I is a %s, not a string", key,
                                          (LUAI_UACINT)i, luaL_typename(L, -1)));
    s = lua_tolstring(L, -1, &len);
    if (strlen(s) != len)
      luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': item %I contains a NUL byte", key,
                                          (LUAI_UACINT)i));
    if (need_eq && (strchr(s, '=') == NULL || s[0] == '='))
      luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': item %I is not NAME=VALUE", key,
                                          (LUAI_UACINT)i));
    lua_pop(L, 1);
  }
  return n;
}

/* A NULL-terminated char* array in a temporary userdata (collected with the call's stack);
 * the strings stay referenced by the option table, which is argument 1. */
static char **string_array(lua_State *L, int idx, lua_Integer n, const char *first) {
  lua_Integer i, off = first ? 1 : 0;
  char **v = (char **)lua_newuserdatauv(L, (size_t)(n + off + 1) * sizeof(char *), 0);
  if (first) v[0] = (char *)first;
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    v[i - 1 + off] = (char *)lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  v[n + off] = NULL;
  return v;
}

static int stream_init(corral_run *r, stream *st, const char *name, size_t cap,
                       size_t tail_cap) {
  int rc = uv_pipe_init(&r->cl->loop, &st->pipe, 0);
  if (rc != 0) return rc;
  st->pipe.data = r;
  st->run = r;
  st->name = name;
  st->state = ST_OPEN;
  st->cap = cap;
  st->tail_cap = tail_cap;
  r->handles++;
  return 0;
}

static void stream_start(stream *st) {
  if (st->state != ST_OPEN) return;
  if (uv_read_start((uv_stream_t *)&st->pipe, alloc_cb, read_cb) != 0) stream_close(st);
}

static uint64_t seconds_to_ms(double s) {
  return (uint64_t)ceil(s * 1000.0);
}

/* The handle of the child's stdin pipe (our end: we write the `stdin` bytes). */
static int stdin_init(corral_run *r) {
  int rc = uv_pipe_init(&r->cl->loop, &r->in, 0);
  if (rc != 0) return rc;
  r->in.data = r;
  r->in_state = ST_OPEN;
  r->handles++;
  return 0;
}

/* Spawn the launcher with libuv: stdin (a pipe, or /dev/null), stdout, stderr, the report fd 3. */
static int start_process(corral_run *r, const char *file, char **argv, char **envp, int has_in,
                         size_t out_cap, size_t err_cap, size_t tail) {
  corral_loop *cl = r->cl;
  uv_stdio_container_t stdio[4];
  uv_process_options_t o;
  int rc = 0;

  memset(stdio, 0, sizeof stdio);
  if (has_in) {
    rc = stdin_init(r);
    if (rc == 0) {
      stdio[0].flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_READABLE_PIPE);
      stdio[0].data.stream = (uv_stream_t *)&r->in;
    }
  } else {
    stdio[0].flags = UV_IGNORE; /* libuv gives the child /dev/null */
  }
  if (rc == 0) rc = stream_init(r, &r->out, "stdout", out_cap, tail);
  if (rc == 0) rc = stream_init(r, &r->err, "stderr", err_cap, tail);
  if (rc == 0 && r->report) rc = stream_init(r, &r->rep, "report", REPORT_CAP, 0);
  stdio[1].flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
  stdio[1].data.stream = (uv_stream_t *)&r->out.pipe;
  stdio[2].flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
  stdio[2].data.stream = (uv_stream_t *)&r->err.pipe;
  stdio[3].flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_WRITABLE_PIPE); /* the child writes */
  stdio[3].data.stream = (uv_stream_t *)&r->rep.pipe;
  if (rc != 0) return rc;

  memset(&o, 0, sizeof o);
  o.exit_cb = exit_cb;
  o.file = file;
  o.args = argv;
  o.env = envp;
  o.stdio_count = r->report ? 4 : 3;
  o.stdio = stdio;
  /* a new session for every child, launcher or not, so that ending the run can always
   * signal its whole process group */
  o.flags = UV_PROCESS_DETACHED;
  r->t_start = uv_hrtime();
  rc = uv_spawn(&cl->loop, &r->process, &o);
  r->process.data = r;
  r->process_init = 1; /* uv_spawn initialises the handle even when it fails */
  r->handles++;
  if (rc == 0) r->pid = r->process.pid;
  return rc;
}

/* One stream of the run as a socketpair, as libuv makes them for a spawned child: our end in
 * the handle, the child's end in *child. */
static int stream_pair(corral_run *r, uv_pipe_t *p, int *child, int ours_is_first) {
  int sv[2], rc;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return uv_translate_sys_error(errno);
  rc = uv_pipe_open(p, ours_is_first ? sv[0] : sv[1]);
  if (rc != 0) {
    close(sv[0]);
    close(sv[1]);
    return rc;
  }
  *child = ours_is_first ? sv[1] : sv[0];
  (void)r;
  return 0;
}

/* The run's stdin (a socketpair, or /dev/null), stdout, stderr and report (socketpairs; the
 * report only with `report`): ours in the run's handles, the child's ends in fds (-1: none). */
static int child_stdio(corral_run *r, int has_in, size_t out_cap, size_t err_cap, size_t tail,
                       int fds[4]) {
  int rc = 0, i;
  for (i = 0; i < 4; i++) fds[i] = -1;
  if (has_in) {
    rc = stdin_init(r);
    if (rc == 0) rc = stream_pair(r, &r->in, &fds[0], 1);
  } else {
    fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fds[0] < 0) rc = uv_translate_sys_error(errno);
  }
  if (rc == 0) rc = stream_init(r, &r->out, "stdout", out_cap, tail);
  if (rc == 0) rc = stream_pair(r, &r->out.pipe, &fds[1], 1);
  if (rc == 0) rc = stream_init(r, &r->err, "stderr", err_cap, tail);
  if (rc == 0) rc = stream_pair(r, &r->err.pipe, &fds[2], 1);
  if (rc == 0 && r->report) rc = stream_init(r, &r->rep, "report", REPORT_CAP, 0);
  if (rc == 0 && r->report) rc = stream_pair(r, &r->rep.pipe, &fds[3], 1);
  if (rc != 0) {
    for (i = 0; i < 4; i++)
      if (fds[i] >= 0) close(fds[i]);
  }
  return rc;
}

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* A child of ours that must not run unwatched: SIGKILL it and its group, and reap it. */
static void kill_and_reap(pid_t pid) {
  int st;
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

/* Whether this kernel has pidfds (Linux 5.3: pidfd_open; 5.4: waitid P_PIDFD), asked once per
 * loop. */
static int have_pidfd(corral_loop *cl) {
  if (cl->have_pidfd == 0) {
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0U);
    siginfo_t si;
    cl->have_pidfd = -1;
    if (fd >= 0) {
      /* P_PIDFD known: on our own (running) process, ECHILD; unknown: EINVAL */
      if (waitid((idtype_t)P_PIDFD, (id_t)fd, &si, WEXITED | WNOHANG) != 0 && errno == ECHILD)
        cl->have_pidfd = 1;
      close(fd);
    }
  }
  return cl->have_pidfd > 0;
}

/* Spawn the launcher as posix_spawn does it (glibc: clone(CLONE_VM | CLONE_VFORK), so the
 * controller's page tables are not copied, unlike libuv 1.44's fork), in a session of its own,
 * with default signal dispositions and nothing blocked; its exit is watched through a pidfd.
 * UV_ENOSYS when the kernel has no pidfd (before Linux 5.3): the caller uses libuv. */
static int start_spawned(corral_run *r, const char *file, char **argv, char **envp, int has_in,
                         size_t out_cap, size_t err_cap, size_t tail) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  sigset_t all, none;
  int fds[4], i, err, rc;
  pid_t pid;

  rc = child_stdio(r, has_in, out_cap, err_cap, tail, fds);
  if (rc != 0) return rc;
  posix_spawn_file_actions_init(&fa);
  for (i = 0; i < 4; i++)
    if (fds[i] >= 0) posix_spawn_file_actions_adddup2(&fa, fds[i], i); /* clears CLOEXEC */
  posix_spawnattr_init(&at);
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&at, &all);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
                                    POSIX_SPAWN_SETSIGMASK);
  r->t_start = uv_hrtime();
  err = strchr(file, '/') ? posix_spawn(&pid, file, &fa, &at, argv, envp)
                          : posix_spawnp(&pid, file, &fa, &at, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  for (i = 0; i < 4; i++)
    if (fds[i] >= 0) close(fds[i]);
  if (err != 0) return uv_translate_sys_error(err);
  r->pid = pid;
  r->pidfd = (int)syscall(SYS_pidfd_open, pid, 0U);
  if (r->pidfd < 0) {
    /* cannot happen for our own unreaped child once pidfd exists; make sure it does not run
     * unwatched */
    err = errno;
    kill_and_reap(pid);
    r->pid = 0;
    return uv_translate_sys_error(err);
  }
  rc = uv_poll_init(&r->cl->loop, &r->pidpoll, r->pidfd);
  if (rc == 0) {
    r->pidpoll.data = r;
    r->pidpoll_init = 1;
    r->handles++;
    rc = uv_poll_start(&r->pidpoll, UV_READABLE, pidfd_cb);
  }
  if (rc != 0) {
    kill_and_reap(pid);
    r->pid = 0;
  }
  return rc;
}

/* Ask a zygote for the run: it starts the run's launcher (or its direct init). The
 * child's ends go to the zygote, which passes them on; ours are read as for a spawned launcher. */
static int start_in_zygote(corral_run *r, struct corral_zygote *z, int has_in, size_t out_cap,
                           size_t err_cap, size_t tail, char **args) {
  int fds[4];
  int rc = child_stdio(r, has_in, out_cap, err_cap, tail, fds);
  if (rc != 0) return rc;
  r->t_start = uv_hrtime();
  rc = corral_zygote_submit(z, r, &zygote_ops, args, fds, &r->zl); /* takes the fds */
  return rc < 0 ? uv_translate_sys_error(-rc) : 0;
}

/* Whether the run's handles keep core.run("default") going. */
static void set_ref(corral_run *r, int on) {
  void (*f)(uv_handle_t *) = on ? uv_ref : uv_unref;
  if (r->process_init) f((uv_handle_t *)&r->process);
  if (r->pidpoll_init) f((uv_handle_t *)&r->pidpoll);
  f((uv_handle_t *)&r->t_timeout);
  f((uv_handle_t *)&r->t_kill);
  f((uv_handle_t *)&r->t_drain);
  if (r->out.state == ST_OPEN) f((uv_handle_t *)&r->out.pipe);
  if (r->err.state == ST_OPEN) f((uv_handle_t *)&r->err.pipe);
  if (r->rep.state == ST_OPEN) f((uv_handle_t *)&r->rep.pipe);
  if (r->in_state == ST_OPEN) f((uv_handle_t *)&r->in);
}

/* The run proper: its stdin goes out, its timeout runs. */
static void begin_run(corral_run *r) {
  start_stdin(r);
  /* libuv timers count from the loop's cached time, which is stale when the loop has not run
   * for a while (the host blocked between runs): refresh it, or the timeout fires early */
  uv_update_time(&r->cl->loop);
  if (r->has_timeout) uv_timer_start(&r->t_timeout, timeout_cb, r->timeout_ms, 0);
}

/* core.spawn(opts) -> proc | nil, err, code */
int corral_spawn(lua_State *L) {
  corral_loop *cl = corral_loop_up(L);
  const char *file, *in;
  size_t file_len, in_len;
  lua_Integer nargs, nenv, out_cap, err_cap, tail;
  int kill_on_overflow, report, has_timeout, ref, hold, streaming, has_in, rc;
  double timeout, grace;
  int i_args, i_env, i_exit, i_output, i_ud;
  char **argv, **envp;
  proc_ud *ud;
  corral_run *r;
  int self_ref, on_exit_ref = LUA_NOREF, on_output_ref = LUA_NOREF;
  struct corral_zygote *zyg = NULL;

  /* 1. options: every mistake raises before anything is acquired */
  luaL_checktype(L, 1, LUA_TTABLE);
  corral_check_keys(L, 1, spawn_keys);
  lua_getfield(L, 1, "zygote");
  if (!lua_isnil(L, -1)) {
    if (!luaL_testudata(L, -1, CORRAL_ZYGOTE_MT))
      luaL_argerror(L, 1, lua_pushfstring(L, "option 'zygote': corral.zygote expected, got %s",
                                          luaL_typename(L, -1)));
    zyg = corral_zygote_check(L, lua_gettop(L));
  }
  file = corral_opt_string(L, 1, "file", &file_len); /* stays on the stack, as do the others */
  if (file == NULL && zyg != NULL) {
    lua_pop(L, 1);
    lua_pushliteral(L, "corral-zygote");
    file = lua_tolstring(L, -1, &file_len);
  }
  if (file == NULL) luaL_argerror(L, 1, "option 'file' is required");
  if (file_len == 0 || strlen(file) != file_len)
    luaL_argerror(L, 1, "option 'file': empty or contains a NUL byte");
  lua_getfield(L, 1, "args");
  i_args = lua_gettop(L);
  nargs = check_string_array(L, i_args, "args", 0);
  lua_getfield(L, 1, "env");
  i_env = lua_gettop(L);
  nenv = check_string_array(L, i_env, "env", 1);
  in = corral_opt_string(L, 1, "stdin", &in_len);
  lua_getfield(L, 1, "on_exit");
  i_exit = lua_gettop(L);
  if (!lua_isnil(L, i_exit) && lua_type(L, i_exit) != LUA_TFUNCTION)
    luaL_argerror(L, 1, lua_pushfstring(L, "option 'on_exit': function expected, got %s",
                                        luaL_typename(L, i_exit)));
  out_cap = corral_opt_integer(L, 1, "stdout_cap", DEFAULT_CAP, 0, MAX_CAP);
  err_cap = corral_opt_integer(L, 1, "stderr_cap", DEFAULT_CAP, 0, MAX_CAP);
  tail = corral_opt_integer(L, 1, "tail_bytes", 0, 0, MAX_CAP);
  kill_on_overflow = corral_opt_boolean(L, 1, "kill_on_overflow", 0);
  report = corral_opt_boolean(L, 1, "report", 0);
  if (zyg != NULL && !report)
    luaL_argerror(L, 1, "option 'zygote' needs 'report' (a zygote run always has a report fd)");
  timeout = corral_opt_number(L, 1, "timeout", -1.0, 0.0, 1e7);
  has_timeout = timeout >= 0.0;
  grace = corral_opt_number(L, 1, "grace", DEFAULT_GRACE, 0.0, 3600.0);
  ref = corral_opt_boolean(L, 1, "ref", 1);
  hold = corral_opt_boolean(L, 1, "hold", 0);
  if (hold && (!report || !ref))
    luaL_argerror(L, 1, "option 'hold' needs 'report', and not 'ref' = false (the launcher "
                        "waits on its report socket)");
  streaming = corral_opt_boolean(L, 1, "stream", 0);
  lua_getfield(L, 1, "on_output");
  i_output = lua_gettop(L);
  if (!lua_isnil(L, i_output) && lua_type(L, i_output) != LUA_TFUNCTION)
    luaL_argerror(L, 1, lua_pushfstring(L, "option 'on_output': function expected, got %s",
                                        luaL_typename(L, i_output)));
  if (!lua_isnil(L, i_output) && !streaming)
    luaL_argerror(L, 1, "option 'on_output' needs 'stream' (without it the output is kept and "
                        "comes in on_exit's result)");
  if (streaming && kill_on_overflow)
    luaL_argerror(L, 1, "option 'kill_on_overflow' does not go with 'stream' (nothing is kept, "
                        "so nothing overflows)");
  if (streaming && hold)
    luaL_argerror(L, 1, "option 'hold' does not go with 'stream' (a held launch gets its stdin "
                        "from proc:go)");
  if (streaming) out_cap = err_cap = tail = 0; /* nothing of stdout/stderr is kept */
  has_in = in != NULL || streaming;

  argv = string_array(L, i_args, nargs, file);
  envp = string_array(L, i_env, nenv, NULL); /* {NULL}: an empty environment */

  /* 2. the userdata, not yet attached to a run; the references (may raise: nothing in C yet) */
  ud = (proc_ud *)lua_newuserdatauv(L, sizeof *ud, 2);
  ud->run = NULL;
  ud->pid = 0;
  ud->done = 0;
  ud->stream = streaming;
  luaL_setmetatable(L, CORRAL_PROC_MT);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the loop lives as long as the proc */
  lua_setiuservalue(L, -2, 1);
  i_ud = lua_gettop(L);
  if (!lua_isnil(L, i_exit)) {
    lua_pushvalue(L, i_exit);
    on_exit_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  if (!lua_isnil(L, i_output)) {
    lua_pushvalue(L, i_output);
    on_output_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_pushvalue(L, i_ud);
  self_ref = luaL_ref(L, LUA_REGISTRYINDEX);

  /* 3. C memory; from here nothing raises until the run is consistent */
  r = (corral_run *)calloc(1, sizeof *r);
  if (r != NULL) r->pidfd = -1;
  if (r != NULL && in != NULL && in_len > 0) {
    r->in_data = (char *)malloc(in_len);
    if (r->in_data == NULL) {
      free(r);
      r = NULL;
    } else {
      memcpy(r->in_data, in, in_len);
      r->in_len = in_len;
    }
  }
  if (r == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, self_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, on_exit_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, on_output_ref);
    return corral_fail_errno(L, ENOMEM, "cannot spawn %s", file);
  }
  r->cl = cl;
  r->self_ref = self_ref;
  r->on_exit_ref = on_exit_ref;
  r->on_output_ref = on_output_ref;
  r->stream = streaming != 0;
  r->timeout_ms = has_timeout ? seconds_to_ms(timeout) : 0;
  r->grace_ms = seconds_to_ms(grace);
  r->has_timeout = has_timeout != 0;
  r->kill_on_overflow = kill_on_overflow != 0;
  r->report = report != 0;
  r->next = cl->runs;
  if (cl->runs) cl->runs->prevp = &r->next;
  r->prevp = &cl->runs;
  cl->runs = r;

  uv_timer_init(&cl->loop, &r->t_timeout);
  uv_timer_init(&cl->loop, &r->t_kill);
  uv_timer_init(&cl->loop, &r->t_drain);
  r->t_timeout.data = r->t_kill.data = r->t_drain.data = r;
  r->handles += 3;

  if (zyg != NULL)
    rc = start_in_zygote(r, zyg, has_in, (size_t)out_cap, (size_t)err_cap, (size_t)tail,
                         argv + 1);
  else if (hold && !have_pidfd(cl))
    rc = UV_ENOSYS; /* a held launch is watched through a pidfd */
  else if (ref && have_pidfd(cl)) /* helpers beside the runs (ref = false) start rarely: libuv */
    rc = start_spawned(r, file, argv, envp, has_in, (size_t)out_cap, (size_t)err_cap,
                       (size_t)tail);
  else
    rc = start_process(r, file, argv, envp, has_in, (size_t)out_cap, (size_t)err_cap,
                       (size_t)tail);
  if (rc != 0) {
    /* Nothing is left open: the pipes' fds are closed by uv_close now, the C memory is freed by
     * the close callbacks on the next turn of the loop. */
    luaL_unref(L, LUA_REGISTRYINDEX, self_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, on_exit_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, on_output_ref);
    r->self_ref = r->on_exit_ref = r->on_output_ref = LUA_NOREF;
    close_all(r);
    return corral_fail_uv(L, rc, "cannot spawn %s", file);
  }

  /* 4. running */
  r->spawned = 1;
  r->ud = ud;
  ud->run = r;
  ud->pid = r->pid;
  stream_start(&r->out);
  stream_start(&r->err);
  stream_start(&r->rep);
  if (hold) {
    /* started ahead: no stdin, no timeout and no hold on core.run("default") until proc:go() */
    r->held = 1;
    set_ref(r, 0);
    corral_zlink_hold(r->zl, 1);
  } else {
    begin_run(r);
  }
  if (!ref) {
    /* a helper that lives beside the runs (the shared network namespace's holder): it does not
     * keep core.run("default") going; it is still reaped, and killed with the loop */
    set_ref(r, 0);
  }
  lua_pushvalue(L, i_ud);
  return 1;
}

/* ---- corral.proc ----------------------------------------------------------------------------- */

static proc_ud *check_proc(lua_State *L) {
  return (proc_ud *)luaL_checkudata(L, 1, CORRAL_PROC_MT);
}

static int proc_pid(lua_State *L) {
  lua_pushinteger(L, check_proc(L)->pid);
  return 1;
}

/* proc:kill() -> true if this call started ending the run, false if it was ending or done. */
static int proc_kill(lua_State *L) {
  proc_ud *ud = check_proc(L);
  corral_run *r = ud->run;
  int started = 0;
  if (r != NULL && !r->finishing) {
    if (!r->exited && !r->ending) {
      r->killed = 1;
      started = 1;
    }
    if (r->held) {
      /* A launch started ahead and let go: nothing of a run in it to let finish; its end must
       * be seen by core.run(). EOF on its report socket ends it where it waits: the init kills
       * and reaps an interpreter it started ahead (files_wait) and exits, and the launcher after
       * it, so that nothing of it is left once its end is seen. A SIGKILL of the launcher would
       * end it at once and leave the namespace's teardown for after. */
      uv_os_fd_t fd;
      r->held = 0;
      r->grace_ms = LET_GO_MS;
      if (r->rep.state == ST_OPEN && uv_fileno((uv_handle_t *)&r->rep.pipe, &fd) == 0)
        shutdown(fd, SHUT_WR);
      else
        r->grace_ms = 0;
      set_ref(r, 1);
      corral_zlink_hold(r->zl, 0);
    }
    end_run(r);
  }
  lua_pushboolean(L, started);
  return 1;
}

/* proc:go{stdin = s, timeout = seconds} -> true, or false when the held launch is gone (or was
 * not held): the launcher, started with `hold` and --prestart, starts its program. stdin (needs
 * a spawn with `stdin`) and timeout (absent: none) replace the spawn's; the wall time counts
 * from here. */
static int proc_go(lua_State *L) {
  proc_ud *ud = check_proc(L);
  corral_run *r = ud->run;
  const char *in = NULL;
  size_t in_len = 0;
  double timeout = -1.0;
  char b = 'g';
  ssize_t n;
  uv_os_fd_t fd;

  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    in = corral_opt_string(L, 2, "stdin", &in_len);
    timeout = corral_opt_number(L, 2, "timeout", -1.0, 0.0, 1e7);
  }
  if (r == NULL || !r->held || r->exited || r->ending || r->finishing ||
      r->rep.state != ST_OPEN || uv_fileno((uv_handle_t *)&r->rep.pipe, &fd) != 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (in != NULL && r->in_state != ST_OPEN)
    return luaL_error(L, "go: stdin given, but the launch was spawned without one");
  if (in != NULL) {
    char *copy = in_len > 0 ? (char *)malloc(in_len) : NULL;
    if (in_len > 0 && copy == NULL) return luaL_error(L, "go: out of memory");
    if (in_len > 0) memcpy(copy, in, in_len);
    free(r->in_data);
    r->in_data = copy;
    r->in_len = in_len;
  }
  do
    n = send(fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n != 1) {
    lua_pushboolean(L, 0); /* the launcher is gone: its exit comes through on_exit */
    return 1;
  }
  r->held = 0;
  corral_zlink_hold(r->zl, 0);
  r->has_timeout = timeout >= 0.0;
  r->timeout_ms = r->has_timeout ? seconds_to_ms(timeout) : 0;
  r->t_start = uv_hrtime();
  set_ref(r, 1);
  begin_run(r);
  lua_pushboolean(L, 1);
  return 1;
}

/* The run of a stream-mode proc, or NULL when it has ended; raises for a proc spawned without
 * `stream`. */
static corral_run *stream_run(lua_State *L, const char *what) {
  proc_ud *ud = check_proc(L);
  if (!ud->stream) luaL_error(L, "%s: the run was not spawned with 'stream'", what);
  return ud->run;
}

/* proc:write(bytes) -> true; false, message when stdin is closed (by close_stdin, a write error
 * or the end of the run); nil, message, "EAGAIN" when the queue is full (the child does not
 * read: the bytes already queued and these would pass STDIN_QUEUE_MAX). Writes go out in
 * order. */
static int proc_write(lua_State *L) {
  corral_run *r = stream_run(L, "write");
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  int rc;
  if (r == NULL || r->in_state != ST_OPEN || r->in_shut) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, r == NULL ? "the run has ended" : "stdin is closed");
    return 2;
  }
  if (r->in_queued > STDIN_QUEUE_MAX || len > STDIN_QUEUE_MAX - r->in_queued) {
    lua_pushnil(L);
    lua_pushfstring(L, "EAGAIN: queue full: %I bytes wait for the child to read its stdin, and "
                       "%I more would pass %I", (LUAI_UACINT)r->in_queued, (LUAI_UACINT)len,
                    (LUAI_UACINT)STDIN_QUEUE_MAX);
    lua_pushliteral(L, "EAGAIN");
    return 3;
  }
  if (len > 0) {
    rc = stdin_queue(r, s, len);
    if (rc == UV_ENOMEM) return corral_fail_uv(L, rc, "write");
    if (rc != 0) {
      stdin_close(r);
      lua_pushboolean(L, 0);
      lua_pushfstring(L, "stdin is closed (%s)", uv_err_name(rc));
      return 2;
    }
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* proc:close_stdin() -> true when this call shut stdin down (the child reads EOF once the queued
 * writes are out), false when it was closed already or the run has ended. */
static int proc_close_stdin(lua_State *L) {
  corral_run *r = stream_run(L, "close_stdin");
  if (r == NULL || r->in_state != ST_OPEN || r->in_shut) {
    lua_pushboolean(L, 0);
    return 1;
  }
  stdin_shutdown(r);
  lua_pushboolean(L, 1);
  return 1;
}

static int proc_done(lua_State *L) {
  lua_pushboolean(L, check_proc(L)->done);
  return 1;
}

static int proc_result(lua_State *L) {
  proc_ud *ud = check_proc(L);
  if (!ud->done) {
    lua_pushnil(L);
    return 1;
  }
  lua_getiuservalue(L, 1, 2);
  return 1;
}

static int proc_tostring(lua_State *L) {
  proc_ud *ud = check_proc(L);
  lua_pushfstring(L, "corral.proc (pid %I, %s)", (LUAI_UACINT)ud->pid,
                  ud->done ? "done" : ud->run ? "running" : "detached");
  return 1;
}

/* __gc: only reached for a running proc when the Lua state closes (until then the registry
 * holds it); the loop's own teardown then kills the child. Detach so nothing points here. */
static int proc_gc(lua_State *L) {
  proc_ud *ud = check_proc(L);
  if (ud->run != NULL) {
    ud->run->ud = NULL;
    ud->run = NULL;
  }
  return 0;
}

void corral_proc_open(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"pid", proc_pid},
      {"kill", proc_kill},
      {"go", proc_go},
      {"write", proc_write},
      {"close_stdin", proc_close_stdin},
      {"done", proc_done},
      {"result", proc_result},
      {NULL, NULL},
  };
  luaL_newmetatable(L, CORRAL_PROC_MT);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, proc_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, proc_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}
