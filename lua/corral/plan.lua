--- A run's plan and its start.
--
-- A plan is what a run is started with, made before its code: its policy, the caller's options
-- (`opts`, checked), the prepared ones (`o`, the policy's defaults and maxima applied), the host,
-- and whether the policy's warm interpreter forks it. Its start takes a launch started ahead that
-- matches (corral.prestart), else starts the run cold (corral.run).
local core = require "corral.core"
local evalmod = require "corral.eval"
local hostmod = require "corral.host"
local options = require "corral.options"
local policy = require "corral.policy"
local pool = require "corral.prestart"
local runmod = require "corral.run"
local schema = require "corral.schema"

local M = {}

--- false: the policies with `warm` run cold (corral.configure's `warm_interpreters`).
M.warm_interpreters = true

local Plan = { __name = "corral.Plan" }
Plan.__index = Plan

local protected = false

--- The plan of a run of `opts` (checked). Raises on bad options, naming `what`.
-- @param extra settings that are not public options (eval_in_sandbox's), or nil
-- @return the plan, or nil, message, code
function M.of(what, opts, extra)
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
  local probe = pol.warm and M.warm_interpreters and pol.pid_namespace and hostmod.probe()
  local use_zygote = probe and probe.pid_namespace and (probe.root or pol.user_namespace ~= "never"
      or (probe.caps["pid-namespace"] or {}).ok)
  return setmetatable({ pol = pol, opts = opts, o = o, host = host, use_zygote = use_zygote or false,
                        extra = extra }, Plan)
end

--- `opts` checked against `schema_of` and planned, or the plan `corral.prepare` made (which must
-- have been made for the same kind of run). Raises on bad options, naming `what`.
-- @param extra eval_in_sandbox's settings (`corral.eval.EXTRA`) for its runs, else nil
-- @return the plan, or nil, message, code
function M.get(what, opts, schema_of, extra)
  if getmetatable(opts) == Plan then
    if (opts.extra ~= nil) ~= (extra ~= nil) then
      error(what .. ": this plan was prepared for " .. (opts.extra and "eval_in_sandbox" or "run_python"), 0)
    end
    return opts
  end
  opts = options.check(what, opts, schema_of)
  if extra then opts = evalmod.run_options(opts) end
  return M.of(what, opts, extra)
end

--- Start the run of plan `p` for `code`; the loop calls `on_done(result, message, code, raw)`
-- once it has ended and been cleaned up.
-- @return the process handle, or nil, message, code
function M.launch(p, code, on_done)
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

--- Start the run of plan `p` for `code` and run the loop until it has ended (not from a callback).
-- @return result, nil, nil, raw; or nil, message, code, raw
function M.wait(p, code)
  local result, rerr, rcode, raw
  local finished = false
  local proc, err, ecode = M.launch(p, code, function(r, e, c, x)
    result, rerr, rcode, raw, finished = r, e, c, x, true
  end)
  if not proc then return nil, err, ecode end
  while not finished do core.run("once") end
  if not result then return nil, rerr, rcode, raw end
  return result, nil, nil, raw
end

return M
