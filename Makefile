# corral — build, test, install.
# Honours CC CFLAGS LDFLAGS PREFIX DESTDIR; finds Lua 5.4, libuv, libseccomp and the embeddable
# libpython3.11 (corral-zygote only) with pkg-config; http-parser (no .pc file in Debian) is
# linked as -lhttp_parser.

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
SECCOMP_LIBS   := $(or $(shell $(PKG_CONFIG) --static --libs libseccomp 2>/dev/null),-lseccomp)
# the zygote links libseccomp dynamically (it links libpython dynamically anyway), with -z now:
# its spawner unmaps libpython, so no symbol may be looked up lazily after start-up (spawner.c)
SECCOMP_DYN_LIBS := $(or $(shell $(PKG_CONFIG) --libs libseccomp 2>/dev/null),-lseccomp)
# The launcher runs once per run: linked as a static PIE (glibc's libc.a and rcrt1.o from
# libc6-dev, libseccomp.a from libseccomp-dev) it starts without the dynamic loader, about 0.3 ms
# less per run. LAUNCH_LINK= links it dynamically. valgrind cannot follow a static glibc (its
# own start-up reads as errors): spec/valgrind.sh checks build/dyn/corral-launch, the same
# sources linked dynamically.
LAUNCH_LINK ?= -static-pie
DYN_LAUNCHER := build/dyn/corral-launch
# corral-zygote embeds the interpreter (python-3.11-embed.pc from libpython3.11-dev); its headers
# as system headers, so that the warnings above apply to our code only. corral-launch must not
# link it: its exec cost is on every run.
PY_PC      ?= python-3.11-embed
PY_CFLAGS  := $(patsubst -I%,-isystem %,$(shell $(PKG_CONFIG) --cflags $(PY_PC) 2>/dev/null))
PY_LIBS    := $(or $(shell $(PKG_CONFIG) --libs $(PY_PC) 2>/dev/null),-lpython3.11)
# the host module's HTTP server (csrc/core/http.c): nodejs http-parser 2.9
HTTP_PARSER_CFLAGS ?=
HTTP_PARSER_LIBS   ?= -lhttp_parser

# Debian packages each target needs; installed when run as root, printed otherwise.
BUILD_PKGS := gcc libc6-dev make pkg-config lua5.4 liblua5.4-dev libuv1-dev libseccomp-dev libhttp-parser-dev \
	libpython3.11-dev musl-tools
TEST_PKGS  := $(BUILD_PKGS) lua-busted lua-cjson python3 bubblewrap util-linux procps luarocks valgrind lua-check \
	curl nginx libnginx-mod-http-lua lua-resty-core python3-yaml shellcheck wrk python3-numpy \
	python3-venv python3-matplotlib
RUN_PKGS   := $(BUILD_PKGS) libseccomp2 libhttp-parser2.9 libpython3.11 lua-cjson python3 bubblewrap
# libFuzzer: clang (Debian 12: clang-14) and its runtime libclang_rt.fuzzer (libclang-rt-14-dev)
FUZZ_PKGS  := $(BUILD_PKGS) clang libclang-rt-14-dev

LAUNCH_SRC := $(wildcard csrc/launch/*.c)
LAUNCH_HDR := $(wildcard csrc/launch/*.h)
CORE_SRC   := $(wildcard csrc/core/*.c)
CORE_HDR   := $(wildcard csrc/core/*.h) csrc/zygote/protocol.h csrc/launch/records.h
ZYGOTE_SRC := $(wildcard csrc/zygote/*.c)
ZYGOTE_HDR := $(LAUNCH_HDR) $(wildcard csrc/zygote/*.h)

# The launcher's steps (csrc/launch but main.c), compiled once into an archive that the three
# programs link: corral-launch (with its main.c), corral-zygote and corral-init each take the
# members they use, as the linker picks them.
STEP_SRC := $(filter-out csrc/launch/main.c,$(LAUNCH_SRC))
STEPS    := build/steps/libsteps.a

# corral-init, the init a direct warm run execs into (csrc/init/main.c): every warm run starts
# it, so it is small and static; against musl libc (musl-tools) its execve and exit take about
# 90 us on the development VM, against a static glibc's 350. musl brings no kernel headers: the
# system's (linux-libc-dev) come after its own. Without musl-gcc: $(CC), static, and $(STEPS).
MUSL_CC  ?= $(shell command -v musl-gcc 2>/dev/null)
INIT_CC  := $(or $(MUSL_CC),$(CC))
INIT_STEPS := $(if $(MUSL_CC),build/steps-musl/libsteps.a,$(STEPS))
MUSL_KERNEL_HDRS := -idirafter /usr/include $(addprefix -idirafter /usr/include/,$(shell $(CC) \
	-print-multiarch 2>/dev/null))

LAUNCHER := csrc/corral-launch
ZYGOTE   := csrc/corral-zygote
INIT     := csrc/corral-init
CORE_SO  := csrc/corral/core.so

.PHONY: all check test test-containers run install clean bench bench-rss bench-zygote soak loadtest deps-build deps-test deps-run \
	deps-fuzz asan fuzz fuzz-build fuzz-replay replay-build

all: $(LAUNCHER) $(ZYGOTE) $(INIT) $(CORE_SO)

build/steps/%.o: csrc/launch/%.c $(LAUNCH_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE $(SECCOMP_CFLAGS) -c -o $@ $<

build/steps-musl/%.o: csrc/launch/%.c $(LAUNCH_HDR)
	@mkdir -p $(@D)
	$(INIT_CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE $(MUSL_KERNEL_HDRS) -c -o $@ $<

build/steps/libsteps.a: $(STEP_SRC:csrc/launch/%.c=build/steps/%.o)
	rm -f $@
	$(AR) rcs $@ $^

build/steps-musl/libsteps.a: $(STEP_SRC:csrc/launch/%.c=build/steps-musl/%.o)
	rm -f $@
	$(AR) rcs $@ $^

$(INIT): csrc/init/main.c $(INIT_STEPS) $(LAUNCH_HDR)
	$(INIT_CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE -static -o $@ csrc/init/main.c $(INIT_STEPS) $(LDFLAGS)

$(LAUNCHER): csrc/launch/main.c $(STEPS) $(LAUNCH_HDR)
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE $(SECCOMP_CFLAGS) $(LAUNCH_LINK) -o $@ csrc/launch/main.c \
		$(STEPS) $(LDFLAGS) $(SECCOMP_LIBS)

$(DYN_LAUNCHER): csrc/launch/main.c $(STEPS) $(LAUNCH_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE $(SECCOMP_CFLAGS) -o $@ csrc/launch/main.c $(STEPS) \
		$(LDFLAGS) $(SECCOMP_LIBS)

$(ZYGOTE): $(ZYGOTE_SRC) $(STEPS) $(ZYGOTE_HDR)
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE $(SECCOMP_CFLAGS) $(PY_CFLAGS) -o $@ $(ZYGOTE_SRC) \
		$(STEPS) $(LDFLAGS) -Wl,-z,now $(SECCOMP_DYN_LIBS) $(PY_LIBS)

$(CORE_SO): $(CORE_SRC) $(CORE_HDR)
	@mkdir -p csrc/corral
	$(CC) $(CFLAGS) $(WARN) -D_GNU_SOURCE -fPIC -shared $(LUA_CFLAGS) $(UV_CFLAGS) \
		$(HTTP_PARSER_CFLAGS) -o $@ $(CORE_SRC) $(LDFLAGS) $(UV_LIBS) $(HTTP_PARSER_LIBS)

# deps-*: install the Debian packages a target needs (as root), or print the exact command.
# apt-get -q writes its log lines (Get:, Unpacking, Setting up) without the progress bars that
# garble a log; Dpkg::Progress-Fancy=0 drops dpkg's status-line bar.
deps-build deps-test deps-run deps-fuzz:
	@pkgs="$(if $(filter deps-build,$@),$(BUILD_PKGS),$(if $(filter deps-test,$@),$(TEST_PKGS),$(if $(filter deps-fuzz,$@),$(FUZZ_PKGS),$(RUN_PKGS))))"; \
	missing=""; for p in $$pkgs; do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "== installing Debian packages for $@ (apt-get update, then install; it can take minutes):"; \
			echo "  $$missing"; \
			apt-get -q update && DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Progress-Fancy=0 \
				install $$missing || exit 1; \
			echo "== installed:$$missing"; \
		else \
			echo "missing Debian packages; run as root:"; \
			echo "  apt-get install -y$$missing"; exit 1; \
		fi; \
	fi

test: deps-test
	@$(MAKE) --no-print-directory all
	@sh spec/run.sh

# The edit-test loop: luacheck and the specs tagged #fast (no run of a sandboxed program but the
# few that check an option is refused before anything starts), well under a minute.
check: all
	@luacheck --no-color -q lua bin/corral policies examples spec bench fuzz
	@$(LUA) /usr/bin/busted --tags=fast spec

# corral in real containers (spec/containers.sh, deploy/README.md "The container test"): a Docker
# daemon of its own (docker.io, runsc, debootstrap: installed when missing), an image built from
# deploy/Dockerfile on a base made by debootstrap, then deploy/README.md's `docker run` with the
# shipped seccomp profile, Docker's default profile and gVisor, under default, warm and bwrap.
# Root only (otherwise it says what it needs and counts itself skipped). Warm (base and image
# cached in /var/cache/corral-containers): 11 min 8 s on the 2-CPU development VM under a load
# average of 8 to 9; cold adds debootstrap and the image build.
test-containers: all
	@sh spec/containers.sh

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
		$(HTTP_PARSER_CFLAGS) -o build/asan/corral/core.so $(CORE_SRC) $(UV_LIBS) $(HTTP_PARSER_LIBS)
	CORRAL_LAUNCH=build/asan/corral-launch CORRAL_CPATH="build/asan/?.so" ASAN_OPTIONS=detect_leaks=0 \
		LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
		$(LUA) spec/valgrind_runs.lua && echo "asan: zero errors"

# Fuzzing (fuzz/, docs/testing.md): one libFuzzer harness per parser of untrusted input. `make
# fuzz` builds them with clang into build/fuzz and runs each for FUZZ_SECONDS on a scratch copy
# of its corpus (build/fuzz/corpus/T, kept between runs; fuzz/corpus and fuzz/regress are only
# read); a crash stops it, non-zero, with the input in build/fuzz/artifacts. `make fuzz-replay`
# runs the committed inputs once through the same harnesses built with $(REPLAY_CC) and its
# sanitizers instead of libFuzzer (spec/fuzz_spec.lua does it in `make test`).
FUZZ_CC      ?= clang
REPLAY_CC    ?= gcc
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := plan utf8 lua records
FUZZ_DIR     ?= build/fuzz
REPLAY_DIR   ?= build/replay
FUZZ_SAN     := -g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all
LUA_LIBS     := $(shell $(PKG_CONFIG) --libs $(LUA_PC) 2>/dev/null)
# per harness: sources beside fuzz/T.c, flags, libraries, libFuzzer options
FUZZ_SRC_plan   := csrc/launch/plan.c
FUZZ_HDR_plan   := csrc/launch/plan.h
FUZZ_SRC_utf8   := csrc/core/utf8.c
FUZZ_FLAGS_utf8 := -DCORRAL_UTF8_NO_LUA
FUZZ_FLAGS_lua  := $(LUA_CFLAGS) -DCORRAL_ROOT='"$(CURDIR)"'
FUZZ_LIBS_lua   := $(LUA_LIBS)
# records.c alone: the Lua API, and libuv's headers only (core.h)
FUZZ_SRC_records   := csrc/core/records.c
FUZZ_HDR_records   := csrc/core/core.h csrc/launch/records.h
FUZZ_FLAGS_records := $(LUA_CFLAGS) $(UV_CFLAGS)
FUZZ_LIBS_records  := $(LUA_LIBS)
FUZZ_ARGS_plan  := -max_len=9000 -dict=fuzz/plan.dict
FUZZ_ARGS_lua   := -max_len=4096 -dict=fuzz/lua.dict

fuzz: deps-fuzz
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=fuzz-%)

fuzz-build: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/%)

.PHONY: $(FUZZ_TARGETS:%=fuzz-%)
$(FUZZ_TARGETS:%=fuzz-%): fuzz-%: $(FUZZ_DIR)/%
	@mkdir -p $(FUZZ_DIR)/corpus/$* $(FUZZ_DIR)/artifacts
	@cp -n fuzz/corpus/$*/* fuzz/regress/$*/* $(FUZZ_DIR)/corpus/$*/ 2>/dev/null || true
	@echo "== fuzz $* for $(FUZZ_SECONDS) s"
	$(FUZZ_DIR)/$* -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 \
		-artifact_prefix=$(FUZZ_DIR)/artifacts/$*- $(FUZZ_ARGS_$*) $(FUZZ_DIR)/corpus/$*

replay-build: $(FUZZ_TARGETS:%=$(REPLAY_DIR)/%)

fuzz-replay: replay-build
	@for t in $(FUZZ_TARGETS); do \
		echo "== replay $$t"; \
		$(REPLAY_DIR)/$$t $$(ls -d fuzz/corpus/$$t fuzz/regress/$$t 2>/dev/null) || exit 1; \
	done

.SECONDEXPANSION:
$(FUZZ_TARGETS:%=$(FUZZ_DIR)/%): $(FUZZ_DIR)/%: fuzz/%.c fuzz/fuzz.h $$(FUZZ_SRC_$$*) $$(FUZZ_HDR_$$*)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer,address,undefined $(WARN) -D_GNU_SOURCE \
		$(FUZZ_FLAGS_$*) -o $@ fuzz/$*.c $(FUZZ_SRC_$*) $(FUZZ_LIBS_$*)

$(FUZZ_TARGETS:%=$(REPLAY_DIR)/%): $(REPLAY_DIR)/%: fuzz/%.c fuzz/replay.c fuzz/fuzz.h $$(FUZZ_SRC_$$*) \
		$$(FUZZ_HDR_$$*)
	@mkdir -p $(@D)
	$(REPLAY_CC) $(FUZZ_SAN) -fsanitize=address,undefined $(WARN) -D_GNU_SOURCE \
		$(FUZZ_FLAGS_$*) -o $@ fuzz/$*.c fuzz/replay.c $(FUZZ_SRC_$*) $(FUZZ_LIBS_$*)

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(LUADIR)/corral \
		$(DESTDIR)$(LIBDIR)/corral $(DESTDIR)$(DATADIR)/policies
	install -m 0755 $(LAUNCHER) $(DESTDIR)$(LIBEXECDIR)/corral-launch
	install -m 0755 $(ZYGOTE) $(DESTDIR)$(LIBEXECDIR)/corral-zygote
	install -m 0755 $(INIT) $(DESTDIR)$(LIBEXECDIR)/corral-init
	install -m 0755 $(CORE_SO) $(DESTDIR)$(LIBDIR)/corral/core.so
	install -m 0644 lua/corral/*.lua $(DESTDIR)$(LUADIR)/corral/
	install -m 0644 policies/*.lua $(DESTDIR)$(DATADIR)/policies/
	install -d $(DESTDIR)$(PREFIX)/share/lua/5.1/resty
	install -m 0644 lua/resty/corral.lua $(DESTDIR)$(PREFIX)/share/lua/5.1/resty/corral.lua
	sed -e 's|^local INSTALLED_PREFIX = nil|local INSTALLED_PREFIX = "$(PREFIX)"|' \
		lua/corral/paths.lua > $(DESTDIR)$(LUADIR)/corral/paths.lua
	sed -e '1s|.*|#!/usr/bin/env $(LUA)|' \
		-e 's|^local INSTALLED_LUADIR, INSTALLED_LIBDIR = nil, nil|local INSTALLED_LUADIR, INSTALLED_LIBDIR = "$(LUADIR)", "$(LIBDIR)"|' \
		bin/corral > $(DESTDIR)$(BINDIR)/corral
	chmod 0755 $(DESTDIR)$(BINDIR)/corral

clean:
	rm -f $(LAUNCHER) $(ZYGOTE) $(INIT) $(CORE_SO)
	rm -rf build

# bench/bench.lua: bare Python against corral (default, bwrap, warm when present) through the
# library, `corral run` and `corral serve` (wrk on loopback TCP): latency median/p99 and ratios,
# runs/s at concurrency 1, 2, 8 with the controller's CPU per run, controller RSS, and the
# performance targets with PASS/MISS. About 2-3 minutes on 2 cores. BENCH_JSON=FILE also writes the figures
# as JSON. `make bench-rss` runs only the RSS series, 10,000 runs unless RSS_RUNS says otherwise.
BENCH_N ?= 100
THROUGHPUT_RUNS ?= 300
SERVE_SECONDS ?= 5
RSS_RUNS ?= 2000
BENCH_JSON ?=
# the page make bench writes: the method (bench/performance-head.md) and this run's figures
BENCH_DOC ?= docs/performance.md
bench: all deps-test
	$(LUA) bench/bench.lua --runs $(BENCH_N) --throughput-runs $(THROUGHPUT_RUNS) \
		--serve-seconds $(SERVE_SECONDS) --rss-runs $(RSS_RUNS) $(if $(BENCH_JSON),--json $(BENCH_JSON)) \
		--doc $(BENCH_DOC)

bench-rss: all deps-test
	$(LUA) bench/bench.lua --only rss \
		--rss-runs $(if $(filter command line environment,$(origin RSS_RUNS)),$(RSS_RUNS),10000) \
		$(if $(BENCH_JSON),--json $(BENCH_JSON))

# a warm run of corral-zygote (the default policy's plan) against bare python3, interleaved
bench-zygote: all deps-test
	$(LUA) bench/zygote.lua 200

# wrk against corral serve on loopback for 30 s at 64 connections: requests/s, p50/p99, rejects,
# controller RSS, processes left.
loadtest: all deps-test
	sh bench/loadtest.sh 30 64

# 5000 runs at concurrency 8, well-behaved and hostile mixed; then no extra fd, process or run
# dir, and controller RSS growth under 5 MB. `make test` runs a shorter one (SOAK_RUNS=500).
SOAK_RUNS ?= 5000
SOAK_CONCURRENCY ?= 8
soak: all
	$(LUA) bench/soak.lua $(SOAK_RUNS) $(SOAK_CONCURRENCY)
