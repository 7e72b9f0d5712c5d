/*
 * corral.core: core.zygote, the controller's end of a warm interpreter (corral-zygote).
 *
 * The zygote is a child of the controller holding one end of a SOCK_SEQPACKET socketpair as its
 * fd 3. Messages are NUL-terminated strings, their words those of csrc/zygote/protocol.h:
 * ready or failed once, then per request (run) its pid, for a direct run maybe ended, and exit
 * or error.
 * The zygote exits when its end reaches EOF, and dies with the controller.
 *
 * A zygote owns C memory (its process handle, its poll handle) freed when both are closed. A
 * run started through it (core.spawn{zygote = z}) is tied to it by a link (struct
 * corral_zlink) that holds the request until it is sent and the id until the exit came; a
 * request that does not fit in the socket waits in a queue until the socket is writable.
 * While it starts or runs something the zygote keeps core.run("default") running; idle, it
 * does not (a controller that is done must not wait for its warm interpreter).
 */
#include "core.h"
#include "../zygote/protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { Z_STARTING = 0, Z_READY, Z_FAILED, Z_GONE };
static const char *const state_names[] = {"starting", "ready", "failed", "exited"};

typedef struct zygote_ud {
  struct corral_zygote *z; /* NULL once closed */
} zygote_ud;

struct corral_zlink {
  struct corral_zygote *z;
  struct corral_run *run;
  const struct corral_zlink_ops *ops; /* what the run is told */
  uint64_t id;
  struct corral_zlink *next, **prevp; /* z->links: sent or queued, not yet exited */
  char *msg;                          /* the request, until sent */
  size_t len;
  int fds[4];                         /* ours to close once sent (or dropped) */
  struct corral_zlink *qnext;         /* z->qhead: waiting for room in the socket, oldest first */
  unsigned queued : 1, started : 1, held : 1;
};

struct corral_zygote {
  corral_loop *cl;
  struct corral_zygote *next, **prevp; /* cl->zygotes */
  zygote_ud *ud;
  uv_process_t process;
  uv_poll_t poll;
  int fd;                              /* our end; -1 once closed */
  int handles;                         /* initialised handles not closed yet */
  int pid, state, events;
  int64_t exit_status;
  int term_signal;
  char *info;                          /* the ready/failed message after its tag */
  size_t info_len;
  uint64_t next_id;
  struct corral_zlink *links;
  struct corral_zlink *qhead, **qtail; /* requests waiting for room in the socket */
  unsigned closing : 1, draining : 1, poll_init : 1, process_init : 1, exited : 1;
};

/* ---- links ----------------------------------------------------------------------------------- */

static void link_drop_request(struct corral_zlink *k) {
  int i;
  free(k->msg);
  k->msg = NULL;
  for (i = 0; i < 4; i++) {
    if (k->fds[i] >= 0) close(k->fds[i]);
    k->fds[i] = -1;
  }
  if (k->queued) {
    struct corral_zlink **pp = &k->z->qhead;
    while (*pp != k) pp = &(*pp)->qnext;
    *pp = k->qnext;
    if (k->z->qtail == &k->qnext) k->z->qtail = pp;
    k->qnext = NULL;
  }
  k->queued = 0;
}

static void link_unlink(struct corral_zlink *k) {
  if (k->prevp == NULL) return;
  *k->prevp = k->next;
  if (k->next) k->next->prevp = k->prevp;
  k->next = NULL;
  k->prevp = NULL;
}

static void zygote_update(struct corral_zygote *z);

/* The run is done with its zygote (it completed, or the loop closes). */
void corral_zlink_free(struct corral_zlink *k) {
  struct corral_zygote *z;
  if (k == NULL) return;
  z = k->z;
  link_drop_request(k);
  link_unlink(k);
  free(k);
  if (z != NULL) zygote_update(z);
}

void corral_zlink_hold(struct corral_zlink *k, int held) {
  if (k == NULL) return;
  k->held = held ? 1 : 0;
  if (k->z != NULL) zygote_update(k->z);
}

/* Tell the run that it ended without an exit status from the zygote. */
/* The link stays the run's (freed with it, by corral_zlink_free), detached from the zygote,
 * which may be freed before the run. */
static void link_detach(struct corral_zlink *k) {
  link_drop_request(k);
  link_unlink(k);
  k->z = NULL;
}

static void link_fail(struct corral_zlink *k, const char *why) {
  struct corral_run *r = k->run;
  link_detach(k);
  k->run = NULL;
  if (r != NULL) k->ops->failed(r, why);
}

static void fail_all(struct corral_zygote *z, const char *why) {
  while (z->links != NULL) link_fail(z->links, why);
}

/* ---- the socket -------------------------------------------------------------------------------- */

/* 1 sent, 0 no room (EAGAIN), -errno failed. */
static int send_request(struct corral_zygote *z, struct corral_zlink *k) {
  struct msghdr mh;
  struct iovec iov;
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr align;
  } u;
  struct cmsghdr *c;
  ssize_t n;

  memset(&mh, 0, sizeof mh);
  memset(&u, 0, sizeof u);
  iov.iov_base = k->msg;
  iov.iov_len = k->len;
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = u.buf;
  mh.msg_controllen = sizeof u.buf;
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * 4);
  memcpy(CMSG_DATA(c), k->fds, sizeof(int) * 4);
  do
    n = sendmsg(z->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
  return 1;
}

/* Why a run ends when the socket failed with err. */
static const char *socket_failed(int err, char *buf, size_t len) {
  snprintf(buf, len, "the warm interpreter's socket failed: %s", strerror(err));
  return buf;
}

static void flush_queue(struct corral_zygote *z) {
  while (z->qhead != NULL) {
    struct corral_zlink *k = z->qhead;
    char why[128];
    int rc = send_request(z, k);
    if (rc == 0) return;
    if (rc < 0)
      link_fail(k, socket_failed(-rc, why, sizeof why));
    else
      link_drop_request(k);
  }
}

static struct corral_zlink *find_link(struct corral_zygote *z, uint64_t id) {
  struct corral_zlink *k;
  for (k = z->links; k != NULL; k = k->next)
    if (k->id == id && !k->queued) return k;
  return NULL;
}

static int parse_u64(const char *s, uint64_t *out) {
  uint64_t v = 0;
  if (*s == '\0') return -1;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 0;
}

/* The strings of one message: up to max, each NUL-terminated within n bytes. */
static int split(char *buf, size_t n, const char **out, int max) {
  int c = 0;
  size_t i = 0;
  while (i < n && c < max) {
    char *e = memchr(buf + i, '\0', n - i);
    if (e == NULL) return -1;
    out[c++] = buf + i;
    i = (size_t)(e - buf) + 1;
  }
  return c;
}

static void keep_info(struct corral_zygote *z, const char *p, size_t n) {
  char *copy = (char *)malloc(n ? n : 1);
  if (copy == NULL) return;
  memcpy(copy, p, n);
  free(z->info);
  z->info = copy;
  z->info_len = n;
}

/* One message, with the fd it carried (ours: closed unless a run takes it), or -1. */
static void on_message(struct corral_zygote *z, char *buf, size_t n, int fd) {
  const char *s[3];
  int c = split(buf, n, s, 3);
  uint64_t id;
  struct corral_zlink *k;

  if (c < 1 || strcmp(s[0], ZP_PID) != 0 || c < 3 || parse_u64(s[1], &id) != 0 || find_link(z, id) == NULL) {
    if (fd >= 0) close(fd); /* only a pid message of a run we know carries one */
    fd = -1;
  }
  if (c < 1) return;
  if (strcmp(s[0], ZP_READY) == 0 || strcmp(s[0], ZP_FAILED) == 0) {
    size_t tag = strlen(s[0]) + 1;
    keep_info(z, buf + tag, n - tag);
    z->state = strcmp(s[0], ZP_READY) == 0 ? Z_READY : Z_FAILED;
    return;
  }
  if (c < 3 || parse_u64(s[1], &id) != 0 || (k = find_link(z, id)) == NULL) return;
  if (strcmp(s[0], ZP_PID) == 0) {
    uint64_t pid;
    if (parse_u64(s[2], &pid) != 0 || pid < 2 || pid > INT32_MAX || k->started) {
      if (fd >= 0) close(fd);
      return;
    }
    k->started = 1;
    k->ops->pid(k->run, (int)pid, fd);
  } else if (strcmp(s[0], ZP_ENDED) == 0) {
    uint64_t st;
    if (parse_u64(s[2], &st) != 0 || st > INT32_MAX || k->run == NULL) return;
    if (WIFSIGNALED((int)st))
      k->ops->ended(k->run, 0, WTERMSIG((int)st));
    else
      k->ops->ended(k->run, WEXITSTATUS((int)st), 0);
  } else if (strcmp(s[0], ZP_EXIT) == 0) {
    uint64_t st;
    struct corral_run *r = k->run;
    if (parse_u64(s[2], &st) != 0 || st > INT32_MAX) return;
    link_detach(k);
    k->run = NULL;
    if (WIFSIGNALED((int)st))
      k->ops->exit(r, 0, WTERMSIG((int)st));
    else
      k->ops->exit(r, WEXITSTATUS((int)st), 0);
  } else if (strcmp(s[0], ZP_ERROR) == 0) {
    link_fail(k, s[2]);
  }
}

static void zygote_gone(struct corral_zygote *z, const char *why);

/* recv() of one message and of the fd it may carry (*fd, close-on-exec; -1: none). Any other
 * fd that came with it is closed. */
static ssize_t recv_fd(int sock, char *buf, size_t len, int *fd) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * 4)];
  } u;
  struct iovec iov = {buf, len};
  struct msghdr m;
  struct cmsghdr *c;
  ssize_t n;
  memset(&m, 0, sizeof m);
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = u.buf;
  m.msg_controllen = sizeof u.buf;
  *fd = -1;
  n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t i, k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (i = 0; i < k; i++) {
        int f;
        memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
        if (*fd < 0) *fd = f;
        else close(f);
      }
    }
  }
  return n;
}

static void poll_cb(uv_poll_t *h, int status, int events) {
  struct corral_zygote *z = (struct corral_zygote *)h->data;
  /* An error (libuv says EBADF for POLLERR: a reset when the zygote exited with requests
   * unread): read what it sent before, which says why. */
  if (status < 0) events = UV_READABLE;
  if (events & UV_READABLE) {
    int reset = 0;
    for (;;) {
      ssize_t n;
      int fd = -1;
      do
        n = recv_fd(z->fd, z->cl->scratch, sizeof z->cl->scratch, &fd);
      while (n < 0 && errno == EINTR);
      if (n == 0 && fd >= 0) { /* an empty record: no message to take its fd */
        close(fd);
        fd = -1;
      }
      /* A reset (it exited with requests unread) is reported once, possibly before what it
       * sent last: read on until nothing is left. gVisor reports it at every read once what
       * was sent is read: a second one is the end. */
      if (n < 0 && errno == ECONNRESET && !reset) {
        reset = 1;
        continue;
      }
      if (n < 0 && errno == ECONNRESET) n = 0;
      if (n > 0) {
        on_message(z, z->cl->scratch, (size_t)n, fd);
        if (z->fd < 0) return;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !reset) break;
      if (n == 0 || reset) { /* EOF, or all read after a reset */
        char why[512];
        if (z->state == Z_FAILED && z->info != NULL)
          snprintf(why, sizeof why, "the warm interpreter failed to start: %.*s",
                   (int)strnlen(z->info, z->info_len), z->info);
        else
          snprintf(why, sizeof why, "%s", z->state == Z_FAILED
                                             ? "the warm interpreter failed to start"
                                             : "the warm interpreter exited");
        zygote_gone(z, why);
        return;
      }
      {
        char why[128];
        zygote_gone(z, socket_failed(errno, why, sizeof why));
        return;
      }
    }
  }
  if (status < 0) {
    char why[128];
    zygote_gone(z, socket_failed(-status, why, sizeof why)); /* libuv's codes are -errno */
    return;
  }
  if ((events & UV_WRITABLE) && z->qhead) flush_queue(z);
  zygote_update(z);
}

/* ---- life ------------------------------------------------------------------------------------ */

static void zygote_free(struct corral_zygote *z) {
  free(z->info);
  free(z);
}

/* The C memory goes when both handles are closed and the userdata has let go (closed or
 * collected): until then z:state() and z:info() still read it. */
static void zygote_closed(uv_handle_t *h) {
  struct corral_zygote *z = (struct corral_zygote *)h->data;
  if (--z->handles > 0) return;
  if (z->prevp) {
    *z->prevp = z->next;
    if (z->next) z->next->prevp = z->prevp;
    z->prevp = NULL;
  }
  if (z->ud == NULL) zygote_free(z);
}

static void close_socket(struct corral_zygote *z) {
  if (z->poll_init && !uv_is_closing((uv_handle_t *)&z->poll))
    uv_close((uv_handle_t *)&z->poll, zygote_closed);
  if (z->fd >= 0) close(z->fd);
  z->fd = -1;
}

/* The socket is gone (EOF, error, the process exited): every run still waiting fails. The
 * runs' launchers die with the zygote (their parent-death signal). */
static void zygote_gone(struct corral_zygote *z, const char *why) {
  if (z->state != Z_FAILED) z->state = Z_GONE;
  close_socket(z);
  fail_all(z, why);
  /* Without its socket it has nothing left to do: make sure it ends, and wait for it (an
   * unreferenced handle is not even polled once the loop has nothing else). */
  if (z->process_init && !z->exited) {
    if (z->pid > 0) kill(z->pid, SIGKILL);
    uv_ref((uv_handle_t *)&z->process);
  }
}

/* A run of it that the loop waits for: one not held (a launch started ahead waits for nobody). */
static int links_pending(const struct corral_zygote *z) {
  const struct corral_zlink *k;
  for (k = z->links; k != NULL; k = k->next)
    if (!k->held) return 1;
  return 0;
}

/* Poll for what is needed, and keep the loop alive only while something is pending. */
static void zygote_update(struct corral_zygote *z) {
  int want;
  if (z->fd < 0 || !z->poll_init || uv_is_closing((uv_handle_t *)&z->poll)) return;
  if (z->draining && z->links == NULL) { /* closed by Lua and idle: EOF tells it to exit */
    shutdown(z->fd, SHUT_WR);
    z->draining = 0;
  }
  want = UV_READABLE | (z->qhead ? UV_WRITABLE : 0);
  if (want != z->events) {
    uv_poll_start(&z->poll, want, poll_cb);
    z->events = want;
  }
  if (links_pending(z) || z->state == Z_STARTING || z->closing)
    uv_ref((uv_handle_t *)&z->poll);
  else
    uv_unref((uv_handle_t *)&z->poll);
}

static void exit_cb(uv_process_t *p, int64_t exit_status, int term_signal) {
  struct corral_zygote *z = (struct corral_zygote *)p->data;
  z->exited = 1;
  z->exit_status = exit_status;
  z->term_signal = term_signal;
  if (!uv_is_closing((uv_handle_t *)p)) uv_close((uv_handle_t *)p, zygote_closed);
  /* what is still in the socket (a failed message, the last exits) is read before EOF */
  if (z->fd >= 0 && z->links == NULL && z->state != Z_STARTING) zygote_gone(z, "exited");
}

/* Close from Lua (or __gc): no new runs; the zygote is told to exit once its runs are done. */
static void zygote_close(struct corral_zygote *z) {
  if (z->ud) z->ud->z = NULL;
  z->ud = NULL;
  if (z->handles == 0) { /* all closed already (it exited): nothing else holds it */
    zygote_free(z);
    return;
  }
  if (z->closing) return;
  z->closing = 1;
  z->draining = 1;
  zygote_update(z);
}

void corral_zygote_shutdown(corral_loop *cl) {
  struct corral_zygote *z;
  for (z = cl->zygotes; z != NULL; z = z->next) {
    if (z->ud) z->ud->z = NULL;
    z->ud = NULL; /* freed by zygote_closed below (a zygote in this list has open handles) */
    z->closing = 1;
    if (z->process_init && !z->exited && z->pid > 0) {
      int st;
      kill(z->pid, SIGKILL);
      while (waitpid(z->pid, &st, 0) < 0 && errno == EINTR) {
      }
      z->exited = 1;
    }
    close_socket(z);
    if (z->process_init && !uv_is_closing((uv_handle_t *)&z->process))
      uv_close((uv_handle_t *)&z->process, zygote_closed);
    /* the links stay: their runs are shut down by corral_runs_shutdown, which kills their launchers */
    while (z->links != NULL) link_detach(z->links);
  }
}

/* ---- runs ------------------------------------------------------------------------------------ */

/* Start a run through z: args is the launcher's argument vector (without argv[0]), fds the
 * run's stdin, stdout, stderr and report ends for the child (taken over: closed here, now or
 * once sent). 0 and *out, or a negative errno. */
int corral_zygote_submit(struct corral_zygote *z, struct corral_run *r,
                         const struct corral_zlink_ops *ops, char *const *args, int fds[4],
                         struct corral_zlink **out) {
  struct corral_zlink *k;
  char idbuf[24];
  size_t len, off;
  int i, rc;

  if (z->fd < 0 || z->closing) {
    for (i = 0; i < 4; i++) close(fds[i]);
    return -EPIPE;
  }
  k = (struct corral_zlink *)calloc(1, sizeof *k);
  snprintf(idbuf, sizeof idbuf, "%llu", (unsigned long long)++z->next_id);
  len = sizeof ZP_RUN + strlen(idbuf) + 1;
  for (i = 0; args[i] != NULL; i++) len += strlen(args[i]) + 1;
  if (k == NULL || (k->msg = (char *)malloc(len)) == NULL) {
    free(k);
    for (i = 0; i < 4; i++) close(fds[i]);
    return -ENOMEM;
  }
  k->z = z;
  k->run = r;
  k->ops = ops;
  k->id = z->next_id;
  k->len = len;
  memcpy(k->msg, ZP_RUN, sizeof ZP_RUN);
  off = sizeof ZP_RUN;
  memcpy(k->msg + off, idbuf, strlen(idbuf) + 1);
  off += strlen(idbuf) + 1;
  for (i = 0; args[i] != NULL; i++) {
    size_t l = strlen(args[i]) + 1;
    memcpy(k->msg + off, args[i], l);
    off += l;
  }
  for (i = 0; i < 4; i++) k->fds[i] = fds[i];
  k->next = z->links;
  if (z->links) z->links->prevp = &k->next;
  k->prevp = &z->links;
  z->links = k;
  rc = z->qhead ? 0 : send_request(z, k);
  if (rc < 0) {
    link_drop_request(k);
    link_unlink(k);
    free(k);
    return rc;
  }
  if (rc == 0) {
    k->queued = 1;
    *z->qtail = k;
    z->qtail = &k->qnext;
  } else {
    link_drop_request(k);
  }
  *out = k;
  zygote_update(z);
  return 0;
}

/* ---- Lua ------------------------------------------------------------------------------------- */

static const char *const zygote_keys[] = {"file", "args", "env", NULL};

static zygote_ud *check_ud(lua_State *L, int idx) {
  return (zygote_ud *)luaL_checkudata(L, idx, CORRAL_ZYGOTE_MT);
}

struct corral_zygote *corral_zygote_check(lua_State *L, int idx) {
  zygote_ud *ud = check_ud(L, idx);
  if (ud->z == NULL) luaL_argerror(L, idx, "the zygote is closed");
  return ud->z;
}

/* A NULL-terminated vector of the strings of table idx (checked), in a temporary userdata. */
static char **str_vector(lua_State *L, int idx, const char *key, const char *first, int need_eq) {
  lua_Integer n = 0, i, off = first ? 1 : 0;
  char **v;
  if (!lua_isnil(L, idx)) {
    if (lua_type(L, idx) != LUA_TTABLE)
      luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': table expected", key));
    n = (lua_Integer)lua_rawlen(L, idx);
  }
  v = (char **)lua_newuserdatauv(L, (size_t)(n + off + 1) * sizeof(char *), 0);
  if (first) v[0] = (char *)first;
  for (i = 1; i <= n; i++) {
    size_t len;
    const char *s;
    if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
      luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': item %I is not a string", key,
                                          (LUAI_UACINT)i));
    s = lua_tolstring(L, -1, &len);
    if (strlen(s) != len || (need_eq && (strchr(s, '=') == NULL || s[0] == '=')))
      luaL_argerror(L, 1, lua_pushfstring(L, "option '%s': item %I is %s", key, (LUAI_UACINT)i,
                                          need_eq ? "not NAME=VALUE" : "not a string without NUL"));
    v[i - 1 + off] = (char *)s; /* kept alive by the option table */
    lua_pop(L, 1);
  }
  v[n + off] = NULL;
  return v;
}

/* core.zygote{file=, args=, env=} -> zygote | nil, err, code */
int corral_zygote_start(lua_State *L) {
  corral_loop *cl = corral_loop_up(L);
  const char *file;
  size_t file_len;
  char **argv, **envp;
  zygote_ud *ud;
  struct corral_zygote *z;
  uv_stdio_container_t stdio[4];
  uv_process_options_t o;
  int sv[2], rc;

  luaL_checktype(L, 1, LUA_TTABLE);
  corral_check_keys(L, 1, zygote_keys);
  file = corral_opt_string(L, 1, "file", &file_len);
  if (file == NULL || file_len == 0 || strlen(file) != file_len)
    luaL_argerror(L, 1, "option 'file' is required (a path without NUL bytes)");
  lua_getfield(L, 1, "args");
  argv = str_vector(L, lua_gettop(L), "args", file, 0);
  lua_getfield(L, 1, "env");
  envp = str_vector(L, lua_gettop(L), "env", NULL, 1);

  ud = (zygote_ud *)lua_newuserdatauv(L, sizeof *ud, 1);
  ud->z = NULL;
  luaL_setmetatable(L, CORRAL_ZYGOTE_MT);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the loop outlives the userdata */
  lua_setiuservalue(L, -2, 1);

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    int e = errno;
    return corral_fail_errno(L, e, "cannot make the warm interpreter's socket");
  }
  z = (struct corral_zygote *)calloc(1, sizeof *z);
  if (z == NULL) {
    close(sv[0]);
    close(sv[1]);
    return corral_fail_errno(L, ENOMEM, "cannot start %s", file);
  }
  z->cl = cl;
  z->fd = sv[0];
  z->state = Z_STARTING;
  z->qtail = &z->qhead;
  z->next = cl->zygotes;
  if (cl->zygotes) cl->zygotes->prevp = &z->next;
  z->prevp = &cl->zygotes;
  cl->zygotes = z;

  memset(stdio, 0, sizeof stdio);
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_IGNORE;
  stdio[2].flags = UV_INHERIT_FD; /* its own diagnostics go where ours go */
  stdio[2].data.fd = 2;
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = sv[1];
  memset(&o, 0, sizeof o);
  o.exit_cb = exit_cb;
  o.file = file;
  o.args = argv;
  o.env = envp;
  o.stdio_count = 4;
  o.stdio = stdio;
  o.flags = UV_PROCESS_DETACHED;
  rc = uv_spawn(&cl->loop, &z->process, &o);
  close(sv[1]);
  z->process.data = z;
  z->process_init = 1;
  z->handles++;
  if (rc == 0) {
    z->pid = z->process.pid;
    uv_unref((uv_handle_t *)&z->process); /* the socket says when it matters */
    rc = uv_poll_init(&cl->loop, &z->poll, z->fd);
    if (rc == 0) {
      z->poll.data = z;
      z->poll_init = 1;
      z->handles++;
    }
  }
  if (rc != 0) {
    if (z->pid > 0) kill(z->pid, SIGKILL); /* its exit_cb reaps it */
    z->state = Z_GONE;
    z->closing = 1;
    close_socket(z);
    if (z->pid <= 0) uv_close((uv_handle_t *)&z->process, zygote_closed);
    return corral_fail_uv(L, rc, "cannot start %s", file);
  }
  z->ud = ud;
  ud->z = z;
  zygote_update(z);
  return 1;
}

static int z_state(lua_State *L) {
  zygote_ud *ud = check_ud(L, 1);
  lua_pushstring(L, ud->z ? state_names[ud->z->state] : "closed");
  return 1;
}

/* z:info() -> the lines of the ready (or failed) message, or nil while starting */
static int z_info(lua_State *L) {
  struct corral_zygote *z = check_ud(L, 1)->z;
  size_t i = 0;
  lua_Integer n = 0;
  if (z == NULL || z->info == NULL) {
    lua_pushnil(L);
    return 1;
  }
  lua_newtable(L);
  while (i < z->info_len) {
    const char *e = memchr(z->info + i, '\0', z->info_len - i);
    size_t l = e ? (size_t)(e - (z->info + i)) : z->info_len - i;
    lua_pushlstring(L, z->info + i, l);
    lua_rawseti(L, -2, ++n);
    i += l + 1;
  }
  return 1;
}

static int z_pid(lua_State *L) {
  struct corral_zygote *z = check_ud(L, 1)->z;
  lua_pushinteger(L, z ? z->pid : 0);
  return 1;
}

static int z_close(lua_State *L) {
  zygote_ud *ud = check_ud(L, 1);
  if (ud->z) zygote_close(ud->z);
  return 0;
}

static int z_tostring(lua_State *L) {
  zygote_ud *ud = check_ud(L, 1);
  if (ud->z == NULL)
    lua_pushstring(L, "corral.zygote (closed)");
  else
    lua_pushfstring(L, "corral.zygote (pid %d, %s)", ud->z->pid, state_names[ud->z->state]);
  return 1;
}

void corral_zygote_open(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"state", z_state}, {"info", z_info}, {"pid", z_pid}, {"close", z_close}, {NULL, NULL},
  };
  luaL_newmetatable(L, CORRAL_ZYGOTE_MT);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, z_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, z_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, z_close);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
}
