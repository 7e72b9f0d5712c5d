--- bwrap: eval_in_sandbox's sandbox — bubblewrap around the interpreter, with corral's launcher outside.
-- `bwrap --unshare-all` but the PID namespace (the launcher's is the run's), `--new-session
-- --die-with-parent --clearenv`, the code as /home/code.py in a read-only /home, a read-only root
-- holding only what the interpreter needs (asked of the interpreter itself, so a python outside
-- /usr works too, with the places outside it that its libraries' symlinks lead to), a read-only
-- /dev of the usual devices with a small /dev/shm, and no other writable directory. The launcher
-- still applies the rlimits (instead of prlimit), the session, the pid namespace, the per-run uid
-- and the clean-up around it. bwrap reports a program's death by signal N as exit 128+N: the
-- interpreter runs under `corral-launch --relay`, which writes how it ended on a pipe the
-- launcher gives bwrap (`--status-fd`), so the launcher reports what happened to the program.
local policy = require "corral.policy"
local core = require "corral.core"
local host = require "corral.host"

-- Where bubblewrap cannot run (no user namespace for it: a container's default seccomp profile;
-- a kernel interface it needs that is missing: gVisor has no /proc/sys/kernel/overflowuid), the
-- runs get the launcher's own sandbox instead, the `default` policy's confinement with this
-- policy's limits: namespaces, Landlock (a read-only view but for the work dir), seccomp. Their
-- `refused` says so under `bwrap`, and `limits` lists what applied. `bwrap_fallback = false`
-- makes such runs fail instead.
local P = policy.load("default"):extend {
  name = "bwrap",
  description = "eval_in_sandbox's sandbox: bubblewrap --unshare-all, read-only root of what python needs, rlimits",
  -- eval_in_sandbox's, as run options (corral.schema)
  defaults = require("corral.schema").eval_defaults(),
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
  -- bwrap's own: a root of read-only binds of what the interpreter needs, in its own mount
  -- namespace (the fallback where bwrap cannot run is default's, which requires it)
  separation = "off",
  bwrap_path = "/usr/bin:/bin:/usr/local/bin",
  -- bwrap's monitor and the relay: RLIMIT_NPROC counts them with the interpreter's processes
  wrapper_processes = 2,
  -- MiB of /dev/shm (POSIX semaphores and shared memory: multiprocessing). bwrap's tmpfs, which
  -- the budget's polling does not see (a run cgroup counts it): bounded by this size alone
  dev_shm_mb = 16,
  -- where the relay appears inside the sandbox
  relay_path = "/run/corral-launch",
  -- the fd on which the relay tells the launcher how the interpreter ended: bwrap's, inherited
  -- through it by the relay, never the interpreter's (not the report fd, 3)
  status_fd = 4,
  bwrap_fallback = true,
  -- bwrap's program works in its own /home, its code at /home/code.py; the launcher's work and
  -- code dirs stay where they were
  work_path = false,
  code_path = false,
}

-- Directories the dynamic loader searches (its defaults and /etc/ld.so.conf's), where a
-- library may be a symlink into a directory the root does not bind (Debian's alternatives:
-- libblas.so.3 -> /etc/alternatives/... -> /usr/lib/.../blas/libblas.so.3).
local function loader_dirs()
  local dirs, seen = {}, {}
  local function add(d)
    if d:sub(1, 1) == "/" and not seen[d] then seen[d] = true; dirs[#dirs + 1] = d end
  end
  local function read_conf(path, depth)
    local f = io.open(path, "r")
    if not f then return end
    for line in f:lines() do
      line = line:gsub("#.*", ""):match("^%s*(.-)%s*$")
      local inc = line:match("^include%s+(.+)$")
      if inc and depth < 2 then
        local dir, pat = inc:match("^(.*)/([^/]*)$")
        local names = dir and core.listdir(dir) or {}
        table.sort(names)
        local lpat = pat and "^" .. pat:gsub("[%.%-%+]", "%%%0"):gsub("%*", ".*") .. "$"
        for _, n in ipairs(names) do
          if lpat and n:match(lpat) then read_conf(dir .. "/" .. n, depth + 1) end
        end
      elseif line ~= "" then
        add(line)
      end
    end
    f:close()
  end
  for _, d in ipairs({ "/lib", "/usr/lib", "/lib64", "/usr/lib64" }) do add(d) end
  read_conf("/etc/ld.so.conf", 0)
  return dirs
end

local function normalize(path)
  local parts = {}
  for seg in path:gmatch("[^/]+") do
    if seg == ".." then parts[#parts] = nil elseif seg ~= "." then parts[#parts + 1] = seg end
  end
  return "/" .. table.concat(parts, "/")
end

local function under(path, roots)
  for _, r in ipairs(roots) do
    if path == r or path:sub(1, #r + 1) == r .. "/" then return true end
  end
  return false
end

-- The binds that make each symlink chain starting at `path` resolve inside the sandbox as it
-- does outside: a link outside the bound `roots` is made again (bwrap --symlink), and where the
-- chain ends outside them, that file or directory is bound read-only. Adds to `out` (a list of
-- {op, a, b}), keyed by path in `seen`.
local function follow(path, roots, out, seen)
  local cur = path
  for _ = 1, 40 do
    local st = core.lstat(cur)
    if not st then return end
    local outside = not under(cur, roots)
    if st.type ~= "link" then
      if outside and not seen[cur] then
        seen[cur] = true
        out[#out + 1] = { "--ro-bind", cur, cur }
      end
      return
    end
    local target = core.readlink(cur)
    if not target then return end
    if outside and not seen[cur] then
      seen[cur] = true
      out[#out + 1] = { "--symlink", target, cur }
    end
    local parent = cur:match("^(.*)/[^/]*$")
    local nxt = normalize(target:sub(1, 1) == "/" and target or ((parent ~= "" and parent or "") .. "/" .. target))
    -- the next link's own directory as the kernel finds it (/lib -> usr/lib)
    local dir, base = nxt:match("^(.*)/([^/]*)$")
    local real = core.realpath(dir ~= "" and dir or "/")
    if not real then return end
    cur = (real == "/" and "" or real) .. "/" .. base
  end
end

-- Per interpreter and set of roots: computed once per process.
local chains = {}

--- The extra binds for the symlinks of the interpreter and of the loader's library directories
-- whose resolution leaves `roots`: a list of {op, a, b}.
function P.symlink_binds(python, roots)
  local key = python .. "\0" .. table.concat(roots, "\0")
  if chains[key] then return chains[key] end
  local real_roots = {}
  for _, r in ipairs(roots) do real_roots[#real_roots + 1] = core.realpath(r) or r end
  local out, seen = {}, {}
  follow(python, real_roots, out, seen)
  for _, d in ipairs(loader_dirs()) do
    local real = core.realpath(d)
    if real and under(real, real_roots) then
      local names = core.listdir(real) or {}
      table.sort(names)
      for _, n in ipairs(names) do
        local p = real .. "/" .. n
        local st = core.lstat(p)
        if st and st.type == "link" then follow(p, real_roots, out, seen) end
      end
    end
  end
  chains[key] = out
  return out
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- bwrap path → true, or why it cannot run here: tried once per process, as every run starts it
local usable = {}
local function try_bwrap(bwrap, python)
  if usable[bwrap] == nil then
    local f = io.popen(shell_quote(bwrap) .. " --unshare-all --die-with-parent --ro-bind / / "
      .. shell_quote(python) .. " -I -S -c '' 2>&1", "r")
    local out = f and f:read("a") or ""
    local ok = f and f:close()
    usable[bwrap] = ok == true or (out:match("(bwrap: [^\n]*)") or ("bwrap failed: " .. out:sub(1, 200)))
  end
  return usable[bwrap]
end

-- bwrap opens /proc/<its own pid>/ns/..., so under a PID namespace of the launcher it needs that
-- namespace's own /proc. In a user namespace the kernel refuses a fresh proc mount while
-- anything is mounted over parts of the current one (a container runtime's masked paths; an
-- empty binfmt_misc is allowed): there bwrap's own PID namespace (--unshare-pid) is the run's.
local function proc_masked()
  local f = io.open("/proc/self/mountinfo", "r")
  if not f then return false end
  local masked = false
  for line in f:lines() do
    local mp = line:match("^%S+ %S+ %S+ %S+ (%S+)")
    if mp and mp:sub(1, 6) == "/proc/" and mp ~= "/proc/sys/fs/binfmt_misc" then masked = true break end
  end
  f:close()
  return masked
end

-- the policies runs use where bwrap cannot run, or with bwrap's PID namespace only
local variants = setmetatable({}, { __mode = "k" })
local function variant(self, kind)
  local v = variants[self] or {}
  variants[self] = v
  if not v[kind] then
    if kind == "fallback" then
      v[kind] = policy.load("default"):extend {
        name = self.name, description = self.description, defaults = self.defaults, maxima = self.maxima,
        clamp = self.clamp, python_args = self.python_args, code_name = self.code_name, network = "new",
      }
    else
      -- bwrap's pid 1 is a process of the run's uid too
      v[kind] = self:extend { pid_namespace = false, wrapper_processes = self.wrapper_processes + 1 }
    end
  end
  return v[kind]
end

function P:prepare(opts, h)
  local o, err, code = policy.Policy.prepare(self, opts, h)
  if not o then return nil, err, code end
  local bwrap = host.which("bwrap", self.bwrap_path)
  if not bwrap then return nil, "ENOENT: Cannot find the `bwrap` executable (install the bubblewrap package)", "ENOENT" end
  o.bwrap_exe = bwrap
  local launcher, lerr, lcode = require("corral.paths").launcher()
  if not launcher then return nil, lerr, lcode end
  o.launcher_exe = launcher
  local state = try_bwrap(bwrap, o.python_exe)
  if state ~= true then
    if self.bwrap_fallback == false then return nil, "EPERM: bubblewrap cannot run here: " .. state, "EPERM" end
    o.bwrap_refused = state
  elseif self.pid_namespace and not h.root and proc_masked() then
    o.bwrap_pidns = true
  end
  return o
end

function P:command(opts, run)
  -- --unshare-all without --unshare-pid: the launcher's PID namespace is the run's
  local a = { opts.bwrap_exe, "--unshare-user-try", "--unshare-ipc", "--unshare-net", "--unshare-uts",
              "--unshare-cgroup-try", "--new-session", "--die-with-parent", "--clearenv",
              "--chdir", "/home", "--ro-bind", run.code_dir, "/home" }
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  -- where a container masks /proc the PID namespace is bwrap's (see proc_masked)
  if opts.bwrap_pidns then add("--unshare-pid") end
  -- /lib, /lib64, /bin as the host has them: symlinks into /usr on merged-/usr systems
  for _, d in ipairs({ "/bin", "/lib", "/lib64", "/lib32", "/sbin" }) do
    local st = core.lstat(d)
    if st and st.type == "link" then add("--symlink", core.readlink(d), d) end
  end
  local roots = {}
  for _, root in ipairs(host.python_roots(opts.python_exe)) do
    local st = core.lstat(root)
    if st and st.type == "directory" then add("--ro-bind", root, root); roots[#roots + 1] = root end
  end
  for _, b in ipairs(P.symlink_binds(opts.python_exe, roots)) do add(b[1], b[2], b[3]) end
  add("--ro-bind", opts.launcher_exe, self.relay_path)
  -- null, zero, full, random, urandom, tty, pts, shm, the fd links; read-only, but for a small
  -- /dev/shm (bwrap's /dev is a tmpfs the program could fill)
  add("--dev", "/dev", "--perms", "1777", "--size", string.format("%d", self.dev_shm_mb * 1048576),
      "--tmpfs", "/dev/shm", "--remount-ro", "/dev")
  add("--remount-ro", "/")
  add("--", self.relay_path, "--relay", "--status-fd", string.format("%d", self.status_fd), "--")
  for _, v in ipairs(self:python_argv(opts, run, "/home/" .. self.code_name)) do add(v) end
  return a
end

-- The relay's directory stays in sight when it lies under one of the launcher's scratch mounts
-- (a source tree in /tmp), as an interpreter's does.
function P:launch_args(opts, run, h)
  if opts.bwrap_refused then return variant(self, "fallback"):launch_args(opts, run, h) end
  local pol = opts.bwrap_pidns and variant(self, "own-pidns") or self
  local a = policy.Policy.launch_args(pol, opts, run, h)
  -- the launcher's options come first, then `--` and bwrap's command
  table.insert(a, 1, string.format("%d", self.status_fd))
  table.insert(a, 1, "--status-fd")
  local dir = opts.launcher_exe:match("^(.*)/[^/]*$")
  for path in pairs(pol.pid_namespace and pol.tmpfs or {}) do
    if dir and dir:sub(1, #path + 1) == path .. "/" then
      table.insert(a, 1, dir)
      table.insert(a, 1, "--ro-bind")
      break
    end
  end
  return a
end

function P:limits(raw, opts, rep, run)
  if opts.bwrap_refused then return variant(self, "fallback"):limits(raw, opts, rep, run) end
  local l = policy.Policy.limits(self, raw, opts, rep, run)
  l[#l + 1] = "no-network"
  l[#l + 1] = "read-only-root"
  if opts.bwrap_pidns then l[#l + 1] = "pid-namespace" end
  return l
end

function P:result(raw, opts, run, h)
  if opts.bwrap_refused then
    local res, err, code = policy.Policy.result(variant(self, "fallback"), raw, opts, run, h)
    if res then
      res.refused = res.refused or {}
      res.refused.bwrap = { errno = "EPERM", message = opts.bwrap_refused
        .. ": bubblewrap cannot run here; the launcher's own namespaces, Landlock and seccomp applied instead" }
    end
    return res, err, code
  end
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
