/*
 * corral.core: core.signal, core.timer and core.reader, small handles that call a Lua function on
 * the loop.
 *
 * A watch owns C memory holding its libuv handle, freed by the handle's close callback. While
 * it may still call Lua (a signal watcher until closed, a timer until it fired or was closed)
 * it keeps its userdata and its function in the registry, so dropping the userdata does not
 * stop it; like every active libuv handle, it keeps core.run("default") running.
 */
#include "core.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

enum { WATCH_SIGNAL, WATCH_TIMER, WATCH_READER };

typedef struct watch_ud {
  struct corral_watch *w; /* NULL once closed (or fired, for a timer; at its end, a reader) */
  int kind;
  int signum;             /* a signal watcher's; the fd, a reader's */
} watch_ud;

typedef struct corral_watch {
  union {
    uv_handle_t handle;
    uv_signal_t signal;
    uv_timer_t timer;
    uv_stream_t stream;
    uv_tty_t tty;
    uv_pipe_t pipe;
  } h;
  corral_loop *cl;
  struct corral_watch *next, **prevp; /* cl->watches */
  watch_ud *ud;
  int fn_ref, self_ref;
  int closing;
} watch;

static void watch_closed(uv_handle_t *h) {
  watch *w = (watch *)h->data;
  *w->prevp = w->next;
  if (w->next) w->next->prevp = w->prevp;
  free(w);
}

/* Close the handle, detach the userdata, drop the references (L NULL: loop teardown, where the
 * registry is left alone). Safe twice. */
static void watch_close(watch *w, lua_State *L) {
  if (w->closing) return;
  w->closing = 1;
  if (w->ud) w->ud->w = NULL;
  w->ud = NULL;
  if (L != NULL && !w->cl->closing) {
    luaL_unref(L, LUA_REGISTRYINDEX, w->fn_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, w->self_ref);
  }
  w->fn_ref = w->self_ref = LUA_NOREF;
  uv_close(&w->h.handle, watch_closed);
}

static void signal_cb(uv_signal_t *h, int signum) {
  watch *w = (watch *)h->data;
  lua_State *L = w->cl->L;
  if (w->closing || w->cl->closing || !lua_checkstack(L, 4)) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->fn_ref);
  lua_pushinteger(L, signum);
  corral_pcall(w->cl, L, 1);
}

static void timer_cb(uv_timer_t *h) {
  watch *w = (watch *)h->data;
  lua_State *L = w->cl->L;
  if (w->closing || w->cl->closing || !lua_checkstack(L, 4)) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->fn_ref); /* on the stack while its reference goes */
  watch_close(w, L);                            /* one shot: closed before fn runs */
  corral_pcall(w->cl, L, 0);
}

static void reader_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  watch *w = (watch *)h->data;
  (void)suggested;
  buf->base = w->cl->scratch;
  buf->len = sizeof w->cl->scratch;
}

static void reader_cb(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf) {
  watch *w = (watch *)h->data;
  lua_State *L = w->cl->L;
  int nargs = 1;
  if (nread == 0 || w->closing || w->cl->closing || !lua_checkstack(L, 4)) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->fn_ref);
  if (nread > 0) {
    lua_pushlstring(L, buf->base, (size_t)nread);
  } else {
    /* the end (EOF; EIO when a terminal hangs up): the last call, closed before fn runs */
    lua_pushnil(L);
    if (nread != UV_EOF) {
      char name[64];
      uv_err_name_r((int)nread, name, sizeof name);
      lua_pushfstring(L, "%s: cannot read fd %d: %s", name, w->ud ? w->ud->signum : -1,
                      uv_strerror((int)nread));
      nargs = 2;
    }
    watch_close(w, L);
  }
  corral_pcall(w->cl, L, nargs);
}

/* The common part of core.signal, core.timer and core.reader: the userdata (closed), the
 * references, the C memory. Leaves the userdata on the stack top; returns NULL when out of
 * memory. */
static watch *watch_new(lua_State *L, const char *mt, int kind, int signum, int fn_idx) {
  corral_loop *cl = corral_loop_up(L);
  watch_ud *ud;
  watch *w;
  int fn_ref, self_ref;
  ud = (watch_ud *)lua_newuserdatauv(L, sizeof *ud, 1);
  ud->w = NULL;
  ud->kind = kind;
  ud->signum = signum;
  luaL_setmetatable(L, mt);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the loop lives as long as the watch */
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, fn_idx); /* references may raise: nothing in C yet */
  fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  w = (watch *)calloc(1, sizeof *w);
  if (w == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, self_ref);
    return NULL;
  }
  w->cl = cl;
  w->fn_ref = fn_ref;
  w->self_ref = self_ref;
  w->ud = ud;
  return w;
}

/* The handle is initialised: link the watch, attach the userdata. */
static void watch_link(watch *w) {
  corral_loop *cl = w->cl;
  w->h.handle.data = w;
  w->next = cl->watches;
  if (cl->watches) cl->watches->prevp = &w->next;
  w->prevp = &cl->watches;
  cl->watches = w;
  w->ud->w = w;
}

static void watch_drop(lua_State *L, watch *w) {
  luaL_unref(L, LUA_REGISTRYINDEX, w->fn_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, w->self_ref);
  free(w);
}

/* core.signal(signum, fn) -> watcher | nil, err, code: fn(signum) on the loop each time the
 * signal arrives, until watcher:close(). */
int corral_signal(lua_State *L) {
  lua_Integer signum = luaL_checkinteger(L, 1);
  watch *w;
  int rc;
  luaL_argcheck(L, signum > 0 && signum < 65, 1, "not a signal number");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  w = watch_new(L, CORRAL_SIGNAL_MT, WATCH_SIGNAL, (int)signum, 2);
  if (w == NULL) return corral_fail_errno(L, ENOMEM, "cannot watch signal %d", (int)signum);
  rc = uv_signal_init(&w->cl->loop, &w->h.signal);
  if (rc != 0) {
    watch_drop(L, w);
    return corral_fail_uv(L, rc, "cannot watch signal %d", (int)signum);
  }
  watch_link(w);
  rc = uv_signal_start(&w->h.signal, signal_cb, (int)signum);
  if (rc != 0) {
    watch_close(w, L);
    return corral_fail_uv(L, rc, "cannot watch signal %d", (int)signum);
  }
  return 1;
}

/* core.timer(seconds, fn) -> timer: fn() once after seconds, unless timer:close() came first. */
int corral_timer(lua_State *L) {
  double seconds = luaL_checknumber(L, 1);
  watch *w;
  luaL_argcheck(L, seconds >= 0 && seconds <= 1e7, 1, "seconds out of range [0, 1e7]");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  w = watch_new(L, CORRAL_TIMER_MT, WATCH_TIMER, 0, 2);
  if (w == NULL) return corral_fail_errno(L, ENOMEM, "cannot create a timer");
  uv_timer_init(&w->cl->loop, &w->h.timer);
  watch_link(w);
  /* the loop's cached time is stale when it has not run for a while */
  uv_update_time(&w->cl->loop);
  uv_timer_start(&w->h.timer, timer_cb, (uint64_t)ceil(seconds * 1000.0), 0);
  return 1;
}

/* core.reader(fd, fn) -> reader | nil, err, code: fn(bytes) on the loop for what each read of fd
 * (a terminal or a pipe) gives, then once fn(nil) at its end or fn(nil, err) on an error, unless
 * reader:close() came first. A terminal is read as it is set (a line at a time when canonical)
 * through a descriptor of its own that libuv opens, so fd keeps its flags; a pipe's fd becomes
 * non-blocking. A regular file is refused (EINVAL): libuv streams cannot read one. */
int corral_reader(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  uv_handle_type type;
  watch *w;
  int rc;
  luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 1, "not a file descriptor");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  type = uv_guess_handle((int)fd);
  if (type != UV_TTY && type != UV_NAMED_PIPE)
    return corral_fail_uv(L, UV_EINVAL, "cannot read fd %d as a stream (not a terminal or a pipe)",
                          (int)fd);
  w = watch_new(L, CORRAL_READER_MT, WATCH_READER, (int)fd, 2);
  if (w == NULL) return corral_fail_errno(L, ENOMEM, "cannot read fd %d", (int)fd);
  if (type == UV_TTY) {
    rc = uv_tty_init(&w->cl->loop, &w->h.tty, (int)fd, 1);
  } else {
    rc = uv_pipe_init(&w->cl->loop, &w->h.pipe, 0);
    if (rc == 0) {
      rc = uv_pipe_open(&w->h.pipe, (int)fd);
      if (rc != 0) {
        /* initialised: it must be closed, not freed */
        watch_link(w);
        watch_close(w, L);
        return corral_fail_uv(L, rc, "cannot read fd %d", (int)fd);
      }
    }
  }
  if (rc != 0) {
    watch_drop(L, w);
    return corral_fail_uv(L, rc, "cannot read fd %d", (int)fd);
  }
  watch_link(w);
  rc = uv_read_start(&w->h.stream, reader_alloc, reader_cb);
  if (rc != 0) {
    watch_close(w, L);
    return corral_fail_uv(L, rc, "cannot read fd %d", (int)fd);
  }
  return 1;
}

/* ---- the userdata ---------------------------------------------------------------------------- */

static watch_ud *check_watch(lua_State *L) {
  watch_ud *ud = (watch_ud *)luaL_testudata(L, 1, CORRAL_SIGNAL_MT);
  if (ud == NULL) ud = (watch_ud *)luaL_testudata(L, 1, CORRAL_READER_MT);
  if (ud == NULL) ud = (watch_ud *)luaL_checkudata(L, 1, CORRAL_TIMER_MT);
  return ud;
}

/* watcher:close(), timer:close(), __close: stop it. Safe twice, and after a timer fired. */
static int watch_close_l(lua_State *L) {
  watch_ud *ud = check_watch(L);
  if (ud->w != NULL) watch_close(ud->w, L);
  return 0;
}

static int watch_active(lua_State *L) {
  lua_pushboolean(L, check_watch(L)->w != NULL);
  return 1;
}

static int watch_tostring(lua_State *L) {
  watch_ud *ud = check_watch(L);
  if (ud->kind == WATCH_SIGNAL)
    lua_pushfstring(L, "corral.signal (%d, %s)", ud->signum, ud->w ? "active" : "closed");
  else if (ud->kind == WATCH_READER)
    lua_pushfstring(L, "corral.reader (fd %d, %s)", ud->signum, ud->w ? "reading" : "closed");
  else
    lua_pushfstring(L, "corral.timer (%s)", ud->w ? "pending" : "done");
  return 1;
}

/* __gc: an active watch is held by the registry, so this is reached while it is active only
 * when the state closes; the loop's teardown closes it. Detach. */
static int watch_gc(lua_State *L) {
  watch_ud *ud = check_watch(L);
  if (ud->w != NULL) {
    ud->w->ud = NULL;
    ud->w = NULL;
  }
  return 0;
}

void corral_watch_shutdown(corral_loop *cl) {
  watch *w;
  for (w = cl->watches; w != NULL; w = w->next) watch_close(w, NULL);
}

void corral_watch_open(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"close", watch_close_l},
      {"active", watch_active},
      {NULL, NULL},
  };
  static const char *const names[] = {CORRAL_SIGNAL_MT, CORRAL_TIMER_MT, CORRAL_READER_MT};
  int i;
  for (i = 0; i < 3; i++) {
    luaL_newmetatable(L, names[i]);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, watch_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, watch_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, watch_close_l);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
  }
}
