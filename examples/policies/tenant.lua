--- tenant: per-tenant limits on top of the default policy.
-- A grading service gives each tenant a tier; whatever a caller asks for is clamped to the tier's
-- maxima (the result lists the clamped options in `clamped`), and a tier may not ask for the host
-- network. Select it with `corral run --policy examples/policies/tenant.lua` or
-- `corral.run_python(code, { policy = "examples/policies/tenant.lua" })`; the tier comes from the
-- CORRAL_TENANT_TIER environment variable of the controller (a real deployment would read it from
-- its own configuration).
local policy = require "corral.policy"

local tiers = {
  free = { timeout = 5,  cpu_seconds = 2,  memory_mb = 128, processes = 8,  max_output = 10000,  file_mb = 1 },
  pro  = { timeout = 60, cpu_seconds = 30, memory_mb = 1024, processes = 64, max_output = 200000, file_mb = 16 },
}

local tier = os.getenv("CORRAL_TENANT_TIER") or "free"
local maxima = tiers[tier]
if not maxima then error("unknown tenant tier '" .. tier .. "' (known: free, pro)") end

local P = policy.load("default"):extend {
  name = "tenant-" .. tier,
  description = "default policy with the '" .. tier .. "' tier's maxima, clamped",
  maxima = maxima,
  clamp = true,
  -- the free tier also gets smaller defaults than the default policy's
  defaults = tier == "free" and { timeout = 3, cpu_seconds = 1, memory_mb = 128, processes = 8, max_output = 10000 } or nil,
}

--- Network isolation is mandatory for tenants: refuse to run where it cannot be had.
function P:prepare(opts, host)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.require_network_isolation = true
  return policy.Policy.prepare(self, o, host)
end

return P
