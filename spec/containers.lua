--- The container matrix of `make test-containers` (spec/containers.sh builds the image and runs
-- the daemon; this drives it). For each configuration (the shipped seccomp profile, Docker's
-- default profile, gVisor) and each policy (default, warm, bwrap) it starts the image with
-- deploy/README.md's own `docker run` command, the socket directory bind-mounted from the host,
-- and then, over that socket:
--   - records the `limits` and `refused` of a plain run and asserts what deploy/README.md
--     promises for the configuration (PROMISES below);
--   - runs every hostile case of spec/hostile/*.lua that makes sense from outside (its code,
--     options and expectations; not the ones that need host-side setup, a companion run, a
--     controller child or a policy variant) through POST /v1/run, and for bwrap the seed-003
--     cases through POST /v1/eval;
-- plus, once per configuration: the health check turns healthy, `docker stop` drains a run in
-- progress and exits 0, and no process of the container is left on the host; and the
-- Deployment's policy (deploy/k8s/policy.lua) either gets the full sandbox or refuses.
-- Prints TAP-like lines; writes the table of limits/refused into deploy/README.md between its
-- markers when every configuration ran.
--
--     lua5.4 spec/containers.lua --image IMAGE --state DIR --docker /usr/bin/docker --tree DIR
package.path = "spec/?.lua;lua/?.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath

local core = require "corral.core"
local cjson = require("cjson").new()
-- the case files' checks use busted's assert
_G.assert = require "luassert"
local S = require "hostile.support"
local H = require "helper"

local args = {}
do
  local i = 1
  while arg[i] do
    local k = arg[i]:match("^%-%-(.+)$")
    assert(k and arg[i + 1], "usage: containers.lua --image IMAGE --state DIR --docker PATH --tree DIR")
    args[k] = arg[i + 1]
    i = i + 2
  end
end
local DOCKER, IMAGE, TREE = args.docker, args.image, args.tree
-- the controller's own: a request body over it is refused (--max-body)
local MAX_BODY = 1048576
-- a run answers within its timeout plus this (HTTP, the container, a busy machine)
local SLACK = 3
-- concurrent requests: the controller's default --concurrency, the container's CPUs
local CONCURRENCY = 2
local ONLY = os.getenv("CONTAINERS_ONLY")   -- "config/policy" Lua pattern, to look at one

local n_ok, n_fail = 0, 0
local function ok(fmt, ...) n_ok = n_ok + 1; print("ok - " .. string.format(fmt, ...)) end
local function not_ok(fmt, ...) n_fail = n_fail + 1; print("not ok - " .. string.format(fmt, ...)) end
local function skip(fmt, ...)
  local line = "ok - " .. string.format(fmt, ...)
  print(line:find(" # SKIP", 1, true) and line or (line .. " # SKIP"))
end
local function note(fmt, ...) print("# " .. string.format(fmt, ...)) end
local function check(cond, fmt, ...)
  if cond then ok(fmt, ...) else not_ok(fmt, ...) end
  return cond
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- Run a shell command; returns its output (stdout and stderr) and whether it exited 0.
local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1", "r")
  local out = f:read("a")
  local okay = f:close()
  return out, okay == true
end

local function docker(...)
  local parts = { q(DOCKER) }
  for _, a in ipairs({ ... }) do parts[#parts + 1] = q(a) end
  return sh(table.concat(parts, " "))
end

local function sleep(s) os.execute("sleep " .. s) end

local read = H.read

local function has(list, v)
  for _, x in ipairs(list or {}) do if x == v then return true end end
  return false
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t or {}) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

---------------------------------------------------------------------------------------------
-- deploy/README.md's `docker run` for the controller, as words: the first ```sh block that
-- starts with `docker run -d --name corral`.
local function readme_run()
  local text = read(TREE .. "/deploy/README.md")
  for block in text:gmatch("```sh\n(.-)```") do
    if block:match("^docker run %-d %-%-name corral") then
      local joined = block:gsub("\\\n", " ")
      local words = {}
      for w in joined:gmatch("%S+") do words[#words + 1] = w end
      return words
    end
  end
  error("deploy/README.md has no ```sh block starting with `docker run -d --name corral`")
end

-- The README's words for one configuration: --name is ours, the image is the one just built;
-- `seccomp = false` drops the seccomp option (Docker's default profile), `runtime` adds
-- --runtime.
local function run_words(config, name, cmd)
  local w = readme_run()
  local out = {}
  local i = 3   -- after "docker run"
  while i <= #w do
    local a, b = w[i], w[i + 1]
    if a == "--name" then
      out[#out + 1] = "--name"; out[#out + 1] = name; i = i + 2
    elseif a == "--security-opt" and b:match("^seccomp=") then
      if config.seccomp ~= false then
        out[#out + 1] = a; out[#out + 1] = "seccomp=" .. TREE .. "/" .. b:match("^seccomp=(.*)$")
      end
      i = i + 2
    elseif a == "corral:latest" then
      if config.runtime then out[#out + 1] = "--runtime"; out[#out + 1] = config.runtime end
      for _, x in ipairs(config.extra or {}) do out[#out + 1] = x end
      out[#out + 1] = IMAGE
      i = i + 1
    else
      out[#out + 1] = a; i = i + 1
    end
  end
  for _, c in ipairs(cmd or {}) do out[#out + 1] = c end
  return out
end

---------------------------------------------------------------------------------------------
-- HTTP over the controller's socket, from inside the container: `docker exec -i NAME python3 -I
-- -c CLIENT`, the request on its stdin. The socket stays on the container's own tmpfs, as
-- deploy/README.md mounts it (a bind-mounted host directory is not that: gVisor cannot chmod a
-- socket made on one). The client prints the body, then a last line "STATUS SECONDS", the
-- seconds being the request's own, not docker exec's.
local CLIENT = [[
import http.client, socket, sys, time
line = sys.stdin.buffer.readline().split()
method, path, timeout = line[0].decode(), line[1].decode(), float(line[2])
body = sys.stdin.buffer.read()
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect('/run/corral/corral.sock')
t = time.monotonic()
try:
    c = Unix('corral', timeout=timeout)
    c.request(method, path, body=body if body else None,
              headers={'Content-Type': 'application/json'} if body else {})
    r = c.getresponse()
    data = r.read()
except Exception as e:
    sys.stdout.write('%s: %s' % (type(e).__name__, e))
    sys.exit(1)
sys.stdout.buffer.write(data + b'\n%d %.3f' % (r.status, time.monotonic() - t))
]]
-- docker exec itself (a busy machine, gVisor) on top of the request's own timeout
local EXEC_SLACK = 20

local function exec_args(name)
  return { "exec", "-i", name, "python3", "-I", "-c", CLIENT }
end

local function request_text(method, path, obj, timeout)
  return string.format("%s %s %d\n", method, path, math.ceil(timeout)) .. (obj and cjson.encode(obj) or "")
end

local function parse_answer(out)
  local body, status, t = out:match("^(.*)\n(%d%d%d) ([%d.]+)$")
  if not body then return { status = 0, error = out } end
  local okj, obj = pcall(cjson.decode, body)
  return { status = tonumber(status), time = tonumber(t), body = body, json = okj and obj or nil }
end

local function docker_env()
  return { "PATH=/usr/bin:/bin", "DOCKER_HOST=" .. os.getenv("DOCKER_HOST") }
end

--- One request to container `name`, started; `done(answer)` is called when it is answered.
local function http_start(name, method, path, obj, timeout, done)
  local spawned, err = core.spawn {
    file = DOCKER, args = exec_args(name), env = docker_env(), stdin = request_text(method, path, obj, timeout),
    timeout = timeout + EXEC_SLACK, stdout_cap = 64 * 1048576,
    on_exit = function(raw)
      done(parse_answer(raw.stdout .. (raw.exit_status ~= 0 and ("\n" .. raw.stderr) or "")))
    end,
  }
  if not spawned then done({ status = 0, error = "cannot start docker exec: " .. tostring(err) }) end
  return spawned
end

--- One request, waited for.
local function http(name, method, path, obj, timeout)
  local answer
  http_start(name, method, path, obj, timeout or 30, function(a) answer = a end)
  while not answer do core.run("once") end
  return answer
end

--- Requests `list` ({path, body, timeout, done = function(answer)}) to container `name`,
--- `CONCURRENCY` at a time.
local function http_many(name, list)
  local running, next_i = 0, 1
  local function start_more()
    while running < CONCURRENCY and next_i <= #list do
      local r = list[next_i]
      next_i = next_i + 1
      running = running + 1
      if not http_start(name, "POST", r.path, r.body, r.timeout, function(a)
        running = running - 1
        r.done(a)
        start_more()
      end) then break end
    end
  end
  start_more()
  while running > 0 do core.run("once") end
end

---------------------------------------------------------------------------------------------
-- Containers.

local started = {}

local function inspect(name, fmt)
  local out, okay = docker("inspect", "-f", fmt, name)
  return okay and out:gsub("%s+$", "") or nil
end

local function remove(name)
  docker("rm", "-f", name)
  started[name] = nil
end

local function wait_for(pred, seconds)
  local deadline = core.hrtime() + seconds
  repeat
    if pred() then return true end
    sleep(0.2)
  until core.hrtime() > deadline
  return pred()
end

--- Start a container; returns its name once /healthz answers 200, or nil and why.
local function start(config, policy_name, cmd)
  local name = "corral-" .. config.name .. "-" .. policy_name
  remove(name)
  local out, okay = docker("run", table.unpack(run_words(config, name, cmd)))
  if not okay then return nil, "docker run failed: " .. out end
  started[name] = true
  local up = wait_for(function()
    local a = http(name, "GET", "/healthz", nil, 3)
    return a.status == 200
  end, 30)
  if not up then
    local logs = docker("logs", name)
    return nil, "no 200 from /healthz within 30 s; state " .. tostring(inspect(name, "{{.State.Status}} exit {{.State.ExitCode}}"))
      .. "; logs: " .. logs:sub(1, 800)
  end
  return name
end

-- The controller's pid inside the container (the child of tini running `corral serve`).
local function controller_pid(name)
  local out = docker("exec", name, "python3", "-I", "-c", [[
import os
for p in os.listdir('/proc'):
    if p.isdigit() and p != '1':
        try:
            a = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')
        except OSError:
            continue
        if b'serve' in a and any(x.endswith(b'/corral') for x in a):
            print(p)
            break
]])
  return tonumber(out:match("^(%d+)"))
end

-- Host pids that belong to a container: its init, every process in its cgroups, and every
-- process naming its id (containerd's shim, runsc's sandbox and gofer). With start times, so a
-- reused pid is not taken for a survivor.
local function start_time(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s:match("%) %S+" .. string.rep(" %S+", 18) .. " (%d+)")
end

local function container_pids(name)
  local id = inspect(name, "{{.Id}}")
  local pids = {}
  local function add(pid)
    pid = tonumber(pid)
    if pid and pid > 0 and not pids[pid] then pids[pid] = start_time(pid) end
  end
  add(inspect(name, "{{.State.Pid}}"))
  if id then
    for _, ctl in ipairs({ "pids", "memory", "cpu" }) do
      local f = io.open("/sys/fs/cgroup/" .. ctl .. "/docker/" .. id .. "/cgroup.procs", "r")
      if f then
        for line in f:lines() do add(line) end
        f:close()
      end
    end
    for _, d in ipairs(core.listdir("/proc") or {}) do
      if d:match("^%d+$") then
        local f = io.open("/proc/" .. d .. "/cmdline", "rb")
        local c = f and f:read("a")
        if f then f:close() end
        if c and c:find(id, 1, true) then add(d) end
      end
    end
  end
  return pids
end

local function survivors(pids)
  local left = {}
  for pid, st in pairs(pids) do
    if st and start_time(pid) == st then left[#left + 1] = pid end
  end
  return left
end

--- The container's life: its HEALTHCHECK turns healthy; `docker stop` (SIGTERM to tini, which
-- forwards it) lets a run in progress finish and answer, and the controller exits 0; then no
-- process of the container is left on the host.
local function check_lifecycle(where, name)
  local healthy = wait_for(function() return inspect(name, "{{.State.Health.Status}}") == "healthy" end, 60)
  check(healthy, "%s: the image's HEALTHCHECK turns healthy (%s)", where, tostring(inspect(name, "{{.State.Health.Status}}")))
  local pids = container_pids(name)
  local answer, stopped
  local code = "import time\nprint('running', flush=True)\ntime.sleep(4)\nprint('drained')"
  http_start(name, "POST", "/v1/run", { code = code, timeout = 20 }, 40, function(a) answer = a end)
  -- the stop comes once the run is under way: the controller has a child (its sandbox)
  local ctl = controller_pid(name)
  wait_for(function()
    local out = docker("exec", name, "python3", "-I", "-c", string.format([[
import os
for p in os.listdir('/proc'):
    try:
        if p.isdigit() and open('/proc/%%s/stat' %% p).read().rsplit(')', 1)[1].split()[1] == '%d':
            print('child')
    except OSError:
        pass
]], ctl or 0))
    return out:find("child") ~= nil
  end, 20)
  assert(core.spawn {
    file = DOCKER, args = { "stop", "-t", "30", name }, env = docker_env(), timeout = 60,
    on_exit = function(raw) stopped = raw end,
  })
  while not (answer and stopped) do core.run("once") end
  local logs = docker("logs", name)
  -- the exec'd client lives in the container, which ends right after the controller answered
  -- and exited: its answer may be cut; the controller's request log says what it sent
  local logged = logs:match("POST /v1/run 200 ") ~= nil
  check((answer.status == 200 and answer.json and answer.json.stdout == "running\ndrained\n")
      or (answer.status == 0 and logged),
    "%s: docker stop lets the run in progress finish and answer (HTTP %s %s; controller log %s)", where,
    tostring(answer.status), tostring(answer.body or answer.error):sub(1, 200), logged and "POST /v1/run 200" or "no 200")
  check(stopped.exit_status == 0 and inspect(name, "{{.State.ExitCode}}") == "0",
    "%s: docker stop drains and the container exits 0 (docker stop %d, exit code %s; log: %s)", where,
    stopped.exit_status, tostring(inspect(name, "{{.State.ExitCode}}")), (docker("logs", "--tail", "3", name)):gsub("\n", " | "))
  local n = 0
  for _ in pairs(pids) do n = n + 1 end
  local gone = wait_for(function() return #survivors(pids) == 0 end, 10)
  check(gone and n > 0, "%s: none of the container's %d host processes is left after it stopped%s", where, n,
    gone and "" or (": " .. table.concat(survivors(pids), " ")))
end

---------------------------------------------------------------------------------------------
-- What deploy/README.md promises per configuration: protections every run's `limits` lists,
-- and ones it must not list (what that configuration cannot give, which `refused` explains).
local CONFIGS = {
  {
    name = "seccomp-corral", label = "runc, `seccomp-corral.json`",
    promise = {
      default = { has = { "pid-namespace", "no-network", "user-namespace", "private-ipc", "private-tmp",
                          "work-tmpfs", "seccomp", "filesystem", "separated", "budget-cpu", "budget-memory" },
                  lacks = { "private-proc" }, refused = { "private-proc" } },
      bwrap = { has = { "no-network", "read-only-root", "pid-namespace" } },
    },
  },
  {
    -- no user namespace, so no PID namespace: Landlock alone does not wall a run off from the
    -- controller's processes, and deploy/one-tenant's `default` accepts it
    name = "docker-default", label = "runc, Docker's default profile, `CORRAL_POLICY_PATH` deploy/one-tenant",
    seccomp = false, extra = { "-e", "CORRAL_POLICY_PATH=/usr/local/share/corral/one-tenant" },
    promise = {
      default = { has = { "seccomp", "filesystem", "deny-sockets", "unix-pairs-only", "subreaper",
                          "budget-cpu", "budget-memory" },
                  lacks = { "pid-namespace", "no-network", "user-namespace", "private-tmp", "work-tmpfs", "separated" },
                  refused = { "pid-namespace", "no-network", "private-tmp", "work-tmpfs", "separation" } },
      bwrap = { has = { "seccomp", "filesystem", "deny-sockets", "unix-pairs-only" },
                lacks = { "read-only-root", "no-network" }, refused = { "bwrap" } },
    },
  },
  {
    -- no Landlock and no private mounts: as uid 10001 the runs cannot be walled off from each
    -- other, which the shipped policies refuse; deploy/one-tenant's `default`, in the image, accepts it
    name = "gvisor", label = "gVisor (`--runtime runsc`, `CORRAL_POLICY_PATH` deploy/one-tenant)", runtime = "runsc",
    extra = { "-e", "CORRAL_POLICY_PATH=/usr/local/share/corral/one-tenant" },
    promise = {
      default = { has = { "pid-namespace", "no-network", "user-namespace", "private-ipc", "seccomp",
                          "budget-cpu", "budget-memory" },
                  lacks = { "filesystem", "private-tmp", "work-tmpfs", "separated" },
                  refused = { "filesystem", "private-tmp", "work-tmpfs", "separation" } },
      bwrap = { has = { "pid-namespace", "no-network", "user-namespace", "seccomp" },
                lacks = { "read-only-root", "separated" }, refused = { "bwrap", "separation" } },
    },
  },
}
for _, c in ipairs(CONFIGS) do c.promise.warm = c.promise.default end
local POLICIES = { "default", "warm", "bwrap" }

-- what each configuration and policy got: rows of the README table
local table_rows = {}

local function check_promise(config, policy_name, res)
  local p = config.promise[policy_name] or {}
  local where = config.name .. "/" .. policy_name
  local bad = {}
  for _, n in ipairs(p.has or {}) do if not has(res.limits, n) then bad[#bad + 1] = "lacks " .. n end end
  for _, n in ipairs(p.lacks or {}) do if has(res.limits, n) then bad[#bad + 1] = "lists " .. n end end
  for _, n in ipairs(p.refused or {}) do
    if not (res.refused and res.refused[n]) then bad[#bad + 1] = "does not say why " .. n .. " is refused" end
  end
  check(#bad == 0, "%s: a run's limits and refused are what deploy/README.md promises%s", where,
    #bad > 0 and (": " .. table.concat(bad, ", ") .. " (limits: " .. table.concat(res.limits or {}, " ")
      .. "; refused: " .. table.concat(sorted_keys(res.refused), " ") .. ")") or "")
end

---------------------------------------------------------------------------------------------
-- The hostile cases.

local SKIP_FIELDS = { "setup", "teardown", "companion", "controller", "variant", "inspector_variant" }
-- cases whose subject is the host itself
local HOST_ONLY = {
  ["the controller's source tree is unreadable"] =
    "its subject is the host's checkout; the image's corral is under /usr, readable as python's own files are",
}
local RUN_FIELDS = { timeout = 1, cpu_seconds = 1, memory_mb = 1, file_mb = 1, processes = 1, open_files = 1,
                     max_output = 1, stdin = 1 }

-- policies/default.lua's defaults, which the cases are written for, sent with every case's run
local DEFAULT_OPTIONS = { timeout = 5, cpu_seconds = 3, memory_mb = 256, file_mb = 1, processes = 32,
                          open_files = 64, max_output = 20000 }

-- Holes the matrix finds that corral or the configuration has, run by nothing: {configuration,
-- policy, case name, why}; printed as `ok - ... # SKIP known: why` and listed in deploy/README.md.
-- `policy` "*" is every policy of that configuration; case "*" is the configuration and policy
-- as a whole, not started.
local KNOWN = {
  { "gvisor", "warm", "an army of unreaped zombies does not disturb the end of the run",
    "gVisor counts RLIMIT_NPROC for the whole sandbox per uid, not per user namespace: the controller, the zygote and a concurrent run take the run's slots, and its forks fail with EAGAIN" },
  { "gvisor", "warm", "threads burning CPU on every core end with reason cpu",
    "gVisor counts RLIMIT_NPROC for the whole sandbox per uid, not per user namespace: the controller, the zygote and a concurrent run take the run's slots, and its threads fail to start" },
  { "gvisor", "*", "the run's own /proc shows neither the controller's pid, the install path, the lock dir nor the plan",
    "no private /proc under gVisor: /proc/1 is the container's tini, whose command line names /run/corral" },
  { "gvisor", "*", "host secrets stay unreadable: /etc/shadow, /root, the kernel's memory",
    "gVisor lets the run read /proc/1/environ, tini's: the container's environment (a CORRAL_TOKEN given with -e)" },
  { "gvisor", "*", "PTRACE_ATTACH to its supervisor fails and its memory cannot be read",
    "attach is refused, but gVisor lets the run read its supervisor's /proc/PID/environ and fd" },
  { "gvisor", "*", "detached SysV shared memory counts against the whole-run memory budget, or is refused within it",
    "under gVisor the budget does not see SysV segments, and the IPC namespace's bounds do not refuse them" },
  { "gvisor", "*", "SysV message queues counts against the whole-run memory budget, or is refused within it",
    "under gVisor the budget does not see SysV message queues" },
  { "gvisor", "*", "SysV semaphore sets counts against the whole-run memory budget, or is refused within it",
    "under gVisor the budget does not see SysV semaphores" },
  { "gvisor", "*", "unix socketpair buffers counts against the whole-run memory budget, or is refused within it",
    "under gVisor the budget does not see socket buffers (no sock_diag)" },
  { "gvisor", "*", "POSIX message queues counts against the whole-run memory budget, or is refused within it",
    "gVisor refuses the case's setrlimit(RLIMIT_MSGQUEUE); its bound on mq_open is not tested there" },
  { "gvisor", "*", "a UDP packet to 8.8.8.8:53 cannot be sent",
    "not sent, but gVisor's netstack says EHOSTUNREACH, which the case does not take for a refusal" },
  { "gvisor", "*", "a fork chain each burning 0.7 s of CPU exceeds a 1 s whole-run budget, reason cpu",
    "under gVisor the CPU budget misses the CPU of the run's exited children: three links of 0.7 s ran to the end" },
  { "gvisor", "*", "8 children of 100 MB each exceed a 256 MB whole-run budget, reason memory",
    "under gVisor the memory budget does not end it before the timeout" },
  { "gvisor", "*", "eight children of 160 MB at once overshoot a 256 MB budget by at most a quarter",
    "under gVisor the memory budget saw 173 MiB of 8 x 160 MiB and did not end it before the timeout" },
  { "gvisor", "*", "a fork bomb is held to the process limit",
    "under gVisor 16 forks of Python can outlast the case's 2 s (2 runs in 3 ended at the timeout), and what it printed is then lost at the stop" },
  { "docker-default", "warm", "an army of unreaped zombies does not disturb the end of the run",
    "no user namespace of the run's own: RLIMIT_NPROC counts every process of the container's uid, the controller's, the zygote's and a concurrent run's, and the run's forks can fail with EAGAIN" },
  { "seccomp-corral", "*", "eight children of 160 MB at once overshoot a 256 MB budget by at most a quarter",
    "a polled budget, without a delegated memory cgroup: in a container on a machine just busy, 8 x 160 MiB at once reached 325-367 MiB before the tick that stopped them, over the quarter (320 MiB)" },
  { "docker-default", "*", "eight children of 160 MB at once overshoot a 256 MB budget by at most a quarter",
    "a polled budget, without a delegated memory cgroup: in a container on a machine just busy, 8 x 160 MiB at once reached 325-367 MiB before the tick that stopped them, over the quarter (320 MiB)" },
  { "docker-default", "*", "unix socketpair buffers counts against the whole-run memory budget, or is refused within it",
    "no network namespace, uid or /proc of the run's own: the budget misses its socket buffers past a sixteenth" },
}
for _, k in ipairs({
  { "a write past file_mb ends with reason file-size", "by design bwrap gives no writable directory: the write fails EROFS" },
  { "a write past file_mb with SIGXFSZ at its default is killed by SIGXFSZ", "by design bwrap gives no writable directory" },
  { "sqlite3 and flock work on the run's own files in its work dir", "by design bwrap gives no writable directory" },
  { "no fd but 0, 1 and 2 is open in the program, 0 being /dev/null", "by design bwrap's root has no /proc to look in" },
  { "unix socketpair buffers counts against the whole-run memory budget, or is refused within it",
    "the budget does not see into bwrap's own network namespace: socket buffers are not counted" },
  { "signals to the supervising init are without effect",
    "the program can kill bwrap's pid 1 in bwrap's own PID namespace: the run ends by SIGKILL (its own run only)" },
}) do
  KNOWN[#KNOWN + 1] = { "seccomp-corral", "bwrap", k[1], k[2] }
end

local function known_hole(where, case_name)
  for _, k in ipairs(KNOWN) do
    if (where == k[1] .. "/" .. k[2] or (k[2] == "*" and where:sub(1, #k[1] + 1) == k[1] .. "/"))
        and case_name == k[3] then
      return k[4]
    end
  end
end

local function as_list(v)
  if v == nil then return {} end
  if type(v) == "table" then return v end
  return { v }
end

-- Every way `r` falls short of the case's expectation (hostile_spec.lua's evaluate(), without
-- what only the host can see: survivors, host leaks, the next run).
local function evaluate(case, ctx, r, elapsed, timeout)
  local P = {}
  local function bad(fmt, ...) P[#P + 1] = string.format(fmt, ...) end
  if elapsed > timeout + SLACK then bad("took %.2f s, more than timeout + %d s", elapsed, SLACK) end
  local e = case.expect
  if type(e) == "function" then e = e(ctx) end
  e = e or {}
  for _, k in ipairs({ "reason", "returncode", "ok", "timed_out", "truncated" }) do
    if e[k] ~= nil and r[k] ~= e[k] then bad("%s is %s, expected %s", k, tostring(r[k]), tostring(e[k])) end
  end
  if e.signal ~= nil then
    local sig = r.signal ~= cjson.null and r.signal or nil
    if sig ~= (e.signal or nil) then bad("signal is %s, expected %s", tostring(sig), tostring(e.signal or nil)) end
  end
  for _, stream in ipairs({ "stdout", "stderr" }) do
    for _, pat in ipairs(as_list(e[stream])) do
      if not r[stream]:find(pat) then bad("%s does not match %q: %q", stream, pat, r[stream]:sub(1, 300)) end
    end
    for _, pat in ipairs(as_list(e[stream .. "_not"])) do
      if r[stream]:find(pat) then bad("%s matches %q: %q", stream, pat, r[stream]:sub(1, 300)) end
    end
  end
  if e.stdout_exact and r.stdout ~= e.stdout_exact then
    bad("stdout is %q, expected %q", r.stdout:sub(1, 300), e.stdout_exact)
  end
  if e.max_elapsed and elapsed > e.max_elapsed + SLACK then
    bad("took %.2f s, expected at most %.2f s (+%d)", elapsed, e.max_elapsed, SLACK)
  end
  local unseen
  if case.check then
    -- a check that reads a field the HTTP result does not carry (the library's byte counts)
    -- does not apply here
    local missing = {}
    local proxy = setmetatable({}, { __index = function(_, k)
      if r[k] == nil then missing[#missing + 1] = k end
      return r[k]
    end })
    local okc, err = pcall(case.check, proxy, ctx, { res = proxy, elapsed = elapsed })
    if not okc and #missing > 0 then
      unseen = "its check reads " .. table.concat(missing, " ") .. ", which the HTTP result does not carry"
    elseif not okc then
      bad("check: %s", tostring(err))
    end
  end
  return P, unseen
end

-- The cases that make sense from outside, with the request each sends; the others with why not.
local function eligible_cases(ctx_base)
  local runnable, skipped = {}, {}
  for _, case in ipairs(S.load_cases()) do
    local why
    for _, k in ipairs(SKIP_FIELDS) do
      if case[k] then why = "needs " .. k; break end
    end
    if not why and HOST_ONLY[case.name] then why = HOST_ONLY[case.name] end
    local body
    if not why then
      local ctx = {}
      for k, v in pairs(ctx_base) do ctx[k] = v end
      ctx.name, ctx.marker, ctx.token = case.name, S.marker(ctx_base.prefix, case.index), S.host_token(ctx_base.prefix, case.index)
      local okc, code = pcall(S.case_code, case, ctx)
      local opts = case.opts
      if type(opts) == "function" then opts = opts(ctx) end
      body = { code = okc and code or "" }
      if not okc then why = "its code needs the host: " .. tostring(code) end
      for k, v in pairs(opts or {}) do
        if not RUN_FIELDS[k] then why = why or ("option " .. k .. " is not a request field") end
        body[k] = v
      end
      local text = cjson.encode(body)
      if not why and #text > MAX_BODY then why = "its body is over the controller's 1 MiB --max-body" end
      if not why and select(2, core.utf8_repair(text)) == false then why = "its body is not UTF-8 (JSON cannot carry it)" end
      case.ctx = ctx
    end
    if why then
      skipped[#skipped + 1] = { case = case, why = why }
    else
      runnable[#runnable + 1] = { case = case, body = body }
    end
  end
  return runnable, skipped
end

local function run_cases(where, name, policy_name, ctx_base, limits_seen)
  local runnable, skipped = eligible_cases(ctx_base)
  local list = {}
  for _, item in ipairs(runnable) do
    local case, body = item.case, item.body
    -- the cases are written for the default policy's defaults: other policies get them explicitly
    for k, v in pairs(DEFAULT_OPTIONS) do
      if body[k] == nil then body[k] = v end
    end
    local timeout = body.timeout
    local needs_missing = {}
    for _, n in ipairs(case.needs or {}) do
      if not has(limits_seen, n) then needs_missing[#needs_missing + 1] = n end
    end
    local known = known_hole(where, case.name)
    if known then
      skip("%s: %s # SKIP known: %s", where, case.name, known)
    elseif #needs_missing > 0 then
      skip("%s: %s: needs %s, which this configuration does not give", where, case.name, table.concat(needs_missing, " "))
    else
      list[#list + 1] = {
        path = "/v1/run", body = body, timeout = timeout + SLACK + 5,
        done = function(a)
          if a.status ~= 200 or not a.json then
            return not_ok("%s: %s: HTTP %s %s", where, case.name, tostring(a.status), tostring(a.body or a.error):sub(1, 400))
          end
          local problems, unseen = evaluate(case, case.ctx, a.json, a.time, timeout)
          if #problems == 0 and unseen then
            skip("%s: %s: %s", where, case.name, unseen)
          elseif #problems == 0 then
            ok("%s: %s", where, case.name)
          else
            local r = a.json
            not_ok("%s: %s\n#   %s\n#   (reason %s, returncode %s, limits: %s)\n#   stdout: %q\n#   stderr: %q", where, case.name,
              table.concat(problems, "\n#   "), tostring(r.reason), tostring(r.returncode),
              table.concat(r.limits or {}, " "), tostring(r.stdout):sub(1, 200), tostring(r.stderr):sub(-300))
          end
        end,
      }
    end
  end
  http_many(name, list)
  return #skipped, skipped
end

---------------------------------------------------------------------------------------------

local prefix = "ctr" .. S.random_hex(4)
local all_ran = true

local function probe_line(res)
  local refused = {}
  for _, k in ipairs(sorted_keys(res.refused)) do
    refused[#refused + 1] = k .. " (" .. tostring(res.refused[k].errno) .. ")"
  end
  return table.concat(res.limits or {}, " "), table.concat(refused, ", ")
end

for _, config in ipairs(CONFIGS) do
  for _, policy_name in ipairs(POLICIES) do
    local where = config.name .. "/" .. policy_name
    if ONLY and not where:find(ONLY) then goto next_policy end
    if known_hole(where, "*") then
      skip("%s # SKIP known: %s", where, known_hole(where, "*"))
      goto next_policy
    end
    do
      local cmd = policy_name ~= "default" and { "serve", "--listen", "unix:/run/corral/corral.sock", "--policy", policy_name } or nil
      local name, err = start(config, policy_name, cmd)
      if not check(name, "%s: the container starts as deploy/README.md says and answers /healthz%s", where,
          name and "" or (": " .. tostring(err))) then
        all_ran = false
        goto next_policy
      end
      local a = http(name, "POST", "/v1/run", { code = "print(6 * 7)" }, 60)
      if not check(a.status == 200 and a.json and a.json.stdout == "42\n",
          "%s: POST /v1/run prints 42%s", where, a.status == 200 and "" or (": HTTP " .. tostring(a.status) .. " " .. tostring(a.body or a.error):sub(1, 400))) then
        all_ran = false
        note("%s: the controller's log: %s", where, (docker("logs", "--tail", "15", name)):gsub("\n", "\n#   "))
        remove(name)
        goto next_policy
      end
      local res = a.json
      check_promise(config, policy_name, res)
      local limits, refused = probe_line(res)
      table_rows[#table_rows + 1] = { config = config.label, policy = policy_name, limits = limits, refused = refused,
                                      network_isolated = res.network_isolated }
      local ctx_base = { prefix = prefix, host_home = "/nonexistent", tree = "/usr/local/share/lua/5.4/corral",
                         controller_pid = controller_pid(name) or 1, root = false, host_uid = 10001,
                         world_writable = {} }
      local n_skipped, skipped = run_cases(where, name, policy_name, ctx_base, res.limits)
      if policy_name == "default" and config.name == CONFIGS[1].name then
        local why = {}
        for _, s in ipairs(skipped) do why[s.why:match("^(%S+ %S+)")] = (why[s.why:match("^(%S+ %S+)")] or 0) + 1 end
        local parts = {}
        for _, k in ipairs(sorted_keys(why)) do parts[#parts + 1] = why[k] .. " " .. k end
        note("hostile cases not run from outside: %d (%s)", n_skipped, table.concat(parts, ", "))
      end
      if policy_name == "default" then check_lifecycle(where, name) end
      remove(name)
    end
    ::next_policy::
  end
end

-- The table of what each configuration and policy got, between deploy/README.md's markers.
local BEGIN = "<!-- containers table: written by make test-containers (spec/containers.lua) -->"
local END = "<!-- end of containers table -->"
local function write_table()
  local lines = { BEGIN, "",
    "| configuration | policy | network isolated | `limits` | `refused` (errno) |",
    "|---|---|---|---|---|" }
  for _, r in ipairs(table_rows) do
    lines[#lines + 1] = string.format("| %s | %s | %s | %s | %s |", r.config, r.policy,
      r.network_isolated and "yes" or "no", r.limits, r.refused ~= "" and r.refused or "nothing")
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "Known holes (spec/containers.lua's `KNOWN`: skipped, each with its reason):"
  lines[#lines + 1] = ""
  for _, k in ipairs(KNOWN) do
    lines[#lines + 1] = string.format("- %s, %s: %s — %s.", k[1], k[2] == "*" and "every policy" or k[2],
      k[3] == "*" and "not run" or k[3], k[4])
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = END
  local path = TREE .. "/deploy/README.md"
  local text = read(path)
  local a = text:find(BEGIN, 1, true)
  local b = a and text:find(END, a, true)
  if not check(a and b, "deploy/README.md has the containers table's markers") then return end
  local new = text:sub(1, a - 1) .. table.concat(lines, "\n") .. text:sub(b + #END)
  if new ~= text then
    local f = assert(io.open(path, "wb"))
    f:write(new)
    f:close()
    note("deploy/README.md: the containers table was rewritten from this run")
  else
    note("deploy/README.md: the containers table is as this run found")
  end
end

for name in pairs(started) do remove(name) end
if all_ran and not ONLY then write_table() end
print(string.format("# containers.lua: %d ok, %d not ok", n_ok, n_fail))
os.exit(n_fail == 0 and 0 or 1)
