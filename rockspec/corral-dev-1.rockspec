rockspec_format = "3.0"
package = "corral"
version = "dev-1"
source = {
  url = "git+file:///corral",
}
description = {
  summary = "Run untrusted, model-written Python under hard limits, and report exactly what happened",
  detailed = [[
corral is an embeddable sandbox controller: a C host on libuv spawns a small launcher that applies
namespaces, a per-run uid, rlimits, no_new_privs and a clean environment before the interpreter's
first instruction; Lua policies decide defaults, fallbacks and result formatting.
]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.4",
}
external_dependencies = {
  LIBUV = { header = "uv.h" },
  LIBSECCOMP = { header = "seccomp.h", library = "seccomp" },   -- the launcher's seccomp filter
  HTTP_PARSER = { header = "http_parser.h", library = "http_parser" }, -- core.http_listen
  PYTHON = { header = "python3.11/Python.h", library = "python3.11" },  -- corral-zygote embeds it
}
build = {
  type = "make",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LUA_CFLAGS = "-I$(LUA_INCDIR)",
    UV_CFLAGS = "-I$(LIBUV_INCDIR)",
    UV_LIBS = "-L$(LIBUV_LIBDIR) -luv",
    SECCOMP_CFLAGS = "-I$(LIBSECCOMP_INCDIR)",
    SECCOMP_LIBS = "-L$(LIBSECCOMP_LIBDIR) -lseccomp",
    HTTP_PARSER_CFLAGS = "-I$(HTTP_PARSER_INCDIR)",
    HTTP_PARSER_LIBS = "-L$(HTTP_PARSER_LIBDIR) -lhttp_parser",
    PY_CFLAGS = "-isystem $(PYTHON_INCDIR)/python3.11",
    PY_LIBS = "-L$(PYTHON_LIBDIR) -lpython3.11",
  },
  install_variables = {
    PREFIX = "$(PREFIX)",
    BINDIR = "$(BINDIR)",
    LUADIR = "$(LUADIR)",
    LIBDIR = "$(LIBDIR)",
  },
}
test = {
  type = "busted",
}
