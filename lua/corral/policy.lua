--- Policies: how a request becomes a launch plan, and how the outcome becomes a result.
--
-- A policy is a Lua file that returns a policy table. The simplest one extends a shipped policy
-- and changes data:
--
--     local policy = require "corral.policy"
--     return policy.load("default"):extend {
--       name = "tenant-small",
--       maxima = { timeout = 10, memory_mb = 128 },
--       clamp = true,
--     }
--
-- Fields (data): `name`, `description`, `defaults` (option defaults), `maxima` (largest value a
-- caller may ask for, per option), `clamp` (true: lower an option over its maximum and say so in
-- `result.clamped`; false: refuse the run naming the option), `python_path` (where an interpreter
-- name is looked up), `python_args`, `env` (the sandbox's environment before HOME/TMPDIR),
-- `network` ("new": a network namespace per run, "shared": one for every run of this controller,
-- "host"), `pid_namespace`, `user_namespace` ("auto", "never", "always"), `uid_range` ({first, last}, used when the
-- controller is root), `tmp_dir`, `tmpfs` (path → MiB: fresh scratch mounts, with a PID
-- namespace), `work_mb` (the work dir as a tmpfs of this size), `work_path` (where the program
-- sees that work dir, its cwd, HOME and TMPDIR, e.g. "/home/sandbox", inside one of `tmpfs`:
-- where the launcher cannot place it there, the host path and `refused["work-at"]`; false: the
-- host path), `code_path` (where the program sees its code dir, e.g. "/run/code", inside one
-- of `tmpfs`: where the launcher cannot bind it there, the host path and `refused["code-at"]`;
-- false: the host path), `kill_on_overflow`, `grace`,
-- `tail_bytes`, `code_name`, `wrapper_processes` (processes of a wrapper the launcher runs instead
-- of the interpreter, such as bwrap's monitor, that RLIMIT_NPROC counts with the program's: added
-- to `processes`).
-- Hardening: `filesystem` ("off", "auto", "require": Landlock), `fs_read` and `fs_write` (paths
-- the program may read and execute, or also write, besides the interpreter's own directories,
-- the code and the work dir), `deny_tcp` (Landlock's TCP wall: true with `network = "new"` or "shared",
-- "always" with the host network too), `scope`
-- (Landlock scoping of signals and abstract unix sockets), `seccomp` ("off", "auto", "require"),
-- `deny_syscalls` (names answered EPERM), `deny_sockets` ("always", "without-netns", "never":
-- socket() of every family but AF_UNIX, and bind()), `unix_sockets` ("pairs", the default with a
-- seccomp filter: no unix socket but a connected stream or seqpacket pair, so no path or name is
-- reached; "any"), `seccomp_cache` (default true: the built filter is kept
-- in the controller's private lock directory and loaded from there by the next runs), `budgets` ("off", "poll", "cgroup", "auto": whole-run
-- CPU and memory), `budget_poll_ms`, `cgroup` (a delegated cgroup v2 directory),
-- `protect_controller` (default true: the controller is made non-dumpable before its first run),
-- `separation` ("off", "auto", "require": the program walled off from the controller and other
-- runs, by a uid of its own or by Landlock with a PID namespace; see corral-launch --separate).
-- Per-run kernel quotas, which the kernel otherwise counts per uid, for every run of a controller
-- that is not root together: `user_quotas` (name → value: /proc/sys/user/max_NAME in the run's own
-- user namespace, e.g. inotify_instances), `pending_signals` (RLIMIT_SIGPENDING: queued signals
-- and POSIX timers), `message_queue_bytes` (RLIMIT_MSGQUEUE), `deny_pipe_growth` (seccomp refuses
-- F_SETPIPE_SZ above a pipe's default 64 KiB).
-- Promises: `require` (a list of `limits` names, e.g. {"pid-namespace", "no-network"}): what
-- every run of this policy must get. `corral serve` probes the policy before it listens and
-- refuses to start, naming each one and why the host refuses it, when a run would lack any.
-- Speed: `warm` (false, or `{preload = {module names}}`: runs are forked from a pre-started
-- interpreter, corral-zygote, that imported these modules; see lua/corral/warm.lua), `prestart`
-- (0..4: launches a controller keeps started ahead of the runs of the same options, each with its
-- namespaces and mounts made, waiting for its code; with a PID namespace; see lua/corral/prestart.lua).
--
-- Methods a policy may override, each called with the policy as `self`:
-- `prepare(opts, host)` → opts (defaults, maxima, checks against the host; raise for a bad request,
-- return nil, message, code when the host cannot do what is asked), `command(opts, run, host)` →
-- argv of the program the launcher starts, `launch_args(opts, run, host)` → the launcher's argv,
-- `classify(raw, opts, rep)` → reason string, `result(raw, opts, run, host)` → the result table.
local core = require "corral.core"
local paths = require "corral.paths"
local prelude = require "corral.prelude"
local report = require "corral.report"

local M = {}
local Policy = {}
-- policy table → why its runs cannot be walled off here (a run's `fatal separation`)
local cannot = setmetatable({}, { __mode = "k" })

--- Why runs of `pol` do not start on this host, known from one that tried (its separation), or nil.
function M.cannot_run(pol) return cannot[pol] end
Policy.__index = Policy

local SIGKILL, SIGXCPU, SIGXFSZ = 9, 24, 25

--- Make a root policy from `spec`: the base methods and only the data `spec` gives. Used by
-- policies/default.lua; anything else starts from a shipped policy with `new` or `extend`.
function M.base(spec)
  return setmetatable(spec or {}, Policy)
end

--- Make a policy from a plain table: the default policy, with what `spec` sets.
function M.new(spec)
  return M.load("default"):extend(spec or {})
end

--- A new policy that inherits everything from `self` and overrides what `spec` sets.
-- Tables in `defaults`, `maxima` and `env` are merged key by key, not replaced.
function Policy:extend(spec)
  spec = spec or {}
  for _, k in ipairs({ "defaults", "maxima", "env" }) do
    if spec[k] and self[k] then
      local merged = {}
      for key, v in pairs(self[k]) do merged[key] = v end
      for key, v in pairs(spec[k]) do merged[key] = v end
      spec[k] = merged
    end
  end
  spec.parent = self
  return setmetatable(spec, { __index = self })
end

local function fail(self, field, msg)
  error("policy '" .. tostring(rawget(self, "name") or self.name) .. "': field '" .. field .. "' " .. msg, 0)
end

local function check_kind(self, field, v, kind)
  if type(v) ~= kind then fail(self, field, "must be a " .. kind .. ", got " .. type(v)) end
end

local function check_strings(self, field, t, keyed)
  check_kind(self, field, t, "table")
  for k, v in pairs(t) do
    if keyed and type(k) ~= "string" then fail(self, field, "must have string keys") end
    if type(v) ~= "string" then fail(self, field, "must hold strings, got " .. type(v)) end
  end
end

-- A list of names, each matching `pattern` ("holds 'x', not <what>" otherwise).
local function check_names(self, field, t, pattern, what)
  check_strings(self, field, t)
  for _, name in ipairs(t) do
    if not name:match(pattern) then fail(self, field, "holds '" .. name .. "', not " .. what) end
  end
end

-- The numeric run options: each needs a default, and a policy may set its maximum.
local NUMERIC = require("corral.schema").numeric()

local MECH = { off = true, auto = true, require = true }
local ENUMS = { network = { new = true, shared = true, host = true },
                user_namespace = { auto = true, never = true, always = true },
                filesystem = MECH, seccomp = MECH, separation = MECH,
                deny_sockets = { always = true, ["without-netns"] = true, never = true },
                unix_sockets = { pairs = true, any = true },
                budgets = { off = true, poll = true, cgroup = true, auto = true } }

local function check_paths(self, field, t)
  check_strings(self, field, t)
  for _, p in ipairs(t) do
    if p:sub(1, 1) ~= "/" then fail(self, field, "must hold absolute paths, got '" .. p .. "'") end
  end
end

--- Check the policy's data, raising an error that names the policy and the field.
-- Called when a policy is loaded or handed over as a table, before any run uses it.
-- @return the policy
function Policy:check()
  local options = require "corral.options"
  check_kind(self, "defaults", self.defaults, "table")
  local ok, err = pcall(options.check, "defaults", self.defaults, options.run_schema)
  if not ok then fail(self, "defaults", "is wrong: " .. tostring(err)) end
  for _, k in ipairs(NUMERIC) do
    if self.defaults[k] == nil then fail(self, "defaults", "lacks " .. k) end
  end
  if self.maxima ~= nil then
    ok, err = pcall(options.check, "maxima", self.maxima, options.run_schema)
    if not ok then fail(self, "maxima", "is wrong: " .. tostring(err)) end
  end
  check_kind(self, "python_path", self.python_path, "string")
  check_strings(self, "python_args", self.python_args)
  check_strings(self, "env", self.env, true)
  for field, allowed in pairs(ENUMS) do
    if self[field] ~= nil and not allowed[self[field]] then
      local names = {}
      for n in pairs(allowed) do names[#names + 1] = n end
      table.sort(names)
      fail(self, field, "must be one of " .. table.concat(names, ", ") .. ", got " .. tostring(self[field]))
    end
  end
  check_kind(self, "pid_namespace", self.pid_namespace, "boolean")
  if self.uid_range ~= nil then
    local r = self.uid_range
    if type(r) ~= "table" or math.type(r[1]) ~= "integer" or math.type(r[2]) ~= "integer"
      or r[1] < 1 or r[2] < r[1] or r[2] > 4294967294 then
      fail(self, "uid_range", "must be {first, last} with 1 <= first <= last")
    end
  end
  check_kind(self, "tmp_dir", self.tmp_dir, "string")
  if self.tmp_dir ~= "auto" and self.tmp_dir:sub(1, 1) ~= "/" then
    fail(self, "tmp_dir", "must be an absolute path or \"auto\"")
  end
  if type(self.code_name) ~= "string" or not self.code_name:match("^[%w_%.%-]+$") then
    fail(self, "code_name", "must be a file name")
  end
  if self.tmpfs ~= nil then
    check_kind(self, "tmpfs", self.tmpfs, "table")
    for path, mb in pairs(self.tmpfs) do
      if type(path) ~= "string" or path:sub(1, 1) ~= "/" then fail(self, "tmpfs", "keys must be absolute paths") end
      if type(mb) ~= "number" or mb < 1 or mb > 1048576 then fail(self, "tmpfs", "sizes must be MiB in 1..1048576") end
    end
  end
  if self.work_mb and (type(self.work_mb) ~= "number" or self.work_mb < 1 or self.work_mb > 1048576) then
    fail(self, "work_mb", "must be MiB in 1..1048576, or false for a work dir on the host")
  end
  for _, k in ipairs({ "work_path", "code_path" }) do
    local w = self[k]
    if w ~= nil and w ~= false and (type(w) ~= "string" or w:sub(1, 1) ~= "/" or w:find("//", 1, true)
      or w:sub(-1) == "/" or ("/" .. w .. "/"):find("/%.%.?/")) then
      fail(self, k, "must be an absolute path without empty, '.' or '..' segments, or false")
    end
  end
  local w, c = self.work_path, self.code_path
  if w and c and ((c .. "/"):sub(1, #w + 1) == w .. "/" or (w .. "/"):sub(1, #c + 1) == c .. "/") then
    fail(self, "code_path", "must not lie in work_path, nor work_path in it")
  end
  for _, k in ipairs({ "fs_read", "fs_write" }) do
    if self[k] ~= nil then check_paths(self, k, self[k]) end
  end
  if self.deny_tcp ~= nil and self.deny_tcp ~= "always" and type(self.deny_tcp) ~= "boolean" then
    fail(self, "deny_tcp", "must be true, false or \"always\"")
  end
  if self.user_quotas ~= nil and self.user_quotas ~= false then
    check_kind(self, "user_quotas", self.user_quotas, "table")
    for k, v in pairs(self.user_quotas) do
      if type(k) ~= "string" or not k:match("^[%l_]+$") or #k > 32 then
        fail(self, "user_quotas", "keys must be names of /proc/sys/user/max_*, got " .. tostring(k))
      end
      if math.type(v) ~= "integer" or v < 0 or v > 2147483647 then
        fail(self, "user_quotas", "values must be integers in 0..2147483647")
      end
    end
  end
  for _, k in ipairs({ "pending_signals", "message_queue_bytes" }) do
    if self[k] ~= nil and self[k] ~= false and (math.type(self[k]) ~= "integer" or self[k] < 0) then
      fail(self, k, "must be an integer >= 0, or false")
    end
  end
  for _, k in ipairs({ "scope", "protect_controller", "seccomp_cache", "deny_pipe_growth" }) do
    if self[k] ~= nil then check_kind(self, k, self[k], "boolean") end
  end

  if self.deny_syscalls ~= nil then
    check_names(self, "deny_syscalls", self.deny_syscalls, "^[%l%d_]+$", "a system call name")
  end
  if self.require ~= nil then check_names(self, "require", self.require, "^[%l%-]+$", "a limits name") end
  if self.budget_poll_ms ~= nil and (math.type(self.budget_poll_ms) ~= "integer"
      or self.budget_poll_ms < 1 or self.budget_poll_ms > 1000) then
    fail(self, "budget_poll_ms", "must be an integer in 1..1000")
  end
  if self.cgroup ~= nil and (type(self.cgroup) ~= "string" or self.cgroup:sub(1, 1) ~= "/") then
    fail(self, "cgroup", "must be an absolute path (a delegated cgroup v2 directory)")
  end
  if self.budgets == "cgroup" and not self.cgroup then
    fail(self, "budgets", "is cgroup but the policy names no cgroup directory")
  end
  if self.wrapper_processes ~= nil and (math.type(self.wrapper_processes) ~= "integer"
      or self.wrapper_processes < 0 or self.wrapper_processes > 16) then
    fail(self, "wrapper_processes", "must be an integer in 0..16")
  end
  for _, k in ipairs({ "grace", "tail_bytes" }) do
    if type(self[k]) ~= "number" or self[k] < 0 then fail(self, k, "must be a number >= 0") end
  end
  for _, k in ipairs({ "max_files_in_mb", "max_file_out_mb", "max_files_out_mb" }) do
    if self[k] ~= nil and (type(self[k]) ~= "number" or self[k] < 0 or self[k] > 1024) then
      fail(self, k, "must be MiB in 0..1024")
    end
  end
  if self.max_files_out ~= nil and (math.type(self.max_files_out) ~= "integer" or self.max_files_out < 0
      or self.max_files_out > 100000) then
    fail(self, "max_files_out", "must be an integer in 0..100000")
  end
  if self.workspace ~= nil then check_kind(self, "workspace", self.workspace, "boolean") end
  if self.prestart ~= nil and (math.type(self.prestart) ~= "integer" or self.prestart < 0
      or self.prestart > 4) then
    fail(self, "prestart", "must be an integer in 0..4")
  end
  if self.warm ~= nil and self.warm ~= false then
    check_kind(self, "warm", self.warm, "table")
    for k in pairs(self.warm) do
      if k ~= "preload" then fail(self, "warm", "has an unknown key '" .. tostring(k) .. "' (known: preload)") end
    end
    if self.warm.preload ~= nil then
      check_strings(self, "warm.preload", self.warm.preload)
      for _, m in ipairs(self.warm.preload) do
        if not m:match("^[%a_][%w_]*$") and not m:match("^[%a_][%w_]*%.[%w_%.]*[%w_]$") then
          fail(self, "warm.preload", "holds '" .. m .. "', not a module name")
        end
      end
    end
  end
  return self
end

--- Fill defaults, apply the policy's maxima, resolve the interpreter, check the host.
-- Raises for a request over a maximum when `clamp` is false (the message names the option).
-- @return opts, or nil, message, code when this host cannot honour the request
function Policy:prepare(opts, host)
  local o = {}
  for k, v in pairs(self.defaults or {}) do o[k] = v end
  for k, v in pairs(opts) do o[k] = v end
  o.clamped = nil
  local maxima = self.maxima or {}
  for _, k in ipairs(NUMERIC) do
    local max = maxima[k]
    if max and o[k] and o[k] > max then
      if self.clamp then
        o.clamped = o.clamped or {}
        o.clamped[#o.clamped + 1] = k
        o[k] = max
      else
        error("option '" .. k .. "' is " .. tostring(o[k]) .. ", over the maximum of " .. tostring(max)
          .. " that policy '" .. tostring(self.name) .. "' allows", 0)
      end
    end
  end
  if o.files or o.collect or o.args then
    local ws = require "corral.workspace"
    if self.workspace == false and (o.files or o.collect) then
      local which = o.files and "files" or "collect"
      error("option '" .. which .. "' is not supported by policy '" .. tostring(self.name) .. "'", 0)
    end
    local over = o.files and ws.over_caps(self, o.files)
    if over then error(over, 0) end
  end
  local python, err, code = require("corral.host").interpreter(o.python or "python3", self.python_path)
  if not python then return nil, err, code end
  o.python_exe = python
  if o.require_network_isolation and self.network ~= "new" and self.network ~= "shared"
    and not self.wrapper_isolates_network then
    return nil, "ENOTSUP: network isolation was required but policy '" .. tostring(self.name)
      .. "' keeps the host network", "ENOTSUP"
  end
  -- known only once a probe ran; otherwise the launcher's `--net require` enforces it
  if o.require_network_isolation and host.network_isolation == false then
    local c = host.caps["userns-network-namespace"] or host.caps["network-namespace"] or {}
    return nil, "ENOTSUP: network isolation is not available here (" .. (c.message or c.errno or "refused")
      .. "); run inside a container with --network none, or allow user namespaces", "ENOTSUP"
  end
  return o
end

--- Whether the run's program starts before its files are made and waits for them (corral-launch
-- --files-wait-fd, corral.prelude's waiting source): a cold run with files through the prelude.
-- The launcher makes them meanwhile, while the interpreter starts.
function Policy:files_wait(run)
  return run.files_in ~= nil and not run.zygote and self:prelude()
end

--- Whether the program runs through the prelude: python_args without -u.
function Policy:prelude()
  for _, a in ipairs(self.python_args or { "-I" }) do
    if a == "-u" then return false end
  end
  return true
end

--- The program the launcher runs: the interpreter on the code file.
-- Without -u in python_args the interpreter runs the code through the prelude (corral.prelude:
-- buffered stdout, flushed when the run is ended); a warm interpreter has the prelude's handlers
-- itself (corral-zygote --flush-handlers) and runs the file as python3 -I FILE does, where the
-- prelude's per-run work would copy zygote pages. With -u it runs the file itself. Python before
-- 3.12 silently stops reading a source file at its first NUL byte: such code goes through the
-- prelude even when warm, and under -u is compiled from bytes instead, so that Python itself
-- reports the NUL bytes as an error (the prelude always compiles from bytes).
-- @param path the code file as the interpreter sees it (default: the code_dir's)
function Policy:python_argv(opts, run, path)
  local argv = { opts.python_exe }
  for _, a in ipairs(self.python_args or { "-I" }) do argv[#argv + 1] = a end
  if self:prelude() and (run.has_nul or not run.zygote) then
    argv[#argv + 1] = "-c"
    argv[#argv + 1] = self:files_wait(run) and prelude.waiting_source or prelude.source
  elseif run.has_nul then
    argv[#argv + 1] = "-c"
    argv[#argv + 1] = "import sys; p = sys.argv[1]; exec(compile(open(p, 'rb').read(), p, 'exec'))"
  end
  -- a file of `files` (args[1]) runs instead of the code, by its path in the work dir, the cwd
  local main = run.main
  if main then
    argv[#argv + 1] = main:sub(1, 1) == "-" and ("./" .. main) or main
  else
    argv[#argv + 1] = path or (self:code_dir(run) .. "/" .. (self.code_name or "main.py"))
  end
  local args = opts.args
  for i = main and 2 or 1, args and #args or 0 do argv[#argv + 1] = args[i] end
  return argv
end

function Policy:command(opts, run)
  return self:python_argv(opts, run)
end

--- Where the program sees its work dir: `work_path` when the launcher is asked to put the work
-- tmpfs there (--work-at: a PID namespace, whose mount namespace holds it, and `work_mb`), else
-- the host's run directory.
function Policy:work_dir(run)
  if self.work_path and self.pid_namespace and self.work_mb then return self.work_path, true end
  return run.workdir, false
end

--- Where the program sees its code dir: `code_path` when the launcher is asked to bind it there
-- (--code-at: a PID namespace, whose mount namespace holds it, and scratch mounts, over which the
-- code dir is bound back), else the host's. Where the launcher cannot, it rewrites the program's
-- arguments that name `code_path` to the host path.
function Policy:code_dir(run)
  if self.code_path and self.pid_namespace and next(self.tmpfs or {}) then return self.code_path, true end
  return run.code_dir, false
end

--- The sandbox's environment, as NAME=VALUE strings in a stable order. HOME and TMPDIR are the
-- work dir; where the launcher cannot place it at `work_path`, it rewrites them to the host path.
function Policy:environment(opts, run)
  local env = {}
  for k, v in pairs(self.env or {}) do env[k] = v end
  local wd = self:work_dir(run)
  env.HOME, env.TMPDIR = wd, wd
  for k, v in pairs(opts.env or {}) do env[k] = v end
  local names = {}
  for k in pairs(env) do names[#names + 1] = k end
  table.sort(names)
  local out = {}
  for i, k in ipairs(names) do out[i] = k .. "=" .. env[k] end
  return out
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

--- What the program may read and execute (`ro`) and also write (`rw`) under Landlock: the
-- interpreter's own directories, the code dir and the policy's `fs_read`; the work dir, the
-- run's private scratch mounts and the policy's `fs_write`. Everything else is denied.
-- @return ro, rw (lists of absolute paths)
function Policy:filesystem_rules(opts, run)
  local ro, rw, seen = {}, {}, {}
  local function add(list, p)
    if not seen[p] then seen[p] = true; list[#list + 1] = p end
  end
  -- both: the launcher grants the one the program works in
  local wd, at = self:work_dir(run)
  if at then add(rw, wd) end
  add(rw, run.workdir)
  if self.pid_namespace then
    -- private to the run (the launcher grants them only when it mounted them)
    for _, path in ipairs(sorted_keys(self.tmpfs)) do add(rw, path) end
  end
  for _, p in ipairs(self.fs_write or {}) do add(rw, p) end
  -- both: the launcher grants the one the code is at
  local cd, cat = self:code_dir(run)
  if cat then add(ro, cd) end
  add(ro, run.code_dir)
  for _, p in ipairs(require("corral.host").python_roots(opts.python_exe)) do add(ro, p) end
  for _, p in ipairs(self.fs_read or {}) do add(ro, p) end
  return ro, rw
end

--- Whether runs of this policy may join the controller's shared network namespace: `network =
-- "shared"`, and the walls that keep concurrent runs apart in it (their loopback and abstract
-- unix sockets are shared): the seccomp filter refusing every socket but AF_UNIX, and Landlock
-- scoping abstract unix sockets. Without them each run gets its own namespace, as with "new".
function Policy:shares_network()
  return self.network == "shared" and self.seccomp ~= nil and self.seccomp ~= "off"
    and (self.deny_sockets == "always" or self.deny_sockets == "without-netns")
    and self.filesystem ~= nil and self.filesystem ~= "off" and self.scope ~= false
end

--- The launcher's argument vector for one run.
function Policy:launch_args(opts, run, host)
  local function int(n) return string.format("%d", math.floor(n)) end
  local a = { "--report-fd", "3", "--parent-pid", tostring(core.getpid()) }
  local n = #a
  local function add(x, y, z, w)   -- one to four arguments, without a table per call
    n = n + 1; a[n] = x
    if y then n = n + 1; a[n] = y end
    if z then n = n + 1; a[n] = z end
    if w then n = n + 1; a[n] = w end
  end
  -- (a run forked by a zygote is in the zygote's namespace, shared by its runs)
  local own_netns = self.network == "new" or self.network == "shared"
  if own_netns then add("--net", opts.require_network_isolation and "require" or "new") end
  if self:shares_network() and not run.zygote then
    -- the controller's shared namespace; without a holder the run makes its own
    local hostm = require("corral.host")
    run.holder_userns = self.user_namespace or "auto"
    run.net_join = hostm.net_holder(run.holder_userns)
    if run.net_join then add("--net-join", tostring(run.net_join)) end
  end
  add(self.pid_namespace and "--pidns" or "--no-pidns")
  if self.user_namespace then add("--userns", self.user_namespace) end
  if run.uid then add("--uid", tostring(run.uid), "--gid", tostring(run.gid)) end
  if self.pid_namespace then
    -- fresh, size-bounded scratch mounts and an in-memory work dir, private to the run; the
    -- code dir (under the host's /tmp, hidden by a /tmp tmpfs) is bound back read-only
    local paths_ = sorted_keys(self.tmpfs)
    for _, path in ipairs(paths_) do add("--tmpfs", path .. "=" .. int(self.tmpfs[path] * 1048576)) end
    if #paths_ > 0 then
      add("--ro-bind", run.code_dir)   -- first: the one --code-at places
      local cd, cat = self:code_dir(run)
      if cat then add("--code-at", cd) end
      -- an interpreter's directory under a scratch path (a virtualenv in /tmp) is bound back too
      for _, root in ipairs(require("corral.host").python_roots(opts.python_exe)) do
        for _, path in ipairs(paths_) do
          if root:sub(1, #path + 1) == path .. "/" then add("--ro-bind", root) break end
        end
      end
    end
    if self.work_mb then add("--work-tmpfs", int(self.work_mb * 1048576)) end
    local wd, at = self:work_dir(run)
    if at then add("--work-at", wd) end
  end
  add("--rlimit", "cpu=" .. int(opts.cpu_seconds))
  add("--rlimit", "as=" .. int(opts.memory_mb * 1048576))
  add("--rlimit", "fsize=" .. int(opts.file_mb * 1048576))
  add("--rlimit", "core=0")
  add("--rlimit", "nofile=" .. int(opts.open_files))
  -- the program's processes; the launcher adds its own that the kernel counts with them, and a
  -- wrapper's (bwrap's monitor) are the policy's to add
  add("--rlimit", "nproc=" .. int(opts.processes + (self.wrapper_processes or 0)))
  if self.pending_signals then add("--rlimit", "sigpending=" .. int(self.pending_signals)) end
  -- POSIX message queues hold kernel memory outside the budget's sight: the policy's bytes (the
  -- kernel's default, 800 KiB, without one), never more than an eighth of memory_mb, and no
  -- program may raise it
  add("--rlimit", "msgqueue=" .. int(math.min(self.message_queue_bytes or 819200, opts.memory_mb * 131072)))
  if self.user_quotas then
    for _, k in ipairs(sorted_keys(self.user_quotas)) do add("--user-max", k .. "=" .. int(self.user_quotas[k])) end
  end
  if self.filesystem and self.filesystem ~= "off" then
    add("--landlock", self.filesystem)
    local ro, rw = self:filesystem_rules(opts, run)
    for _, p in ipairs(ro) do a[n + 1], a[n + 2], n = "--fs-ro", p, n + 2 end
    for _, p in ipairs(rw) do a[n + 1], a[n + 2], n = "--fs-rw", p, n + 2 end
    if self.deny_tcp == "always" or (self.deny_tcp and own_netns) then add("--deny-tcp") end
    if self.scope ~= false then add("--scope") end
  end
  if self.separation and self.separation ~= "off" then add("--separate", self.separation) end
  -- the prelude flushes the program's output on the launcher's signal before a stop's kill; not
  -- through a wrapper (bwrap's monitor would die of the signal at once). The wait ends when every
  -- process is gone; its bound is half the grace the host gives the launcher after the stop (the
  -- kill and the report take the rest): under gVisor a handler can take tens of milliseconds
  if self:prelude() and (self.wrapper_processes or 0) == 0 then
    add("--flush-signal", "--flush-ms", int(math.max(1, (self.grace or 0.2) * 500)))
  end
  if self.seccomp and self.seccomp ~= "off" then
    add("--seccomp", self.seccomp)
    -- inline: the longest list of a run's arguments, on the path of every run
    for _, name in ipairs(self.deny_syscalls or {}) do a[n + 1], a[n + 2], n = "--deny-syscall", name, n + 2 end
    if self.deny_sockets == "always" then
      add("--deny-sockets")
    elseif self.deny_sockets == "without-netns" and own_netns then
      add("--deny-sockets-without-netns")
    end
    -- no socket that could address a host socket by path, whatever uid the run has (Landlock
    -- does not control connect(), nor a read-only mount)
    if self.unix_sockets ~= "any" then add("--unix-pairs-only") end
    if self.deny_pipe_growth then add("--deny-pipe-growth") end
    if self.seccomp_cache ~= false then
      local dir = require("corral.host").lock_dir()
      if dir then add("--seccomp-cache", dir) end
    end
  end
  if self.budgets and self.budgets ~= "off" then
    -- 0.25 s and a twentieth over cpu_seconds, so that a run of one busy process meets its own
    -- RLIMIT_CPU first (SIGXCPU, which Python can catch) instead of racing the budget's SIGKILL.
    -- The kernel checks RLIMIT_CPU against CPU time sampled at its ticks, which the budget's own
    -- 10 ms wakeups skew: a one-second loop got its SIGXCPU at 0.85 to 1.17 s of exact CPU
    -- time with the budget polling (0.97 to 1.02 s without), and 1 in 16 met a 0.1 s margin's
    -- SIGKILL first
    add("--budget-cpu-ms", int(opts.cpu_seconds * 1050 + 250), "--budget-memory-kb", int(opts.memory_mb * 1024))
    if self.budget_poll_ms then add("--budget-poll-ms", int(self.budget_poll_ms)) end
    if self.cgroup and self.budgets ~= "poll" then
      add("--cgroup", self.cgroup)
      if self.budgets == "cgroup" then add("--cgroup-require") end
    end
  end
  -- the program's files in and out of its work dir (corral.workspace)
  if run.files_in then add("--files-in", run.files_in) end
  if self:files_wait(run) then add("--files-wait-fd", tostring(prelude.FILES_WAIT_FD)) end
  if run.files_out then
    add("--collect-to", run.files_out)
    if opts.collect == true then
      add("--collect-all")
    else
      for _, g in ipairs(opts.collect) do add("--collect", g) end
    end
    local caps = require("corral.workspace").caps(self)
    add("--collect-max", caps.out_files .. "," .. caps.out_file_bytes .. "," .. caps.out_bytes)
  end
  -- the records are the supervisor's and the host's alone: once open, their names go (the host
  -- keeps fds of its own), before a program that may share our uid could reach them
  if run.files_in or run.files_out then add("--unlink-files") end
  for _, e in ipairs(self:environment(opts, run)) do a[n + 1], a[n + 2], n = "--env", e, n + 2 end
  add("--chdir", run.workdir, "--")
  for _, v in ipairs(self:command(opts, run, host)) do a[#a + 1] = v end
  return a
end

-- Lines at the end of stderr that mean the interpreter ran out of memory or file size.
local function last_line(s)
  return (s or ""):gsub("%s+$", ""):match("([^\n]*)$") or ""
end

local function says_memory(tail)
  return tail:match("^MemoryError") or tail:find("Cannot allocate memory", 1, true)
    or tail:find("Fatal Python error: .*[Mm]emory") or tail:find("std::bad_alloc", 1, true)
end

-- What the program prints is only a claim: a limit is named when the supervisor saw it reached.
-- Memory: a refused allocation means address space + request > RLIMIT_AS; a process that grew
-- in steps to its limit holds within a step of it, and its resident set trails its address space
-- by what it mapped and never touched (the interpreter's libraries and arenas: 6 to 14 MiB of
-- python3, more in the warm zygote). So it came near when its largest resident set (getrusage) or
-- address space (the budget's walks) is within a quarter of the limit, or 32 MiB. A single
-- request far past the limit leaves nothing behind and reads as a plain exit: it cannot be told
-- from a program that only prints MemoryError.
local function near_memory(rep)
  local limit = rep.applied.memory and tonumber(rep.applied.memory)
  if not limit then return false end
  local limit_kb = limit // 1024
  local seen = math.max(rep.usage and rep.usage.maxrss_kb or 0, rep.observed.vm or 0)
  return seen >= limit_kb - math.max(limit_kb // 4, 32768)
end

-- File size: write() stops at RLIMIT_FSIZE, then fails (EFBIG, SIGXFSZ): the file is at the
-- limit. The supervisor reports the largest file left in the run's own directories.
local function reached_file_size(rep)
  local limit = rep.applied["file-size"] and tonumber(rep.applied["file-size"])
  return limit and rep.observed.file and rep.observed.file >= limit or false
end

-- Processes: fork() fails with EAGAIN when the run's tasks (threads too, zombies until reaped)
-- would pass RLIMIT_NPROC; the budget's walks (and one at the program's exit) count them.
-- Not applied (uid 0) or not counted (no budget): never.
local function reached_processes(rep)
  local limit = rep.applied.processes and tonumber(rep.applied.processes)
  return limit and rep.observed.tasks and rep.observed.tasks >= limit or false
end

--- Why the run ended: exit, timeout, cpu, memory, processes, file-size, output or signal.
-- @param raw the host's raw outcome; `rep` the parsed launcher report
function Policy:classify(raw, opts, rep)
  if raw.timed_out then return "timeout" end
  -- a whole-run budget ended it
  if rep.exceeded then return rep.exceeded.name == "tasks" and "processes" or rep.exceeded.name end
  if raw.overflow then return "output" end
  local sig = rep.status and rep.status.kind == "signal" and rep.status.code or raw.term_signal
  local cpu_s = rep.usage and (rep.usage.user_us + rep.usage.sys_us) / 1e6 or 0
  if rep.total then cpu_s = math.max(cpu_s, rep.total.cpu_us / 1e6) end
  -- the launcher sets the soft CPU limit at cpu_seconds (SIGXCPU) and the hard one a second later
  -- (SIGKILL, for a program that ignores SIGXCPU). Either is put down to the CPU limit only when
  -- the run spent about that much CPU: a program may send itself SIGXCPU, and the kernel's CPU
  -- clock runs ahead of what getrusage reports by up to a few tenths of a second on a busy machine
  if (sig == SIGXCPU and cpu_s >= opts.cpu_seconds - 0.3)
    or (sig == SIGKILL and cpu_s >= opts.cpu_seconds + 0.5) then
    return "cpu"
  end
  -- SIGXFSZ alone is a signal: the kernel's looks like one the program sends itself
  if sig == SIGXFSZ and reached_file_size(rep) then return "file-size" end
  local tail = last_line(raw.stderr_tail ~= "" and raw.stderr_tail or raw.stderr)
  local failed = (sig and sig ~= 0) or (rep.status and rep.status.code ~= 0) or raw.exit_status ~= 0
  if failed then
    if says_memory(tail) and near_memory(rep) then return "memory" end
    if tail:find("[Errno 27] File too large", 1, true) and reached_file_size(rep) then return "file-size" end
    if reached_processes(rep) then return "processes" end
  end
  if sig and sig ~= 0 then return "signal" end
  return "exit"
end

-- `applied` names in the report → run_python's `limits` names, in its order, then corral's own.
local LIMIT_NAMES = {
  { "cpu", "cpu" }, { "memory", "memory" }, { "file-size", "file-size" }, { "no-core", "no-core" },
  { "open-files", "open-files" }, { "processes", "processes" },
}
local EXTRA_NAMES = {
  { "session", "session" }, { "die-with-parent", "die-with-parent" },
  { "pid-namespace", "pid-namespace" }, { "private-ipc", "private-ipc" }, { "private-proc", "private-proc" },
  { "private-tmp", "private-tmp" }, { "work-tmpfs", "work-tmpfs" }, { "subreaper", "subreaper" },
  { "user-namespace", "user-namespace" }, { "shared-netns", "shared-netns" }, { "uid", "run-uid" },
  { "no-new-privs", "no-new-privs" }, { "message-queues", "message-queues" },
  { "ipc-limits", "ipc-limits" },
  { "closed-fds", "closed-fds" },
  { "filesystem", "filesystem" }, { "landlock-net", "landlock-net" },
  { "scoped-signals", "scoped-signals" }, { "scoped-abstract-unix", "scoped-abstract-unix" },
  { "separation", "separated" },
  { "seccomp", "seccomp" }, { "deny-sockets", "deny-sockets" }, { "unix-pairs-only", "unix-pairs-only" },
  { "deny-pipe-growth", "deny-pipe-growth" }, { "pending-signals", "pending-signals" },
  { "user-quotas", "user-quotas" },
  { "budget-cpu", "budget-cpu" }, { "budget-memory", "budget-memory" },
  { "budget-poll", "budget-poll" }, { "cgroup", "cgroup" },
}

--- The `limits` list: what the report says was applied, plus what the host itself enforced.
function Policy:limits(raw, opts, rep, run)
  local l = {}
  local applied = rep.applied
  local as_root = run.uid == nil and run.euid == 0
  for _, pair in ipairs(LIMIT_NAMES) do
    -- RLIMIT_NPROC is not enforced for uid 0: listing it would be a lie
    if applied[pair[1]] and not (pair[1] == "processes" and as_root) then l[#l + 1] = pair[2] end
  end
  l[#l + 1] = "timeout"
  if applied["empty-env"] then l[#l + 1] = "empty-env" end
  if applied["workdir"] then l[#l + 1] = "temp-dir" end
  if applied["no-network"] then l[#l + 1] = "no-network" end
  for _, pair in ipairs(EXTRA_NAMES) do
    if applied[pair[1]] then l[#l + 1] = pair[2] end
  end
  if not opts.stdin then l[#l + 1] = "no-stdin" end
  l[#l + 1] = "output-cap"
  return l
end

local function repair(s)
  return (core.utf8_repair(s or ""))
end

--- Turn the host's raw outcome into the result table (see README, "The result").
-- @return result, or nil, message, code when the sandbox itself failed
function Policy:result(raw, opts, run, host)
  local rep = report.parse(raw.report)
  -- a launch started ahead would wait within such runs' reach
  if rep.refused.separation then require("corral.prestart").unseparated() end
  local refused_share = run.net_join and rep.refused["shared-netns"]
  if refused_share then
    require("corral.host").net_holder_refused(run.holder_userns, run.net_join, refused_share.errno,
      refused_share.message)
  end
  if rep.fatal then
    local f = rep.fatal
    if f.step == "no-network" and opts.require_network_isolation then
      return nil, "ENOTSUP: network isolation was required but is not available here (" .. f.errno .. ": "
        .. f.message .. "); nothing ran", "ENOTSUP"
    end
    if f.step == "separation" then
      cannot[self] = "ENOTSUP: policy '" .. tostring(self.name) .. "' walls each run off from the controller "
        .. "and other runs (separation), which this host cannot do: " .. f.message .. ". Nothing ran; "
        .. "a policy with separation = \"auto\" runs without that wall"
      return nil, cannot[self], "ENOTSUP"
    end
    return nil, f.errno .. ": sandbox setup failed at " .. f.step .. ": " .. f.message, f.errno
  end
  if not rep.version and not raw.timed_out and not raw.killed then
    local said = (raw.stderr or ""):match("^(corral%-launch: [^\n]*)")
      or (raw.stderr or ""):match("^(corral%-zygote: [^\n]*)")
    return nil, "EIO: the launcher ended without a report (exit " .. tostring(raw.exit_status)
      .. ", signal " .. tostring(raw.term_signal) .. ")" .. (said and (": " .. said) or ""), "EIO"
  end
  -- a program that exited by itself just as the timer fired did not time out
  local timed_out = raw.timed_out and not (rep.status and rep.status.kind == "exit")
  raw.timed_out = timed_out
  local returncode, signal
  if rep.status then
    if rep.status.kind == "exit" then returncode = rep.status.code
    else signal = rep.status.code; returncode = -signal end
  elseif raw.term_signal ~= 0 then
    signal = raw.term_signal; returncode = -signal
  else
    returncode = raw.exit_status
  end
  if timed_out and not signal then signal = SIGKILL; returncode = -SIGKILL end
  local reason = self:classify(raw, opts, rep)
  local usage = {
    wall_s = raw.wall_s,
    cpu_user_s = rep.usage and rep.usage.user_us / 1e6 or 0,
    cpu_sys_s = rep.usage and rep.usage.sys_us / 1e6 or 0,
    max_rss_kb = rep.usage and rep.usage.maxrss_kb or 0,
    -- the whole run (every process), measured by the budget supervisor
    cpu_total_s = rep.total and rep.total.cpu_us / 1e6 or nil,
    memory_peak_kb = rep.total and rep.total.peak_kb or nil,
  }
  local max = opts.max_output
  local res = {
    ok = (returncode == 0 and not timed_out),
    stdout = repair(raw.stdout),
    stderr = repair(raw.stderr),
    returncode = returncode,
    timed_out = timed_out and true or false,
    truncated = (raw.stdout_bytes > max or raw.stderr_bytes > max),
    network_isolated = rep.applied["no-network"] ~= nil,
    limits = self:limits(raw, opts, rep, run),
    reason = reason,
    signal = signal,
    usage = usage,
    clamped = opts.clamped,
    policy = self.name,
    refused = next(rep.refused) and rep.refused or nil,
    stdout_bytes = raw.stdout_bytes,
    stderr_bytes = raw.stderr_bytes,
  }
  return res
end

--- Load a policy by name (searched in `paths.policy_dirs()`), by path (contains a slash or ends
-- in .lua), or return a policy table as is. Loaded policies are cached per process.
-- @return policy, or raises naming the policy when it cannot be found or is invalid
local loaded = {}
function M.load(spec)
  if type(spec) == "table" then
    if getmetatable(spec) == nil then spec = M.new(spec) end
    return spec:check()
  end
  if loaded[spec] then return loaded[spec] end
  local path
  if spec:find("/", 1, true) or spec:match("%.lua$") then
    path = spec
  else
    if not spec:match("^[%w_%-]+$") then error("policy name '" .. spec .. "' is not a valid name", 0) end
    local tried = {}
    for _, dir in ipairs(paths.policy_dirs()) do
      local p = dir .. "/" .. spec .. ".lua"
      tried[#tried + 1] = p
      if paths.exists(p) then path = p break end
    end
    if not path then error("policy '" .. spec .. "' not found (looked in " .. table.concat(tried, ", ") .. ")", 0) end
  end
  local chunk, err = loadfile(path)
  if not chunk then
    -- loadfile says "cannot open PATH: reason" (or "cannot read") when it cannot read the
    -- file: the reason alone, the message names the policy
    local reason = err:match("^cannot %a+ " .. path:gsub("%p", "%%%0") .. ": (.*)$")
    if reason then error("policy '" .. spec .. "' cannot be read: " .. reason, 0) end
    error("policy '" .. spec .. "' cannot be loaded: " .. err, 0)
  end
  local ok, p = pcall(chunk)
  if not ok then error("policy '" .. spec .. "' failed to load: " .. tostring(p), 0) end
  if type(p) ~= "table" then error("policy '" .. spec .. "' must return a table, got " .. type(p), 0) end
  if getmetatable(p) == nil then p = M.new(p) end
  if rawget(p, "name") == nil then p.name = spec end
  p.path = path
  p:check()
  loaded[spec] = p
  return p
end

--- Names and descriptions of the policies found in the policy directories.
function M.list()
  local out, seen = {}, {}
  for _, dir in ipairs(paths.policy_dirs()) do
    local f = io.popen("ls -1 '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
    if f then
      for file in f:lines() do
        local name = file:match("^([%w_%-]+)%.lua$")
        if name and not seen[name] then
          seen[name] = true
          local ok, p = pcall(M.load, name)
          out[#out + 1] = { name = name, path = dir .. "/" .. file,
                            description = ok and p.description or ("cannot load: " .. tostring(p)) }
        end
      end
      f:close()
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

M.Policy = Policy
return M
