/*
 * corral.core: utf8_repair, json_raw_control and json_separators (checks of JSON text lua-cjson does
 * not make), and base64 (b64encode, b64decode: the bytes of files over JSON).
 *
 * utf8_repair() is a pure function (no Lua, no allocation) so that a fuzz harness can build this
 * file alone: cc -DCORRAL_UTF8_NO_LUA -c utf8.c. It gives the same bytes as Python's
 * bytes.decode("utf-8", "replace").encode("utf-8"): each maximal subpart of an ill-formed
 * sequence (Unicode 3.9, "U+FFFD Substitution of Maximal Subparts") becomes one U+FFFD. A
 * maximal subpart is the longest prefix of a well-formed sequence, or one byte when the first
 * byte cannot start one: E2 82 at the end is one U+FFFD; F0 80 is two (80 cannot follow F0);
 * ED A0 (a surrogate), C0 and C1 (overlong), F5..FF (beyond U+10FFFF) each stand alone.
 */
#include <stddef.h>
#include <string.h>

#ifdef CORRAL_UTF8_NO_LUA
size_t utf8_repair(const unsigned char *in, size_t n, unsigned char *out, int *valid);
long json_raw_control(const unsigned char *s, size_t n);
size_t json_separators(const unsigned char *s, size_t n);
size_t b64_encode(const unsigned char *in, size_t n, char *out);
long b64_decode(const unsigned char *s, size_t n, unsigned char *out);
#else
#include "core.h"
#endif

static const unsigned char REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};

size_t utf8_repair(const unsigned char *in, size_t n, unsigned char *out, int *valid) {
  size_t i = 0, o = 0;
  int ok = 1;
  while (i < n) {
    unsigned char b = in[i];
    size_t need, j;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      if (out) out[o] = b;
      o++;
      i++;
      continue;
    }
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b == 0xE0) {
      need = 2;
      lo = 0xA0;
    } else if (b == 0xED) {
      need = 2;
      hi = 0x9F;
    } else if (b >= 0xE1 && b <= 0xEF) {
      need = 2;
    } else if (b == 0xF0) {
      need = 3;
      lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need = 3;
    } else if (b == 0xF4) {
      need = 3;
      hi = 0x8F;
    } else {
      need = 0; /* 80..C1, F5..FF never start a sequence */
    }
    j = i + 1;
    if (need > 0 && j < n && in[j] >= lo && in[j] <= hi) {
      j++;
      while (j < n && j - i <= need && in[j] >= 0x80 && in[j] <= 0xBF) j++;
      if (j - i == need + 1) { /* well formed */
        if (out) memcpy(out + o, in + i, need + 1);
        o += need + 1;
        i = j;
        continue;
      }
    }
    /* in[i..j) is a maximal subpart */
    ok = 0;
    if (out) memcpy(out + o, REPLACEMENT, sizeof REPLACEMENT);
    o += sizeof REPLACEMENT;
    i = j;
  }
  if (valid) *valid = ok;
  return o;
}

#ifndef CORRAL_UTF8_NO_LUA
/* core.utf8_repair(s) -> s2, valid */
int corral_utf8_repair(lua_State *L) {
  size_t n, m;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  int valid;
  luaL_Buffer b;
  m = utf8_repair(s, n, NULL, &valid);
  if (valid) {
    lua_settop(L, 1);
    lua_pushboolean(L, 1);
    return 2;
  }
  utf8_repair(s, n, (unsigned char *)luaL_buffinitsize(L, &b, m), NULL);
  luaL_pushresultsize(&b, m);
  lua_pushboolean(L, 0);
  return 2;
}
#endif

/* The first raw control character (U+0000..U+001F) inside a JSON string of s[0..n), which RFC
 * 8259 forbids and lua-cjson accepts: its offset, or -1. Strings are followed through their
 * escapes; outside them such a byte is a syntax error the decoder reports itself. */
long json_raw_control(const unsigned char *s, size_t n) {
  size_t i;
  int in_string = 0;
  for (i = 0; i < n; i++) {
    unsigned char ch = s[i];
    if (!in_string) {
      if (ch == '"') in_string = 1;
    } else if (ch == '\\') {
      i++; /* the escaped byte: a quote or a backslash does not end or start anything */
    } else if (ch == '"') {
      in_string = 0;
    } else if (ch < 0x20) {
      return (long)i;
    }
  }
  return -1;
}

/* The bytes '[', '{', ',' and ':' outside strings: each opens a value or separates two, so a
 * decoder builds at most about as many values from the text. Counted without a copy, so that a
 * reader can bound what decoding an untrusted text would build before it decodes. */
size_t json_separators(const unsigned char *s, size_t n) {
  size_t i, count = 0;
  int in_string = 0;
  for (i = 0; i < n; i++) {
    unsigned char ch = s[i];
    if (in_string) {
      if (ch == '\\')
        i++;
      else if (ch == '"')
        in_string = 0;
    } else if (ch == '"') {
      in_string = 1;
    } else if (ch == '[' || ch == '{' || ch == ',' || ch == ':') {
      count++;
    }
  }
  return count;
}

#ifndef CORRAL_UTF8_NO_LUA
/* core.json_separators(s) -> count */
int corral_json_separators(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  lua_pushinteger(L, (lua_Integer)json_separators(s, n));
  return 1;
}

/* core.json_raw_control(s) -> offset (1-based), byte | nil */
int corral_json_raw_control(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  long at = json_raw_control(s, n);
  if (at < 0) return 0;
  lua_pushinteger(L, (lua_Integer)at + 1);
  lua_pushinteger(L, s[at]);
  return 2;
}
#endif

/* Base64 (RFC 4648, standard alphabet, padded): the bytes of files over JSON. */
static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t b64_encode(const unsigned char *in, size_t n, char *out) {
  size_t i, o = 0;
  for (i = 0; i + 2 < n; i += 3) {
    unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
    out[o++] = b64_alphabet[v >> 18];
    out[o++] = b64_alphabet[(v >> 12) & 63];
    out[o++] = b64_alphabet[(v >> 6) & 63];
    out[o++] = b64_alphabet[v & 63];
  }
  if (i < n) {
    unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0);
    out[o++] = b64_alphabet[v >> 18];
    out[o++] = b64_alphabet[(v >> 12) & 63];
    out[o++] = i + 1 < n ? b64_alphabet[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  return o;
}

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Decodes s[0..n) into out (room for n / 4 * 3 bytes): the length, or -1 - the offset of the
 * first byte that is wrong (a length not a multiple of 4, a byte outside the alphabet, padding
 * anywhere but at the end, or bits set under the padding). */
long b64_decode(const unsigned char *s, size_t n, unsigned char *out) {
  size_t i, o = 0;
  if (n % 4) return -1 - (long)(n - n % 4);
  for (i = 0; i < n; i += 4) {
    int a = b64_value(s[i]), b = b64_value(s[i + 1]), c, d;
    int last = i + 4 == n;
    if (a < 0) return -1 - (long)i;
    if (b < 0) return -1 - (long)(i + 1);
    c = last && s[i + 2] == '=' && s[i + 3] == '=' ? -2 : b64_value(s[i + 2]);
    d = last && s[i + 3] == '=' && c != -1 ? -2 : b64_value(s[i + 3]);
    if (c == -1) return -1 - (long)(i + 2);
    if (d == -1) return -1 - (long)(i + 3);
    out[o++] = (unsigned char)(a << 2 | b >> 4);
    if (c == -2) {
      if (b & 15) return -1 - (long)(i + 1);
      break;
    }
    out[o++] = (unsigned char)((b & 15) << 4 | c >> 2);
    if (d == -2) {
      if (c & 3) return -1 - (long)(i + 2);
      break;
    }
    out[o++] = (unsigned char)((c & 3) << 6 | d);
  }
  return (long)o;
}

#ifndef CORRAL_UTF8_NO_LUA
/* core.b64encode(s) -> text */
int corral_b64encode(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  luaL_Buffer b;
  size_t m = (n + 2) / 3 * 4;
  luaL_pushresultsize(&b, b64_encode(s, n, luaL_buffinitsize(L, &b, m ? m : 1)));
  return 1;
}

/* core.b64decode(text) -> bytes | nil, offset (1-based) of the first wrong byte */
int corral_b64decode(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  luaL_Buffer b;
  long r = b64_decode(s, n, (unsigned char *)luaL_buffinitsize(L, &b, n / 4 * 3 + 1));
  if (r < 0) {
    lua_pushnil(L);
    lua_pushinteger(L, -r);
    return 2;
  }
  luaL_pushresultsize(&b, (size_t)r);
  return 1;
}
#endif
