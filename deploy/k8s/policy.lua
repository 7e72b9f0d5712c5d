-- The policy of the Deployment's controllers (`corral serve --policy /etc/corral/policy.lua`,
-- mounted from the ConfigMap that kustomization.yaml generates from this file).
--
-- It is the shipped `default` with maxima, because two numbers in deployment.yaml depend on
-- them, and spec/deploy_spec.lua checks both:
-- - terminationGracePeriodSeconds must exceed the longest run a caller can ask for
--   (maxima.timeout, plus the kill grace), so that a controller told to stop (SIGTERM: it
--   drains) finishes every run it accepted before the kubelet's SIGKILL;
-- - the container's memory limit must hold --concurrency runs at their largest
--   (maxima.memory_mb, plus each run's in-memory tmpfs mounts and work dir) and the /tmp volume.
-- A request over a maximum is refused, naming the option (clamp = false): a caller learns the
-- limit instead of silently getting less.
--
-- `require`: what the Deployment promises (the full sandbox, which its Localhost seccomp profile
-- gives). `corral serve` probes the policy before it listens and refuses to start, naming what
-- is missing and why, where a run would lack any of these (the runtime's default seccomp
-- profile, a node without user namespaces): the pod crash-loops loudly instead of serving
-- degraded runs.
local policy = require "corral.policy"

return policy.load("default"):extend {
  name = "k8s",
  description = "default, with maxima that fit the Deployment's drain window and memory limit",
  maxima = {
    timeout = 60, cpu_seconds = 60, memory_mb = 256, file_mb = 16, processes = 64,
    open_files = 256, max_output = 1000000,
  },
  clamp = false,
  require = { "user-namespace", "pid-namespace", "no-network", "private-ipc", "private-tmp", "work-tmpfs",
              "seccomp", "filesystem", "budget-cpu", "budget-memory" },
}
