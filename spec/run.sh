#!/bin/sh
# The test suite: busted as the current user, again as an unprivileged user when run as root
# (most users run corral without root), and the C code under valgrind. Ends with one line
# "N passed, M failed".
set -u
cd "$(dirname "$0")/.." || exit 1
LUA=${LUA:-lua5.4}
BUSTED="$LUA /usr/bin/busted"
passed=0
failed=0
log=$(mktemp -d /tmp/corral-test-log.XXXXXX)
# spec/unix_sockets_spec.lua's host sockets: a sticky world-writable directory outside the
# directories each run replaces, made by root for both passes
sockdir=/var/lib/corral-spec
made_sockdir=
if [ "$(id -u)" = 0 ] && [ ! -e "$sockdir" ]; then
  mkdir -p "$sockdir" && chmod 1777 "$sockdir" && made_sockdir=1
fi
nobody_pid=
copy=
trap '[ -n "$nobody_pid" ] && pkill -KILL -f "$copy/spec"; rm -rf "$log" ${copy:+"$copy"}; [ -n "$made_sockdir" ] && rm -rf "$sockdir"' EXIT

# count TAP lines: "ok N - ..." passes (pending ones too, marked # SKIP), "not ok N" fails
tally() {
  p=$(grep -c '^ok ' "$1")
  f=$(grep -c '^not ok ' "$1")
  passed=$((passed + p))
  failed=$((failed + f))
  echo "== $2: $p passed, $f failed"
}

# As root the suite also runs as nobody, from a copy of the tree nobody can read, at the same time
# as root's pass (spec/helper.lua: each pass judges only the processes and run dirs of its own
# uid), on a machine both passes load; CORRAL_TEST_SERIAL=1 runs nobody's after root's.
both=
[ "$(id -u)" = 0 ] && [ "${CORRAL_SKIP_UNPRIVILEGED:-}" = "" ] && both=1
# the hostile programs as session cells: the default base in root's pass and warm in nobody's
# when there is one, both here otherwise
bases="default warm"
[ -n "$both" ] && bases=default
if [ -n "$both" ]; then
  copy=$(mktemp -d /tmp/corral-test-tree.XXXXXX)
  cp -a . "$copy/"
  chmod -R a+rX "$copy"
  chmod 0755 "$copy"
  nobody() {
    (cd "$copy" && setpriv --reuid nobody --regid nogroup --clear-groups --reset-env \
        env HOME=/tmp CORRAL_HOSTILE_SESSION_BASES=warm $BUSTED -o TAP "$copy/spec") > "$log/nobody.tap" 2>&1
  }
  if [ -z "${CORRAL_TEST_SERIAL:-}" ]; then
    echo "== busted as nobody, meanwhile"
    nobody &
    nobody_pid=$!
  fi
fi

echo "== busted as $(id -un) (uid $(id -u))"
CORRAL_HOSTILE_SESSION_BASES=${CORRAL_HOSTILE_SESSION_BASES:-$bases} $BUSTED -o TAP spec > "$log/self.tap" 2>&1
cat "$log/self.tap"
tally "$log/self.tap" "as $(id -un)"
# a crash of busted itself must count as a failure
grep -q '^1\.\.' "$log/self.tap" || failed=$((failed + 1))

if [ -n "$both" ]; then
  if [ -n "$nobody_pid" ]; then
    wait "$nobody_pid"
    nobody_pid=
  else
    nobody
  fi
  echo "== busted as nobody"
  cat "$log/nobody.tap"
  tally "$log/nobody.tap" "as nobody"
  grep -q '^1\.\.' "$log/nobody.tap" || failed=$((failed + 1))
fi

echo "== soak: ${SOAK_RUNS:-500} runs at concurrency 8"
if $LUA bench/soak.lua "${SOAK_RUNS:-500}" 8 > "$log/soak.log" 2>&1; then
  passed=$((passed + 1)); cat "$log/soak.log"; echo "ok - soak"
else
  failed=$((failed + 1)); cat "$log/soak.log"; echo "not ok - soak"
fi

echo "== luacheck"
if luacheck --no-color -q lua bin/corral policies examples spec bench fuzz > "$log/luacheck.log" 2>&1; then
  passed=$((passed + 1)); echo "ok - luacheck: no warnings"
else
  failed=$((failed + 1)); cat "$log/luacheck.log"; echo "not ok - luacheck"
fi

if command -v valgrind >/dev/null 2>&1; then
  echo "== valgrind: host module and launcher"
  if sh spec/valgrind.sh > "$log/valgrind.log" 2>&1; then
    passed=$((passed + 1)); echo "ok - valgrind: zero errors"
  else
    failed=$((failed + 1)); cat "$log/valgrind.log"; echo "not ok - valgrind reported errors"
  fi
fi

echo "== AddressSanitizer + UBSan: host module and launcher"
if make -s asan > "$log/asan.log" 2>&1; then
  passed=$((passed + 1)); echo "ok - asan: zero errors"
else
  failed=$((failed + 1)); cat "$log/asan.log"; echo "not ok - asan reported errors"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
