/* fuzz/lua.c: the Lua parsers of untrusted input, in an embedded Lua 5.4.
 *
 * For each input:
 *   (a) report.parse(input) (lua/corral/report.lua: the launcher's report, read from a pipe the
 *       host does not trust): it must not raise, and must return the documented shape;
 *   (b) the input, read by a small deterministic decoder (below), becomes an options table:
 *       keys drawn from the real option names (both schemas of lua/corral/options.lua) or short
 *       random strings, values of every type (numbers with NaN, infinities, huge, negative and
 *       fractional ones, strings with NUL and bytes that are not UTF-8, booleans, nested tables,
 *       functions, userdata, threads). options.check() is called as run_python and
 *       eval_in_sandbox call it, on the whole table and on each entry alone (pairs() order is
 *       not fixed, so a bug tied to one key reproduces from the entry alone): it must accept
 *       exactly the valid tables and raise nothing but "what: option 'NAME' ...".
 * The checks themselves are Lua, in fuzz/lua_checks.lua; a violated one aborts.
 *
 * libFuzzer sees no coverage inside liblua (not instrumented), so a line hook feeds the Lua
 * lines executed in the modules of lua/corral/, as edges (previous line, line), to libFuzzer's extra
 * counters. No process is spawned; the modules are found under CORRAL_ROOT (the environment
 * variable, else the tree the harness was built from). CORRAL_FUZZ_PRINT=1 prints each decoded
 * options table to stderr.
 */
#include "fuzz.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#ifndef CORRAL_ROOT
#define CORRAL_ROOT "."
#endif

/* Lua line coverage, read by libFuzzer (and ignored by fuzz/replay.c). */
#define LUA_COV_SIZE 65536
__attribute__((used, section("__libfuzzer_extra_counters")))
static uint8_t lua_cov[LUA_COV_SIZE];

static lua_State *L;
static int checks_ref, options_ref, names_ref;
static int nnames;
static int print_options;       /* CORRAL_FUZZ_PRINT set: print each decoded table (triage) */

static const char *cov_source;  /* the chunk of the last hook call, and whether it counts */
static int cov_counts;
static uint32_t cov_prev;

static void line_hook(lua_State *l, lua_Debug *ar)
{
	uint32_t loc;

	if (!lua_getinfo(l, "S", ar))
		return;
	if (ar->source != cov_source) {
		cov_source = ar->source;
		cov_counts = strstr(ar->source, "/lua/corral/") != NULL;
	}
	if (!cov_counts)
		return;
	loc = (uint32_t)(((uintptr_t)ar->source >> 4) * 2654435761u) ^ (uint32_t)ar->currentline * 40503u;
	lua_cov[(loc ^ cov_prev) % LUA_COV_SIZE]++;
	cov_prev = loc >> 1;
}

/* ---- the decoder: bytes to Lua values; reads zeros past the end ---- */

struct src {
	const uint8_t *p;
	size_t n, i;
};

static uint8_t byte(struct src *s)
{
	return s->i < s->n ? s->p[s->i++] : 0;
}

static uint64_t u64(struct src *s)
{
	uint64_t v = 0;
	int k;

	for (k = 0; k < 8; k++)
		v = (v << 8) | byte(s);
	return v;
}

static int16_t i16(struct src *s)
{
	uint16_t hi = byte(s);

	return (int16_t)(uint16_t)(hi << 8 | byte(s));
}

static const double special_doubles[] = {
	NAN, INFINITY, -INFINITY, 0.0, -0.0, 0.5, -0.5, 0.001, 0.0009999, 1e-300, 4.9e-324, 1.5,
	15.999999, 16.0, 86400.0, 86400.5, 86401.0, 1048576.0, 1048576.5, 1073741824.0, 1e9,
	1e300, -1e300, 9007199254740992.0, 9223372036854775808.0, -9223372036854775808.0,
	18446744073709551616.0, DBL_MAX, -DBL_MAX,
};

static const lua_Integer special_ints[] = {
	0, 1, -1, 3, 4, 15, 16, 17, 1000000, 1000001, 86400, 86401, 1048576, 1048577,
	1073741824, 1073741825, LUA_MAXINTEGER, LUA_MININTEGER, 9007199254740993LL,
};

static const struct {
	const char *s;
	size_t len;
} special_strings[] = {
	{ "", 0 }, { "default", 7 }, { "bwrap", 5 }, { "python3", 7 }, { "/usr/bin/python3", 16 },
	{ "a\0b", 3 }, { "\xff\xfe", 2 }, { "print(1)", 8 }, { "PATH", 4 }, { "/nonexistent", 12 },
	{ "x=y", 3 }, { "\xed\xa0\x80", 3 }, { "\0", 1 },
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int called_function(lua_State *l)
{
	return luaL_error(l, "fuzz: a function given as an option value was called");
}

static void push_random_string(struct src *s, size_t max)
{
	char buf[32];
	size_t len = byte(s) % (max + 1), k;

	for (k = 0; k < len; k++)
		buf[k] = (char)byte(s);
	lua_pushlstring(L, buf, len);
}

/* A key: a real option name (often) or a short random string. */
static void push_name(struct src *s)
{
	uint8_t b = byte(s);

	if (b < 200) {
		lua_rawgeti(L, LUA_REGISTRYINDEX, names_ref);
		lua_rawgeti(L, -1, (lua_Integer)(b % nnames) + 1);
		lua_remove(L, -2);
	} else {
		push_random_string(s, 12);
	}
}

static void push_value(struct src *s, int depth);

/* A table with keys of any type (names too) and values of any type. */
static void push_table(struct src *s, int depth, int string_keys)
{
	int n = byte(s) % 6, k;

	lua_createtable(L, 0, n);
	for (k = 0; k < n; k++) {
		uint8_t how = byte(s);

		if (string_keys || how % 4 == 0)
			push_name(s);
		else if (how % 4 == 1)
			lua_pushinteger(L, (lua_Integer)(int8_t)byte(s));
		else if (how % 4 == 2)
			push_random_string(s, 8);
		else
			push_value(s, depth + 1);
		/* nil and NaN cannot be keys */
		if (lua_isnil(L, -1) || (lua_type(L, -1) == LUA_TNUMBER && !lua_isinteger(L, -1) &&
					 isnan(lua_tonumber(L, -1)))) {
			lua_pop(L, 1);
			continue;
		}
		if (string_keys && how % 3 == 0)
			push_random_string(s, 16);      /* env-like: a string value */
		else
			push_value(s, depth + 1);
		lua_rawset(L, -3);
	}
}

static void push_value(struct src *s, int depth)
{
	uint8_t tag = byte(s);
	double d;
	uint64_t bits;

	switch (tag % 16) {
	case 0:
		lua_pushboolean(L, tag & 0x10);
		break;
	case 1:
		lua_pushinteger(L, (lua_Integer)(int8_t)byte(s));
		break;
	case 2:
		lua_pushinteger(L, (lua_Integer)u64(s));
		break;
	case 3:
		bits = u64(s);
		memcpy(&d, &bits, sizeof d);
		lua_pushnumber(L, d);
		break;
	case 4:
		lua_pushnumber(L, special_doubles[byte(s) % COUNT(special_doubles)]);
		break;
	case 5:         /* fractional */
		d = (double)i16(s);
		lua_pushnumber(L, d / (double)(1 + byte(s) % 16));
		break;
	case 6:         /* a whole number as a float */
		lua_pushnumber(L, (double)i16(s));
		break;
	case 7:
		push_random_string(s, 24);
		break;
	case 8: {
		size_t k = byte(s) % COUNT(special_strings);

		lua_pushlstring(L, special_strings[k].s, special_strings[k].len);
		break;
	}
	case 9:
		if (depth < 3)
			push_table(s, depth, 0);
		else
			lua_pushinteger(L, depth);
		break;
	case 10:        /* env-like: names to strings, mostly */
		if (depth < 3)
			push_table(s, depth, 1);
		else
			lua_pushliteral(L, "deep");
		break;
	case 11:
		lua_pushcfunction(L, called_function);
		break;
	case 12:
		lua_newuserdatauv(L, 1, 0);
		break;
	case 13:
		lua_newthread(L);
		break;
	case 14:
		lua_pushinteger(L, special_ints[byte(s) % COUNT(special_ints)]);
		break;
	default:
		lua_pushnil(L);
		break;
	}
}

/* ---- checks ---- */

/* Calls checks[fn](args...) with the nargs values on top of the stack; aborts on a message. */
static void check(const char *fn, int nargs, const char *what)
{
	int base = lua_gettop(L) - nargs;

	lua_rawgeti(L, LUA_REGISTRYINDEX, checks_ref);
	lua_getfield(L, -1, fn);
	lua_remove(L, -2);
	lua_insert(L, base + 1);
	if (lua_pcall(L, nargs, 1, 0) != LUA_OK) {
		fprintf(stderr, "fuzz/lua_checks.lua %s raised: %s\n", fn, lua_tostring(L, -1));
		abort();
	}
	if (!lua_isnil(L, -1)) {
		fprintf(stderr, "%s (%s): %s\n", fn, what, lua_tostring(L, -1));
		abort();
	}
	lua_pop(L, 1);
}

static void check_options(int t, const char *what, const char *schema)
{
	lua_pushstring(L, what);
	lua_pushvalue(L, t);
	lua_rawgeti(L, LUA_REGISTRYINDEX, options_ref);
	lua_getfield(L, -1, schema);
	lua_remove(L, -2);
	check("options", 3, what);
}

static const char *root_dir(void)
{
	const char *r = getenv("CORRAL_ROOT");

	return r && *r ? r : CORRAL_ROOT;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *root = root_dir();

	(void)argc;
	(void)argv;
	print_options = getenv("CORRAL_FUZZ_PRINT") != NULL;
	L = luaL_newstate();
	if (!L)
		abort();
	luaL_openlibs(L);
	lua_getglobal(L, "package");
	lua_pushfstring(L, "%s/lua/?.lua;%s/fuzz/?.lua", root, root);
	lua_setfield(L, -2, "path");
	lua_pushliteral(L, "");
	lua_setfield(L, -2, "cpath");
	lua_pop(L, 1);
	lua_getglobal(L, "require");
	lua_pushliteral(L, "lua_checks");
	if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
		fprintf(stderr, "fuzz: cannot load fuzz/lua_checks.lua under %s: %s\n", root,
			lua_tostring(L, -1));
		abort();
	}
	lua_getfield(L, -1, "option_names");
	lua_call(L, 0, 1);
	nnames = (int)luaL_len(L, -1);
	if (nnames < 1)
		abort();
	names_ref = luaL_ref(L, LUA_REGISTRYINDEX);
	checks_ref = luaL_ref(L, LUA_REGISTRYINDEX);
	lua_getglobal(L, "require");
	lua_pushliteral(L, "corral.options");
	lua_call(L, 1, 1);
	options_ref = luaL_ref(L, LUA_REGISTRYINDEX);

	/* once: parse() of what is not a string; check() of no table at all */
	lua_pushnil(L);
	check("report", 1, "nil");
	lua_pushinteger(L, 3);
	check("report", 1, "a number");
	lua_pushnil(L);
	check_options(lua_gettop(L), "run_python", "run_schema");
	lua_pop(L, 1);

	lua_sethook(L, line_hook, LUA_MASKLINE, 0);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct src s = { data, size, 0 };
	int t, n, k;
	clock_t t0;
	double secs;

	if (!L)
		LLVMFuzzerInitialize(NULL, NULL);
	cov_prev = 0;

	/* (a) the report; linear time: the host parses up to 64 KiB in its event loop, so a
	 * parse that takes seconds (a backtracking pattern) stalls every run */
	t0 = clock();
	lua_pushlstring(L, (const char *)data, size);
	check("report", 1, "report.parse");
	secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
	FUZZ_CHECK(secs < 2.0, "report.parse took %.1f s of CPU for %zu bytes", secs, size);

	/* (b) an options table: up to 8 entries, keys mostly real names */
	n = byte(&s) % 9;
	lua_createtable(L, 0, n);
	t = lua_gettop(L);
	for (k = 0; k < n; k++) {
		push_name(&s);
		push_value(&s, 1);
		if (lua_isnil(L, -1))
			lua_pop(L, 2);
		else
			lua_rawset(L, t);
	}
	if (print_options) {
		lua_rawgeti(L, LUA_REGISTRYINDEX, checks_ref);
		lua_getfield(L, -1, "dump");
		lua_pushvalue(L, t);
		lua_call(L, 1, 1);
		fprintf(stderr, "options: %s\n", lua_tostring(L, -1));
		lua_pop(L, 2);
	}
	check_options(t, "run_python", "run_schema");
	check_options(t, "eval_in_sandbox", "eval_schema");
	/* each entry alone */
	lua_pushnil(L);
	while (lua_next(L, t)) {
		lua_createtable(L, 0, 1);
		lua_pushvalue(L, -3);
		lua_pushvalue(L, -3);
		lua_rawset(L, -3);
		check_options(lua_gettop(L), "run_python", "run_schema");
		check_options(lua_gettop(L), "eval_in_sandbox", "eval_schema");
		lua_pop(L, 2);
	}
	lua_settop(L, 0);
	return 0;
}
