/*
 * corral.core: what every binding uses: the loop of the function called, errors as luv's
 * (nil, "ENAME: ...", "ENAME"), protected calls with a traceback, strict option tables.
 */
#include "core.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

/* ---- the loop -------------------------------------------------------------------------------- */

corral_loop *corral_loop_up(lua_State *L) {
  corral_loop **pp = (corral_loop **)lua_touserdata(L, lua_upvalueindex(1));
  if (pp == NULL || *pp == NULL) luaL_error(L, "corral.core: the loop is closed");
  return *pp;
}

/* ---- errors ---------------------------------------------------------------------------------- */

static int push_fail(lua_State *L, const char *name, const char *msg, const char *fmt,
                     va_list ap) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: ", name);
  lua_pushvfstring(L, fmt, ap);
  lua_pushfstring(L, ": %s", msg);
  lua_concat(L, 3);
  lua_pushstring(L, name);
  return 3;
}

int corral_fail_errno(lua_State *L, int err, const char *fmt, ...) {
  char nbuf[32], mbuf[256];
  const char *name = strerrorname_np(err);
  const char *msg = strerror_r(err, mbuf, sizeof mbuf);
  va_list ap;
  int n;
  if (name == NULL) {
    snprintf(nbuf, sizeof nbuf, "E%d", err);
    name = nbuf;
  }
  va_start(ap, fmt);
  n = push_fail(L, name, msg, fmt, ap);
  va_end(ap);
  return n;
}

int corral_fail_uv(lua_State *L, int uverr, const char *fmt, ...) {
  char nbuf[64], mbuf[256];
  va_list ap;
  int n;
  uv_err_name_r(uverr, nbuf, sizeof nbuf);
  uv_strerror_r(uverr, mbuf, sizeof mbuf);
  va_start(ap, fmt);
  n = push_fail(L, nbuf, mbuf, fmt, ap);
  va_end(ap);
  return n;
}

/* ---- protected calls from libuv callbacks ---------------------------------------------------- */

/* The message handler: the error with a traceback (as lua.c's msghandler). */
static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      msg = lua_tostring(L, -1);
    else
      msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int corral_pcall_keep(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs; /* the function */
  int status;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  status = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  return status;
}

/* The error slot of a loop is registry[cl] (a light userdata key created at luaopen, so storing
 * into it never allocates): false, or the first error a callback raised. */
int corral_pcall(corral_loop *cl, lua_State *L, int nargs) {
  int status = corral_pcall_keep(L, nargs);
  if (status != LUA_OK) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, cl);
    if (lua_toboolean(L, -1)) {
      lua_pop(L, 2); /* keep the first error */
    } else {
      lua_pop(L, 1);
      lua_rawsetp(L, LUA_REGISTRYINDEX, cl);
    }
    uv_stop(&cl->loop); /* so that core.run returns and re-raises it */
  }
  return status;
}

/* ---- strict option tables -------------------------------------------------------------------- */

void corral_check_keys(lua_State *L, int idx, const char *const known[]) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const char *key;
    int i;
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, idx, lua_pushfstring(L, "option names must be strings, got a %s key",
                                            luaL_typename(L, -1)));
    key = lua_tostring(L, -1);
    for (i = 0; known[i] != NULL; i++)
      if (strcmp(key, known[i]) == 0) break;
    if (known[i] == NULL)
      luaL_argerror(L, idx, lua_pushfstring(L, "unknown option '%s'", key));
  }
}

static int wrong_type(lua_State *L, int idx, const char *key, const char *expected) {
  return luaL_argerror(L, idx, lua_pushfstring(L, "option '%s': %s expected, got %s", key,
                                               expected, luaL_typename(L, -1)));
}

lua_Integer corral_opt_integer(lua_State *L, int idx, const char *key, lua_Integer def,
                               lua_Integer min, lua_Integer max) {
  lua_Integer v;
  int isint;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, key) == LUA_TNIL) {
    lua_pop(L, 1);
    return def;
  }
  if (lua_type(L, -1) != LUA_TNUMBER) wrong_type(L, idx, key, "integer");
  v = lua_tointegerx(L, -1, &isint);
  if (!isint) wrong_type(L, idx, key, "integer");
  if (v < min || v > max)
    luaL_argerror(L, idx, lua_pushfstring(L, "option '%s': %I is out of range [%I, %I]", key,
                                          (LUAI_UACINT)v, (LUAI_UACINT)min, (LUAI_UACINT)max));
  lua_pop(L, 1);
  return v;
}

double corral_opt_number(lua_State *L, int idx, const char *key, double def, double min,
                         double max) {
  double v;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, key) == LUA_TNIL) {
    lua_pop(L, 1);
    return def;
  }
  if (lua_type(L, -1) != LUA_TNUMBER) wrong_type(L, idx, key, "number");
  v = (double)lua_tonumber(L, -1);
  if (!(v >= min && v <= max)) /* also refuses NaN */
    luaL_argerror(L, idx, lua_pushfstring(L, "option '%s': %f is out of range [%f, %f]", key,
                                          (LUAI_UACNUMBER)v, (LUAI_UACNUMBER)min,
                                          (LUAI_UACNUMBER)max));
  lua_pop(L, 1);
  return v;
}

int corral_opt_boolean(lua_State *L, int idx, const char *key, int def) {
  int v;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, key) == LUA_TNIL) {
    lua_pop(L, 1);
    return def;
  }
  if (lua_type(L, -1) != LUA_TBOOLEAN) wrong_type(L, idx, key, "boolean");
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

const char *corral_opt_string(lua_State *L, int idx, const char *key, size_t *len) {
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, key) == LUA_TNIL) {
    if (len) *len = 0;
    return NULL;
  }
  if (lua_type(L, -1) != LUA_TSTRING) wrong_type(L, idx, key, "string");
  return lua_tolstring(L, -1, len);
}
