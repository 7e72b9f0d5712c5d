--- What a policy applies on this host: the host's capabilities (corral.host), the policy's
-- description, and what the policy applied to a real (empty) run — not a prediction.
local hostmod = require "corral.host"
local plan = require "corral.plan"
local policy = require "corral.policy"

local M = {}

-- The host's side of a probe and the policy's description, and the policy; or nil, message,
-- code. Raises naming `what` when the policy cannot be loaded.
local function base(what, name)
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

-- The empty run's outcome into the probe: its limits and refusals, or why it could not run.
local function finish(out, res, rerr)
  if res then
    out.policy.limits = res.limits
    out.policy.refused = res.refused
  else
    out.policy.error = rerr
  end
  return out
end

--- The probe of policy `name`, its run waited for on the loop (not from a callback).
-- @return the probe, or nil, message, code
function M.run(name)
  local out, pol, ecode = base("probe", name)
  if not out then return nil, pol, ecode end
  local p, res, rerr
  p, rerr = plan.of("probe", { policy = pol })
  if p then res, rerr = plan.wait(p, "pass") end
  return finish(out, res, rerr)
end

--- The probe of policy `name` without waiting: the loop calls `on_done(probe)`.
-- @return true, or nil, message, code when its run could not start
function M.start(name, on_done)
  local out, pol, ecode = base("start_probe", name)
  if not out then return nil, pol, ecode end
  local p, err, code = plan.of("start_probe", { policy = pol })
  local proc
  if p then
    proc, err, code = plan.launch(p, "pass", function(res, rerr)
      on_done(finish(out, res, rerr))
    end)
  end
  if not proc then return nil, err, code end
  return true
end

return M
