--- default, for a container that serves one tenant where runs cannot be walled off.
-- A controller that is not root needs Landlock and a PID namespace to wall its runs off: gVisor
-- has no Landlock, and Docker's default seccomp profile refuses the user namespace the PID
-- namespace needs. There a program has the controller's uid with nothing in its way, and the
-- shipped `default` (`separation = "require"`) runs nothing. This file (in the image at /usr/local/share/corral/one-tenant, which
-- CORRAL_POLICY_PATH puts first) is that policy accepting it
-- (`separation = "auto"`: `refused.separation` says so in every result, and no launch is
-- started ahead), and `warm` and `bwrap`'s fallback, which extend `default` by name, with it.
-- Use it only for a container that serves one tenant: a run can read and change what the
-- controller's uid can (the run directories of concurrent runs among them). See THREAT-MODEL.md.
local policy = require "corral.policy"

return policy.load("/usr/local/share/corral/policies/default.lua"):extend {
  name = "default",
  separation = "auto",
}
