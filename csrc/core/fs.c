/*
 * corral.core: files. mkdtemp, rmtree, write_file, create_file (a file kept open), read_file,
 * chown, chmod, exists.
 *
 * None of them follows a symlink in the last component. rmtree walks a tree the sandboxed code
 * may have shaped (symlinks to elsewhere, chmod 000 directories, 10,000 levels of nesting): it
 * works relative to directory fds, holds at most two of them at a time, and keeps its own stack.
 */
#include "core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* A path argument: a string without NUL bytes. */
static const char *check_path(lua_State *L, int arg) {
  size_t len;
  const char *p = luaL_checklstring(L, arg, &len);
  luaL_argcheck(L, len > 0 && strlen(p) == len, arg, "path is empty or contains a NUL byte");
  return p;
}

static mode_t check_mode(lua_State *L, int arg, lua_Integer def) {
  lua_Integer m = luaL_optinteger(L, arg, def);
  luaL_argcheck(L, m >= 0 && m <= 07777, arg, "mode must be in [0, 07777]");
  return (mode_t)m;
}

/* core.mkdtemp(template) -> path | nil, err, code */
int corral_mkdtemp(lua_State *L) {
  char buf[PATH_MAX];
  const char *t = check_path(L, 1);
  size_t n = strlen(t);
  luaL_argcheck(L, n >= 6 && strcmp(t + n - 6, "XXXXXX") == 0, 1, "template must end in XXXXXX");
  if (n >= sizeof buf) return corral_fail_errno(L, ENAMETOOLONG, "cannot create %s", t);
  memcpy(buf, t, n + 1);
  if (mkdtemp(buf) == NULL) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot create %s", t);
  }
  lua_pushstring(L, buf);
  return 1;
}

/* core.write_file(path, data[, mode=0600]) -> true | nil, err, code. The file must not exist;
 * its mode is exactly `mode` (not masked by the umask). A failed write removes the file. `data`
 * is a string or a list of strings. */
/* All of data[0..len) to fd: 0, or -1 with errno. */
static int write_all(int fd, const char *data, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    off += (size_t)w;
  }
  return 0;
}

/* The strings 1..n of the list at index 2 to fd, in writev calls of up to WRITE_IOV of them (one
 * call for a run's files-in records of 100 files): 0, or -1 with errno. */
#define WRITE_IOV 1024
static int write_list(lua_State *L, int fd, lua_Integer n) {
  struct iovec iov[WRITE_IOV];
  lua_Integer i = 1;
  while (i <= n) {
    int k = 0, at = 0;
    for (; i <= n && k < WRITE_IOV; i++) {
      lua_rawgeti(L, 2, i);
      /* (the table keeps the string) */
      iov[k].iov_base = (void *)lua_tolstring(L, -1, &iov[k].iov_len);
      lua_pop(L, 1);
      if (iov[k].iov_len > 0) k++;
    }
    while (at < k) {
      ssize_t w = writev(fd, iov + at, k - at);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return -1;
      if (w == 0) {
        errno = EIO;
        return -1;
      }
      /* a short write: on from the first byte not written */
      while (at < k && (size_t)w >= iov[at].iov_len) w -= (ssize_t)iov[at++].iov_len;
      if (at < k) {
        iov[at].iov_base = (char *)iov[at].iov_base + w;
        iov[at].iov_len -= (size_t)w;
      }
    }
  }
  return 0;
}

/* The data argument at index 2: a string (*data, *len), or a list of *n strings written one after
 * another (no copy joins them; *data NULL). Raises for anything else. */
static void check_data(lua_State *L, const char **data, size_t *len, lua_Integer *n) {
  lua_Integer i;
  *data = NULL;
  *len = 0;
  *n = 0;
  if (lua_type(L, 2) == LUA_TTABLE) {
    *n = (lua_Integer)lua_rawlen(L, 2);
    for (i = 1; i <= *n; i++) {
      if (lua_rawgeti(L, 2, i) != LUA_TSTRING) luaL_argerror(L, 2, "a list of strings expected");
      lua_pop(L, 1);
    }
  } else {
    *data = luaL_checklstring(L, 2, len);
  }
}

int corral_write_file(lua_State *L) {
  const char *path = check_path(L, 1);
  size_t len;
  lua_Integer n;
  const char *data;
  mode_t mode = check_mode(L, 3, 0600);
  int fd, e;
  check_data(L, &data, &len, &n);
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    e = errno;
    return corral_fail_errno(L, e, "cannot create %s", path);
  }
  if (fchmod(fd, mode) < 0) goto fail;
  if (data) {
    if (write_all(fd, data, len) < 0) goto fail;
  } else if (write_list(L, fd, n) < 0) {
    goto fail;
  }
  if (close(fd) < 0) {
    e = errno;
    unlink(path);
    return corral_fail_errno(L, e, "cannot write %s", path);
  }
  lua_pushboolean(L, 1);
  return 1;
fail:
  e = errno;
  close(fd);
  unlink(path);
  return corral_fail_errno(L, e, "cannot write %s", path);
}

/* core.append_file(path, data) -> true | nil, err, code: data (as write_file's) at the end of
 * the regular file at path, which must exist (never through a link at its last name). A file
 * another process opened already gets its bytes: a run's files in, written while its launcher
 * starts. On failure what was written stays. */
int corral_append_file(lua_State *L) {
  const char *path = check_path(L, 1);
  size_t len;
  lua_Integer n;
  const char *data;
  struct stat st;
  int fd, e;
  check_data(L, &data, &len, &n);
  fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    e = errno;
    return corral_fail_errno(L, e, "cannot open %s", path);
  }
  e = fstat(fd, &st) < 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
  if (e != 0) {
    close(fd);
    return corral_fail_errno(L, e, "%s is not a regular file", path);
  }
  if ((data ? write_all(fd, data, len) : write_list(L, fd, n)) < 0) {
    e = errno;
    close(fd);
    return corral_fail_errno(L, e, "cannot write %s", path);
  }
  if (close(fd) < 0) {
    e = errno;
    return corral_fail_errno(L, e, "cannot write %s", path);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* ---- files kept open ------------------------------------------------------------------------ */

/* A run's records in and out: made by name in the run's directory, then reached through this fd
 * alone once the launcher has removed the name (--unlink-files), so that a program sharing our
 * uid finds no path to them (the controller is not dumpable: not through /proc/PID/fd either). */
typedef struct file_ud {
  int fd; /* -1: closed */
} file_ud;

static file_ud *file_check(lua_State *L, int idx) {
  file_ud *f = (file_ud *)luaL_checkudata(L, idx, CORRAL_FILE_MT);
  luaL_argcheck(L, f->fd >= 0, idx, "the file is closed");
  return f;
}

int corral_file_fd(lua_State *L, int idx) {
  return file_check(L, idx)->fd;
}

/* core.create_file(path[, mode=0600]) -> file | nil, err, code: a new regular file (O_EXCL,
 * never through a link), its mode exactly `mode`, open for reading and appending whatever the
 * mode. */
int corral_create_file(lua_State *L) {
  const char *path = check_path(L, 1);
  mode_t mode = check_mode(L, 2, 0600);
  file_ud *f = (file_ud *)lua_newuserdatauv(L, sizeof *f, 0);
  int e;
  f->fd = -1;
  luaL_setmetatable(L, CORRAL_FILE_MT);
  f->fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (f->fd < 0) {
    e = errno;
    return corral_fail_errno(L, e, "cannot create %s", path);
  }
  if (fchmod(f->fd, mode) < 0) {
    e = errno;
    close(f->fd);
    f->fd = -1;
    unlink(path);
    return corral_fail_errno(L, e, "cannot set the mode of %s", path);
  }
  return 1;
}

/* file:append(data) -> true | nil, err, code: data (as write_file's) at the end. A process that
 * opened the file already reads it. On failure what was written stays. */
static int file_append(lua_State *L) {
  file_ud *f = file_check(L, 1);
  size_t len;
  lua_Integer n;
  const char *data;
  check_data(L, &data, &len, &n);
  if ((data ? write_all(f->fd, data, len) : write_list(L, f->fd, n)) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot write the file");
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* file:close(), __gc, __close. Safe twice. */
static int file_close(lua_State *L) {
  file_ud *f = (file_ud *)luaL_checkudata(L, 1, CORRAL_FILE_MT);
  if (f->fd >= 0) {
    close(f->fd);
    f->fd = -1;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int file_tostring(lua_State *L) {
  file_ud *f = (file_ud *)luaL_checkudata(L, 1, CORRAL_FILE_MT);
  if (f->fd < 0)
    lua_pushstring(L, "corral.file (closed)");
  else
    lua_pushfstring(L, "corral.file (fd %d)", f->fd);
  return 1;
}

void corral_file_open(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"append", file_append},
      {"close", file_close},
      {NULL, NULL},
  };
  luaL_newmetatable(L, CORRAL_FILE_MT);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, file_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, file_close);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, file_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

/* core.read_file(path, max) -> bytes, truncated | nil, err, code: a regular file, never through a
 * link at its last name, at most `max` bytes of it (a file the host reads back from a run). Read
 * into one buffer of the file's size. */
int corral_read_file(lua_State *L) {
  const char *path = check_path(L, 1);
  lua_Integer max = luaL_checkinteger(L, 2);
  luaL_Buffer b;
  struct stat st;
  size_t got = 0, want;
  char *p;
  int fd, e;
  luaL_argcheck(L, max >= 0 && max <= ((lua_Integer)1 << 40), 2, "max out of range");
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    e = errno;
    return corral_fail_errno(L, e, "cannot open %s", path);
  }
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    e = S_ISREG(st.st_mode) ? errno : EINVAL;
    close(fd);
    return corral_fail_errno(L, e, "%s is not a regular file", path);
  }
  want = (lua_Integer)st.st_size < max ? (size_t)st.st_size : (size_t)max;
  p = luaL_buffinitsize(L, &b, want + 1);
  while (got < want) {
    ssize_t r = read(fd, p + got, want - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      e = errno;
      close(fd);
      return corral_fail_errno(L, e, "cannot read %s", path);
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  luaL_pushresultsize(&b, got);
  lua_pushboolean(L, (lua_Integer)st.st_size > max);
  return 2;
}

static lua_Integer check_id(lua_State *L, int arg) {
  lua_Integer id = luaL_checkinteger(L, arg);
  luaL_argcheck(L, id >= -1 && id < (lua_Integer)UINT32_MAX, arg, "id must be in [-1, 2^32-2]");
  return id;
}

/* core.chown(path, uid, gid) -> true | nil, err, code (-1 leaves an id as it is). */
int corral_chown(lua_State *L) {
  const char *path = check_path(L, 1);
  uid_t uid = (uid_t)check_id(L, 2);
  gid_t gid = (gid_t)check_id(L, 3);
  if (fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot chown %s", path);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.chmod(path, mode) -> true | nil, err, code. A symlink is refused (EOPNOTSUPP). */
int corral_chmod(lua_State *L) {
  const char *path = check_path(L, 1);
  mode_t mode;
  luaL_checkinteger(L, 2);
  mode = check_mode(L, 2, 0);
  if (fchmodat(AT_FDCWD, path, mode, AT_SYMLINK_NOFOLLOW) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot chmod %s", path);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.exists(path) -> bool | nil, err, code (a symlink exists, dangling or not). */
int corral_exists(lua_State *L) {
  const char *path = check_path(L, 1);
  struct stat st;
  if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (errno == ENOENT || errno == ENOTDIR) {
    lua_pushboolean(L, 0);
    return 1;
  }
  {
    int e = errno;
    return corral_fail_errno(L, e, "cannot stat %s", path);
  }
}

/* ---- rmtree ---------------------------------------------------------------------------------- */

typedef struct rm_frame {
  dev_t dev;
  ino_t ino;
  char *name; /* in the parent; NULL for the root */
} rm_frame;

typedef struct rm_id {
  dev_t dev;
  ino_t ino;
} rm_id;

typedef struct rm_state {
  const char *root;
  dev_t root_dev;
  rm_frame *stack; /* stack[0] is the root, stack[depth-1] the directory being emptied */
  size_t depth, stack_alloc;
  rm_id *skip; /* entries that could not be removed: not retried, not re-entered */
  size_t nskip, skip_alloc;
  int err;       /* the first error */
  char *errpath; /* and where */
} rm_state;

/* The path of entry `name` in the directory stack[depth-1] (name NULL: that directory). */
static char *rm_path(const rm_state *s, const char *name) {
  size_t len = strlen(s->root) + 1, i;
  char *p, *q;
  for (i = 1; i < s->depth; i++) len += strlen(s->stack[i].name) + 1;
  if (name) len += strlen(name) + 1;
  p = (char *)malloc(len);
  if (p == NULL) return NULL;
  q = stpcpy(p, s->root);
  for (i = 1; i < s->depth; i++) {
    *q++ = '/';
    q = stpcpy(q, s->stack[i].name);
  }
  if (name) {
    *q++ = '/';
    q = stpcpy(q, name);
  }
  return p;
}

static void rm_note(rm_state *s, int err, const char *name) {
  if (s->err != 0) return;
  s->err = err;
  s->errpath = rm_path(s, name);
}

static int rm_skipped(const rm_state *s, const struct stat *st) {
  size_t i;
  for (i = 0; i < s->nskip; i++)
    if (s->skip[i].ino == st->st_ino && s->skip[i].dev == st->st_dev) return 1;
  return 0;
}

static void rm_skip(rm_state *s, dev_t dev, ino_t ino) {
  if (s->nskip == s->skip_alloc) {
    size_t n = s->skip_alloc ? s->skip_alloc * 2 : 16;
    rm_id *p = (rm_id *)realloc(s->skip, n * sizeof *p);
    if (p == NULL) return; /* then it may be retried, which is harmless */
    s->skip = p;
    s->skip_alloc = n;
  }
  s->skip[s->nskip].dev = dev;
  s->skip[s->nskip].ino = ino;
  s->nskip++;
}

static int rm_push(rm_state *s, dev_t dev, ino_t ino, const char *name) {
  char *copy = NULL;
  if (s->depth == s->stack_alloc) {
    size_t n = s->stack_alloc ? s->stack_alloc * 2 : 64;
    rm_frame *p = (rm_frame *)realloc(s->stack, n * sizeof *p);
    if (p == NULL) return ENOMEM;
    s->stack = p;
    s->stack_alloc = n;
  }
  if (name != NULL && (copy = strdup(name)) == NULL) return ENOMEM;
  s->stack[s->depth].dev = dev;
  s->stack[s->depth].ino = ino;
  s->stack[s->depth].name = copy;
  s->depth++;
  return 0;
}

/* Open directory `name` of dirfd without following a symlink, check that it is the one that was
 * stat'ed, and make it readable, searchable and writable for us (the sandbox may have chmod'ed
 * it 000). Returns the fd, or -1 with *err set. */
static int rm_open_dir(int dirfd, const char *name, const struct stat *expect, int *err) {
  const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  struct stat st;
  int fd = openat(dirfd, name, flags);
  if (fd < 0) {
    *err = errno;
    if (*err != EACCES && *err != EPERM) return -1;
    if (fchmodat(dirfd, name, 0700, AT_SYMLINK_NOFOLLOW) < 0) return -1;
    fd = openat(dirfd, name, flags);
    if (fd < 0) {
      *err = errno;
      return -1;
    }
  }
  if (fstat(fd, &st) < 0) {
    *err = errno;
    close(fd);
    return -1;
  }
  if (st.st_dev != expect->st_dev || st.st_ino != expect->st_ino) {
    *err = EAGAIN; /* replaced while we were looking: let the caller try again */
    close(fd);
    return -1;
  }
  if ((st.st_mode & 0700) != 0700) fchmod(fd, 0700);
  return fd;
}

/* unlinkat, and when the directory refuses (not writable for us), make it writable and retry. */
static int rm_unlink(int dirfd, const char *name, int flags) {
  int e;
  if (unlinkat(dirfd, name, flags) == 0 || errno == ENOENT) return 0;
  e = errno;
  if ((e == EACCES || e == EPERM) && fchmod(dirfd, 0700) == 0) {
    if (unlinkat(dirfd, name, flags) == 0 || errno == ENOENT) return 0;
    e = errno;
  }
  return e;
}

/* Empty the directory open at `cur` (taken), whose stat is root_st. Depth first: descend into
 * the first subdirectory found (closing the parent), and when a directory is empty go back up
 * through "..", checked against the recorded parent, remove it and list the parent again.
 * 0 when the walk came back to the root (which may still hold what could not go), -1 when it
 * was cut short. */
static int rm_walk(rm_state *s, int cur, const struct stat *root_st) {
  int err = 0, e;
  s->root_dev = root_st->st_dev;
  if ((e = rm_push(s, root_st->st_dev, root_st->st_ino, NULL)) != 0) {
    close(cur);
    rm_note(s, e, NULL);
    return -1;
  }
  for (;;) {
    DIR *d = fdopendir(cur);
    struct dirent *de;
    int child = -1, pfd;
    rm_frame f;
    struct stat pst;
    if (d == NULL) {
      rm_note(s, errno, NULL);
      close(cur);
      return -1;
    }
    for (;;) {
      struct stat st;
      errno = 0;
      de = readdir(d);
      if (de == NULL) {
        if (errno != 0) rm_note(s, errno, NULL);
        break;
      }
      if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
      if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT) rm_note(s, errno, de->d_name);
        continue;
      }
      if (rm_skipped(s, &st)) continue;
      if (S_ISDIR(st.st_mode) && st.st_dev == s->root_dev) {
        child = rm_open_dir(dirfd(d), de->d_name, &st, &err);
        if (child < 0) {
          rm_note(s, err, de->d_name);
          rm_skip(s, st.st_dev, st.st_ino);
          continue;
        }
        if ((e = rm_push(s, st.st_dev, st.st_ino, de->d_name)) != 0) {
          close(child);
          closedir(d);
          rm_note(s, e, de->d_name);
          return -1;
        }
        break;
      }
      /* a file, a symlink (never followed), or a mount point (never entered: its rmdir fails) */
      e = rm_unlink(dirfd(d), de->d_name, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0);
      if (e != 0) {
        rm_note(s, e, de->d_name);
        rm_skip(s, st.st_dev, st.st_ino);
      }
    }
    if (child >= 0) { /* go down */
      closedir(d);
      cur = child;
      continue;
    }
    if (s->depth == 1) { /* the root is empty (or holds what could not go) */
      closedir(d);
      break;
    }
    /* go up */
    pfd = openat(dirfd(d), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    e = errno;
    closedir(d);
    if (pfd < 0) {
      rm_note(s, e, NULL);
      return -1;
    }
    if (fstat(pfd, &pst) < 0 || pst.st_dev != s->stack[s->depth - 2].dev ||
        pst.st_ino != s->stack[s->depth - 2].ino) {
      rm_note(s, EAGAIN, NULL); /* moved while we were inside it */
      close(pfd);
      return -1;
    }
    f = s->stack[--s->depth];
    e = rm_unlink(pfd, f.name, AT_REMOVEDIR);
    if (e != 0) {
      rm_note(s, e, f.name);
      rm_skip(s, f.dev, f.ino);
    }
    free(f.name);
    cur = pfd;
  }
  return 0;
}

/* Empty and remove directory `path` (already lstat'ed as st). */
static void rm_dir(rm_state *s, const char *path, const struct stat *root_st) {
  int cur, err = 0;
  cur = rm_open_dir(AT_FDCWD, path, root_st, &err);
  if (cur < 0) {
    rm_note(s, err, NULL);
    return;
  }
  if (rm_walk(s, cur, root_st) == 0 && unlinkat(AT_FDCWD, path, AT_REMOVEDIR) < 0 && errno != ENOENT)
    rm_note(s, errno, NULL);
}

/* Whether `name` of dirfd is the directory `want` (never following a link). */
static int rm_is(int dirfd, const char *name, const struct stat *want) {
  struct stat st;
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
         st.st_dev == want->st_dev && st.st_ino == want->st_ino;
}

/* Remove the directory held from wherever it is: at `path` when that is still it (a link or a
 * file put in its place goes, unfollowed; a directory there, which another run may have been
 * given since, stays), else where the kernel says it is now (/proc/self/fd), once its entry there
 * is checked to be the same inode. 0 when done; ENOTEMPTY, not noted, when `quiet` and it is not
 * empty; -1 after a failure, noted. */
static int rm_held_root(rm_state *s, const char *path, int held, const struct stat *hst, int quiet) {
  struct stat st;
  char proc[32], *where, *slash;
  ssize_t n;
  int pfd, e;
  if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (st.st_dev == hst->st_dev && st.st_ino == hst->st_ino) {
      if (unlinkat(AT_FDCWD, path, AT_REMOVEDIR) == 0 || errno == ENOENT) return 0;
      e = errno;
      if (quiet && (e == ENOTEMPTY || e == EEXIST)) return ENOTEMPTY;
      rm_note(s, e, NULL);
      return -1;
    }
    if (!S_ISDIR(st.st_mode) && unlinkat(AT_FDCWD, path, 0) < 0 && errno != ENOENT)
      rm_note(s, errno, NULL);
  } else if (errno != ENOENT && errno != ENOTDIR) {
    rm_note(s, errno, NULL);
  }
  /* renamed away, or removed already (no link left to it) */
  if (fstat(held, &st) < 0 || st.st_nlink == 0) return 0;
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", held);
  where = (char *)malloc(PATH_MAX);
  if (where == NULL) {
    rm_note(s, ENOMEM, NULL);
    return -1;
  }
  n = readlink(proc, where, PATH_MAX - 1);
  if (n <= 0 || where[0] != '/') { /* no /proc, or out of our sight (another mount namespace) */
    rm_note(s, n < 0 ? errno : EXDEV, NULL);
    free(where);
    return -1;
  }
  where[n] = '\0';
  slash = strrchr(where, '/');
  *slash = '\0';
  pfd = open(slash == where ? "/" : where, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0)
    e = errno;
  else if (!rm_is(pfd, slash + 1, hst))
    e = EAGAIN; /* moved again meanwhile */
  else
    e = unlinkat(pfd, slash + 1, AT_REMOVEDIR) < 0 ? errno : 0;
  if (pfd >= 0) close(pfd);
  if (quiet && (e == ENOTEMPTY || e == EEXIST)) {
    free(where);
    return ENOTEMPTY;
  }
  if (e != 0 && s->err == 0) {
    *slash = '/';
    s->err = e;
    s->errpath = where; /* freed with the state's */
    return -1;
  }
  free(where);
  return e != 0 ? -1 : 0;
}

/* Remove `name` (relative: its segments checked by the caller; a trailing '/' says it is a
 * directory) below the directory fd `held`, each segment opened with O_NOFOLLOW. Failures are
 * left to the walk. */
static void rm_name(int held, const char *name) {
  char buf[PATH_MAX];
  char *seg = buf, *slash;
  size_t len = strlen(name);
  int dfd = held, flags = 0;
  if (len == 0 || len >= sizeof buf) return;
  memcpy(buf, name, len + 1);
  if (buf[len - 1] == '/') {
    buf[len - 1] = '\0';
    flags = AT_REMOVEDIR;
  }
  while ((slash = strchr(seg, '/')) != NULL) {
    int next;
    *slash = '\0';
    next = openat(dfd, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd != held) close(dfd);
    if (next < 0) return;
    dfd = next;
    seg = slash + 1;
  }
  unlinkat(dfd, seg, flags);
  if (dfd != held) close(dfd);
}

/* Empty and remove the directory open at `held` (an fd opened with O_NOFOLLOW when it was made),
 * which was made at `path`. A process that shares our uid may have renamed it away and put a link
 * or a file at `path`: everything starts from the fd, never from the path (rm_held_root). The
 * `names` the caller expects there (nnames of them) go first, a call or two each; the walk
 * (a listing per directory, a stat per entry) only when they were not all there is. */
static void rm_held(rm_state *s, const char *path, int held, const char *const *names, int nnames) {
  struct stat hst;
  int cur, i;
  if (fstat(held, &hst) < 0) {
    rm_note(s, errno, NULL);
    return;
  }
  if (!S_ISDIR(hst.st_mode)) {
    rm_note(s, ENOTDIR, NULL);
    return;
  }
  /* (the program may have made it 000: reading it needs r, removing in it w and x) */
  if ((hst.st_mode & 0700) != 0700) fchmod(held, 0700);
  if (nnames > 0) {
    for (i = 0; i < nnames; i++) rm_name(held, names[i]);
    if (rm_held_root(s, path, held, &hst, 1) != ENOTEMPTY) return;
  }
  cur = openat(held, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* a listing of our own */
  if (cur < 0) {
    rm_note(s, errno, NULL);
    return;
  }
  if (rm_walk(s, cur, &hst) != 0) return;
  rm_held_root(s, path, held, &hst, 0);
}

/* core.rmtree(path[, held[, names]]) -> true | nil, err, code. A missing path is success; a
 * symlink is removed, not followed. held: a lock taken on the directory made at path (core.lock),
 * whose fd the tree is removed through, wherever it is now (rm_held); once closed (a Lua state's
 * close finalizes it first), the path is walked as without it. names: with held, at most
 * RM_NAMES relative paths expected in it ("dir/" for a directory), removed first. */
#define RM_NAMES 16
int corral_rmtree(lua_State *L) {
  const char *arg = check_path(L, 1);
  int held = lua_isnoneornil(L, 2) ? -1 : corral_lock_fd(L, 2);
  const char *names[RM_NAMES];
  int nnames = 0;
  size_t n = strlen(arg);
  rm_state s;
  struct stat st;
  size_t i;
  char *path;
  while (n > 1 && arg[n - 1] == '/') n--; /* "link/" would follow the link */
  luaL_argcheck(L, !(n == 1 && arg[0] == '/'), 1, "refusing to remove /");
  if (!lua_isnoneornil(L, 3)) {
    lua_Integer k, len;
    luaL_checktype(L, 3, LUA_TTABLE);
    len = (lua_Integer)lua_rawlen(L, 3);
    luaL_argcheck(L, len <= RM_NAMES, 3, "too many names");
    for (k = 1; k <= len; k++) {
      size_t nl;
      const char *nm, *seg;
      lua_rawgeti(L, 3, k);
      nm = lua_tolstring(L, -1, &nl);
      lua_pop(L, 1); /* (the table keeps the string) */
      luaL_argcheck(L, nm != NULL && nl > 0 && strlen(nm) == nl && nm[0] != '/', 3,
                    "names must be relative paths");
      for (seg = nm; *seg;) {
        size_t sl = strcspn(seg, "/");
        luaL_argcheck(L, !(sl == 0 && seg[sl] == '/') && !(sl == 1 && seg[0] == '.') &&
                      !(sl == 2 && seg[0] == '.' && seg[1] == '.'), 3,
                      "a name has an empty, '.' or '..' segment");
        seg += sl;
        if (*seg == '/') seg++;
      }
      names[nnames++] = nm;
    }
  }
  lua_pushlstring(L, arg, n);
  path = (char *)lua_tostring(L, -1);

  memset(&s, 0, sizeof s);
  s.root = path;
  if (held >= 0) {
    rm_held(&s, path, held, names, nnames);
  } else if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno != ENOENT) rm_note(&s, errno, NULL);
  } else if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(AT_FDCWD, path, 0) < 0 && errno != ENOENT) rm_note(&s, errno, NULL);
  } else {
    rm_dir(&s, path, &st);
  }
  for (i = 0; i < s.depth; i++) free(s.stack[i].name);
  free(s.stack);
  free(s.skip);
  if (s.err != 0) {
    /* copy the C string into Lua before freeing it: pushing may raise */
    lua_pushstring(L, s.errpath ? s.errpath : path);
    free(s.errpath);
    return corral_fail_errno(L, s.err, "cannot remove %s", lua_tostring(L, -1));
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.mkdir(path[, mode=0700]) -> true | nil, err, code. The mode is exact (not masked). */
int corral_mkdir(lua_State *L) {
  const char *path = check_path(L, 1);
  mode_t mode = check_mode(L, 2, 0700);
  if (mkdir(path, 0700) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot create directory %s", path);
  }
  if (fchmodat(AT_FDCWD, path, mode, 0) < 0) {
    int e = errno;
    rmdir(path);
    return corral_fail_errno(L, e, "cannot chmod %s", path);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.symlink(target, path) -> true | nil, err, code */
int corral_symlink(lua_State *L) {
  const char *target = check_path(L, 1);
  const char *path = check_path(L, 2);
  if (symlink(target, path) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot create symlink %s", path);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.readlink(path) -> target | nil, err, code */
int corral_readlink(lua_State *L) {
  const char *path = check_path(L, 1);
  char buf[PATH_MAX];
  ssize_t n = readlink(path, buf, sizeof buf);
  if (n < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot read link %s", path);
  }
  if ((size_t)n >= sizeof buf) return corral_fail_errno(L, ENAMETOOLONG, "cannot read link %s", path);
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

static const char *type_name(mode_t m) {
  if (S_ISREG(m)) return "file";
  if (S_ISDIR(m)) return "directory";
  if (S_ISLNK(m)) return "link";
  if (S_ISFIFO(m)) return "fifo";
  if (S_ISSOCK(m)) return "socket";
  if (S_ISCHR(m)) return "char";
  if (S_ISBLK(m)) return "block";
  return "other";
}

/* core.lstat(path) -> {type, mode, uid, gid, size, dev, ino, mtime} | nil, err, code (no following). */
int corral_lstat(lua_State *L) {
  const char *path = check_path(L, 1);
  struct stat st;
  if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot stat %s", path);
  }
  lua_createtable(L, 0, 7);
  lua_pushstring(L, type_name(st.st_mode));
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer)(st.st_mode & 07777));
  lua_setfield(L, -2, "mode");
  lua_pushinteger(L, (lua_Integer)st.st_uid);
  lua_setfield(L, -2, "uid");
  lua_pushinteger(L, (lua_Integer)st.st_gid);
  lua_setfield(L, -2, "gid");
  lua_pushinteger(L, (lua_Integer)st.st_size);
  lua_setfield(L, -2, "size");
  lua_pushinteger(L, (lua_Integer)st.st_dev);
  lua_setfield(L, -2, "dev");
  lua_pushinteger(L, (lua_Integer)st.st_ino);
  lua_setfield(L, -2, "ino");
  lua_pushinteger(L, (lua_Integer)st.st_mtime);
  lua_setfield(L, -2, "mtime");
  return 1;
}

/* core.access(path, how) -> bool: `how` is a string of r, w, x (empty: exists). Uses the real
 * ids, as the sandbox's uid question is answered by the policy, not here. */
int corral_access(lua_State *L) {
  const char *path = check_path(L, 1);
  const char *how = luaL_optstring(L, 2, "");
  int mode = F_OK;
  for (; *how; how++) {
    switch (*how) {
      case 'r': mode |= R_OK; break;
      case 'w': mode |= W_OK; break;
      case 'x': mode |= X_OK; break;
      default: return luaL_argerror(L, 2, "must be made of the letters r, w and x");
    }
  }
  if (mode & X_OK) {
    /* X_OK is true for directories; callers ask for executables */
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) {
      lua_pushboolean(L, 0);
      return 1;
    }
  }
  lua_pushboolean(L, access(path, mode) == 0);
  return 1;
}

/* core.realpath(path) -> absolute path with no symlinks | nil, err, code */
int corral_realpath(lua_State *L) {
  const char *path = check_path(L, 1);
  char buf[PATH_MAX];
  if (realpath(path, buf) == NULL) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot resolve %s", path);
  }
  lua_pushstring(L, buf);
  return 1;
}

/* core.listdir(path) -> array of names (without . and ..) | nil, err, code */
int corral_listdir(lua_State *L) {
  const char *path = check_path(L, 1);
  DIR *d = opendir(path);
  struct dirent *e;
  lua_Integer n = 0;
  if (d == NULL) {
    int err = errno;
    return corral_fail_errno(L, err, "cannot list %s", path);
  }
  lua_newtable(L);
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    lua_pushstring(L, e->d_name);
    lua_rawseti(L, -2, ++n);
  }
  closedir(d);
  return 1;
}
