--- default, for a container that serves one tenant where runs cannot be walled off.
-- A controller that is not root needs Landlock and a PID namespace to wall its runs off: gVisor
-- has no Landlock, and Docker's default seccomp profile refuses the user namespace the PID
-- namespace needs. There a program has the controller's uid with nothing in its way, and the
-- shipped `default` (`separation = "require"`) runs nothing. This file (in the image at
-- /usr/local/share/corral/one-tenant, which CORRAL_POLICY_PATH puts first) is that policy
-- accepting it (`separation = "auto"`: `refused.separation` says so in every result, and no
-- launch is started ahead), and `warm` and `bwrap`'s fallback, which extend `default` by name,
-- with it.
-- Use it only for a container that serves one tenant: a run can read and change what the
-- controller's uid can (the run directories of concurrent runs among them). See THREAT-MODEL.md.
local policy = require "corral.policy"
local paths = require "corral.paths"

-- the shipped `default`: the first on the policy path that is not this file's
local function trim(d) return (d:gsub("/+$", "")) end
local here = trim(debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or ".")
local shipped
for _, d in ipairs(paths.policy_dirs()) do
  if trim(d) ~= here and paths.exists(d .. "/default.lua") then
    shipped = d .. "/default.lua"
    break
  end
end
assert(shipped, "deploy/one-tenant/default.lua: no shipped default.lua on the policy path")

return policy.load(shipped):extend {
  name = "default",
  separation = "auto",
}
