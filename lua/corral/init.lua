--- corral: run untrusted Python under hard limits and report exactly what happened.
--
-- Conventions: bad options (unknown key, wrong type, out-of-range value, a value over the policy's
-- maximum) raise an error that names the option, before anything starts. Runtime failures of the
-- sandbox itself (launcher missing, work dir cannot be made, a protection that was required cannot
-- be had, the launcher's setup failed) return `nil, message, code`, where `code` is a symbolic
-- name such as "ENOENT", "ENOTSUP" or "EPERM" and `message` starts with it. `eval_in_sandbox`
-- follows eval_in_sandbox's instead and raises a SandboxError table.
--
-- This is the public face; the options are corral.schema's (checked by corral.options), a run's
-- directory, spawn and end are corral.run's, the launches started ahead corral.prestart's, and
-- eval_in_sandbox's semantics corral.eval's.
local core = require "corral.core"
local options = require "corral.options"
local policy = require "corral.policy"
local hostmod = require "corral.host"
local warm = require "corral.warm"
local schema = require "corral.schema"
local runmod = require "corral.run"
local pool = require "corral.prestart"
local evalmod = require "corral.eval"

local M = { _VERSION = "corral 0.1.0" }

M.SandboxError = evalmod.SandboxError
M.is_sandbox_error = evalmod.is_sandbox_error

-- What `configure` sets. warm_interpreters false: the policies with `warm` run cold, each run
-- through a fresh corral-launch (the same sandbox, but not the program's view of a warm run).
local settings = { warm_interpreters = true }

--- Set how this process runs its runs (each key optional; the rest keep their values):
-- `warm_interpreters` (default true; false: run the `warm` policies cold), `prestart_launches`
-- (default true; false: start no launch ahead of its run, as a one-shot process should),
-- `prestart_after_pause` (default false; true: after a pause, start the next launch once the run
-- has ended rather than while it runs: for a controller whose loop runs between runs, as
-- `corral serve`), `share_network` (default true; false: policies with `network = "shared"` give
-- each run its own network namespace, as a one-run process should).
-- @return the settings as they are now
function M.configure(t)
  if t ~= nil and type(t) ~= "table" then error("configure: settings must be a table, got " .. type(t), 0) end
  for k, v in pairs(t or {}) do
    if k ~= "warm_interpreters" and k ~= "prestart_launches" and k ~= "prestart_after_pause"
       and k ~= "share_network" then
      error("configure: setting '" .. tostring(k) .. "' is not known", 0)
    end
    if type(v) ~= "boolean" then error("configure: setting '" .. k .. "' must be a boolean, got " .. type(v), 0) end
  end
  t = t or {}
  if t.warm_interpreters ~= nil then settings.warm_interpreters = t.warm_interpreters end
  if t.prestart_launches ~= nil then pool.enabled = t.prestart_launches end
  if t.prestart_after_pause ~= nil then pool.after_pause = t.prestart_after_pause end
  if t.share_network ~= nil then hostmod.set_share_network(t.share_network) end
  return { warm_interpreters = settings.warm_interpreters, prestart_launches = pool.enabled,
           prestart_after_pause = pool.after_pause, share_network = hostmod.share_network() }
end

-- A run prepared ahead of its code (see `prepare`).
local Plan = { __name = "corral.Plan" }
Plan.__index = Plan

local protected = false

-- What a run of `opts` (checked) is started with: its policy, the caller's options, the prepared
-- ones, the host, and whether its warm interpreter forks it; or nil, message, code. Raises on bad
-- options, naming `what`. `extra`: settings that are not public options (eval_in_sandbox's).
local function plan_of(what, opts, extra)
  local ok, pol = pcall(policy.load, opts.policy or schema.run_by_name.policy.default)
  if not ok then error(what .. ": " .. tostring(pol), 0) end
  -- Where a run shares the controller's uid (no user namespace, no run uid) and Landlock is
  -- missing, a dumpable controller's /proc/PID/environ, fds and memory would be open to it.
  -- Off once, before the first run, unless the policy says the embedding program needs it.
  if not protected and pol.protect_controller ~= false then
    core.set_dumpable(false)
    protected = true
  end
  local host, err, ecode = hostmod.basics()
  if not host then return nil, err, ecode end
  local o
  ok, o, err, ecode = pcall(pol.prepare, pol, opts, host)
  if not ok then error(what .. ": " .. tostring(o), 0) end
  if not o then return nil, err, ecode end
  -- a warm policy's runs are forked by its zygote, with the same launcher arguments
  -- (its program is forked into the run's PID namespace: without one the policy runs cold)
  local probe = pol.warm and settings.warm_interpreters and pol.pid_namespace and hostmod.probe()
  local use_zygote = probe and probe.pid_namespace and (probe.root or pol.user_namespace ~= "never"
      or (probe.caps["pid-namespace"] or {}).ok)
  return setmetatable({ pol = pol, opts = opts, o = o, host = host, use_zygote = use_zygote or false,
                        extra = extra }, Plan)
end

-- Start the run of plan `p` for `code`: from a launch started ahead that matches, else cold.
local function launch(p, code, on_done)
  -- a launch the run before left for the next turn, not started yet: now, for this run to take
  pool.flush_deferred(true)
  local key = pool.key(p, code, p.extra)
  local ended, ticket = pool.begin(on_done)
  local proc
  if key then proc = pool.take(key, p, code, ended, p.extra) end
  if not proc then
    local err, ecode
    proc, err, ecode = runmod.start_cold(p.pol, p.o, p.host, code, ended, p.extra, p.use_zygote)
    if not proc then return nil, err, ecode end
  end
  pool.started(key, p, code, p.extra, ticket)
  return proc
end

local function check_code(what, code)
  if type(code) ~= "string" then error(what .. ": code must be a string, got " .. type(code), 0) end
end

-- The code of a run of plan `p`: `code`, or without it the file of `files` that args[1] names
-- (its path goes in `p.o.main`; the run's code file stays empty).
local function code_of(what, code, p)
  if code == nil and p then
    local main = require("corral.workspace").main_file(p.opts)
    if main then
      p.o.main = main.path
      return ""
    end
    error(what .. ": code must be a string, or nil with args[1] naming a file of `files`", 0)
  end
  check_code(what, code)
  return code
end

-- `opts` checked and planned, or the plan `prepare` made.
local function plan_for(what, opts, schema_of, extra)
  if getmetatable(opts) == Plan then
    if (opts.extra ~= nil) ~= (extra ~= nil) then
      error(what .. ": this plan was prepared for " .. (opts.extra and "eval_in_sandbox" or "run_python"), 0)
    end
    return opts
  end
  opts = options.check(what, opts, schema_of)
  if extra then opts = evalmod.run_options(opts) end
  return plan_of(what, opts, extra)
end

--- Check `opts` and prepare a run of them now, before its code: the policy loaded, its defaults
-- and maxima applied, the host checked. `start` takes the plan in place of the options (once):
-- a controller admits a request with this and starts it later without doing it again.
-- @return a plan (`plan.o`: the options the run will have), or nil, message, code
function M.prepare(opts)
  return plan_for("prepare", opts, options.run_schema)
end

--- `prepare` for `start_eval`, with eval_in_sandbox's options.
-- @return a plan, or nil, message, code
function M.prepare_eval(opts)
  return plan_for("prepare_eval", opts, options.eval_schema, evalmod.EXTRA)
end

--- Start launches ahead for runs with these options now, as the library does from a repeated
-- run's second on (`prestart`): for a caller that knows a run is coming. Up to the policy's
-- `prestart` wait for code without a NUL byte; the next run with exactly these options (stdin's
-- bytes and timeout aside) takes one. Does not count as a run: a key's next run still starts
-- none for the run after it, unless it is that key's second.
-- @return how many wait for these options (0: the policy or this process starts none), or
-- nil, message, code
function M.prestart(opts)
  local p, err, ecode = plan_for("prestart", opts or {}, options.run_schema)
  if not p then return nil, err, ecode end
  local key = pool.key(p, nil)
  if not key then return 0 end
  return pool.fill(key, p, false)
end

--- Start a run without waiting: the loop calls `on_done(result)` or `on_done(nil, message, code)`
-- when it has ended and been cleaned up. Drive the loop with `corral.run_loop()` (the HTTP
-- controller runs it forever). Do not call `run_python` from inside `on_done`: start another run.
-- @param opts run options, or a plan from `prepare`
-- @return a process handle (`:kill()`, `:pid()`), or nil, message, code
function M.start(code, opts, on_done)
  if code ~= nil then check_code("start", code) end
  if type(on_done) ~= "function" then error("start: on_done must be a function", 0) end
  local p, err, ecode = plan_for("start", opts, options.run_schema)
  if not p then return nil, err, ecode end
  return launch(p, code_of("start", code, p), on_done)
end

--- Let go of the launches started ahead: each is killed, and cleaned up once the loop has seen
-- its end. Returns their procs.
M.let_go_prestarted = pool.let_go_all

--- Let go of the launches started ahead and wait for their ends (running the loop, so not from
-- a callback) for at most `seconds` (default 5). corral.close() does it too.
-- @return true, or nil and a message
M.release_prestarted = pool.release

--- Let go of what the library keeps between runs: the launches started ahead (a policy's
-- `prestart`), the run uids it holds between runs (as root), and the warm interpreters (policy
-- `warm`). Each interpreter finishes the runs it has, then exits; this waits for that (running
-- the loop, so not from a callback) for at most `seconds` (default 10). The next warm run starts
-- a new one.
-- @return true, or nil and a message when one was still there at the deadline
function M.close(seconds)
  local released, rerr = pool.release(seconds)
  hostmod.release_idle_uids()
  local pids = warm.close_all()
  local deadline = core.hrtime() + (seconds or 10)
  for _, pid in ipairs(pids) do
    if not runmod.loop_until(function() return pid <= 0 or not core.kill(pid, 0) end, deadline) then
      return nil, "ETIMEDOUT: warm interpreter " .. pid .. " is still running"
    end
  end
  core.run("nowait")
  if not released then return nil, rerr end
  return true
end

--- Run the loop (see `start`): mode "default" (until nothing is pending), "once" or "nowait".
function M.run_loop(mode)
  return core.run(mode or "default")
end

local function wait(p, code)
  local result, rerr, rcode, raw
  local finished = false
  local proc, err, ecode = launch(p, code, function(r, e, c, x)
    result, rerr, rcode, raw, finished = r, e, c, x, true
  end)
  if not proc then return nil, err, ecode end
  while not finished do core.run("once") end
  if not result then return nil, rerr, rcode, raw end
  return result, nil, nil, raw
end

--- Run Python code under the policy's limits and wait for it.
-- Options: corral.schema's (`corral options` lists them with run_python's defaults): timeout,
-- cpu_seconds, memory_mb, file_mb, processes, open_files, max_output, require_network_isolation,
-- policy (a name, a path or a policy table), python, stdin (bytes), env (extra variables).
-- @return result table (ok, stdout, stderr, returncode, timed_out, truncated, network_isolated,
-- limits, reason, signal, usage), or nil, message, code when the sandbox itself failed
function M.run_python(code, opts)
  if code ~= nil then check_code("run_python", code) end
  local p, err, ecode = plan_for("run_python", opts, options.run_schema)
  if not p then return nil, err, ecode end
  local res
  res, err, ecode = wait(p, code_of("run_python", code, p))
  if not res then return nil, err, ecode end
  return res
end

--- Run many programs at once on one loop, at most `concurrency` at a time.
-- @param jobs array; each entry is a code string or a table `{code = "...", <run_python options>}`
-- @param settings optional `{concurrency = n}` (default: the number of CPUs)
-- @return array of results in job order; a job the sandbox could not run gets
-- `{ok = false, error = {kind = code, message = message}}`
function M.run_many(jobs, many)
  if type(jobs) ~= "table" then error("run_many: jobs must be an array, got " .. type(jobs), 0) end
  many = many or {}
  if type(many) ~= "table" then error("run_many: settings must be a table", 0) end
  for k in pairs(many) do
    if k ~= "concurrency" then error("run_many: setting '" .. tostring(k) .. "' is not known", 0) end
  end
  local limit = many.concurrency or core.cpu_count()
  if type(limit) ~= "number" or limit < 1 or math.floor(limit) ~= limit then
    error("run_many: setting 'concurrency' must be a whole number >= 1", 0)
  end
  -- validate every job before starting any, so bad input starts nothing
  local prepared = {}
  for i, job in ipairs(jobs) do
    local code, o
    if type(job) == "string" then
      code, o = job, {}
    elseif type(job) == "table" then
      code = job.code
      o = {}
      for k, v in pairs(job) do if k ~= "code" then o[k] = v end end
    else
      error("run_many: job " .. i .. " must be a string or a table, got " .. type(job), 0)
    end
    if type(code) ~= "string" then error("run_many: job " .. i .. ": code must be a string", 0) end
    prepared[i] = { code = code, opts = options.check("run_many: job " .. i, o, options.run_schema) }
  end
  local results, running, next_job, total = {}, 0, 1, #prepared
  local function failed(i, message, code)
    results[i] = { ok = false, error = { kind = code or "error", message = message } }
  end
  local function start_more()
    while running < limit and next_job <= total do
      local i = next_job
      next_job = next_job + 1
      local ok, proc, err, ecode = pcall(function()
        local p, perr, pcode = plan_of("run_many", prepared[i].opts)
        if not p then return nil, perr, pcode end
        return launch(p, prepared[i].code, function(res, rerr, rcode)
          running = running - 1
          if res then results[i] = res else failed(i, rerr, rcode) end
          start_more()
        end)
      end)
      if not ok then failed(i, tostring(proc), "EINVAL")
      elseif not proc then failed(i, err, ecode)
      else running = running + 1 end
    end
  end
  start_more()
  while running > 0 do core.run("once") end
  return results
end

--- Seed 003's `eval_in_sandbox`: run code under bubblewrap (policy "bwrap") with the given limits.
-- Options (eval_in_sandbox's names, corral.schema): mem_max_mb=100, cpu_max_time_sec=1,
-- timeout_max_time_sec=10, io_max_kb=128 (per stream), and policy, python, stdin.
-- @return `{returncode, stdout, stderr, ok}` with stripped output
-- @raise a SandboxError table `{kind, message}`: kind "timeout", "output" (over io_max_kb),
-- "encoding" (output not UTF-8), "unavailable" (bubblewrap or the launcher missing) or "sandbox"
function M.eval_in_sandbox(code, opts)
  check_code("eval_in_sandbox", code)
  local p, err, ecode = plan_for("eval_in_sandbox", opts, options.eval_schema, evalmod.EXTRA)
  local out, serr
  if p then out, serr = evalmod.outcome(wait(p, code)) else out, serr = evalmod.outcome(nil, err, ecode) end
  if not out then error(serr, 2) end
  return out
end

--- `eval_in_sandbox` without waiting (for the HTTP controller): the loop calls
-- `on_done(output)` or `on_done(nil, sandbox_error)` when the run has ended and been cleaned up;
-- a third argument is the run's own result (for its `reason` and `usage`), nil when the sandbox
-- failed. Bad options raise, as in `eval_in_sandbox`.
-- @param opts eval_in_sandbox's options, or a plan from `prepare_eval`
-- @return a process handle (`:kill()`, `:pid()`), or nil and a SandboxError when nothing started
function M.start_eval(code, opts, on_done)
  check_code("start_eval", code)
  if type(on_done) ~= "function" then error("start_eval: on_done must be a function", 0) end
  local p, err, ecode = plan_for("start_eval", opts, options.eval_schema, evalmod.EXTRA)
  local proc
  if p then
    proc, err, ecode = launch(p, code, function(res, rerr, rcode, raw)
      local out, serr = evalmod.outcome(res, rerr, rcode, raw)
      on_done(out, serr, res)
    end)
  end
  if not proc then return nil, select(2, evalmod.outcome(nil, err, ecode)) end
  return proc
end

-- The host's side of a probe and the policy's description; the caller adds what the policy
-- applied to a real (empty) run.
local function probe_base(what, name)
  local host, err, ecode = hostmod.probe()
  if not host then return nil, err, ecode end
  local ok, pol = pcall(policy.load, name or "default")
  if not ok then error(what .. ": " .. tostring(pol), 0) end
  local out = {}
  for k, v in pairs(host) do out[k] = v end
  out.policy = { name = pol.name, description = pol.description, network = pol.network,
                 pid_namespace = pol.pid_namespace,
                 run_uid = (host.root and host.setuid and pol.uid_range) and
                   (pol.uid_range[1] .. "-" .. pol.uid_range[2]) or nil }
  return out, pol
end

local function probe_finish(out, res, rerr)
  if res then
    out.policy.limits = res.limits
    out.policy.refused = res.refused
  else
    out.policy.error = rerr
  end
  return out
end

--- What this host supports and what a policy will apply.
-- @param name policy name (default "default")
-- @return table `{launcher, euid, root, network_isolation, pid_namespace, setuid, bwrap, caps,
-- rlimits, policy}`, or nil, message, code
function M.probe(name)
  local out, pol, ecode = probe_base("probe", name)
  if not out then return nil, pol, ecode end
  -- what the policy applies here is what it applied to a real (empty) run, not a prediction
  local p, res, rerr
  p, rerr = plan_of("probe", { policy = pol })
  if p then res, rerr = wait(p, "pass") end
  return probe_finish(out, res, rerr)
end

--- `probe` without waiting for its run (for the HTTP controller): the loop calls `on_done(probe)`
-- or `on_done(nil, message, code)`. The host's capabilities are learnt with a short blocking
-- `corral-launch --probe` the first time (then cached).
-- @return true, or nil, message, code when nothing started
function M.start_probe(name, on_done)
  if type(on_done) ~= "function" then error("start_probe: on_done must be a function", 0) end
  local out, pol, ecode = probe_base("start_probe", name)
  if not out then return nil, pol, ecode end
  local p, err, code = plan_of("start_probe", { policy = pol })
  local proc
  if p then
    proc, err, code = launch(p, "pass", function(res, rerr)
      on_done(probe_finish(out, res, rerr))
    end)
  end
  -- the run could not start: the probe still says what the host supports
  if not proc then return nil, err, code end
  return true
end

--- Policies found on the policy path: array of `{name, path, description}`.
function M.policies()
  return policy.list()
end

M.load_policy = policy.load

return M
