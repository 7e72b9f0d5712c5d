#!/bin/sh
# Load test of `corral serve`: wrk against a controller on loopback TCP, for DURATION seconds
# (default 30) at CONNECTIONS connections (default 64), POST /v1/run of print('hello').
# Prints requests/s, latency p50/p99, the status counts (2xx, 503 admission rejects, other 5xx),
# the controller's RSS before and after, and the processes left behind. Exits 1 on any 5xx other
# than an admission 503, or on a process left behind.
#   sh bench/loadtest.sh [DURATION] [CONNECTIONS]          (make loadtest)
set -eu
cd "$(dirname "$0")/.."
DURATION=${1:-30}
CONNECTIONS=${2:-64}
LUA=${LUA:-lua5.4}
tmp=$(mktemp -d /tmp/corral-load.XXXXXX)
server=""
cleanup() {
  if [ -n "$server" ]; then kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/token"
$LUA bin/corral serve --listen "127.0.0.1:$port" --token-file "$tmp/token" --drain-seconds 5 \
  2> "$tmp/server.log" &
server=$!
i=0
until curl -s -o /dev/null "http://127.0.0.1:$port/healthz"; do
  i=$((i + 1)); [ "$i" -lt 100 ] || { echo "the controller did not start:"; cat "$tmp/server.log"; exit 1; }
  sleep 0.05
done
rss() { awk '/^VmRSS/ {print $2}' "/proc/$server/status"; }
rss_before=$(rss)

# wrk's script: the request, and a count of each status at the end
cat > "$tmp/run.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"code": "print(\'hello\')"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $(cat "$tmp/token")"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init() counts = {} end
function response(status) counts[status] = (counts[status] or 0) + 1 end
function done()
  local all = {}
  for _, t in ipairs(threads) do
    for s, n in pairs(t:get("counts")) do all[s] = (all[s] or 0) + n end
  end
  for s, n in pairs(all) do io.write(string.format("status %d %d\n", s, n)) end
end
EOF
wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$tmp/run.lua" "http://127.0.0.1:$port/v1/run" > "$tmp/wrk.out"
rss_after=$(rss)
kill -TERM "$server"; wait "$server" || true; server=""

rps=$(awk '/^Requests\/sec/ {print $2}' "$tmp/wrk.out")
p50=$(awk '$1 == "50%" {print $2}' "$tmp/wrk.out")
p99=$(awk '$1 == "99%" {print $2}' "$tmp/wrk.out")
ok=$(awk '$1 == "status" && $2 >= 200 && $2 < 300 {n += $3} END {print n + 0}' "$tmp/wrk.out")
rejected=$(awk '$1 == "status" && $2 == 503 {n += $3} END {print n + 0}' "$tmp/wrk.out")
errors=$(awk '$1 == "status" && ($2 >= 500 && $2 != 503 || $2 < 200 || ($2 >= 300 && $2 < 500)) {n += $3} END {print n + 0}' "$tmp/wrk.out")
sockerr=$(awk '/Socket errors/ {print}' "$tmp/wrk.out")
left=$(ps -eo stat=,uid=,args= | awk '$1 !~ /^Z/ && (($2 >= 60000 && $2 <= 60999) || /\/tmp\/corral-[A-Za-z0-9]+\/code\//)' | wc -l)

echo "corral serve load test: ${DURATION} s, ${CONNECTIONS} connections, POST /v1/run print('hello')"
echo "requests/s: $rps   latency p50: $p50   p99: $p99"
echo "2xx: $ok   503 (admission): $rejected   other errors: $errors ${sockerr:+($sockerr)}"
echo "controller RSS: ${rss_before} KB before, ${rss_after} KB after"
echo "processes left: $left"
[ "$errors" = 0 ] && [ "$left" = 0 ]
