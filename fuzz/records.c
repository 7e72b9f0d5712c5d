/* fuzz/records.c: core.records_unpack (csrc/core/records.c), the parser of a run's collection
 * and of a session kernel's answer, which the program can forge.
 *
 * The input's first three bytes choose caps (files 0..15, file_bytes 0..63, bytes 0..255; a
 * byte of 255 for no cap), the rest is the records. For each input, records_unpack(data) and
 * records_unpack(data, nil, caps):
 *   - raise nothing;
 *   - agree on complete and seen: what is past a cap is still read as a record;
 *   - with caps: at most `files` entries, min(files, the entries without caps); "files" in flags
 *     exactly when the records hold more; no content over file_bytes, none over bytes in all;
 *     a file's truncated exactly when its content is shorter than its size; each entry's
 *     content a prefix of the content of an entry of the same path made without caps;
 *   - give lists sorted by the paths' bytes.
 * The checks are Lua (below); a violated one aborts.
 */
#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

int corral_records_unpack(lua_State *L);

/* records.c's calls into the rest of the module (records_read's errors and its open file):
 * not reached. */
int corral_fail_errno(lua_State *L, int err, const char *fmt, ...);
int corral_fail_errno(lua_State *L, int err, const char *fmt, ...)
{
	(void)err;
	(void)fmt;
	return luaL_error(L, "not reached");
}

int corral_file_fd(lua_State *L, int idx);
int corral_file_fd(lua_State *L, int idx)
{
	(void)idx;
	return luaL_error(L, "not reached");
}

static const char CHECKS[] =
	"local unpack, data, files, file_bytes, bytes = ...\n"
	"local caps = { files = files, file_bytes = file_bytes, bytes = bytes }\n"
	"local all, complete, seen, flags = unpack(data)\n"
	"local list, complete2, seen2, flags2 = unpack(data, nil, caps)\n"
	"if complete ~= complete2 or seen ~= seen2 then return 'complete or seen differ' end\n"
	"local function words(f) local t = {} for w in f:gmatch('[^,]+') do t[w] = true end return t end\n"
	"local had, got = words(flags), words(flags2)\n"
	"for w in pairs(had) do if not got[w] then return 'flag ' .. w .. ' lost' end end\n"
	"files = files or math.huge\n"
	"if #list ~= math.min(files, #all) then return #list .. ' entries of ' .. #all end\n"
	"if #all > files and not got.files then return 'files past the cap not flagged' end\n"
	"if #all <= files and got.files ~= had.files then return 'files flagged within the cap' end\n"
	"local by = {}\n"
	"for _, e in ipairs(all) do by[e.path] = by[e.path] or {} table.insert(by[e.path], e) end\n"
	"local total = 0\n"
	"for i, e in ipairs(list) do\n"
	"  if i > 1 and list[i - 1].path > e.path then return 'not sorted' end\n"
	"  local found = false\n"
	"  for _, a in ipairs(by[e.path] or {}) do\n"
	"    local x, y = e.content or e.target or e.error, a.content or a.target or a.error\n"
	"    if a.type == e.type and a.mode == e.mode and y:sub(1, #x) == x then found = true end\n"
	"  end\n"
	"  if not found then return 'entry ' .. i .. ' is no prefix of one made without caps' end\n"
	"  if e.type == 'file' then\n"
	"    if #e.content > (file_bytes or math.huge) then return 'content over file_bytes' end\n"
	"    total = total + #e.content\n"
	"    if e.truncated ~= (#e.content < e.size) then return 'truncated is wrong' end\n"
	"  end\n"
	"end\n"
	"if total > (bytes or math.huge) then return 'contents over bytes' end\n"
	"for i = 2, #all do if all[i - 1].path > all[i].path then return 'not sorted' end end\n"
	"return nil\n";

static lua_State *L;
static int checks_ref;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	L = luaL_newstate();
	if (!L)
		abort();
	luaL_openlibs(L);
	if (luaL_loadbuffer(L, CHECKS, sizeof CHECKS - 1, "=records_checks") != LUA_OK) {
		fprintf(stderr, "%s\n", lua_tostring(L, -1));
		abort();
	}
	checks_ref = luaL_ref(L, LUA_REGISTRYINDEX);
	return 0;
}

/* A cap from a byte: 255 none (nil), else the byte modulo m. */
static void push_cap(unsigned char b, unsigned m)
{
	if (b == 255)
		lua_pushnil(L);
	else
		lua_pushinteger(L, (lua_Integer)(b % m));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char c[3] = {255, 255, 255};
	size_t head = size < 3 ? size : 3;

	if (!L)
		LLVMFuzzerInitialize(NULL, NULL);
	memcpy(c, data, head);
	lua_settop(L, 0);
	lua_rawgeti(L, LUA_REGISTRYINDEX, checks_ref);
	lua_pushcfunction(L, corral_records_unpack);
	lua_pushlstring(L, (const char *)data + head, size - head);
	push_cap(c[0], 16);
	push_cap(c[1], 64);
	push_cap(c[2], 255);
	if (lua_pcall(L, 5, 1, 0) != LUA_OK) {
		fprintf(stderr, "raised: %s\n", lua_tostring(L, -1));
		abort();
	}
	FUZZ_CHECK(lua_isnil(L, -1), "%s", lua_tostring(L, -1));
	lua_settop(L, 0);
	lua_gc(L, LUA_GCCOLLECT);
	return 0;
}
