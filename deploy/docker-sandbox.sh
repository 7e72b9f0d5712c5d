#!/usr/bin/env bash
# docker-sandbox.sh: run one Python program in a locked-down, throwaway container, with corral
# inside it providing the per-run limits and the report. The container is the boundary `run_python`
# asks for ("run this inside a container or microVM that provides the real boundary"); corral is
# the hygiene inside it. Prints corral's JSON result (or, with --text, the program's output) and
# exits as `corral run` does. Run with --help for the options.
set -euo pipefail
# decimal points, whatever the caller's locale: in awk, for timeout(1), in $EPOCHREALTIME
export LC_NUMERIC=C

PROG=${0##*/}
# the Docker client; overridable for tests (spec/deploy_spec.lua uses a stub)
DOCKER=${DOCKER:-docker}

usage() {
  cat <<EOF
usage: $PROG [OPTIONS] FILE|-

Runs FILE (or the program read from standard input, for -) with \`corral run\` inside a
throwaway container: no network, read-only root, all capabilities dropped, no-new-privileges,
user nobody, memory/pids/CPU limits, a small /tmp. The program is sent on the container's
standard input; nothing of the host is mounted. The program itself gets an empty stdin.

corral's limits (passed to \`corral run\`):
  --timeout S          wall-clock seconds (default 5)
  --cpu S              CPU seconds (default 3)
  --memory MB          memory limit in MiB (default 256)
  --file-size MB       largest file the program may write, MiB (default 1)
  --processes N        process limit (default 32)
  --open-files N       open-file limit (default 64)
  --max-output BYTES   bytes kept per stream (default 20000)
  --policy NAME        a policy shipped in the image (default: default)
  --require-network-isolation
                       fail (exit 125) rather than run without a network namespace
  --text               print the program's output instead of the JSON result

the container (the outer boundary):
  --image IMAGE        image to run (default \$CORRAL_IMAGE or corral:latest; never pulled)
  --container-memory SIZE
                       memory of the whole container, docker syntax (default 768m)
  --container-pids N   process limit of the container (default 128)
  --container-cpus N   CPUs of the container (default 1)
  --start-grace S      seconds allowed for the container to start and stop, on top of
                       --timeout, before it is killed (default 30)
  --gvisor             run under gVisor (--runtime=runsc); fails if Docker has no runsc
  --runtime NAME       run under another OCI runtime Docker knows (e.g. kata)
  --seccomp-profile FILE
                       the container's seccomp profile instead of Docker's default, e.g.
                       deploy/k8s/seccomp-corral.json, which lets corral make its user, PID
                       and network namespaces (the default profile refuses them: corral then
                       runs degraded, and its result says so in limits/refused)
  --apparmor PROFILE   the container's AppArmor profile (e.g. unconfined: docker-default
                       refuses the mounts of corral's private /tmp and work dir)
  -h, --help           show this text

exit status: the program's; 124 timed out (corral's timeout, or the container did not finish
within --timeout + --start-grace and was killed); 128+N killed by signal N; 125 the sandbox
failed (corral's setup, Docker, a missing image or runtime); 2 usage error.
EOF
}

die_usage() {
  printf '%s: %s\n' "$PROG" "$1" >&2
  printf 'try %s --help\n' "$PROG" >&2
  exit 2
}

die_sandbox() {
  printf '%s: %s\n' "$PROG" "$1" >&2
  exit 125
}

# value check: a non-negative decimal number (seconds), or a positive integer
is_number() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ ! $1 =~ ^0+([.]0+)?$ ]]; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
is_size() { [[ $1 =~ ^[1-9][0-9]*[bkmg]?$ ]]; }

need_value() {
  # $1: option, $2: number of arguments left including the option
  [[ $2 -ge 2 ]] || die_usage "option $1 needs a value"
}

image=${CORRAL_IMAGE:-corral:latest}
container_memory=768m
container_pids=128
container_cpus=1
start_grace=30
runtime=
seccomp_profile=
apparmor=
timeout=5
json=1
corral_args=()
file=

while [[ $# -gt 0 ]]; do
  opt=$1
  case $opt in
    -h|--help) usage; exit 0 ;;
    --timeout)
      need_value "$opt" $#; is_number "$2" || die_usage "$opt must be a positive number of seconds, not '$2'"
      timeout=$2; shift 2 ;;
    --cpu)
      need_value "$opt" $#; is_number "$2" || die_usage "$opt must be a positive number of seconds, not '$2'"
      corral_args+=(--cpu "$2"); shift 2 ;;
    --memory|--file-size|--processes|--open-files|--max-output)
      need_value "$opt" $#; is_count "$2" || die_usage "$opt must be a positive integer, not '$2'"
      corral_args+=("$opt" "$2"); shift 2 ;;
    --policy)
      need_value "$opt" $#; [[ $2 =~ ^[A-Za-z0-9_-]+$ ]] || die_usage "$opt takes the name of a policy shipped in the image, not '$2'"
      corral_args+=(--policy "$2"); shift 2 ;;
    --require-network-isolation) corral_args+=("$opt"); shift ;;
    --text) json=0; shift ;;
    --image)
      need_value "$opt" $#; [[ -n $2 && $2 != -* ]] || die_usage "$opt needs an image name"
      image=$2; shift 2 ;;
    --container-memory)
      need_value "$opt" $#; is_size "$2" || die_usage "$opt must be a size such as 768m or 2g, not '$2'"
      container_memory=$2; shift 2 ;;
    --container-pids)
      need_value "$opt" $#; is_count "$2" || die_usage "$opt must be a positive integer, not '$2'"
      container_pids=$2; shift 2 ;;
    --container-cpus)
      need_value "$opt" $#; is_number "$2" || die_usage "$opt must be a positive number, not '$2'"
      container_cpus=$2; shift 2 ;;
    --start-grace)
      need_value "$opt" $#; is_number "$2" || die_usage "$opt must be a positive number of seconds, not '$2'"
      start_grace=$2; shift 2 ;;
    --gvisor) runtime=runsc; shift ;;
    --runtime)
      need_value "$opt" $#; [[ $2 =~ ^[A-Za-z0-9_.-]+$ ]] || die_usage "$opt needs a runtime name, not '$2'"
      runtime=$2; shift 2 ;;
    --seccomp-profile)
      need_value "$opt" $#; [[ -f $2 && -r $2 ]] || die_usage "$opt: cannot read '$2'"
      seccomp_profile=$2; shift 2 ;;
    --apparmor)
      need_value "$opt" $#; [[ $2 =~ ^[A-Za-z0-9_.-]+$ ]] || die_usage "$opt needs a profile name, not '$2'"
      apparmor=$2; shift 2 ;;
    --) shift; [[ $# -eq 1 ]] || die_usage "expected one FILE after --"; file=$1; shift ;;
    -) [[ -z $file ]] || die_usage "only one FILE may be given"; file=-; shift ;;
    -*) die_usage "unknown option '$opt'" ;;
    *) [[ -z $file ]] || die_usage "only one FILE may be given"; file=$opt; shift ;;
  esac
done

[[ -n $file ]] || die_usage "missing FILE (or - for standard input)"
if [[ $file != - ]]; then
  [[ -f $file ]] || die_usage "no such file: '$file'"
  [[ -r $file ]] || die_usage "cannot read '$file'"
fi

command -v "$DOCKER" >/dev/null 2>&1 || die_sandbox "the Docker client '$DOCKER' is not installed (or set DOCKER)"

if [[ -n $runtime ]]; then
  # a runtime Docker does not know would make `docker run` fail late with a vaguer message
  # shellcheck disable=SC2016 # a Go template for docker, not a shell expansion
  runtimes=$("$DOCKER" info --format '{{range $name, $rt := .Runtimes}}{{$name}} {{end}}' 2>/dev/null) \
    || die_sandbox "cannot ask Docker which runtimes it has (is the daemon running?)"
  [[ " $runtimes " == *" $runtime "* ]] \
    || die_sandbox "Docker has no runtime '$runtime' (it has: ${runtimes:-none}); for gVisor see https://gvisor.dev/docs/user_guide/install/"
fi

# The outer deadline: corral ends the program at --timeout; the container gets --start-grace
# more to start and stop, then it is killed (and the run reported as timed out, 124).
deadline=$(awk -v a="$timeout" -v b="$start_grace" 'BEGIN { printf "%.3f", a + b }')
name="corral-sandbox-$$-$RANDOM"

run=("$DOCKER" run --rm -i --name "$name"
  --pull never                      # never fetch an image of that name from a registry
  --network none                    # no network at all, whatever corral can do inside
  --read-only                       # the image cannot be changed
  --tmpfs /tmp:size=64m             # corral's run dir; the program's own scratch is per run
  --memory "$container_memory" --memory-swap "$container_memory"
  --pids-limit "$container_pids"
  --cpus "$container_cpus"
  --cap-drop ALL
  --security-opt no-new-privileges
  --user 65534:65534                # nobody: not even the image's own user
  --log-driver none                 # the result goes to this terminal, not to the daemon's logs
  --no-healthcheck                  # the image's check is for `corral serve`
)
# Under gVisor (no Landlock) or Docker's default seccomp profile (no user namespace) a run cannot
# be walled off from the controller, which the shipped policies refuse. One run per container has
# nothing else to reach: the image's deploy/one-tenant policies accept it
run+=(-e CORRAL_POLICY_PATH=/usr/local/share/corral/one-tenant)
[[ -z $runtime ]] || run+=(--runtime "$runtime")
[[ -z $seccomp_profile ]] || run+=(--security-opt "seccomp=$seccomp_profile")
[[ -z $apparmor ]] || run+=(--security-opt "apparmor=$apparmor")
run+=("$image" run --timeout "$timeout")
[[ ${#corral_args[@]} -eq 0 ]] || run+=("${corral_args[@]}")
[[ $json -eq 0 ]] || run+=(--json)
run+=(-)

# shellcheck disable=SC2317 # called from the traps
cleanup() {
  # after a normal end --rm has removed it already; this is for a deadline or a signal
  "$DOCKER" rm -f "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# --foreground: the Docker client may read a terminal (FILE -) and gets its signals
started=$EPOCHREALTIME
status=0
if [[ $file == - ]]; then
  timeout --foreground --kill-after=5 "$deadline" "${run[@]}" || status=$?
else
  timeout --foreground --kill-after=5 "$deadline" "${run[@]}" < "$file" || status=$?
fi
# timeout(1) says 124 when the deadline passed, or 137 when the client also needed a SIGKILL;
# a program killed by SIGKILL is 137 too, but ends long before the deadline
if [[ $status -eq 124 || $status -eq 137 ]] \
  && awk -v s="$started" -v e="$EPOCHREALTIME" -v d="$deadline" 'BEGIN { exit !(e - s >= d) }'; then
  printf '%s: no result within %s s: container %s killed\n' "$PROG" "$deadline" "$name" >&2
  status=124
fi
exit "$status"
