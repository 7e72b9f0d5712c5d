--- default: seed 000's behaviour, with the holes closed.
-- rlimits (cpu, memory, file-size, no-core, open-files, processes), a wall-clock timeout, an empty
-- environment, a throwaway work dir, no stdin, capped output, a new empty network namespace; plus a
-- PID namespace whose end kills every descendant (setsid escapees included), a per-run uid when
-- the controller is root (so RLIMIT_NPROC holds), no_new_privs and no inherited fds. What the
-- kernel refuses is left out of `limits` and the run goes on, unless the caller requires network
-- isolation.
local policy = require "corral.policy"

return policy.base {
  name = "default",
  description = "seed 000 limits + pid namespace, per-run uid as root, empty netns; degrades gracefully",
  defaults = {
    timeout = 5, cpu_seconds = 3, memory_mb = 256, file_mb = 1, processes = 32,
    open_files = 64, max_output = 20000, require_network_isolation = false,
  },
  -- where a bare interpreter name such as "python3" is looked up: the sandbox's own PATH
  python_path = "/usr/local/bin:/usr/bin:/bin",
  -- -I: isolated mode (no PYTHON* variables, no user site, no script dir on sys.path);
  -- -u: unbuffered, so output written before a kill is not lost
  python_args = { "-I", "-u" },
  env = { PATH = "/usr/bin:/bin", LANG = "C.UTF-8" },
  network = "new",
  pid_namespace = true,
  -- "auto": a user namespace only where the namespaces are refused without one (not root)
  user_namespace = "auto",
  uid_range = { 60000, 60999 },
  -- with the PID namespace's mount namespace: fresh scratch mounts (MiB) that no other run sees
  -- and that vanish with the run, and the work dir (cwd, HOME, TMPDIR) as a tmpfs of work_mb
  tmpfs = { ["/tmp"] = 16, ["/var/tmp"] = 16, ["/dev/shm"] = 64 },
  work_mb = 64,
  tmp_dir = "/tmp",
  kill_on_overflow = false,
  grace = 0.2,
  tail_bytes = 1024,
  code_name = "main.py",
}
