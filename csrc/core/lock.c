/*
 * corral.core: core.lock(path), an exclusive non-blocking flock on a file it creates if needed,
 * or on the directory at path itself. Used to take a per-run uid across processes, and to mark a
 * run directory as having a live owner. The lock file is left in place on close (removing it
 * would race with the next locker).
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

typedef struct lock_ud {
  int fd; /* -1: closed */
} lock_ud;

/* lock:close(), __gc, __close: release. Safe twice. */
static int lock_close(lua_State *L) {
  lock_ud *k = (lock_ud *)luaL_checkudata(L, 1, CORRAL_LOCK_MT);
  if (k->fd >= 0) {
    close(k->fd); /* releases the flock */
    k->fd = -1;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int lock_tostring(lua_State *L) {
  lock_ud *k = (lock_ud *)luaL_checkudata(L, 1, CORRAL_LOCK_MT);
  if (k->fd < 0)
    lua_pushstring(L, "corral.lock (closed)");
  else
    lua_pushfstring(L, "corral.lock (fd %d)", k->fd);
  return 1;
}

/* core.lock(path) -> lock | nil, err, code ("EAGAIN" when another process holds it). A directory
 * is locked itself (no file is made in it). */
int corral_lock(lua_State *L) {
  size_t len;
  const char *path = luaL_checklstring(L, 1, &len);
  lock_ud *k;
  int fd;
  luaL_argcheck(L, len > 0 && strlen(path) == len, 1, "path is empty or contains a NUL byte");
  k = (lock_ud *)lua_newuserdatauv(L, sizeof *k, 0);
  k->fd = -1;
  luaL_setmetatable(L, CORRAL_LOCK_MT);
  fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EISDIR) fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot open lock file %s", path);
  }
  while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    if (e == EINTR) continue;
    close(fd);
    if (e == EWOULDBLOCK) return corral_fail_errno(L, e, "lock %s is already held", path);
    return corral_fail_errno(L, e, "cannot lock %s", path);
  }
  k->fd = fd;
  return 1;
}

/* The fd of the lock at idx (a directory's, for core.lock(dir)); -1 once closed. */
int corral_lock_fd(lua_State *L, int idx) {
  lock_ud *k = (lock_ud *)luaL_checkudata(L, idx, CORRAL_LOCK_MT);
  return k->fd;
}

void corral_lock_open(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"close", lock_close},
      {NULL, NULL},
  };
  luaL_newmetatable(L, CORRAL_LOCK_MT);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lock_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lock_close);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, lock_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}
