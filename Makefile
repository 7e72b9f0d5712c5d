# corral — build, test, install.
# Honours CC CFLAGS LDFLAGS PREFIX DESTDIR; finds Lua 5.4, libuv and libseccomp with pkg-config.

PREFIX  ?= /usr/local
DESTDIR ?=
LUA     ?= lua5.4
LUA_PC  ?= lua5.4
PKG_CONFIG ?= pkg-config

BINDIR  ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec/corral
LUADIR  ?= $(PREFIX)/share/lua/5.4
LIBDIR  ?= $(PREFIX)/lib/lua/5.4
DATADIR ?= $(PREFIX)/share/corral

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes -Wstrict-prototypes
LUA_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(LUA_PC) 2>/dev/null)
UV_CFLAGS  := $(shell $(PKG_CONFIG) --cflags libuv 2>/dev/null)
UV_LIBS    := $(shell $(PKG_CONFIG) --libs libuv 2>/dev/null)
# the launcher's seccomp filter (csrc/launch/seccomp.c)
SECCOMP_CFLAGS := $(shell $(PKG_CONFIG) --cflags libseccomp 2>/dev/null)
SECCOMP_LIBS   := $(or $(shell $(PKG_CONFIG) --libs libseccomp 2>/dev/null),-lseccomp)

# Debian packages each target needs; installed when run as root, printed otherwise.
BUILD_PKGS := gcc make pkg-config lua5.4 liblua5.4-dev libuv1-dev libseccomp-dev
TEST_PKGS  := $(BUILD_PKGS) lua-busted lua-cjson python3 bubblewrap util-linux procps luarocks valgrind lua-check
RUN_PKGS   := $(BUILD_PKGS) libseccomp2 lua-cjson python3 bubblewrap

LAUNCH_SRC := $(wildcard csrc/launch/*.c)
LAUNCH_HDR := $(wildcard csrc/launch/*.h)
CORE_SRC   := $(wildcard csrc/core/*.c)
CORE_HDR   := $(wildcard csrc/core/*.h)

LAUNCHER := csrc/corral-launch
CORE_SO  := csrc/corral/core.so

.PHONY: all test run install clean bench soak deps-build deps-test deps-run asan

all: $(LAUNCHER) $(CORE_SO)

$(LAUNCHER): $(LAUNCH_SRC) $(LAUNCH_HDR)
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE $(SECCOMP_CFLAGS) -o $@ $(LAUNCH_SRC) $(LDFLAGS) \
		$(SECCOMP_LIBS)

$(CORE_SO): $(CORE_SRC) $(CORE_HDR)
	@mkdir -p csrc/corral
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE -fPIC -shared $(LUA_CFLAGS) $(UV_CFLAGS) \
		-o $@ $(CORE_SRC) $(LDFLAGS) $(UV_LIBS)

# deps-*: install the Debian packages a target needs (as root), or print the exact command.
deps-build deps-test deps-run:
	@pkgs="$(if $(filter deps-build,$@),$(BUILD_PKGS),$(if $(filter deps-test,$@),$(TEST_PKGS),$(RUN_PKGS)))"; \
	missing=""; for p in $$pkgs; do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
		else \
			echo "missing Debian packages; run as root:"; \
			echo "  apt-get install -y$$missing"; exit 1; \
		fi; \
	fi

test: deps-test
	@$(MAKE) --no-print-directory all
	@sh spec/run.sh

run: deps-run
	@$(MAKE) --no-print-directory all
	$(LUA) bin/corral run examples/model_program.py

# The C code under AddressSanitizer and UBSan, built apart in build/asan (the tree's own build
# stays as it is), driving the same real runs as the valgrind check.
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
asan: deps-test
	@mkdir -p build/asan/corral
	$(CC) $(ASAN_FLAGS) $(WARN) -D_GNU_SOURCE $(SECCOMP_CFLAGS) -o build/asan/corral-launch \
		$(LAUNCH_SRC) $(SECCOMP_LIBS)
	$(CC) $(ASAN_FLAGS) $(WARN) -D_GNU_SOURCE -fPIC -shared $(LUA_CFLAGS) $(UV_CFLAGS) \
		-o build/asan/corral/core.so $(CORE_SRC) $(UV_LIBS)
	CORRAL_LAUNCH=build/asan/corral-launch CORRAL_CPATH="build/asan/?.so" ASAN_OPTIONS=detect_leaks=0 \
		LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
		$(LUA) spec/valgrind_runs.lua && echo "asan: zero errors"

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(LUADIR)/corral \
		$(DESTDIR)$(LIBDIR)/corral $(DESTDIR)$(DATADIR)/policies
	install -m 0755 $(LAUNCHER) $(DESTDIR)$(LIBEXECDIR)/corral-launch
	install -m 0755 $(CORE_SO) $(DESTDIR)$(LIBDIR)/corral/core.so
	install -m 0644 lua/corral/*.lua $(DESTDIR)$(LUADIR)/corral/
	install -m 0644 policies/*.lua $(DESTDIR)$(DATADIR)/policies/
	sed -e 's|^local INSTALLED_PREFIX = nil|local INSTALLED_PREFIX = "$(PREFIX)"|' \
		lua/corral/paths.lua > $(DESTDIR)$(LUADIR)/corral/paths.lua
	sed -e '1s|.*|#!/usr/bin/env $(LUA)|' bin/corral > $(DESTDIR)$(BINDIR)/corral
	chmod 0755 $(DESTDIR)$(BINDIR)/corral

clean:
	rm -f $(LAUNCHER) $(CORE_SO)
	rm -rf build

bench: all
	$(LUA) bench/latency.lua 50

# 5000 runs at concurrency 8, well-behaved and hostile mixed; then no extra fd, process or run
# dir, and controller RSS growth under 5 MB. `make test` runs a shorter one (SOAK_RUNS=500).
SOAK_RUNS ?= 5000
SOAK_CONCURRENCY ?= 8
soak: all
	$(LUA) bench/soak.lua $(SOAK_RUNS) $(SOAK_CONCURRENCY)
