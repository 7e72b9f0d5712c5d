/*
 * corral.core: luaopen, the loop userdata, core.run, error and option helpers, small calls.
 *
 * Each luaopen makes its own loop (a userdata holding a malloc'd corral_loop), kept as the first
 * upvalue of every module function; its __gc tears the loop down, killing any child still running.
 */
#include "core.h"

#include <sys/random.h>

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

LUAMOD_API int luaopen_corral_core(lua_State *L);

/* ---- the loop -------------------------------------------------------------------------------- */

/* close, __gc: close the servers and watches (no Lua), kill and reap what still runs, close
 * every handle, let the close callbacks run, close the loop. Safe twice. */
static int loop_close(lua_State *L) {
  corral_loop **pp = (corral_loop **)luaL_checkudata(L, 1, CORRAL_LOOP_MT);
  corral_loop *cl = *pp;
  if (cl == NULL) return 0;
  *pp = NULL;
  cl->closing = 1;
  corral_http_shutdown(cl); /* before the runs': its walk closes whatever is left as a run's */
  corral_watch_shutdown(cl);
  corral_zygote_shutdown(cl); /* before the runs': its handles are not runs' */
  corral_runs_shutdown(cl);
  uv_run(&cl->loop, UV_RUN_DEFAULT); /* only close callbacks are left */
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, cl);
  if (uv_loop_close(&cl->loop) != 0) return 0; /* a handle is still open: leak rather than crash */
  free(cl);
  return 0;
}

static int loop_tostring(lua_State *L) {
  corral_loop **pp = (corral_loop **)luaL_checkudata(L, 1, CORRAL_LOOP_MT);
  if (*pp == NULL)
    lua_pushstring(L, "corral.loop (closed)");
  else
    lua_pushfstring(L, "corral.loop (%p)", (void *)*pp);
  return 1;
}

/* core.run([mode]) -> alive */
static int l_run(lua_State *L) {
  static const char *const names[] = {"default", "once", "nowait", NULL};
  static const uv_run_mode modes[] = {UV_RUN_DEFAULT, UV_RUN_ONCE, UV_RUN_NOWAIT};
  corral_loop *cl = corral_loop_up(L);
  int mode = luaL_checkoption(L, 1, "default", names);
  int alive;
  if (cl->running) return luaL_error(L, "core.run: the loop is already running (called from a callback?)");
  cl->running = 1;
  alive = uv_run(&cl->loop, modes[mode]);
  cl->running = 0;
  lua_rawgetp(L, LUA_REGISTRYINDEX, cl);
  if (lua_toboolean(L, -1)) { /* a callback failed: clear the slot and re-raise here */
    lua_pushboolean(L, 0);
    lua_rawsetp(L, LUA_REGISTRYINDEX, cl);
    return lua_error(L);
  }
  lua_pop(L, 1);
  lua_pushboolean(L, alive != 0);
  return 1;
}

/* ---- small calls ----------------------------------------------------------------------------- */

static int l_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

/* core.yield(): sched_yield(), so that a process this one just woke on its CPU runs first. */
static int l_yield(lua_State *L) {
  (void)L;
  sched_yield();
  return 0;
}

static int l_getuid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getuid());
  return 1;
}

static int l_geteuid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)geteuid());
  return 1;
}

static int l_getgid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getgid());
  return 1;
}

/* core.kill(pid, sig) -> true | nil, err, code. pid 0 and -1 (our own group, every process)
 * are refused: no policy means them. */
static int l_kill(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  lua_Integer sig = luaL_checkinteger(L, 2);
  luaL_argcheck(L, pid != 0 && pid != -1 && pid >= INT32_MIN && pid <= INT32_MAX, 1,
                "pid must be a process (> 0) or a group (< -1)");
  luaL_argcheck(L, sig >= 0 && sig < 65, 2, "not a signal number");
  if (kill((pid_t)pid, (int)sig) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot signal %I", (LUAI_UACINT)pid);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_hrtime(lua_State *L) {
  lua_pushnumber(L, (lua_Number)uv_hrtime() / 1e9);
  return 1;
}

static int l_cpu_count(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)uv_available_parallelism());
  return 1;
}

static int l_rusage(lua_State *L) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "getrusage");
  }
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, (lua_Number)ru.ru_utime.tv_sec + (lua_Number)ru.ru_utime.tv_usec / 1e6);
  lua_setfield(L, -2, "user_s");
  lua_pushnumber(L, (lua_Number)ru.ru_stime.tv_sec + (lua_Number)ru.ru_stime.tv_usec / 1e6);
  lua_setfield(L, -2, "sys_s");
  lua_pushinteger(L, (lua_Integer)ru.ru_maxrss);
  lua_setfield(L, -2, "maxrss_kb");
  return 1;
}

/* A DIR* owned by a userdata, so that a memory error while building a table cannot leak it. */
typedef struct dirguard {
  DIR *dir;
} dirguard;

static int dirguard_close(lua_State *L) {
  dirguard *g = (dirguard *)luaL_checkudata(L, 1, CORRAL_DIR_MT);
  if (g->dir != NULL) {
    closedir(g->dir);
    g->dir = NULL;
  }
  return 0;
}

/* core.fds() -> array of the open fds of this process (ascending, as /proc lists them). */
static int l_fds(lua_State *L) {
  dirguard *g = (dirguard *)lua_newuserdatauv(L, sizeof *g, 0);
  struct dirent *de;
  lua_Integer n = 0;
  int self;
  g->dir = NULL;
  luaL_setmetatable(L, CORRAL_DIR_MT);
  g->dir = opendir("/proc/self/fd");
  if (g->dir == NULL) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot list /proc/self/fd");
  }
  self = dirfd(g->dir);
  lua_newtable(L);
  while ((de = readdir(g->dir)) != NULL) {
    char *end;
    long fd;
    if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
    fd = strtol(de->d_name, &end, 10);
    if (*end != '\0' || fd == self) continue;
    lua_pushinteger(L, (lua_Integer)fd);
    lua_rawseti(L, -2, ++n);
  }
  closedir(g->dir);
  g->dir = NULL;
  return 1;
}

/* ---- luaopen --------------------------------------------------------------------------------- */

static void ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
      sa.sa_handler == SIG_DFL) {
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
  }
}

/* core.set_dumpable(bool) -> true | nil, err, code: PR_SET_DUMPABLE for this process. A
 * controller that is not dumpable cannot be ptraced, nor its /proc/PID/environ read, by a
 * program that shares its uid (the degraded mode without a user namespace or a run uid). */
static int l_set_dumpable(lua_State *L) {
  int on;
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  on = lua_toboolean(L, 1);
  if (prctl(PR_SET_DUMPABLE, on ? 1 : 0, 0, 0, 0) != 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot set PR_SET_DUMPABLE");
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.time() -> seconds since the epoch (wall clock), for file ages */
static int l_time(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)time(NULL));
  return 1;
}

/* core.random_hex(n) -> 2n hex digits of the kernel's random bytes (getrandom): session ids and
 * the tokens that end a session's requests; 1 <= n <= 64 */
static int l_random_hex(lua_State *L) {
  static const char hex[] = "0123456789abcdef";
  unsigned char b[64];
  char out[128];
  lua_Integer n = luaL_checkinteger(L, 1);
  size_t got = 0, i;
  luaL_argcheck(L, n >= 1 && n <= 64, 1, "1 to 64 bytes");
  while (got < (size_t)n) {
    ssize_t r = getrandom(b + got, (size_t)n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return corral_fail_errno(L, errno, "getrandom failed");
    got += (size_t)r;
  }
  for (i = 0; i < (size_t)n; i++) {
    out[2 * i] = hex[b[i] >> 4];
    out[2 * i + 1] = hex[b[i] & 15];
  }
  lua_pushlstring(L, out, 2 * (size_t)n);
  return 1;
}

static const luaL_Reg funcs[] = {
    {"set_dumpable", l_set_dumpable},
    {"random_hex", l_random_hex},
    {"time", l_time},
    {"spawn", corral_spawn},
    {"zygote", corral_zygote_start},
    {"http_listen", corral_http_listen},
    {"resolve", corral_resolve},
    {"signal", corral_signal},
    {"timer", corral_timer},
    {"reader", corral_reader},
    {"run", l_run},
    {"mkdtemp", corral_mkdtemp},
    {"rmtree", corral_rmtree},
    {"write_file", corral_write_file},
    {"append_file", corral_append_file},
    {"create_file", corral_create_file},
    {"read_file", corral_read_file},
    {"records_read", corral_records_read},
    {"records_unpack", corral_records_unpack},
    {"chown", corral_chown},
    {"chmod", corral_chmod},
    {"exists", corral_exists},
    {"mkdir", corral_mkdir},
    {"symlink", corral_symlink},
    {"readlink", corral_readlink},
    {"lstat", corral_lstat},
    {"access", corral_access},
    {"realpath", corral_realpath},
    {"listdir", corral_listdir},
    {"utf8_repair", corral_utf8_repair},
    {"json_raw_control", corral_json_raw_control},
    {"json_separators", corral_json_separators},
    {"b64encode", corral_b64encode},
    {"b64decode", corral_b64decode},
    {"lock", corral_lock},
    {"fds", l_fds},
    {"getpid", l_getpid},
    {"yield", l_yield},
    {"getuid", l_getuid},
    {"geteuid", l_geteuid},
    {"getgid", l_getgid},
    {"kill", l_kill},
    {"hrtime", l_hrtime},
    {"cpu_count", l_cpu_count},
    {"rusage", l_rusage},
    {NULL, NULL},
};

LUAMOD_API int luaopen_corral_core(lua_State *L) {
  corral_loop **pp;
  corral_loop *cl;
  int rc;

  ignore_sigpipe();

  luaL_newmetatable(L, CORRAL_LOOP_MT);
  lua_pushcfunction(L, loop_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, loop_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  luaL_newmetatable(L, CORRAL_DIR_MT);
  lua_pushcfunction(L, dirguard_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);

  corral_proc_open(L);
  corral_lock_open(L);
  corral_file_open(L);
  corral_records_open(L);
  corral_http_open(L);
  corral_watch_open(L);
  corral_zygote_open(L);

  /* the userdata first, closed; then the loop */
  pp = (corral_loop **)lua_newuserdatauv(L, sizeof *pp, 0);
  *pp = NULL;
  luaL_setmetatable(L, CORRAL_LOOP_MT);
  cl = (corral_loop *)calloc(1, sizeof *cl);
  if (cl == NULL) return luaL_error(L, "corral.core: out of memory");
  rc = uv_loop_init(&cl->loop);
  if (rc != 0) {
    free(cl);
    return luaL_error(L, "corral.core: cannot create a libuv loop: %s", uv_strerror(rc));
  }
  *pp = cl; /* from here the loop's __gc owns cl */
  lua_pushboolean(L, 0);
  lua_rawsetp(L, LUA_REGISTRYINDEX, cl); /* the error slot */
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  cl->L = lua_tothread(L, -1);
  lua_pop(L, 1);

  lua_newtable(L);
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, funcs, 1);
  lua_pushstring(L, uv_version_string());
  lua_setfield(L, -2, "uv_version");
  return 1;
}
