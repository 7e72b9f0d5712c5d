#!/bin/sh
# The host module and the launcher under valgrind: a few real runs (normal, timeout, output
# flood, stdin, bad interpreter) must produce zero valgrind errors.
set -eu
cd "$(dirname "$0")/.."
VG="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite"
# the launcher alone (its supervisor side; children are not traced), linked dynamically: valgrind
# cannot follow the static glibc of csrc/corral-launch (Makefile, LAUNCH_LINK)
env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s --no-print-directory build/dyn/corral-launch
L=./build/dyn/corral-launch
$VG --trace-children=no $L --report-fd 3 --pidns --net new --rlimit cpu=2 \
  --rlimit nofile=64 --env PATH=/usr/bin:/bin --chdir /tmp -- /usr/bin/python3 -I -c 'print("hi")' 3>/dev/null
$VG --trace-children=no $L --no-pidns -- /usr/bin/python3 -I -c 'import os; os.fork() or print(1)' >/dev/null
# whole-run budgets: a run that stays under them, and one ended by the CPU budget (exit 137)
$VG --trace-children=no $L --report-fd 3 --pidns --budget-cpu-ms 5000 \
  --budget-memory-kb 1048576 -- /usr/bin/python3 -I -c 'import os; os.fork() or print(1)' 3>/dev/null >/dev/null
st=0; $VG --trace-children=no $L --report-fd 3 --no-pidns --budget-cpu-ms 300 \
  --cgroup /nonexistent -- /usr/bin/python3 -I -c 'while True: pass' 3>/dev/null || st=$?
[ "$st" = 137 ]
$VG --trace-children=no $L --probe >/dev/null
# with a seccomp filter (valgrind 3.19 does not know seccomp(): the launcher falls back to prctl)
$VG --trace-children=no $L --report-fd 3 --seccomp require --deny-sockets \
  --deny-syscall ptrace --deny-syscall unshare --deny-syscall no_such_call -- /usr/bin/python3 -I -c 'print(1)' 3>/dev/null >/dev/null
# the filter cache: a miss that builds and writes it, then a hit that reads it
cache=$(mktemp -d /tmp/corral-vg-cache.XXXXXX)
for pass in miss hit; do
  $VG --trace-children=no $L --report-fd 3 --seccomp require --seccomp-cache "$cache" --deny-sockets \
    --deny-syscall ptrace -- /usr/bin/python3 -I -c 'print(1)' 3>/dev/null >/dev/null
done
rm -rf "$cache"
# files in, made while the program waits on fd 4 for them, and out: one given back as it was
ws=$(mktemp -d /tmp/corral-vg-ws.XXXXXX)
mkdir "$ws/work"
printf 'in/a\000644\0003\000abc' >"$ws/in"
: >"$ws/out"
$VG --trace-children=no $L --report-fd 3 --pidns --work-tmpfs 1048576 --chdir "$ws/work" \
  --files-in "$ws/in" --files-wait-fd 4 --collect-to "$ws/out" --collect '**' -- \
  /bin/sh -c 'cat <&4 >/dev/null; echo x >made' 3>/dev/null
grep -q made "$ws/out"
# again without a PID namespace, the names removed once open: the caller reads out through its fd
rm -rf "$ws/work" "$ws/out"
mkdir "$ws/work"
printf 'in/a\000644\0003\000abc' >"$ws/in"
: >"$ws/out"
exec 5<"$ws/out"
$VG --trace-children=no $L --report-fd 3 --no-pidns --chdir "$ws/work" --files-in "$ws/in" \
  --collect-to "$ws/out" --collect '**' --unlink-files -- /bin/sh -c 'cat in/a >/dev/null; echo x >made' 3>/dev/null
[ ! -e "$ws/in" ] && [ ! -e "$ws/out" ] && grep -q made <&5
exec 5<&-
rm -rf "$ws"
# the holder of a shared network namespace, ended at EOF on its stdin
(sleep 0.2) | $VG --trace-children=no $L --hold-net >/dev/null
# the host module driving real runs
$VG lua5.4 spec/valgrind_runs.lua
