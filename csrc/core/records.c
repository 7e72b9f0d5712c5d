/*
 * corral.core: the records of a run's collection (csrc/launch/records.h), read into Lua tables.
 *
 * core.records_read(path or file, max[, given[, caps]]) -> list, complete, seen, flags | nil, err,
 * code
 *   the records in at most `max` bytes of the regular file at path (never through a link at its
 *   last name), or of a file of core.create_file (from its start), read in pieces of RECORDS_BUF: a collection costs the strings of its contents
 *   and no string of the whole (100 files of 10 KB: one copy each, no 1 MB string to copy from
 *   and collect).
 * core.records_unpack(data[, given[, caps]]) -> list, complete, seen, flags
 *   the records in a string (a session's kernel sends them in its answer).
 * caps: {files, file_bytes, bytes}, each an integer >= 0 or absent (no cap): at most `files`
 *   entries are made, in the order of the records; a file's content is cut to `file_bytes`, and
 *   to what is left of `bytes` in all. What is past a cap is skipped, never made: a record past
 *   `files` costs its parse and no allocation, so a producer that writes millions of tiny
 *   records costs the host the bytes it sent and `files` tables. A record past `files` adds
 *   "files" to flags, a content cut by what was left of `bytes` (not by `file_bytes`) "bytes";
 *   a file whose content was cut has truncated true and a size at least its stored bytes.
 * given: the run's files in, path -> content. A file that holds what it was given comes as a
 *   record without its bytes (REC_GIVEN): its content is given[path], the same string, which
 *   must be there with the size the record says. Without given, such a record is not well
 *   formed.
 *
 * list: the entries sorted by path (byte order), each {path, type, size, mode, ...}: type "file"
 * with content and truncated (size > #content), "link" with target (and no size), "error" with
 * error (the errno name). seen: the end record's count of the entries looked at; flags: its list
 * of what cut the list short, as written ("files,bytes"), and then each word the caps add that
 * it does not hold; complete: the end record was there.
 * Neither source is trusted: a record cut short or not well formed ends the list (complete
 * false), as a writer killed before its end record does; nothing in them can make either
 * function raise or read past what it was given.
 */
#include "core.h"
#include "../launch/records.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RECORDS_MT "corral.records"
#define RECORDS_BUF (64 * 1024)         /* a record head, or a file's content, that fits is read
                                         * whole into it */

/* A file being read, owned by a userdata so that a memory error while the tables are built
 * cannot leak its fd (closed at the next collection then), and its buffer. */
typedef struct recfile {
  int fd;
  char buf[RECORDS_BUF];
} recfile;

static int recfile_close(lua_State *L) {
  recfile *f = (recfile *)luaL_checkudata(L, 1, RECORDS_MT);
  if (f->fd >= 0) {
    close(f->fd);
    f->fd = -1;
  }
  return 0;
}

/* The bytes at hand, p[off..len): all of a string's, or what the buffer of a file holds. */
typedef struct src {
  const char *p;
  size_t off, len;
  recfile *f;                  /* NULL: a string */
  unsigned long long left;     /* a file: the bytes it may still give (of max) */
} src;

/* Read what the buffer has room for, within left: 1, or 0 at the end (EOF, a read error, max). */
static int src_fill(src *s) {
  size_t room = RECORDS_BUF - s->len;
  ssize_t r;
  if (room > s->left) room = (size_t)s->left;
  if (room == 0) return 0;
  do
    r = read(s->f->fd, s->f->buf + s->len, room);
  while (r < 0 && errno == EINTR);
  if (r <= 0) {
    s->left = 0;
    return 0;
  }
  s->len += (size_t)r;
  s->left -= (unsigned long long)r;
  return 1;
}

/* At least n bytes at hand (a file: n <= RECORDS_BUF; what it holds goes to the front first):
 * 1, or 0 when the records end before. */
static int src_want(src *s, size_t n) {
  if (s->len - s->off >= n) return 1;
  if (s->f == NULL || n > RECORDS_BUF) return 0;
  memmove(s->f->buf, s->f->buf + s->off, s->len - s->off);
  s->len -= s->off;
  s->off = 0;
  while (s->len < n)
    if (!src_fill(s)) return 0;
  return 1;
}

/* The next NUL-terminated field: a pointer to it (valid until the next read) and its length in
 * *n, or NULL when the records end before its NUL (a file's field longer than the buffer too). */
static const char *src_field(src *s, size_t *n) {
  size_t looked = 0;
  for (;;) {
    const char *at = s->p + s->off;
    const char *z = memchr(at + looked, '\0', s->len - s->off - looked);
    if (z != NULL) {
      *n = (size_t)(z - at);
      s->off += *n + 1;
      return at;
    }
    looked = s->len - s->off;
    if (!src_want(s, looked + 1)) return NULL;
  }
}

/* A field of digits only in base 8 or 10, at most 2^63 - 1: 1 and *v, else 0. */
static int number(const char *f, size_t n, unsigned base, lua_Integer *v) {
  unsigned long long x = 0;
  size_t i;
  if (n == 0 || n > 22) return 0;
  for (i = 0; i < n; i++) {
    unsigned d = (unsigned)(unsigned char)f[i] - '0';
    if (d >= base) return 0;
    if (x > ((unsigned long long)INT64_MAX - d) / base) return 0;
    x = x * base + d;
  }
  *v = (lua_Integer)x;
  return 1;
}

/* The next field as a number, or 0 when it is missing or not one. */
static int number_field(src *s, unsigned base, lua_Integer *v) {
  size_t n;
  const char *f = src_field(s, &n);
  return f != NULL && number(f, n, base, v);
}

/* Push the next n bytes as a string: 1, or 0 (nothing pushed) when the records end before. A
 * file's content larger than the buffer is read straight into the string's buffer. */
static int push_bytes(lua_State *L, src *s, size_t n) {
  luaL_Buffer b;
  char *d;
  size_t have;
  if (src_want(s, n)) {
    lua_pushlstring(L, s->p + s->off, n);
    s->off += n;
    return 1;
  }
  if (s->f == NULL || n - (s->len - s->off) > s->left) return 0;
  d = luaL_buffinitsize(L, &b, n);
  have = s->len - s->off;
  memcpy(d, s->p + s->off, have);
  s->off = s->len = 0;
  while (have < n) {
    ssize_t r = read(s->f->fd, d + have, n - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      s->left = 0;
      lua_pop(L, 1);
      return 0;
    }
    have += (size_t)r;
    s->left -= (unsigned long long)r;
  }
  luaL_pushresultsize(&b, n);
  return 1;
}

/* Pass over the next n bytes, making nothing (a file's are read into the buffer and dropped):
 * 1, or 0 when the records end before. */
static int src_skip(src *s, unsigned long long n) {
  if (s->len - s->off >= n) {
    s->off += (size_t)n;
    return 1;
  }
  if (s->f == NULL) return 0;
  n -= s->len - s->off;
  s->off = s->len = 0;
  while (src_fill(s)) {
    if (s->len >= n) {
      s->off = (size_t)n;
      return 1;
    }
    n -= s->len;
    s->len = 0;
  }
  return 0;
}

/* What the caller keeps (the caps argument), and what was kept so far. */
typedef struct caps {
  lua_Integer files, file_bytes, bytes; /* LUA_MAXINTEGER: no cap */
  lua_Integer made, total;              /* entries made, bytes of content in them */
  int cut_files, cut_bytes;             /* a cap cut the list: "files", "bytes" */
} caps;

static const char *const CAP_NAMES[] = {"files", "file_bytes", "bytes", NULL};

/* The caps table at arg (absent or nil: no caps) into *c; an unknown key, or a value that is not
 * an integer >= 0, raises naming the key. */
static void caps_arg(lua_State *L, int arg, caps *c) {
  lua_Integer *slot[3];
  memset(c, 0, sizeof *c);
  c->files = c->file_bytes = c->bytes = LUA_MAXINTEGER;
  if (lua_isnoneornil(L, arg)) return;
  luaL_checktype(L, arg, LUA_TTABLE);
  slot[0] = &c->files;
  slot[1] = &c->file_bytes;
  slot[2] = &c->bytes;
  lua_pushnil(L);
  while (lua_next(L, arg) != 0) {
    int i, isint;
    lua_Integer v;
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    for (i = 0; k != NULL && CAP_NAMES[i] != NULL; i++)
      if (strcmp(k, CAP_NAMES[i]) == 0) break;
    if (k == NULL || CAP_NAMES[i] == NULL)
      luaL_error(L, "bad caps: unknown key %s (files, file_bytes, bytes)",
                 k != NULL ? k : luaL_typename(L, -2));
    v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : (isint = 0);
    if (!isint || v < 0) luaL_error(L, "bad caps: %s must be an integer >= 0", k);
    *slot[i] = v;
    lua_pop(L, 1);
  }
}

/* Of a content of n bytes, what the caps keep: at most the room, the smaller of file_bytes and
 * what is left of bytes; "bytes" when the latter cut it (a cut by file_bytes alone shows as the
 * file's truncated). */
static size_t caps_keep(caps *c, size_t n) {
  lua_Integer left = c->bytes == LUA_MAXINTEGER ? LUA_MAXINTEGER : c->bytes - c->total;
  lua_Integer room = c->file_bytes < left ? c->file_bytes : left;
  if ((unsigned long long)n > (unsigned long long)room) {
    if (room < c->file_bytes) c->cut_bytes = 1;
    n = (size_t)room;
  }
  /* (n <= room <= bytes - total, or no cap on the sum: it saturates) */
  c->total = (unsigned long long)n > (unsigned long long)(LUA_MAXINTEGER - c->total) ? LUA_MAXINTEGER
                                                                                     : c->total + (lua_Integer)n;
  return n;
}

/* What next_entry found. */
enum { REC_STOP, REC_MADE, REC_SKIPPED };

/* One record into a table pushed on the stack: REC_MADE; REC_SKIPPED for a record well formed
 * past the caps' entries (nothing pushed, nothing made); REC_STOP at the end record or where the
 * records stop (nothing pushed; *complete set at the end record, *seen and the flags string
 * pushed then). */
static int next_entry(lua_State *L, src *s, int given, caps *c, int *complete, lua_Integer *seen) {
  char kind[8];
  size_t n, keep;
  lua_Integer size, mode, stored;
  const char *f = src_field(s, &n);
  if (f == NULL || n >= sizeof kind) return REC_STOP;
  memcpy(kind, f, n);
  kind[n] = '\0';
  if (strcmp(kind, REC_END) == 0) {
    /* complete with its two fields only: the writer may have been killed between two writes,
     * and the flags it did not write are what cut the list */
    int counted = number_field(s, 10, seen);
    f = counted ? src_field(s, &n) : NULL;
    *complete = f != NULL;
    if (!counted) *seen = 0;
    lua_pushlstring(L, f != NULL ? f : "", f != NULL ? n : 0);
    return REC_STOP;
  }
  if (c->made >= c->files) {
    /* past the cap: its fields checked as a made one's are, its bytes passed over; a given
     * file's bytes are not looked up (they would make nothing) */
    if (src_field(s, &n) == NULL || !number_field(s, 10, &size) || !number_field(s, 8, &mode) ||
        !number_field(s, 10, &stored) || (strcmp(kind, REC_GIVEN) == 0 && (given == 0 || stored != 0)) ||
        !src_skip(s, (unsigned long long)stored))
      return REC_STOP;
    c->cut_files = 1;
    return REC_SKIPPED;
  }
  f = src_field(s, &n);
  if (f == NULL) return REC_STOP;
  lua_pushlstring(L, f, n); /* the path: the buffer moves on */
  if (!number_field(s, 10, &size) || !number_field(s, 8, &mode) || !number_field(s, 10, &stored) ||
      (unsigned long long)stored > SIZE_MAX) {
    lua_pop(L, 1);
    return REC_STOP;
  }
  /* a file's content within the caps, the rest passed over */
  keep = strcmp(kind, REC_FILE) == 0 ? caps_keep(c, (size_t)stored) : (size_t)stored;
  if (!push_bytes(L, s, keep)) {
    lua_pop(L, 1);
    return REC_STOP;
  }
  if (keep < (size_t)stored && !src_skip(s, (unsigned long long)stored - keep)) {
    lua_pop(L, 2);
    return REC_STOP;
  }
  if (strcmp(kind, REC_GIVEN) == 0) {
    /* the bytes given at this path, which the file still holds: given[path] */
    size_t len;
    if (given == 0 || stored != 0) {
      lua_pop(L, 2);
      return REC_STOP;
    }
    lua_pushvalue(L, -2);
    lua_rawget(L, given);
    if (lua_type(L, -1) != LUA_TSTRING || (lua_tolstring(L, -1, &len), (lua_Integer)len != size)) {
      lua_pop(L, 3);
      return REC_STOP;
    }
    stored = size;
    keep = caps_keep(c, len);
    if (keep < len) {
      /* its first bytes within the caps: a copy of them */
      lua_pushlstring(L, lua_tostring(L, -1), keep);
      lua_replace(L, -2);
    }
    lua_replace(L, -2);
    memcpy(kind, REC_FILE, sizeof REC_FILE);
  }
  /* path, bytes -> {path, size, mode, type, content | target | error} */
  lua_createtable(L, 0, 6);
  lua_pushvalue(L, -3);
  lua_setfield(L, -2, "path");
  lua_pushinteger(L, mode & 07777);
  lua_setfield(L, -2, "mode");
  lua_pushvalue(L, -2);
  if (strcmp(kind, REC_FILE) == 0) {
    /* a size said smaller than the bytes stored is at least those */
    if (size < stored) size = stored;
    lua_setfield(L, -2, "content");
    lua_pushstring(L, "file");
    lua_pushboolean(L, (lua_Integer)keep < size);
    lua_setfield(L, -3, "truncated");
    lua_pushinteger(L, size);
    lua_setfield(L, -3, "size");
  } else if (strcmp(kind, REC_LINK) == 0) {
    lua_setfield(L, -2, "target");
    lua_pushstring(L, "link");
  } else {
    lua_setfield(L, -2, "error");
    lua_pushstring(L, "error");
    lua_pushinteger(L, size);
    lua_setfield(L, -3, "size");
  }
  lua_setfield(L, -2, "type");
  lua_replace(L, -3);
  lua_pop(L, 1);
  c->made++;
  return REC_MADE;
}

/* An entry's path, for the sort. */
typedef struct keyed {
  const char *path;
  size_t len;
  lua_Integer i;
} keyed;

static int by_path(const void *a, const void *b) {
  const keyed *x = (const keyed *)a, *y = (const keyed *)b;
  int c = memcmp(x->path, y->path, x->len < y->len ? x->len : y->len);
  if (c != 0) return c;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

/* The list at the top of the stack replaced by the same entries sorted by path. */
static void sort_list(lua_State *L, lua_Integer n) {
  keyed *k;
  lua_Integer i;
  int list = lua_gettop(L);
  if (n < 2) return;
  k = (keyed *)lua_newuserdatauv(L, (size_t)n * sizeof *k, 0);
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, list, i);
    lua_getfield(L, -1, "path");
    /* (the entry, which the list holds, keeps the string) */
    k[i - 1].path = lua_tolstring(L, -1, &k[i - 1].len);
    k[i - 1].i = i;
    lua_pop(L, 2);
  }
  qsort(k, (size_t)n, sizeof *k, by_path);
  lua_createtable(L, (int)n, 0);
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, list, k[i - 1].i);
    lua_rawseti(L, -2, i);
  }
  lua_replace(L, list);
  lua_pop(L, 1);
}

/* Whether the comma-separated list f[0..n) holds word. */
static int has_word(const char *f, size_t n, const char *word) {
  size_t w = strlen(word), i = 0;
  while (i <= n) {
    const char *comma = memchr(f + i, ',', n - i);
    size_t end = comma != NULL ? (size_t)(comma - f) : n;
    if (end - i == w && memcmp(f + i, word, w) == 0) return 1;
    i = end + 1;
  }
  return 0;
}

/* The flags string at the top of the stack replaced by it with each word the caps cut added
 * (once). */
static void add_cut(lua_State *L, const caps *c) {
  const char *words[2] = {c->cut_files ? "files" : NULL, c->cut_bytes ? "bytes" : NULL};
  int i;
  for (i = 0; i < 2; i++) {
    size_t n;
    const char *f = lua_tolstring(L, -1, &n);
    if (words[i] == NULL || has_word(f, n, words[i])) continue;
    if (n > 0) {
      lua_pushliteral(L, ",");
      lua_pushstring(L, words[i]);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushstring(L, words[i]);
    }
  }
}

/* list, complete, seen, flags from s; given: the stack index of the table of contents given, or
 * 0; c: the caps. */
static int unpack(lua_State *L, src *s, int given, caps *c) {
  lua_Integer n = 0, seen = 0;
  int complete = 0, top, r;
  lua_newtable(L);
  top = lua_gettop(L);
  while ((r = next_entry(L, s, given, c, &complete, &seen)) != REC_STOP)
    if (r == REC_MADE) lua_rawseti(L, top, ++n);
  if (!complete) lua_pushliteral(L, "");
  add_cut(L, c);
  lua_pushvalue(L, top);
  sort_list(L, n);
  lua_pushboolean(L, complete);
  lua_pushinteger(L, seen);
  lua_pushvalue(L, top + 1); /* flags */
  return 4;
}

/* The index of the optional table of contents given at arg, or 0. */
static int given_arg(lua_State *L, int arg) {
  if (lua_isnoneornil(L, arg)) return 0;
  luaL_checktype(L, arg, LUA_TTABLE);
  return arg;
}

/* core.records_unpack(data[, given[, caps]]) -> list, complete, seen, flags */
int corral_records_unpack(lua_State *L) {
  src s;
  caps c;
  int given;
  memset(&s, 0, sizeof s);
  s.p = luaL_checklstring(L, 1, &s.len);
  given = given_arg(L, 2);
  caps_arg(L, 3, &c);
  lua_settop(L, 2); /* data stays on the stack: the fields point into it */
  return unpack(L, &s, given, &c);
}

/* core.records_read(path or file, max[, given[, caps]]) -> list, complete, seen, flags | nil, err,
 * code. A file (core.create_file) is read from its start. */
int corral_records_read(lua_State *L) {
  size_t plen = 0;
  int held = lua_type(L, 1) == LUA_TUSERDATA ? corral_file_fd(L, 1) : -1;
  const char *path = held >= 0 ? "the collected file" : luaL_checklstring(L, 1, &plen);
  lua_Integer max = luaL_checkinteger(L, 2);
  struct stat st;
  recfile *f;
  src s;
  caps c;
  int nret, given, e;
  luaL_argcheck(L, held >= 0 || (plen > 0 && strlen(path) == plen), 1,
                "path is empty or contains a NUL byte");
  luaL_argcheck(L, max >= 0 && max <= ((lua_Integer)1 << 40), 2, "max out of range");
  given = given_arg(L, 3);
  caps_arg(L, 4, &c);
  lua_settop(L, 3);
  f = (recfile *)lua_newuserdatauv(L, sizeof *f, 0);
  f->fd = -1;
  luaL_setmetatable(L, RECORDS_MT);
  /* (a file's own offset, shared with the dup, goes back to its start; its appends are not
   * moved by it) */
  if (held >= 0) {
    f->fd = fcntl(held, F_DUPFD_CLOEXEC, 0);
    if (f->fd >= 0 && lseek(f->fd, 0, SEEK_SET) < 0) {
      e = errno;
      close(f->fd);
      f->fd = -1;
      errno = e;
    }
  } else {
    f->fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (f->fd < 0) {
    e = errno;
    return corral_fail_errno(L, e, "cannot open %s", path);
  }
  e = fstat(f->fd, &st) < 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
  if (e != 0) {
    close(f->fd);
    f->fd = -1;
    return corral_fail_errno(L, e, "%s is not a regular file", path);
  }
  memset(&s, 0, sizeof s);
  s.p = f->buf;
  s.f = f;
  s.left = (unsigned long long)max;
  nret = unpack(L, &s, given, &c);
  close(f->fd);
  f->fd = -1;
  return nret;
}

void corral_records_open(lua_State *L) {
  luaL_newmetatable(L, RECORDS_MT);
  lua_pushcfunction(L, recfile_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}
