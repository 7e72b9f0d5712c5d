--- bwrap: seed 003's sandbox — bubblewrap around the interpreter, with corral's launcher outside.
-- `bwrap --unshare-all --new-session --die-with-parent --clearenv`, the code as /home/code.py in a
-- read-only /home, a read-only root holding only what the interpreter needs (asked of the
-- interpreter itself, so a python outside /usr works too) and no writable directory. The launcher
-- still applies the rlimits (instead of prlimit), the session, the pid namespace, the per-run uid
-- and the clean-up around it.
local policy = require "corral.policy"
local core = require "corral.core"
local host = require "corral.host"

local P = policy.load("default"):extend {
  name = "bwrap",
  description = "seed 003: bubblewrap --unshare-all, read-only root of what python needs, rlimits",
  defaults = { timeout = 10, cpu_seconds = 1, memory_mb = 100, max_output = 131072 },
  -- bwrap clears the environment; the launcher's own needs none either
  env = {},
  code_name = "code.py",
  python_args = { "-I", "-u" },
  network = "host",       -- bwrap --unshare-all makes the network namespace
  wrapper_isolates_network = true,
  -- bwrap makes its own namespaces and mounts, which Landlock and the seccomp deny list forbid
  -- to everything under them; it has its own read-only root
  filesystem = "off",
  seccomp = "off",
  bwrap_path = "/usr/bin:/bin:/usr/local/bin",
}

function P:prepare(opts, h)
  local o, err, code = policy.Policy.prepare(self, opts, h)
  if not o then return nil, err, code end
  local bwrap = host.which("bwrap", self.bwrap_path)
  if not bwrap then return nil, "ENOENT: Cannot find the `bwrap` executable (install the bubblewrap package)", "ENOENT" end
  o.bwrap_exe = bwrap
  return o
end

function P:command(opts, run)
  local a = { opts.bwrap_exe, "--unshare-all", "--new-session", "--die-with-parent", "--clearenv",
              "--chdir", "/home", "--ro-bind", run.code_dir, "/home" }
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  -- /lib, /lib64, /bin as the host has them: symlinks into /usr on merged-/usr systems
  for _, d in ipairs({ "/bin", "/lib", "/lib64", "/lib32", "/sbin" }) do
    local st = core.lstat(d)
    if st and st.type == "link" then add("--symlink", core.readlink(d), d) end
  end
  for _, root in ipairs(host.python_roots(opts.python_exe)) do
    local st = core.lstat(root)
    if st and st.type == "directory" then add("--ro-bind", root, root) end
  end
  add("--remount-ro", "/")
  for _, v in ipairs(self:python_argv(opts, run, "/home/" .. self.code_name)) do add(v) end
  return a
end

function P:limits(raw, opts, rep, run)
  local l = policy.Policy.limits(self, raw, opts, rep, run)
  l[#l + 1] = "no-network"
  l[#l + 1] = "read-only-root"
  return l
end

function P:result(raw, opts, run, h)
  -- bwrap reports its own setup failures as one line "bwrap: ..." on stderr with exit status 1,
  -- before the interpreter starts
  if raw.exit_status == 1 and raw.stdout_bytes == 0 and (raw.stderr or ""):match("^bwrap: [^\n]*\n?$") then
    return nil, "EPERM: " .. raw.stderr:gsub("%s+$", ""), "EPERM"
  end
  local res, err, code = policy.Policy.result(self, raw, opts, run, h)
  if res then res.network_isolated = true end
  return res, err, code
end

return P
