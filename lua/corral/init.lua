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
-- plan and start corral.plan's, its directory, spawn and end corral.run's, the launches started
-- ahead corral.prestart's, eval_in_sandbox's semantics corral.eval's and a probe corral.probe's.
local core = require "corral.core"
local evalmod = require "corral.eval"
local hostmod = require "corral.host"
local options = require "corral.options"
local plan = require "corral.plan"
local policy = require "corral.policy"
local pool = require "corral.prestart"
local probemod = require "corral.probe"
local runmod = require "corral.run"
local warm = require "corral.warm"

local M = { _VERSION = "corral 0.1.0" }

M.SandboxError = evalmod.SandboxError
M.is_sandbox_error = evalmod.is_sandbox_error

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
  if t.warm_interpreters ~= nil then plan.warm_interpreters = t.warm_interpreters end
  if t.prestart_launches ~= nil then pool.enabled = t.prestart_launches end
  if t.prestart_after_pause ~= nil then pool.after_pause = t.prestart_after_pause end
  if t.share_network ~= nil then hostmod.set_share_network(t.share_network) end
  return { warm_interpreters = plan.warm_interpreters, prestart_launches = pool.enabled,
           prestart_after_pause = pool.after_pause, share_network = hostmod.share_network() }
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

--- Check `opts` and prepare a run of them now, before its code: the policy loaded, its defaults
-- and maxima applied, the host checked. `start` takes the plan in place of the options (once):
-- a controller admits a request with this and starts it later without doing it again.
-- @return a plan (`plan.o`: the options the run will have), or nil, message, code
function M.prepare(opts)
  return plan.get("prepare", opts, options.run_schema)
end

--- `prepare` for `start_eval`, with eval_in_sandbox's options.
-- @return a plan, or nil, message, code
function M.prepare_eval(opts)
  return plan.get("prepare_eval", opts, options.eval_schema, evalmod.EXTRA)
end

--- Start launches ahead for runs with these options now, as the library does from a repeated
-- run's second on (`prestart`): for a caller that knows a run is coming. Up to the policy's
-- `prestart` wait for code without a NUL byte; the next run with exactly these options (stdin's
-- bytes and timeout aside) takes one. Does not count as a run: a key's next run still starts
-- none for the run after it, unless it is that key's second.
-- @return how many wait for these options (0: the policy or this process starts none), or
-- nil, message, code
function M.prestart(opts)
  local p, err, ecode = plan.get("prestart", opts or {}, options.run_schema)
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
  local p, err, ecode = plan.get("start", opts, options.run_schema)
  if not p then return nil, err, ecode end
  return plan.launch(p, code_of("start", code, p), on_done)
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
  -- the sessions started ahead (corral.session), if sessions were used
  local sessions = package.loaded["corral.session"]
  if sessions then sessions.close_spares() end
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

--- Run Python code under the policy's limits and wait for it.
-- Options: corral.schema's (`corral options` lists them with run_python's defaults): timeout,
-- cpu_seconds, memory_mb, file_mb, processes, open_files, max_output, require_network_isolation,
-- policy (a name, a path or a policy table), python, stdin (bytes), env (extra variables).
-- @return result table (ok, stdout, stderr, returncode, timed_out, truncated, network_isolated,
-- limits, reason, signal, usage), or nil, message, code when the sandbox itself failed
function M.run_python(code, opts)
  if code ~= nil then check_code("run_python", code) end
  local p, err, ecode = plan.get("run_python", opts, options.run_schema)
  if not p then return nil, err, ecode end
  local res
  res, err, ecode = plan.wait(p, code_of("run_python", code, p))
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
        local p, perr, pcode = plan.of("run_many", prepared[i].opts)
        if not p then return nil, perr, pcode end
        return plan.launch(p, prepared[i].code, function(res, rerr, rcode)
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
  local p, err, ecode = plan.get("eval_in_sandbox", opts, options.eval_schema, evalmod.EXTRA)
  local out, serr
  if p then out, serr = evalmod.outcome(plan.wait(p, code)) else out, serr = evalmod.outcome(nil, err, ecode) end
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
  local p, err, ecode = plan.get("start_eval", opts, options.eval_schema, evalmod.EXTRA)
  local proc
  if p then
    proc, err, ecode = plan.launch(p, code, function(res, rerr, rcode, raw)
      local out, serr = evalmod.outcome(res, rerr, rcode, raw)
      on_done(out, serr, res)
    end)
  end
  if not proc then return nil, select(2, evalmod.outcome(nil, err, ecode)) end
  return proc
end

--- What this host supports and what a policy will apply.
-- @param name policy name (default "default")
-- @return table `{launcher, euid, root, network_isolation, pid_namespace, setuid, bwrap, caps,
-- rlimits, policy}`, or nil, message, code
function M.probe(name)
  return probemod.run(name)
end

--- `probe` without waiting for its run (for the HTTP controller): the loop calls `on_done(probe)`
-- or `on_done(nil, message, code)`. The host's capabilities are learnt with a short blocking
-- `corral-launch --probe` the first time (then cached).
-- @return true, or nil, message, code when nothing started
function M.start_probe(name, on_done)
  if type(on_done) ~= "function" then error("start_probe: on_done must be a function", 0) end
  return probemod.start(name, on_done)
end

--- Policies found on the policy path: array of `{name, path, description}`.
function M.policies()
  return policy.list()
end

M.load_policy = policy.load

return M
