/*
 * corral.core: core.http_listen, an HTTP/1.1 server on the module's loop, and its objects
 * corral.http_server and corral.http_res. Requests are parsed by nodejs http-parser.
 *
 * Memory is bounded per connection: a fixed read buffer (CONN_RBUF), the request head (at most
 * max_header_bytes: the parser is never fed more head than that), the body (at most
 * max_body_bytes), and one response being written. A connection handles one request at a time:
 * after a message the parser is paused until its response has been written, so pipelined
 * requests wait in the read buffer (reading stops when it is full) and a client that does not
 * read its responses holds at most one.
 *
 * A connection is in one state at a time, each with its own timer (one uv_timer per connection):
 *   IDLE     between requests: idle_timeout (header_timeout on a new connection); closes silently
 *   HEAD     from the first byte of a request until its head is complete: header_timeout, 408
 *   BODY     until the body is complete: body_timeout, 408
 *   HANDLER  on_request was called; waiting for res:send (no timer; reading goes on so that a
 *            client that goes away is noticed: on_close)
 *   WRITING  a response is being written: send_timeout, then closed
 *   LINGER   after a response with "Connection: close": write side shut down, input read and
 *            dropped until EOF or LINGER_MS, so that unread input does not turn the close into
 *            a reset that could destroy the response at the client
 *
 * Lifetimes: a server (C memory) lives until its listener and every connection have been closed
 * and freed; a connection until both its handles' close callbacks ran. The Lua objects point to
 * them and are detached (pointer set to NULL) when either side goes first. Lua callbacks
 * (on_request, on_close) are called through the module's protected-call helpers, never during
 * loop teardown.
 */
#include "core.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <fcntl.h>
#include <unistd.h>

#include <http_parser.h>

#define CONN_RBUF ((size_t)16 * 1024) /* per-connection read buffer */
#define LINGER_MS 2000                 /* reading after a closing response */
#define REJECT_SLACK 64 /* over max_connections by more than this: closed without a 503 */
#define MAX_HEADER_LIMIT (80 * 1024)   /* http-parser's compiled-in HTTP_MAX_HEADER_SIZE */

enum { C_IDLE, C_HEAD, C_BODY, C_HANDLER, C_WRITING, C_LINGER };
/* framing checks the parser skips without HTTP_PARSER_STRICT (frame_scan) */
enum {
  FR_HEAD, FR_HEAD_CR, FR_HEAD_END, FR_PLAIN, FR_SIZE, FR_EXT, FR_SIZE_LF, FR_DATA, FR_DATA_CR, FR_DATA_LF,
  FR_TRAILER_START, FR_TRAILER, FR_TRAILER_LF, FR_END_LF, FR_DONE
};
enum { EV_NONE, EV_HEADERS, EV_MESSAGE };
enum { CB_NONE, CB_FIELD, CB_VALUE };

typedef union net {
  uv_handle_t handle;
  uv_stream_t stream;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
} net;

typedef struct corral_http_server http_server;
typedef struct conn conn;

/* A header of the request being read: offsets into conn.head (at most MAX_HEADER_LIMIT + 1). */
typedef struct header {
  uint32_t name, name_len, value, value_len;
} header;

/* corral.http_res */
typedef struct res_ud {
  conn *c;      /* the connection while the response is owed; NULL once sent or closed */
  int sent;     /* res:send was called (or C answered 500 for a failed handler) */
  int closed;   /* the connection closed before the response was sent */
  char peer[64];
} res_ud;

/* corral.http_server */
typedef struct srv_ud {
  http_server *s; /* NULL once the server's C memory is freed */
  int closed;     /* srv:close() was called */
} srv_ud;

struct conn {
  net h; /* first member */
  uv_timer_t timer;
  http_server *s;
  conn *next, **prevp;
  int handles; /* close callbacks still to come */
  int state;
  http_parser parser;
  int ev; /* what paused the parser */
  /* input */
  char *rbuf;
  size_t rlen, roff;
  size_t head_bytes; /* bytes of the current head fed to the parser */
  /* the request: target, then header names and values, in one buffer */
  char *head;
  size_t head_len, head_alloc, url_len;
  header *hdrs;
  size_t nhdrs, hdrs_alloc;
  int last_cb;
  char *body;
  size_t body_len, body_alloc;
  int fail_status; /* set by a parser callback that refused the request (413) */
  int frame;        /* F_*: where frame_scan is in the message */
  int frame_chunked;
  uint64_t frame_left; /* chunk size being read, then its bytes still to come */
  /* output */
  char *wbuf;
  uv_write_t wreq, creq;
  uv_shutdown_t sreq;
  res_ud *res;
  int res_ref;
  char peer[64];
  unsigned closing : 1, reading : 1, eof : 1, keep_alive : 1, close_after : 1, discard : 1;
  unsigned is_head : 1, fresh : 1;
};

struct corral_http_server {
  corral_loop *cl;
  struct corral_http_server *next, **prevp;
  srv_ud *ud;
  net listener;
  net spare; /* accepts and closes a connection when its memory cannot be allocated */
  conn *conns;
  size_t nconns; /* connections not closing */
  int refs;      /* the listener, the spare while closing, every connection not yet freed */
  int self_ref, on_request_ref, on_error_ref;
  int is_unix;
  uint64_t header_ms, body_ms, idle_ms, send_ms;
  double header_s, body_s;
  size_t max_header, max_body, max_conns;
  time_t date_time;
  char date[40];
  unsigned listening : 1, draining : 1, closed : 1, lua_released : 1, spare_busy : 1;
};

/* ---- small helpers --------------------------------------------------------------------------- */

static uint64_t seconds_to_ms(double s) {
  return (uint64_t)ceil(s * 1000.0);
}

/* Grow *buf to hold need bytes (geometrically, at most max). */
static int grow(char **buf, size_t *alloc, size_t need, size_t max) {
  size_t n;
  char *p;
  if (need <= *alloc) return 0;
  if (need > max) return -1;
  n = *alloc ? *alloc * 2 : 1024;
  if (n < need) n = need;
  if (n > max) n = max;
  p = (char *)realloc(*buf, n);
  if (p == NULL) return -1;
  *buf = p;
  *alloc = n;
  return 0;
}

static int lower(int ch) {
  return (ch >= 'A' && ch <= 'Z') ? ch + ('a' - 'A') : ch;
}

/* Case-insensitive comparison of s[0..n) with the lower-case word w. */
static int word_is(const char *s, size_t n, const char *w) {
  size_t i;
  if (strlen(w) != n) return 0;
  for (i = 0; i < n; i++)
    if (lower((unsigned char)s[i]) != w[i]) return 0;
  return 1;
}

/* The IMF-fixdate of now, cached per second per server. */
static const char *http_date(http_server *s) {
  static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  time_t now = time(NULL);
  struct tm tm;
  if (now != s->date_time || s->date[0] == '\0') {
    gmtime_r(&now, &tm);
    snprintf(s->date, sizeof s->date, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7],
             tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
             tm.tm_sec);
    s->date_time = now;
  }
  return s->date;
}

/* ---- the server's end ------------------------------------------------------------------------ */

static void server_unref(http_server *s) {
  if (--s->refs > 0) return;
  if (s->prevp) {
    *s->prevp = s->next;
    if (s->next) s->next->prevp = s->prevp;
  }
  if (s->ud) s->ud->s = NULL;
  free(s);
}

/* No more Lua callbacks can come from this server: drop its references. */
static void server_release_lua(http_server *s, lua_State *L) {
  if (s->lua_released) return;
  s->lua_released = 1;
  if (s->cl->closing || L == NULL) return; /* teardown: the registry goes with the state */
  luaL_unref(L, LUA_REGISTRYINDEX, s->on_request_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, s->on_error_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, s->self_ref);
  s->on_request_ref = s->on_error_ref = s->self_ref = LUA_NOREF;
}

static void server_check_drained(http_server *s, lua_State *L) {
  if (!s->listening && s->nconns == 0) server_release_lua(s, L);
}

static void listener_closed(uv_handle_t *h) {
  server_unref((http_server *)h->data);
}

/* For a unix socket, libuv unlinks the path it bound when the handle is closed. */
static void listener_close(http_server *s) {
  if (!s->listening) return;
  s->listening = 0;
  uv_close(&s->listener.handle, listener_closed);
}

/* ---- connections: closing -------------------------------------------------------------------- */

static void conn_free(conn *c) {
  http_server *s = c->s;
  *c->prevp = c->next;
  if (c->next) c->next->prevp = c->prevp;
  free(c->rbuf);
  free(c->head);
  free(c->hdrs);
  free(c->body);
  free(c->wbuf); /* normally freed by its write callback already */
  free(c);
  server_unref(s);
}

static void conn_closed(uv_handle_t *h) {
  conn *c = (conn *)h->data;
  if (--c->handles == 0) conn_free(c);
}

/* Close the connection. A response still owed is abandoned: its res is marked closed and its
 * on_close function called (on L; never during loop teardown). Safe twice. */
static void conn_close(conn *c, lua_State *L) {
  http_server *s = c->s;
  corral_loop *cl = s->cl;
  if (c->closing) return;
  c->closing = 1;
  s->nconns--;
  uv_close(&c->h.handle, conn_closed);
  uv_close((uv_handle_t *)&c->timer, conn_closed);
  if (c->res != NULL) {
    res_ud *r = c->res;
    c->res = NULL;
    r->c = NULL;
    if (!r->sent) r->closed = 1;
    if (!cl->closing && L != NULL) {
      int top = lua_gettop(L);
      if (!r->sent && lua_checkstack(L, 4)) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, c->res_ref);
        if (lua_getiuservalue(L, -1, 1) == LUA_TFUNCTION) corral_pcall(cl, L, 0);
        lua_settop(L, top);
      }
      luaL_unref(L, LUA_REGISTRYINDEX, c->res_ref);
    }
    c->res_ref = LUA_NOREF;
  }
  server_check_drained(s, L);
}

/* ---- connections: reading -------------------------------------------------------------------- */

static void conn_process(conn *c, lua_State *L);
static void conn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void conn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn *c = (conn *)h->data;
  (void)suggested;
  if (c->discard) { /* input is dropped: read it into the loop's scratch buffer */
    buf->base = c->s->cl->scratch;
    buf->len = sizeof c->s->cl->scratch;
    return;
  }
  if (c->rbuf == NULL) c->rbuf = (char *)malloc(CONN_RBUF);
  if (c->rbuf == NULL || c->rlen >= CONN_RBUF) { /* read_cb gets UV_ENOBUFS */
    buf->base = NULL;
    buf->len = 0;
    return;
  }
  buf->base = c->rbuf + c->rlen;
  buf->len = CONN_RBUF - c->rlen;
}

/* Read while there is room (or input is dropped), not after EOF. */
static void conn_update_reading(conn *c) {
  int want = !c->closing && !c->eof && (c->discard || c->rlen < CONN_RBUF);
  if (want && !c->reading) {
    if (uv_read_start(&c->h.stream, conn_alloc_cb, conn_read_cb) == 0) c->reading = 1;
  } else if (!want && c->reading) {
    uv_read_stop(&c->h.stream);
    c->reading = 0;
  }
}

static void conn_timer_cb(uv_timer_t *t);

static void conn_timer(conn *c, uint64_t ms) {
  uv_timer_start(&c->timer, conn_timer_cb, ms, 0);
}

/* ---- connections: writing -------------------------------------------------------------------- */

static void conn_linger(conn *c, lua_State *L);

static void conn_written(uv_write_t *req, int status) {
  conn *c = (conn *)req->data;
  lua_State *L = c->s->cl->L;
  free(c->wbuf);
  c->wbuf = NULL;
  if (c->closing) return; /* cancelled by a close */
  if (status < 0 || c->eof) {
    conn_close(c, L);
    return;
  }
  if (c->close_after || c->s->draining) {
    conn_linger(c, L);
    return;
  }
  /* keep-alive: the next request, maybe already buffered */
  c->state = C_IDLE;
  c->fresh = 0;
  conn_timer(c, c->s->idle_ms);
  conn_process(c, L);
  if (!c->closing) conn_update_reading(c);
}

/* Write buf[0..len) (malloc'd; owned from here) as the response; close afterwards when
 * close_after. Returns 0, or a libuv error after closing the connection. */
static int conn_write(conn *c, lua_State *L, char *buf, size_t len, int close_after) {
  uv_buf_t b = uv_buf_init(buf, (unsigned int)len);
  int rc;
  c->state = C_WRITING;
  c->close_after = close_after != 0;
  if (close_after) { /* what else the client sends is read and dropped */
    c->discard = 1;
    c->rlen = c->roff = 0;
  }
  c->wbuf = buf;
  c->wreq.data = c;
  rc = uv_write(&c->wreq, &c->h.stream, &b, 1, conn_written);
  if (rc != 0) {
    free(buf);
    c->wbuf = NULL;
    conn_close(c, L);
    return rc;
  }
  conn_timer(c, c->s->send_ms);
  conn_update_reading(c);
  return 0;
}

static void shutdown_cb(uv_shutdown_t *req, int status) {
  conn *c = (conn *)req->data;
  if (status < 0 && !c->closing) conn_close(c, c->s->cl->L);
}

static void conn_linger(conn *c, lua_State *L) {
  c->state = C_LINGER;
  c->discard = 1;
  c->rlen = c->roff = 0;
  c->sreq.data = c;
  if (uv_shutdown(&c->sreq, &c->h.stream, shutdown_cb) != 0) {
    conn_close(c, L);
    return;
  }
  conn_timer(c, LINGER_MS);
  conn_update_reading(c);
}

/* Append s to the JSON string being built in out (at most cap bytes), escaped. */
static size_t json_escape(char *out, size_t cap, const char *s) {
  size_t n = 0;
  for (; *s && n + 7 < cap; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      out[n++] = '\\';
      out[n++] = (char)ch;
    } else if (ch < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", ch);
    } else {
      out[n++] = (char)ch;
    }
  }
  out[n] = '\0';
  return n;
}

/* A response made by C: status, a JSON error body. */
static void conn_send_error(conn *c, lua_State *L, int status, const char *code, int keep_alive,
                            const char *fmt, ...) {
  char msg[256], esc[512], body[700], *buf;
  const char *reason = http_status_str((enum http_status)status);
  size_t blen, cap;
  int n;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_escape(esc, sizeof esc, msg);
  n = snprintf(body, sizeof body, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}", code, esc);
  blen = (size_t)n < sizeof body ? (size_t)n : sizeof body - 1;
  cap = blen + 256;
  buf = (char *)malloc(cap);
  if (buf == NULL) {
    conn_close(c, L);
    return;
  }
  n = snprintf(buf, cap,
               "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
               "Date: %s\r\nConnection: %s\r\n\r\n",
               status, reason, blen, http_date(c->s), keep_alive ? "keep-alive" : "close");
  if (!c->is_head || c->state != C_HANDLER) {
    memcpy(buf + n, body, blen);
    n += (int)blen;
  }
  conn_write(c, L, buf, (size_t)n, !keep_alive);
}

/* ---- parser callbacks ------------------------------------------------------------------------ */

static void conn_dispatch(conn *c, lua_State *L);

static int head_append(conn *c, const char *at, size_t len) {
  /* the parser is never fed more than max_header + 1 head bytes: this stays bounded */
  if (grow(&c->head, &c->head_alloc, c->head_len + len, c->s->max_header + 1) < 0) return -1;
  memcpy(c->head + c->head_len, at, len);
  c->head_len += len;
  return 0;
}

static int on_message_begin(http_parser *p) {
  conn *c = (conn *)p->data;
  c->state = C_HEAD;
  c->head_len = c->url_len = 0;
  c->nhdrs = 0;
  c->last_cb = CB_NONE;
  c->body_len = 0;
  c->fail_status = 0;
  conn_timer(c, c->s->header_ms);
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  conn *c = (conn *)p->data;
  if (head_append(c, at, len) < 0) return -1;
  c->url_len += len;
  return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  conn *c = (conn *)p->data;
  header *h;
  if (c->state != C_HEAD) return 0; /* trailers of a chunked body: ignored */
  if (c->last_cb != CB_FIELD) {     /* a new header */
    if (c->nhdrs == c->hdrs_alloc) {
      size_t n = c->hdrs_alloc ? c->hdrs_alloc * 2 : 16;
      header *nh = (header *)realloc(c->hdrs, n * sizeof *nh);
      if (nh == NULL) return -1;
      c->hdrs = nh;
      c->hdrs_alloc = n;
    }
    h = &c->hdrs[c->nhdrs++];
    h->name = (uint32_t)c->head_len;
    h->name_len = 0;
    h->value = (uint32_t)c->head_len;
    h->value_len = 0;
    c->last_cb = CB_FIELD;
  }
  h = &c->hdrs[c->nhdrs - 1];
  if (head_append(c, at, len) < 0) return -1;
  h->name_len += (uint32_t)len;
  h->value = (uint32_t)c->head_len;
  return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  conn *c = (conn *)p->data;
  header *h;
  if (c->state != C_HEAD || c->nhdrs == 0) return 0;
  h = &c->hdrs[c->nhdrs - 1];
  if (c->last_cb != CB_VALUE) {
    h->value = (uint32_t)c->head_len;
    h->value_len = 0;
    c->last_cb = CB_VALUE;
  }
  if (head_append(c, at, len) < 0) return -1;
  h->value_len += (uint32_t)len;
  return 0;
}

static int on_headers_complete(http_parser *p) {
  conn *c = (conn *)p->data;
  c->ev = EV_HEADERS;
  http_parser_pause(p, 1); /* checked by conn_head before the body is read */
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  conn *c = (conn *)p->data;
  if (len > c->s->max_body - c->body_len) {
    c->fail_status = 413;
    return -1;
  }
  if (grow(&c->body, &c->body_alloc, c->body_len + len, c->s->max_body) < 0) {
    c->fail_status = 500;
    return -1;
  }
  memcpy(c->body + c->body_len, at, len);
  c->body_len += len;
  return 0;
}

/* A chunk announces its size first: refuse it before reading it. */
static int on_chunk_header(http_parser *p) {
  conn *c = (conn *)p->data;
  if (p->content_length > (uint64_t)(c->s->max_body - c->body_len)) {
    c->fail_status = 413;
    return -1;
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  conn *c = (conn *)p->data;
  c->ev = EV_MESSAGE;
  http_parser_pause(p, 1); /* until the response has been written */
  return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
    .on_chunk_header = on_chunk_header,
};

/* ---- the request ----------------------------------------------------------------------------- */

/* RFC 9110 token characters (header names) */
static int is_tchar(int ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

/* What Debian's http-parser, built without HTTP_PARSER_STRICT, lets through: blanks and other
 * controls in the target, any byte but ':' in a header name. Returns the error or HPE_OK. */
static enum http_errno check_strict(const conn *c) {
  size_t i, k;
  for (i = 0; i < c->url_len; i++) {
    unsigned char ch = (unsigned char)c->head[i];
    if (ch <= 0x20 || ch == 0x7f) return HPE_INVALID_URL;
  }
  for (i = 0; i < c->nhdrs; i++)
    for (k = 0; k < c->hdrs[i].name_len; k++)
      if (!is_tchar((unsigned char)c->head[c->hdrs[i].name + k])) return HPE_INVALID_HEADER_TOKEN;
  return HPE_OK;
}

static const header *find_header(const conn *c, const char *lname, int *count) {
  const header *found = NULL;
  size_t i;
  *count = 0;
  for (i = 0; i < c->nhdrs; i++) {
    if (word_is(c->head + c->hdrs[i].name, c->hdrs[i].name_len, lname)) {
      if (found == NULL) found = &c->hdrs[i];
      ++*count;
    }
  }
  return found;
}

/* Value of h without surrounding blanks. */
static const char *header_value(const conn *c, const header *h, size_t *len) {
  const char *v = c->head + h->value;
  size_t n = h->value_len;
  while (n > 0 && (v[0] == ' ' || v[0] == '\t')) v++, n--;
  while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
  *len = n;
  return v;
}

/* The head is complete (the parser is paused on its last byte): check it before the body is
 * read. Returns 1 to go on, 0 when the request was refused. */
static int conn_head(conn *c, lua_State *L) {
  http_server *s = c->s;
  http_parser *p = &c->parser;
  const header *h;
  enum http_errno err;
  int n, chunked, has_body;
  size_t vlen;
  const char *v;
  if (c->head_bytes + 1 > s->max_header) {
    conn_send_error(c, L, 431, "header_too_large", 0, "the request head is over %zu bytes",
                    s->max_header);
    return 0;
  }
  c->head_bytes = 0;
  err = check_strict(c);
  if (err != HPE_OK) {
    conn_send_error(c, L, 400, "bad_request", 0, "%s: %s", http_errno_name(err),
                    http_errno_description(err));
    return 0;
  }
  if (p->http_major != 1) {
    conn_send_error(c, L, 505, "bad_request", 0, "HTTP/%d.%d is not supported",
                    (int)p->http_major, (int)p->http_minor);
    return 0;
  }
  if (p->upgrade) {
    conn_send_error(c, L, 400, "bad_request", 0, "%s",
                    p->method == HTTP_CONNECT ? "CONNECT is not supported"
                                              : "protocol upgrades are not supported");
    return 0;
  }
  chunked = (p->flags & F_CHUNKED) != 0;
  h = find_header(c, "transfer-encoding", &n);
  if (h != NULL) {
    v = header_value(c, h, &vlen);
    if (n != 1 || !word_is(v, vlen, "chunked") || !chunked) {
      conn_send_error(c, L, 400, "bad_request", 0, "%s: only \"Transfer-Encoding: chunked\" is "
                      "supported", http_errno_name(HPE_INVALID_TRANSFER_ENCODING));
      return 0;
    }
  }
  has_body = chunked || (p->content_length > 0 && p->content_length != UINT64_MAX);
  if (!chunked && has_body && p->content_length > (uint64_t)s->max_body) {
    conn_send_error(c, L, 413, "body_too_large", 0, "the request body is over %zu bytes",
                    s->max_body);
    return 0;
  }
  c->state = C_BODY;
  conn_timer(c, s->body_ms);
  h = find_header(c, "expect", &n);
  if (h != NULL && has_body && p->http_minor >= 1) {
    v = header_value(c, h, &vlen);
    /* the parser stopped before the head's last byte: more than that means body bytes came */
    if (word_is(v, vlen, "100-continue") && c->rlen - c->roff <= 1) {
      static char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
      uv_buf_t b = uv_buf_init(cont, sizeof cont - 1);
      c->creq.data = c;
      if (uv_write(&c->creq, &c->h.stream, &b, 1, NULL) != 0) {
        conn_close(c, L);
        return 0;
      }
    }
  }
  return 1;
}

/* The parser refused the input (or a callback did). */
static void conn_bad_request(conn *c, lua_State *L, enum http_errno err) {
  http_server *s = c->s;
  if (c->fail_status == 413)
    conn_send_error(c, L, 413, "body_too_large", 0, "the request body is over %zu bytes",
                    s->max_body);
  else if (c->fail_status != 0 || err == HPE_CB_url || err == HPE_CB_header_field ||
           err == HPE_CB_header_value)
    conn_close(c, L); /* out of memory */
  else if (err == HPE_HEADER_OVERFLOW)
    conn_send_error(c, L, 431, "header_too_large", 0, "the request head is over %zu bytes",
                    s->max_header);
  else
    conn_send_error(c, L, 400, "bad_request", 0, "%s: %s", http_errno_name(err),
                    http_errno_description(err));
}

/* What Debian's http-parser, built without HTTP_PARSER_STRICT, accepts in the framing: a bare CR
 * in the head (taken as a line end), any byte after a chunk size's CR, any two bytes where CRLF
 * ends chunk data, a trailer line or the chunked body. A request smuggled behind such a body
 * would be read as the next one. The parser has consumed p[0..n) of this message; check those
 * bytes in order. Returns NULL or what is wrong (an error name, then a description). */
static const char *frame_scan(conn *c, const char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)p[i];
    switch (c->frame) {
      case FR_HEAD:
        if (ch == '\r') c->frame = FR_HEAD_CR;
        break;
      case FR_HEAD_CR:
        if (ch != '\n') return "HPE_LF_EXPECTED: a CR in the request head is not followed by LF";
        c->frame = FR_HEAD;
        break;
      case FR_HEAD_END: /* the head's last byte, which the parser paused on */
        if (ch != '\n') return "HPE_LF_EXPECTED: the request head does not end with CRLF CRLF";
        c->frame = c->frame_chunked ? FR_SIZE : FR_PLAIN;
        c->frame_left = 0;
        break;
      case FR_PLAIN: /* Content-Length: the parser counts */
        return NULL;
      case FR_SIZE:
        if (ch >= '0' && ch <= '9') {
          c->frame_left = c->frame_left * 16 + (ch - '0');
        } else if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f') {
          c->frame_left = c->frame_left * 16 + ((ch | 0x20) - 'a' + 10);
        } else if (ch == ';' || ch == ' ' || ch == '\t') {
          c->frame = FR_EXT;
        } else if (ch == '\r') {
          c->frame = FR_SIZE_LF;
        } else {
          return "HPE_INVALID_CHUNK_SIZE: invalid character in chunk size header";
        }
        if (c->frame_left >> 60) return "HPE_INVALID_CHUNK_SIZE: the chunk size is too large";
        break;
      case FR_EXT:
        if (ch == '\r') c->frame = FR_SIZE_LF;
        else if (ch == '\n') return "HPE_LF_EXPECTED: a chunk size line does not end with CRLF";
        break;
      case FR_SIZE_LF:
        if (ch != '\n') return "HPE_LF_EXPECTED: a chunk size line does not end with CRLF";
        c->frame = c->frame_left > 0 ? FR_DATA : FR_TRAILER_START;
        break;
      case FR_DATA: {
        size_t take = n - i;
        if ((uint64_t)take > c->frame_left) take = (size_t)c->frame_left;
        c->frame_left -= take;
        i += take - 1;
        if (c->frame_left == 0) c->frame = FR_DATA_CR;
        break;
      }
      case FR_DATA_CR:
        if (ch != '\r') return "HPE_STRICT: chunk data is not followed by CRLF";
        c->frame = FR_DATA_LF;
        break;
      case FR_DATA_LF:
        if (ch != '\n') return "HPE_STRICT: chunk data is not followed by CRLF";
        c->frame = FR_SIZE;
        c->frame_left = 0;
        break;
      case FR_TRAILER_START:
        c->frame = ch == '\r' ? FR_END_LF : FR_TRAILER;
        if (ch == '\n') return "HPE_LF_EXPECTED: the chunked body does not end with CRLF";
        break;
      case FR_TRAILER:
        if (ch == '\r') c->frame = FR_TRAILER_LF;
        else if (ch == '\n') return "HPE_LF_EXPECTED: a trailer line does not end with CRLF";
        break;
      case FR_TRAILER_LF:
        if (ch != '\n') return "HPE_LF_EXPECTED: a trailer line does not end with CRLF";
        c->frame = FR_TRAILER_START;
        break;
      case FR_END_LF:
        if (ch != '\n') return "HPE_LF_EXPECTED: the chunked body does not end with CRLF";
        c->frame = FR_DONE;
        break;
      default: /* FR_DONE: the parser pauses at the end of the message */
        return "HPE_STRICT: bytes after the end of the chunked body";
    }
  }
  return NULL;
}

/* Feed the buffered input to the parser, one request at a time. */
static void conn_process(conn *c, lua_State *L) {
  http_server *s = c->s;
  while (!c->closing && c->state <= C_BODY && c->roff < c->rlen) {
    int in_head = c->state == C_IDLE || c->state == C_HEAD;
    size_t feed = c->rlen - c->roff, n;
    enum http_errno err;
    const char *bad;
    if (in_head && feed > s->max_header + 1 - c->head_bytes)
      feed = s->max_header + 1 - c->head_bytes; /* never more head than the limit allows */
    c->ev = EV_NONE;
    n = http_parser_execute(&c->parser, &parser_settings, c->rbuf + c->roff, feed);
    bad = frame_scan(c, c->rbuf + c->roff, n);
    c->roff += n;
    if (in_head) c->head_bytes += n;
    err = HTTP_PARSER_ERRNO(&c->parser);
    if (bad != NULL && (err == HPE_OK || err == HPE_PAUSED)) {
      conn_send_error(c, L, 400, "bad_request", 0, "%s", bad);
      break;
    }
    if (err == HPE_PAUSED) {
      http_parser_pause(&c->parser, 0);
      if (c->ev == EV_HEADERS) {
        /* paused before the head's last byte: frame_scan sees it with the body */
        c->frame = FR_HEAD_END;
        c->frame_chunked = (c->parser.flags & F_CHUNKED) != 0;
        if (!conn_head(c, L)) break;
      } else if (c->ev == EV_MESSAGE) {
        c->frame = FR_HEAD; /* the next request */
        conn_dispatch(c, L);
      }
    } else if (err != HPE_OK) {
      conn_bad_request(c, L, err);
      break;
    } else if (in_head && c->head_bytes > s->max_header) {
      conn_send_error(c, L, 431, "header_too_large", 0, "the request head is over %zu bytes",
                      s->max_header);
      break;
    }
  }
  if (c->closing || c->discard) return;
  if (c->roff == c->rlen) {
    c->rlen = c->roff = 0;
  } else if (c->roff > 0) {
    memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
    c->rlen -= c->roff;
    c->roff = 0;
  }
}

static void conn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn *c = (conn *)st->data;
  lua_State *L = c->s->cl->L;
  (void)buf;
  if (c->closing || nread == 0) return;
  if (nread < 0) {
    if (nread == UV_EOF && c->state == C_WRITING) {
      c->eof = 1; /* finish writing the response, then close */
      conn_update_reading(c);
    } else {
      conn_close(c, L); /* reset, EOF: a response still owed is abandoned (on_close) */
    }
    return;
  }
  if (c->discard) return;
  c->rlen += (size_t)nread;
  conn_process(c, L);
  if (!c->closing) conn_update_reading(c);
}

static void conn_timer_cb(uv_timer_t *t) {
  conn *c = (conn *)t->data;
  lua_State *L = c->s->cl->L;
  switch (c->state) {
    case C_HEAD:
      conn_send_error(c, L, 408, "request_timeout", 0, "the request head did not arrive within %g s",
                      c->s->header_s);
      break;
    case C_BODY:
      conn_send_error(c, L, 408, "request_timeout", 0, "the request body did not arrive within %g s",
                      c->s->body_s);
      break;
    case C_HANDLER:
      break;
    default: /* idle, a write that does not progress, the end of lingering */
      conn_close(c, L);
      break;
  }
}

/* ---- on_request ------------------------------------------------------------------------------ */

static void push_request(lua_State *L, conn *c) {
  http_parser *p = &c->parser;
  const char *url = c->head, *q;
  size_t i;
  lua_createtable(L, 0, 10);
  lua_pushstring(L, http_method_str((enum http_method)p->method));
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, url, c->url_len);
  lua_setfield(L, -2, "target");
  q = (const char *)memchr(url, '?', c->url_len);
  if (q != NULL) {
    lua_pushlstring(L, url, (size_t)(q - url));
    lua_setfield(L, -2, "path");
    lua_pushlstring(L, q + 1, c->url_len - (size_t)(q - url) - 1);
    lua_setfield(L, -2, "query");
  } else {
    lua_pushlstring(L, url, c->url_len);
    lua_setfield(L, -2, "path");
  }
  lua_pushfstring(L, "%d.%d", (int)p->http_major, (int)p->http_minor);
  lua_setfield(L, -2, "version");
  lua_createtable(L, 0, (int)c->nhdrs);
  for (i = 0; i < c->nhdrs; i++) {
    header *h = &c->hdrs[i];
    char *name = c->head + h->name;
    const char *v;
    size_t k, vlen;
    for (k = 0; k < h->name_len; k++) name[k] = (char)lower((unsigned char)name[k]);
    v = header_value(c, h, &vlen);
    lua_pushlstring(L, name, h->name_len);
    if (lua_rawget(L, -2) == LUA_TSTRING) { /* repeated: joined with ", " */
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, v, vlen);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, v, vlen);
    }
    lua_pushlstring(L, name, h->name_len);
    lua_insert(L, -2);
    lua_rawset(L, -3);
  }
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, c->body ? c->body : "", c->body_len);
  lua_setfield(L, -2, "body");
  lua_pushstring(L, c->peer);
  lua_setfield(L, -2, "peer");
  lua_pushboolean(L, c->keep_alive);
  lua_setfield(L, -2, "keep_alive");
}

/* Protected: build req and res, call on_request(req, res). */
static int dispatch_l(lua_State *L) {
  conn *c = (conn *)lua_touserdata(L, 1);
  res_ud *r;
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->s->on_request_ref);
  push_request(L, c);
  r = (res_ud *)lua_newuserdatauv(L, sizeof *r, 1);
  memset(r, 0, sizeof *r);
  memcpy(r->peer, c->peer, sizeof r->peer);
  luaL_setmetatable(L, CORRAL_RES_MT);
  lua_pushvalue(L, -1);
  c->res_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  r->c = c;
  c->res = r;
  lua_call(L, 2, 0);
  return 0;
}

/* A failed on_request: on_error(msg), else a line on stderr. The message is on the stack top. */
static void report_error(http_server *s, lua_State *L) {
  if (s->on_error_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->on_error_ref);
    lua_insert(L, -2);
    corral_pcall(s->cl, L, 1);
  } else {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "corral.core: http on_request failed: %s\n", msg ? msg : "(no message)");
    fflush(stderr);
    lua_pop(L, 1);
  }
}

static void conn_dispatch(conn *c, lua_State *L) {
  http_server *s = c->s;
  int top = lua_gettop(L), status;
  uv_timer_stop(&c->timer);
  c->state = C_HANDLER;
  c->keep_alive = http_should_keep_alive(&c->parser) && !s->draining;
  c->is_head = c->parser.method == HTTP_HEAD;
  if (!lua_checkstack(L, 16)) {
    conn_close(c, L);
    return;
  }
  lua_pushcfunction(L, dispatch_l);
  lua_pushlightuserdata(L, c);
  status = corral_pcall_keep(L, 1);
  free(c->body); /* the handler has its copy */
  c->body = NULL;
  c->body_len = c->body_alloc = 0;
  if (status != LUA_OK) {
    if (!c->closing && c->res != NULL) { /* the handler failed before send: C answers */
      res_ud *r = c->res;
      r->sent = 1;
      r->c = NULL;
      c->res = NULL;
      luaL_unref(L, LUA_REGISTRYINDEX, c->res_ref);
      c->res_ref = LUA_NOREF;
    }
    report_error(s, L);
    if (!c->closing && c->state == C_HANDLER)
      conn_send_error(c, L, 500, "internal_error", c->keep_alive,
                      "the request handler failed");
  }
  lua_settop(L, top);
}

/* ---- accepting ------------------------------------------------------------------------------- */

static void spare_closed(uv_handle_t *h) {
  http_server *s = (http_server *)h->data;
  s->spare_busy = 0;
  server_unref(s);
}

/* No memory for a connection: accept it into the spare handle and close it, so that the
 * listener does not stall on a connection it never takes. */
static void reject_spare(http_server *s) {
  int rc;
  if (s->spare_busy) return;
  rc = s->is_unix ? uv_pipe_init(&s->cl->loop, &s->spare.pipe, 0)
                  : uv_tcp_init(&s->cl->loop, &s->spare.tcp);
  if (rc != 0) return;
  s->spare.handle.data = s;
  s->spare_busy = 1;
  s->refs++;
  uv_accept(&s->listener.stream, &s->spare.stream);
  uv_close(&s->spare.handle, spare_closed);
}

static void format_peer(conn *c) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  char ip[INET6_ADDRSTRLEN];
  if (c->s->is_unix) {
    strcpy(c->peer, "unix");
    return;
  }
  strcpy(c->peer, "?");
  if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) != 0) return;
  if (ss.ss_family == AF_INET) {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    uv_ip4_name(a, ip, sizeof ip);
    snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(a->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    uv_ip6_name(a, ip, sizeof ip);
    snprintf(c->peer, sizeof c->peer, "[%s]:%d", ip, ntohs(a->sin6_port));
  }
}

static void on_connection(uv_stream_t *ls, int status) {
  http_server *s = (http_server *)ls->data;
  lua_State *L = s->cl->L;
  conn *c;
  int rc;
  if (status < 0 || !s->listening) return;
  c = (conn *)calloc(1, sizeof *c);
  if (c == NULL) {
    reject_spare(s);
    return;
  }
  rc = s->is_unix ? uv_pipe_init(&s->cl->loop, &c->h.pipe, 0) : uv_tcp_init(&s->cl->loop, &c->h.tcp);
  if (rc != 0) {
    free(c);
    reject_spare(s);
    return;
  }
  uv_timer_init(&s->cl->loop, &c->timer);
  c->h.handle.data = c;
  c->timer.data = c;
  c->handles = 2;
  c->s = s;
  c->res_ref = LUA_NOREF;
  c->next = s->conns;
  if (s->conns) s->conns->prevp = &c->next;
  c->prevp = &s->conns;
  s->conns = c;
  s->refs++;
  s->nconns++;
  if (uv_accept(ls, &c->h.stream) != 0) {
    conn_close(c, L);
    return;
  }
  if (!s->is_unix) uv_tcp_nodelay(&c->h.tcp, 1);
  format_peer(c);
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  c->state = C_IDLE;
  c->fresh = 1;
  if (s->nconns > s->max_conns) {
    if (s->nconns > s->max_conns + REJECT_SLACK)
      conn_close(c, L);
    else
      conn_send_error(c, L, 503, "overloaded", 0, "too many connections (%zu)", s->max_conns);
    return;
  }
  conn_timer(c, s->header_ms); /* a new connection has header_timeout to send its request */
  conn_update_reading(c);
}

/* ---- corral.http_res ------------------------------------------------------------------------- */

static res_ud *check_res(lua_State *L) {
  return (res_ud *)luaL_checkudata(L, 1, CORRAL_RES_MT);
}

/* Check the headers table (argument 3) and return the bytes its lines take. Raises. */
static size_t check_headers(lua_State *L) {
  size_t total = 0;
  if (lua_isnoneornil(L, 3)) return 0;
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    size_t nlen, vlen, i;
    const char *name, *v;
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_argerror(L, 3, "header names must be strings");
    name = lua_tolstring(L, -2, &nlen);
    if (nlen == 0) luaL_argerror(L, 3, "empty header name");
    for (i = 0; i < nlen; i++)
      if (!is_tchar((unsigned char)name[i]))
        luaL_argerror(L, 3, lua_pushfstring(L, "invalid header name '%s'", name));
    if (word_is(name, nlen, "content-length") || word_is(name, nlen, "connection") ||
        word_is(name, nlen, "date") || word_is(name, nlen, "transfer-encoding"))
      luaL_argerror(L, 3, lua_pushfstring(L, "header '%s' is set by the server", name));
    if (lua_type(L, -1) == LUA_TNUMBER) {
      vlen = 32;
    } else if (lua_type(L, -1) == LUA_TSTRING) {
      v = lua_tolstring(L, -1, &vlen);
      for (i = 0; i < vlen; i++) {
        unsigned char ch = (unsigned char)v[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
          luaL_argerror(L, 3, lua_pushfstring(L, "header '%s': control character in the value",
                                              name));
      }
    } else {
      luaL_argerror(L, 3, lua_pushfstring(L, "header '%s': string or number expected, got %s",
                                          name, luaL_typename(L, -1)));
    }
    total += nlen + vlen + 4;
    lua_pop(L, 1);
  }
  return total;
}

/* Write the checked headers of argument 3 into out; returns the bytes written. No raising. */
static size_t put_headers(lua_State *L, char *out) {
  size_t n = 0;
  if (lua_isnoneornil(L, 3)) return 0;
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    size_t nlen, vlen;
    const char *name = lua_tolstring(L, -2, &nlen); /* a string: no conversion */
    memcpy(out + n, name, nlen);
    n += nlen;
    out[n++] = ':';
    out[n++] = ' ';
    if (lua_type(L, -1) == LUA_TNUMBER) {
      if (lua_isinteger(L, -1))
        n += (size_t)snprintf(out + n, 32, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, -1));
      else
        n += (size_t)snprintf(out + n, 32, "%.14g", (double)lua_tonumber(L, -1));
    } else {
      const char *v = lua_tolstring(L, -1, &vlen);
      memcpy(out + n, v, vlen);
      n += vlen;
    }
    out[n++] = '\r';
    out[n++] = '\n';
    lua_pop(L, 1);
  }
  return n;
}

/* res:send(status, headers, body) -> true | false, err, code ("ECONNRESET": the client is
 * gone). Raises when called twice or with bad arguments. */
static int res_send(lua_State *L) {
  res_ud *r = check_res(L);
  lua_Integer status = luaL_checkinteger(L, 2);
  size_t hlen, blen, cap, n;
  const char *body, *reason;
  int no_body, keep;
  conn *c;
  char *buf;
  luaL_argcheck(L, status >= 200 && status <= 599, 2, "status must be 200..599");
  hlen = check_headers(L);
  body = luaL_optlstring(L, 4, "", &blen);
  no_body = status == 204 || status == 304;
  luaL_argcheck(L, !no_body || blen == 0, 4, "a 204 or 304 response has no body");
  if (r->sent) return luaL_error(L, "res:send: the response was already sent");
  r->sent = 1;
  c = r->c;
  if (c == NULL) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "ECONNRESET: the client closed the connection before the response");
    lua_pushliteral(L, "ECONNRESET");
    return 3;
  }
  /* the connection no longer owes this response */
  r->c = NULL;
  c->res = NULL;
  luaL_unref(L, LUA_REGISTRYINDEX, c->res_ref);
  c->res_ref = LUA_NOREF;
  keep = c->keep_alive && !c->s->draining;
  reason = http_status_str((enum http_status)status);
  if (reason[0] == '<') reason = ""; /* "<unknown>": an empty reason phrase is valid */
  cap = 160 + strlen(reason) + hlen + (c->is_head ? 0 : blen);
  buf = (char *)malloc(cap);
  if (buf == NULL) {
    conn_close(c, L);
    return corral_fail_errno(L, ENOMEM, "cannot send the response");
  }
  n = (size_t)snprintf(buf, cap, "HTTP/1.1 %d %s\r\n", (int)status, reason);
  n += put_headers(L, buf + n);
  if (!no_body) n += (size_t)snprintf(buf + n, cap - n, "Content-Length: %zu\r\n", blen);
  n += (size_t)snprintf(buf + n, cap - n, "Date: %s\r\nConnection: %s\r\n\r\n", http_date(c->s),
                        keep ? "keep-alive" : "close");
  if (!c->is_head && blen > 0) {
    memcpy(buf + n, body, blen);
    n += blen;
  }
  {
    int rc = conn_write(c, L, buf, n, !keep);
    if (rc != 0) return corral_fail_uv(L, rc, "cannot send the response");
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* res:on_close(fn): fn() when the connection closes before the response is sent; called at
 * once when it already has. */
static int res_on_close(lua_State *L) {
  res_ud *r = check_res(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 1, 1);
  if (r->closed) {
    lua_pushvalue(L, 2);
    lua_call(L, 0, 0);
  }
  return 0;
}

static int res_closed(lua_State *L) {
  lua_pushboolean(L, check_res(L)->closed);
  return 1;
}

static int res_peer(lua_State *L) {
  lua_pushstring(L, check_res(L)->peer);
  return 1;
}

static int res_tostring(lua_State *L) {
  res_ud *r = check_res(L);
  lua_pushfstring(L, "corral.http_res (%s, %s)", r->peer,
                  r->sent ? "sent" : r->closed ? "closed" : "pending");
  return 1;
}

/* __gc: only reached once the connection dropped its reference (or the state closes). */
static int res_gc(lua_State *L) {
  res_ud *r = check_res(L);
  if (r->c != NULL) {
    r->c->res = NULL;
    r->c->res_ref = LUA_NOREF;
    r->c = NULL;
  }
  return 0;
}

/* ---- corral.http_server ---------------------------------------------------------------------- */

static srv_ud *check_srv(lua_State *L) {
  return (srv_ud *)luaL_checkudata(L, 1, CORRAL_SERVER_MT);
}

/* srv:close(): the listener and every connection (on_close fires for requests not answered).
 * Safe twice. */
static int srv_close(lua_State *L) {
  srv_ud *ud = check_srv(L);
  http_server *s = ud->s;
  conn *c;
  ud->closed = 1;
  if (s == NULL || s->closed) return 0;
  s->closed = 1;
  s->draining = 1;
  listener_close(s);
  for (c = s->conns; c != NULL; c = c->next) conn_close(c, L);
  server_release_lua(s, L);
  return 0;
}

/* srv:stop_accepting(): close the listener; idle connections now, the others after their
 * current request. */
static int srv_stop_accepting(lua_State *L) {
  srv_ud *ud = check_srv(L);
  http_server *s = ud->s;
  conn *c;
  if (s == NULL || s->closed) return 0;
  s->draining = 1;
  listener_close(s);
  for (c = s->conns; c != NULL; c = c->next)
    if (!c->closing && c->state == C_IDLE) conn_close(c, L);
  server_check_drained(s, L);
  return 0;
}

static int srv_connections(lua_State *L) {
  srv_ud *ud = check_srv(L);
  lua_pushinteger(L, ud->s && !ud->closed ? (lua_Integer)ud->s->nconns : 0);
  return 1;
}

static int srv_address(lua_State *L) {
  check_srv(L);
  lua_getiuservalue(L, 1, 2);
  return 1;
}

static int srv_tostring(lua_State *L) {
  srv_ud *ud = check_srv(L);
  lua_getiuservalue(L, 1, 2);
  lua_pushfstring(L, "corral.http_server (%s, %s)", lua_tostring(L, -1),
                  ud->closed || ud->s == NULL ? "closed"
                  : ud->s->listening          ? "listening"
                                              : "draining");
  return 1;
}

/* __gc: reached while the server is open only when the state closes (the registry holds it
 * until then); the loop's teardown closes it. Detach so nothing points here. */
static int srv_gc(lua_State *L) {
  srv_ud *ud = check_srv(L);
  if (ud->s != NULL) {
    ud->s->ud = NULL;
    ud->s = NULL;
  }
  return 0;
}

/* ---- core.http_listen ------------------------------------------------------------------------ */

static const char *const listen_keys[] = {
    "listen", "unix_mode", "backlog", "max_header_bytes", "max_body_bytes", "header_timeout",
    "body_timeout", "idle_timeout", "send_timeout", "max_connections", "on_request", "on_error",
    NULL,
};

/* Parse "HOST:PORT" / "[HOST6]:PORT" into sa; 0 or -1. */
static int parse_inet(const char *a, struct sockaddr_storage *sa) {
  char host[INET6_ADDRSTRLEN + 1];
  const char *colon, *h = a;
  size_t hlen;
  char *end;
  long port;
  int v6 = 0;
  if (a[0] == '[') {
    const char *close = strchr(a, ']');
    if (close == NULL || close[1] != ':') return -1;
    h = a + 1;
    hlen = (size_t)(close - h);
    colon = close + 1;
    v6 = 1;
  } else {
    colon = strrchr(a, ':');
    if (colon == NULL) return -1;
    hlen = (size_t)(colon - a);
  }
  if (hlen == 0 || hlen >= sizeof host) return -1;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  errno = 0;
  port = strtol(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535 || errno != 0) return -1;
  if (v6) return uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)sa) == 0 ? 0 : -1;
  if (strchr(host, ':') != NULL) return -1; /* IPv6 without brackets */
  return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)sa) == 0 ? 0 : -1;
}

/* An existing path where the socket should be: a stale socket (nobody listens: connect is
 * refused) is removed; anything else is an error. Returns 0 or an errno value (*what says). */
static int clear_stale_socket(const char *path, const char **what) {
  struct stat st;
  struct sockaddr_un sun;
  int fd, rc, e;
  if (lstat(path, &st) < 0) {
    e = errno;
    *what = "cannot check";
    return e == ENOENT ? 0 : e;
  }
  if (!S_ISSOCK(st.st_mode)) {
    *what = "exists and is not a socket:";
    return ENOTSOCK;
  }
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    e = errno;
    *what = "cannot probe";
    return e;
  }
  memset(&sun, 0, sizeof sun);
  sun.sun_family = AF_UNIX;
  memcpy(sun.sun_path, path, strlen(path) + 1);
  rc = connect(fd, (struct sockaddr *)&sun, sizeof sun);
  e = errno;
  close(fd);
  if (rc == 0 || e == EAGAIN || e == EINPROGRESS) {
    *what = "a server is listening on";
    return EADDRINUSE;
  }
  if (e != ECONNREFUSED) {
    *what = "cannot probe";
    return e;
  }
  if (unlink(path) < 0 && errno != ENOENT) {
    e = errno;
    *what = "cannot remove the stale socket";
    return e;
  }
  return 0;
}

/* Bind and listen; on failure push nil, err, code and return 3 (the caller closes the handle:
 * libuv then unlinks a socket path it bound). On success push the real address, return 0. */
static int server_bind(lua_State *L, http_server *s, const char *listen,
                       const struct sockaddr_storage *sa, int unix_mode, int backlog) {
  int rc;
  if (s->is_unix) {
    const char *path = listen + 5, *what = "";
    int e = clear_stale_socket(path, &what);
    if (e != 0) return corral_fail_errno(L, e, "%s %s", what, path);
    rc = uv_pipe_bind(&s->listener.pipe, path);
    if (rc == UV_EACCES) { /* libuv reports a missing directory as EACCES too */
      char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
      char *slash;
      snprintf(dir, sizeof dir, "%s", path);
      slash = strrchr(dir, '/');
      if (slash != NULL) {
        struct stat st;
        *(slash == dir ? slash + 1 : slash) = '\0';
        if (stat(dir, &st) < 0 && errno == ENOENT)
          return corral_fail_errno(L, ENOENT, "cannot bind %s", path);
      }
    }
    if (rc != 0) return corral_fail_uv(L, rc, "cannot bind %s", path);
    /* before listen: nobody can connect while the mode is still the umask's */
    if (fchmodat(AT_FDCWD, path, (mode_t)unix_mode, AT_SYMLINK_NOFOLLOW) < 0) {
      e = errno;
      return corral_fail_errno(L, e, "cannot chmod %s", path);
    }
    rc = uv_listen(&s->listener.stream, backlog, on_connection);
    if (rc != 0) return corral_fail_uv(L, rc, "cannot listen on %s", path);
    lua_pushstring(L, listen);
  } else {
    struct sockaddr_storage got;
    int len = sizeof got;
    char ip[INET6_ADDRSTRLEN];
    rc = uv_tcp_bind(&s->listener.tcp, (const struct sockaddr *)sa, 0);
    if (rc == 0) rc = uv_listen(&s->listener.stream, backlog, on_connection);
    if (rc != 0) return corral_fail_uv(L, rc, "cannot listen on %s", listen);
    rc = uv_tcp_getsockname(&s->listener.tcp, (struct sockaddr *)&got, &len);
    if (rc != 0) return corral_fail_uv(L, rc, "cannot get the address of %s", listen);
    if (got.ss_family == AF_INET6) {
      uv_ip6_name((struct sockaddr_in6 *)&got, ip, sizeof ip);
      lua_pushfstring(L, "[%s]:%d", ip, (int)ntohs(((struct sockaddr_in6 *)&got)->sin6_port));
    } else {
      uv_ip4_name((struct sockaddr_in *)&got, ip, sizeof ip);
      lua_pushfstring(L, "%s:%d", ip, (int)ntohs(((struct sockaddr_in *)&got)->sin_port));
    }
  }
  return 0;
}

/* core.resolve(host) -> {address, ...} | nil, err, code: the numeric IPv4 and IPv6 addresses
 * of a host name (or of a numeric address), in getaddrinfo's order of preference, each once.
 * Synchronous (no callback: libuv resolves in this thread), for a listener's address at start.
 * No AI_ADDRCONFIG: glibc ignores loopback when it applies it, so in a network namespace with
 * only lo "localhost" would resolve to nothing. */
int corral_resolve(lua_State *L) {
  corral_loop *cl = corral_loop_up(L);
  size_t len;
  const char *host = luaL_checklstring(L, 1, &len);
  struct addrinfo hints, *ai;
  uv_getaddrinfo_t req;
  char ip[INET6_ADDRSTRLEN];
  int rc, n = 0;

  if (strlen(host) != len) luaL_argerror(L, 1, "host name contains a NUL byte");
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  rc = uv_getaddrinfo(&cl->loop, &req, NULL, host, NULL, &hints);
  if (rc != 0) return corral_fail_uv(L, rc, "cannot resolve '%s'", host);
  lua_newtable(L); /* the result */
  lua_newtable(L); /* addresses seen */
  for (ai = req.addrinfo; ai != NULL; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET6)
      uv_ip6_name((struct sockaddr_in6 *)ai->ai_addr, ip, sizeof ip);
    else if (ai->ai_family == AF_INET)
      uv_ip4_name((struct sockaddr_in *)ai->ai_addr, ip, sizeof ip);
    else
      continue;
    if (lua_getfield(L, -1, ip) == LUA_TNIL) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -3, ip);
      lua_pushstring(L, ip);
      lua_rawseti(L, -4, ++n);
    }
    lua_pop(L, 1);
  }
  uv_freeaddrinfo(req.addrinfo);
  lua_pop(L, 1);
  return 1;
}

/* core.http_listen(opts) -> server | nil, err, code */
int corral_http_listen(lua_State *L) {
  corral_loop *cl = corral_loop_up(L);
  const char *listen;
  size_t listen_len;
  lua_Integer unix_mode, backlog, max_header, max_body, max_conns;
  double header_s, body_s, idle_s, send_s;
  int i_req, i_err, i_ud, is_unix, rc, nret;
  struct sockaddr_storage sa;
  srv_ud *ud;
  http_server *s;

  /* 1. options: every mistake raises before anything is acquired */
  luaL_checktype(L, 1, LUA_TTABLE);
  corral_check_keys(L, 1, listen_keys);
  listen = corral_opt_string(L, 1, "listen", &listen_len);
  if (listen == NULL) luaL_argerror(L, 1, "option 'listen' is required");
  if (strlen(listen) != listen_len) luaL_argerror(L, 1, "option 'listen' contains a NUL byte");
  is_unix = strncmp(listen, "unix:", 5) == 0;
  if (is_unix && listen_len == 5) luaL_argerror(L, 1, "option 'listen': empty unix socket path");
  unix_mode = corral_opt_integer(L, 1, "unix_mode", 0660, 0, 0777);
  backlog = corral_opt_integer(L, 1, "backlog", 511, 1, 65535);
  max_header = corral_opt_integer(L, 1, "max_header_bytes", 16384, 64, MAX_HEADER_LIMIT);
  max_body = corral_opt_integer(L, 1, "max_body_bytes", 1048576, 0, (lua_Integer)1 << 30);
  header_s = corral_opt_number(L, 1, "header_timeout", 10, 0.001, 86400);
  body_s = corral_opt_number(L, 1, "body_timeout", 30, 0.001, 86400);
  idle_s = corral_opt_number(L, 1, "idle_timeout", 60, 0.001, 86400);
  send_s = corral_opt_number(L, 1, "send_timeout", 30, 0.001, 86400);
  max_conns = corral_opt_integer(L, 1, "max_connections", 1024, 1, 1 << 20);
  lua_getfield(L, 1, "on_request");
  i_req = lua_gettop(L);
  if (lua_type(L, i_req) != LUA_TFUNCTION)
    luaL_argerror(L, 1, lua_pushfstring(L, "option 'on_request': function expected, got %s",
                                        luaL_typename(L, i_req)));
  lua_getfield(L, 1, "on_error");
  i_err = lua_gettop(L);
  if (!lua_isnil(L, i_err) && lua_type(L, i_err) != LUA_TFUNCTION)
    luaL_argerror(L, 1, lua_pushfstring(L, "option 'on_error': function expected, got %s",
                                        luaL_typename(L, i_err)));
  memset(&sa, 0, sizeof sa);
  if (!is_unix && parse_inet(listen, &sa) < 0)
    luaL_argerror(L, 1, lua_pushfstring(L, "option 'listen': '%s' is not unix:/PATH, "
                                        "IPV4:PORT or [IPV6]:PORT", listen));
  /* libuv 1.44 would truncate a long path silently */
  if (is_unix && listen_len - 5 >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return corral_fail_errno(L, ENAMETOOLONG, "cannot listen on %s", listen + 5);

  /* 2. the userdata, closed; the references (may raise: nothing in C yet) */
  ud = (srv_ud *)lua_newuserdatauv(L, sizeof *ud, 2);
  ud->s = NULL;
  ud->closed = 1;
  luaL_setmetatable(L, CORRAL_SERVER_MT);
  i_ud = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1)); /* the loop lives as long as the server */
  lua_setiuservalue(L, i_ud, 1);
  lua_pushstring(L, listen);
  lua_setiuservalue(L, i_ud, 2);

  /* 3. C memory and the listener */
  s = (http_server *)calloc(1, sizeof *s);
  if (s == NULL) return corral_fail_errno(L, ENOMEM, "cannot listen on %s", listen);
  s->cl = cl;
  s->is_unix = is_unix;
  s->max_header = (size_t)max_header;
  s->max_body = (size_t)max_body;
  s->max_conns = (size_t)max_conns;
  s->header_s = header_s;
  s->body_s = body_s;
  s->header_ms = seconds_to_ms(header_s);
  s->body_ms = seconds_to_ms(body_s);
  s->idle_ms = seconds_to_ms(idle_s);
  s->send_ms = seconds_to_ms(send_s);
  s->self_ref = s->on_request_ref = s->on_error_ref = LUA_NOREF;
  s->lua_released = 1; /* no references taken yet */
  rc = is_unix ? uv_pipe_init(&cl->loop, &s->listener.pipe, 0)
               : uv_tcp_init(&cl->loop, &s->listener.tcp);
  if (rc != 0) {
    free(s);
    return corral_fail_uv(L, rc, "cannot listen on %s", listen);
  }
  s->listener.handle.data = s;
  s->listening = 1;
  s->refs = 1;
  s->next = cl->servers;
  if (cl->servers) cl->servers->prevp = &s->next;
  s->prevp = &cl->servers;
  cl->servers = s;
  s->ud = ud;
  ud->s = s;

  nret = server_bind(L, s, listen, &sa, (int)unix_mode, (int)backlog);
  if (nret != 0) {
    listener_close(s); /* frees s in its close callback */
    return nret;
  }
  lua_setiuservalue(L, i_ud, 2); /* the real address */

  /* 4. listening: keep the server (and its functions) while it may call Lua */
  lua_pushvalue(L, i_req);
  s->on_request_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (!lua_isnil(L, i_err)) {
    lua_pushvalue(L, i_err);
    s->on_error_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_pushvalue(L, i_ud);
  s->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  s->lua_released = 0;
  ud->closed = 0;
  lua_pushvalue(L, i_ud);
  return 1;
}

/* ---- teardown and registration --------------------------------------------------------------- */

void corral_http_shutdown(corral_loop *cl) {
  http_server *s;
  for (s = cl->servers; s != NULL; s = s->next) {
    conn *c;
    s->closed = 1;
    s->draining = 1;
    listener_close(s);
    for (c = s->conns; c != NULL; c = c->next) conn_close(c, NULL);
    s->lua_released = 1;
  }
}

void corral_http_open(lua_State *L) {
  static const luaL_Reg srv_methods[] = {
      {"close", srv_close},
      {"stop_accepting", srv_stop_accepting},
      {"connections", srv_connections},
      {"address", srv_address},
      {NULL, NULL},
  };
  static const luaL_Reg res_methods[] = {
      {"send", res_send},
      {"on_close", res_on_close},
      {"closed", res_closed},
      {"peer", res_peer},
      {NULL, NULL},
  };
  luaL_newmetatable(L, CORRAL_SERVER_MT);
  lua_newtable(L);
  luaL_setfuncs(L, srv_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, srv_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, srv_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, srv_close);
  lua_setfield(L, -2, "__close");
  lua_pop(L, 1);

  luaL_newmetatable(L, CORRAL_RES_MT);
  lua_newtable(L);
  luaL_setfuncs(L, res_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, res_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, res_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}
