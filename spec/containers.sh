#!/bin/sh
# make test-containers: corral deployed in real containers, as deploy/README.md says.
#
# A Docker daemon of its own (dockerd from Debian's docker.io, no iptables, no bridge, its own
# data root, exec root, socket and pid file; gVisor's runsc registered as a runtime), a base
# image made by debootstrap from the apt mirror this host uses and `docker import`ed (cached in
# $CACHE, keyed by the mirror and the Dockerfile's package lists), then `docker build` of
# deploy/Dockerfile on that base. spec/containers.lua then starts the image as deploy/README.md
# says, in each configuration (the shipped seccomp profile, Docker's default profile, gVisor)
# and under each policy, and drives it over its unix socket from inside (`docker exec` of a
# small python3 client: the socket stays on the container's own tmpfs). TAP-like `ok`/`not ok` lines, then "K skipped" and "N passed, M failed".
#
# Needs root (dockerd, debootstrap, mounts); as root it installs its Debian packages. Without
# root, or where no Docker daemon can run, it says why and counts itself skipped. Everything it
# starts is ended by pid and everything it mounts unmounted by path, on failure too.
set -u
cd "$(dirname "$0")/.." || exit 1
TREE=$(pwd)
LUA=${LUA:-lua5.4}
CACHE=${CORRAL_CONTAINERS_CACHE:-/var/cache/corral-containers}
SUITE=bookworm
PKGS="docker.io runsc debootstrap curl"
IMAGE=corral:containers-test
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
# Debian's docker.io client, not another one earlier in PATH
DOCKER=/usr/bin/docker

passed=0
failed=0
skipped=0
STATE=
DOCKERD_PID=

summary() {
  echo "$skipped skipped"
  echo "$passed passed, $failed failed"
}
ok() { passed=$((passed + 1)); echo "ok - $*"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $*"; }
skip_all() {
  skipped=$((skipped + 1))
  echo "ok - containers # SKIP $*"
  summary
  exit 0
}
now() { date +%s; }

if [ "$(id -u)" != 0 ]; then
  skip_all "needs root (a Docker daemon of its own, debootstrap); as root it installs: $PKGS"
fi
for cmd in "$LUA" flock; do
  command -v "$cmd" >/dev/null 2>&1 || skip_all "needs $cmd"
done
[ -f csrc/corral/core.so ] || skip_all "needs the host module built first (make all)"

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "# installing:$missing"
  # shellcheck disable=SC2086 # one argument per package
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null; }; then
    skip_all "cannot install:$missing"
  fi
fi

mkdir -p "$CACHE" || skip_all "cannot make $CACHE"
# one run at a time per cache: the daemon's data root is in it
exec 9>"$CACHE/.lock"
flock 9

# Everything of this run: the daemon's exec root, socket, pid file and log, the build context.
# Short, for the unix sockets below it.
STATE=$(mktemp -d /tmp/corral-ctr.XXXXXX) || exit 1
chmod 0755 "$STATE"
DATA_ROOT=$CACHE/docker
DOCKER_HOST=unix://$STATE/docker.sock
export DOCKER_HOST

# pids of processes whose command line names this run's state directory (containerd, its shims,
# runsc's sandboxes and gofers)
state_pids() {
  for d in /proc/[0-9]*; do
    { tr '\0' ' ' < "$d/cmdline"; } 2>/dev/null | grep -qF -- "$STATE/" && echo "${d#/proc/}"
  done
}

cleanup() {
  trap - EXIT INT TERM
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    ids=$("$DOCKER" ps -aq 2>/dev/null)
    # shellcheck disable=SC2086 # one argument per id
    [ -z "$ids" ] || "$DOCKER" rm -f $ids >/dev/null 2>&1
    kill -TERM "$DOCKERD_PID" 2>/dev/null
    i=0
    while kill -0 "$DOCKERD_PID" 2>/dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
    kill -KILL "$DOCKERD_PID" 2>/dev/null
    wait "$DOCKERD_PID" 2>/dev/null
  fi
  if [ -n "$STATE" ]; then
    for pid in $(state_pids); do kill -KILL "$pid" 2>/dev/null; done
    # mounts below the state dir or the data root, deepest first
    awk -v a="$STATE/" -v b="$DATA_ROOT/" 'index($5, a) == 1 || index($5, b) == 1 { print $5 }' \
      /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
    rm -rf "$STATE"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the daemon ------------------------------------------------------------------------------
# runsc: no network stack of its own (--network none containers only)
cat > "$STATE/daemon.json" <<EOF
{
  "runtimes": {
    "runsc": {
      "path": "/usr/bin/runsc",
      "runtimeArgs": ["--network=none", "--root=$STATE/runsc"]
    }
  }
}
EOF
dockerd --config-file "$STATE/daemon.json" --iptables=false --ip-masq=false --bridge=none \
  --userland-proxy=false --data-root "$DATA_ROOT" --exec-root "$STATE/x" --host "$DOCKER_HOST" \
  --pidfile "$STATE/dockerd.pid" > "$STATE/dockerd.log" 2>&1 &
DOCKERD_PID=$!
t0=$(now)
until "$DOCKER" version >/dev/null 2>&1; do
  if ! kill -0 "$DOCKERD_PID" 2>/dev/null || [ $(($(now) - t0)) -gt 60 ]; then
    tail -n 20 "$STATE/dockerd.log" | sed 's/^/# /'
    skip_all "no Docker daemon could start here (dockerd's log above)"
  fi
  sleep 1
done
# shellcheck disable=SC2016 # Go templates, not shell expansions
ok "dockerd $("$DOCKER" version -f '{{.Server.Version}}') started (no iptables, no bridge; runtimes: $("$DOCKER" info -f '{{range $n, $r := .Runtimes}}{{$n}} {{end}}'))"
# containers a killed earlier run left in the cached data root
old=$("$DOCKER" ps -aq)
# shellcheck disable=SC2086 # one argument per id
[ -z "$old" ] || "$DOCKER" rm -f $old >/dev/null 2>&1

# ---- the base image --------------------------------------------------------------------------
# The Debian mirror apt uses (deb822 .sources or one-line lists), and its security archive.
mirrors() {
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      /^deb[ \t]/ { u = $2; if ($2 ~ /^\[/) { for (i = 2; i <= NF && $i !~ /\]$/; i++); u = $(i + 1); s = $(i + 2) } else s = $3
                    print u, s; next }
      /^URIs:/ { split(substr($0, 6), us, " "); u = us[1] }
      /^Suites:/ { n = split(substr($0, 8), ss, " "); for (i = 1; i <= n; i++) print u, ss[i] }
      /^$/ { u = "" }' "$f"
  done
}
MIRROR=$(mirrors | awk -v s="$SUITE" '$2 == s { print $1; exit }')
SECURITY=$(mirrors | awk -v s="$SUITE-security" '$2 == s { print $1; exit }')
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
KEY=$({ echo "$MIRROR $SECURITY $SUITE minbase"
        sed -n '/apt-get install/,/rm -rf \/var\/lib\/apt\/lists/p' deploy/Dockerfile; } | sha256sum | cut -c1-16)
BASE_TAR=$CACHE/base-$KEY.tar
BASE=corral-base:$KEY
if [ ! -s "$BASE_TAR" ]; then
  echo "# debootstrap --variant=minbase $SUITE from $MIRROR (cached as $BASE_TAR)"
  t0=$(now)
  root=$CACHE/rootfs-$KEY.tmp
  rm -rf "$root"
  if debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" > "$STATE/debootstrap.log" 2>&1; then
    {
      echo "deb $MIRROR $SUITE main"
      echo "deb $MIRROR $SUITE-updates main"
      [ -z "$SECURITY" ] || echo "deb $SECURITY $SUITE-security main"
    } > "$root/etc/apt/sources.list"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$BASE_TAR.tmp" . && mv "$BASE_TAR.tmp" "$BASE_TAR"
    ok "base image made by debootstrap in $(($(now) - t0)) s"
  else
    tail -n 20 "$STATE/debootstrap.log" | sed 's/^/# /'
    not_ok "debootstrap failed (log above)"
  fi
  rm -rf "$root"
fi
if [ -s "$BASE_TAR" ] && ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  "$DOCKER" import "$BASE_TAR" "$BASE" >/dev/null || not_ok "docker import $BASE_TAR"
fi

# ---- the image -------------------------------------------------------------------------------
# The classic builder (Debian's docker.io has no buildx for BuildKit), which reads .dockerignore
# at the context's root only: the context is a copy of the tree (tracked and untracked files git
# does not ignore) with deploy/Dockerfile.dockerignore as its .dockerignore.
built=
if "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  ctx=$STATE/context
  mkdir "$ctx"
  if git rev-parse --git-dir >/dev/null 2>&1; then
    # shellcheck disable=SC2016 # the inner shell expands it
    git ls-files -z --cached --others --exclude-standard \
      | xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\n" "$f"; done' sh
  else
    find . -path ./.git -prune -o -path ./build -prune -o -type f -print
  fi | tar -cf - -T - | tar -C "$ctx" -xf -
  cp deploy/Dockerfile.dockerignore "$ctx/.dockerignore"
  t0=$(now)
  if DOCKER_BUILDKIT=0 "$DOCKER" build --network host --build-arg "BASE=$BASE" -f "$ctx/deploy/Dockerfile" \
      -t "$IMAGE" "$ctx" > "$STATE/build.log" 2>&1; then
    ok "docker build of deploy/Dockerfile on $BASE in $(($(now) - t0)) s"
    built=1
  else
    tail -n 30 "$STATE/build.log" | sed 's/^/# /'
    not_ok "docker build of deploy/Dockerfile (log above)"
  fi
fi

# ---- the containers --------------------------------------------------------------------------
if [ -n "$built" ]; then
  "$LUA" spec/containers.lua --image "$IMAGE" --state "$STATE" --docker "$DOCKER" --tree "$TREE" \
    > "$STATE/containers.tap" 2>&1
  status=$?
  cat "$STATE/containers.tap"
  p=$(grep '^ok ' "$STATE/containers.tap" | grep -vc '# SKIP')
  s=$(grep '^ok ' "$STATE/containers.tap" | grep -c '# SKIP')
  f=$(grep -c '^not ok ' "$STATE/containers.tap")
  passed=$((passed + p)); skipped=$((skipped + s)); failed=$((failed + f))
  if [ "$status" != 0 ] && [ "$f" = 0 ]; then not_ok "spec/containers.lua exited $status"; fi
fi

summary
[ "$failed" = 0 ]
