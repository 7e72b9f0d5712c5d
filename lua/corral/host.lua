--- What this host can do, learnt once per process, and the per-run resources it hands out.
-- The capability probe runs `corral-launch --probe` the first time it is needed and is cached for
-- the life of the process: no probe process per run. Sandbox uids are taken from a range with an
-- in-process set plus an flock per uid, so concurrent controllers on one machine never share one.
-- The shared network namespace (policies with `network = "shared"`) is kept by a holder process,
-- `corral-launch --hold-net`, started on the first run that wants it, restarted when it died,
-- and gone with the controller.
local core = require "corral.core"
local paths = require "corral.paths"

local M = {}

local cache = {}          -- probe results, interpreter paths
local uids_in_use = {}    -- uid → {lock =, marker =}: held by a run
-- uid → {lock =, marker =}: ours between two runs. Its lock and marker are kept, so that taking
-- it again costs no file operation (on /run's disk, about 0.07 ms a run); release_idle_uids()
-- gives them back.
local uids_idle = {}
local IDLE_UIDS_MAX = 16
local idle_count = 0
-- user namespace mode → { proc, pid, netns } (a live holder) or { failed = message }; kept by
-- reset(): a holder belongs to the process, not to what it learnt of the host
local holders = {}
local share_network = true

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

--- Parse `corral-launch --probe` output into a table.
-- @return table: `euid`, `caps` (name → {ok=bool, errno=, message=}), `rlimits` (name → bool),
-- `landlock_abi` (0: none)
function M.parse_probe(text)
  local p = { caps = {}, rlimits = {} }
  for line in text:gmatch("[^\n]+") do
    local name, rest = line:match("^probe (%S+) ?(.*)$")
    if name == "euid" then
      p.euid = tonumber(rest)
    elseif name == "rlimit" then
      local r, yes = rest:match("^(%S+) (%S+)")
      if r then p.rlimits[r] = (yes == "yes") end
    elseif name == "landlock" then
      -- "yes abi N", or "no ERRNO message"
      local abi = rest:match("^yes abi (%d+)")
      p.landlock_abi = tonumber(abi) or 0
      local errno, msg = rest:match("^no (%S+) ?(.*)$")
      p.caps.landlock = { ok = abi ~= nil, errno = errno, message = msg ~= "" and msg or nil }
    elseif name then
      local yes, errno, msg = rest:match("^(%S+) ?(%S*) ?(.*)$")
      p.caps[name] = { ok = (yes == "yes"), errno = errno ~= "" and errno or nil, message = msg ~= "" and msg or nil }
    end
  end
  return p
end

--- Find an executable named `name` in a colon-separated search path.
local function which(name, search)
  for dir in search:gmatch("[^:]+") do
    local path = dir .. "/" .. name
    if core.access(path, "x") then return path end
  end
  return nil
end
M.which = which

--- The host's capabilities (cached).
-- @return table with `launcher`, `euid`, `root`, `caps`, `rlimits`, `network_isolation` (bool),
-- `pid_namespace` (bool), `bwrap` (path or nil); or nil, message, code when the launcher is missing
function M.probe()
  if cache.probe then return cache.probe end
  local basics, err, code = M.basics()
  if not basics then return nil, err, code end
  local launcher = basics.launcher
  local f = io.popen(shell_quote(launcher) .. " --probe 2>&1", "r")
  local text = f and f:read("a") or ""
  if f then f:close() end
  local p = M.parse_probe(text)
  if not p.euid then
    return nil, "EIO: `" .. launcher .. " --probe` gave no answer: " .. text:sub(1, 200), "EIO"
  end
  local caps = p.caps
  local function ok(name) return caps[name] ~= nil and caps[name].ok end
  p.launcher = launcher
  p.root = (p.euid == 0)
  p.network_isolation = ok("network-namespace") or (ok("user-namespace") and ok("userns-network-namespace"))
  p.pid_namespace = ok("pid-namespace") or (ok("user-namespace") and ok("userns-pid-namespace"))
  p.setuid = ok("setuid")
  p.bwrap = which("bwrap", "/usr/bin:/bin:/usr/local/bin")
  cache.probe = p
  return p
end

-- Effective capability bit `n` of this process, from /proc/self/status.
local function has_cap(n)
  local f = io.open("/proc/self/status", "r")
  if not f then return false end
  local text = f:read("a")
  f:close()
  local hex = text:match("CapEff:%s*(%x+)")
  local caps = hex and tonumber(hex, 16)
  return caps ~= nil and ((caps >> n) & 1) == 1
end

--- What every run needs to know, found without starting a process (cached): the launcher, the
-- effective uid, and whether this process can switch to a run uid (CAP_SETUID and CAP_SETGID).
-- Whether namespaces will be granted is learnt from the launcher's report of each run; a run
-- that requires network isolation passes `--net require`, which the launcher enforces.
-- @return table `{launcher, euid, root, setuid}` (plus the probe's fields once `probe()` ran),
-- or nil, message, code when the launcher is missing
function M.basics()
  if cache.probe then return cache.probe end
  if cache.basics then return cache.basics end
  local launcher, err = paths.launcher()
  if not launcher then return nil, err, "ENOENT" end
  if not core.access(launcher, "x") then
    return nil, "ENOENT: " .. launcher .. " is not an executable; run `make`", "ENOENT"
  end
  local euid = core.geteuid()
  cache.basics = { launcher = launcher, euid = euid, root = (euid == 0), setuid = has_cap(7) and has_cap(6) }
  return cache.basics
end

--- Resolve the interpreter a run asks for.
-- A name without a slash is looked up in `search` (the sandbox's own PATH, not the caller's: a
-- pyenv shim or a virtualenv in a private home would not be reachable from inside).
-- @return absolute path, or nil, message, code
function M.interpreter(name, search)
  local key = name .. "\0" .. search
  if cache[key] then return cache[key] end
  local path
  if name:find("/", 1, true) then
    path = core.access(name, "x") and name or nil
  else
    path = which(name, search)
  end
  if not path then
    return nil, "ENOENT: interpreter '" .. name .. "' not found" ..
      (name:find("/", 1, true) and "" or (" in " .. search)), "ENOENT"
  end
  cache[key] = path
  return path
end

-- "size mtime" of a file, or "-" when there is none
local function file_stamp(path)
  local st = core.lstat(path)
  return st and (st.size .. ":" .. st.mtime) or "-"
end

--- The directories an interpreter reads from, asked of the interpreter itself once per process:
-- its prefixes (a virtualenv's own and its base interpreter's), the entries of its sys.path and
-- every file it has mapped at start (shared objects), its executable as named and as resolved.
-- A path inside a prefix counts as that prefix; /usr/... and /lib*/... as /usr and /lib*; any
-- other file as its own directory, never a wider one. A virtualenv's prefix is its own
-- directory, however deep (its pyvenv.cfg is read at start), so a venv under /tmp gives
-- /tmp/x/venv, never /tmp itself.
-- The interpreter is asked with -I -S: no site module, so no .pth file of a virtualenv runs
-- code here, in the controller's name, nor widens what runs may read (a venv's site-packages
-- is inside its prefix anyway; a path a .pth adds from elsewhere is not granted).
-- Used by the bwrap policy (what to bind) and by Landlock (what may be read and executed).
-- The answer is also kept in the private lock directory, keyed by the path as named, the real
-- path, its size and mtime, and the pyvenv.cfg beside it or above it (a venv's python is a link
-- to the system's: the same real path), so that a short-lived process (the CLI) does not start
-- an interpreter first.
-- @return a sorted list of absolute directory paths (always holding /usr)
function M.python_roots(python)
  local key = "roots\0" .. python
  if cache[key] then return cache[key] end
  local real = core.realpath(python)
  local st = real and core.lstat(real)
  local bindir = python:match("^(.*)/[^/]*$") or "."
  local stamp = st and (python .. " " .. real .. " " .. st.size .. " " .. st.mtime .. " " ..
    file_stamp(bindir .. "/pyvenv.cfg") .. " " .. file_stamp(bindir .. "/../pyvenv.cfg"))
  local dir = stamp and M.lock_dir()
  local file = dir and (dir .. "/python-roots-" .. python:gsub("[^%w]", "_"))
  local saved = file and io.open(file, "r")
  if saved then
    local text = saved:read("a")
    saved:close()
    local first, rest = text:match("^([^\n]*)\n(.*)$")
    if first == stamp then
      local roots = {}
      for line in rest:gmatch("[^\n]+") do roots[#roots + 1] = line end
      cache[key] = roots
      return roots
    end
  end
  -- "prefix DIR" lines first, then "dir DIR" and "file FILE" lines
  -- (without site, a venv's prefix is the directory of its pyvenv.cfg, found as site finds it)
  local script = "import sys, os\n" ..
    "d = os.path.dirname(os.path.abspath(sys.executable))\n" ..
    "for v in (d, os.path.dirname(d)):\n" ..
    "    if os.path.isfile(os.path.join(v, 'pyvenv.cfg')):\n" ..
    "        print('prefix', os.path.realpath(v))\n" ..
    "        break\n" ..
    "for p in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}:\n" ..
    "    if p.startswith('/'): print('prefix', os.path.realpath(p))\n" ..
    "print('file', os.path.realpath(sys.executable))\n" ..
    "print('file', os.path.abspath(sys.executable))\n" ..
    "for p in sys.path:\n" ..
    "    if p.startswith('/'): print('dir' if os.path.isdir(p) else 'file', os.path.realpath(p))\n" ..
    "for line in open('/proc/self/maps'):\n" ..
    "    f = line.split()\n" ..
    "    if len(f) >= 6 and f[5].startswith('/'): print('file', f[5])\n" ..
    "print('done')\n"
  local f = io.popen(shell_quote(python) .. " -I -S -c " .. shell_quote(script) .. " 2>/dev/null")
  local text = f and f:read("a") or ""
  if f then f:close() end
  local prefixes, roots, seen = {}, {}, {}
  local function add(top)
    local pseudo = top and (top:match("^/proc") or top:match("^/sys") or
      (top:match("^/dev") and not top:match("^/dev/shm/")))
    if top and top ~= "/" and not seen[top] and not pseudo then
      seen[top] = true
      roots[#roots + 1] = top
    end
  end
  local function top_of(kind, path)
    for _, pre in ipairs(prefixes) do
      if path == pre or path:sub(1, #pre + 1) == pre .. "/" then return pre end
    end
    return path:match("^(/usr)/") or path:match("^(/usr)$") or path:match("^(/lib[^/]*)/")
      or (kind == "dir" and path) or path:match("^(/.+)/[^/]*$")
  end
  local complete = text:sub(-6) == "\ndone\n"
  for kind, path in text:gmatch("(%a+) ([^\n]+)") do
    if kind == "prefix" then
      -- /usr stays /usr; a prefix of its own (/opt/py, a venv) is kept whole
      local pre = path:match("^(/usr)/") or path
      prefixes[#prefixes + 1] = pre
      add(pre)
    else
      add(top_of(kind, path))
    end
  end
  if not seen["/usr"] then roots[#roots + 1] = "/usr" end
  table.sort(roots)
  cache[key] = roots
  -- a complete answer only (the interpreter printed something)
  if file and complete then
    local tmp = file .. ".new-" .. core.getpid()
    os.remove(tmp)
    if core.write_file(tmp, stamp .. "\n" .. table.concat(roots, "\n") .. "\n", 384) then
      os.rename(tmp, file)
    end
  end
  return roots
end

local function lock_dir()
  if cache.lock_dir then return cache.lock_dir end
  local dir = "/run/corral"
  if not core.access("/run", "w") then dir = "/tmp/corral-uids-" .. core.geteuid() end
  local ok, err, code = core.mkdir(dir, 448) -- 0700
  if not ok and code ~= "EEXIST" then return nil, err, code end
  local st = core.lstat(dir)
  if not st or st.type ~= "directory" or st.uid ~= core.geteuid() or st.mode % 64 ~= 0 then
    return nil, "EPERM: lock directory " .. dir .. " must be a directory owned by uid "
      .. core.geteuid() .. " with mode 0700", "EPERM"
  end
  cache.lock_dir = dir
  return dir
end
M.lock_dir = lock_dir

--- Take a free uid from `first`..`last` for one run.
-- @return uid, or nil, message, code ("EBUSY" when every uid in the range is in use)
function M.take_uid(first, last)
  local again
  for uid in pairs(uids_idle) do
    if uid >= first and uid <= last and (not again or uid < again) then again = uid end
  end
  if again then
    uids_in_use[again], uids_idle[again] = uids_idle[again], nil
    idle_count = idle_count - 1
    return again
  end
  local dir, err, code = lock_dir()
  if not dir then return nil, err, code end
  for uid = first, last do
    if not uids_in_use[uid] then
      local lock = core.lock(dir .. "/uid-" .. uid)
      if lock then
        -- uid-N.running exists while a controller holds the uid; finding it left by one that
        -- died, end whatever a run of it left running under the uid (its processes would share
        -- RLIMIT_NPROC and signals with ours) before handing the uid out again
        local marker = dir .. "/uid-" .. uid .. ".running"
        if not core.write_file(marker, "", 384) then
          local launcher = paths.launcher()
          if launcher then os.execute(shell_quote(launcher) .. " --kill-uid " .. uid .. " >/dev/null 2>&1") end
        end
        uids_in_use[uid] = { lock = lock, marker = marker }
        return uid
      end
    end
  end
  return nil, "EBUSY: every sandbox uid in " .. first .. "-" .. last .. " is in use", "EBUSY"
end

--- Give a uid back (after the run's last process is gone): this controller keeps up to
-- IDLE_UIDS_MAX of them for its next runs, locked, until release_idle_uids().
function M.release_uid(uid)
  local held = uids_in_use[uid]
  if not held then return end
  uids_in_use[uid] = nil
  if idle_count < IDLE_UIDS_MAX then
    uids_idle[uid] = held
    idle_count = idle_count + 1
  else
    os.remove(held.marker)
    held.lock:close()
  end
end

--- Give back the uids kept between runs (corral.close()): other controllers may take them.
function M.release_idle_uids()
  for uid, held in pairs(uids_idle) do
    uids_idle[uid] = nil
    os.remove(held.marker)
    held.lock:close()
  end
  idle_count = 0
end

--- Where run directories go under `tmp_dir = "auto"`: /dev/shm when it is a tmpfs we may write
-- that is not small (a container's default 64 MiB one is: code files of concurrent runs could
-- fill it), else /tmp. Making and removing a run directory costs about 0.03 ms on a tmpfs and
-- 0.3 to 0.5 ms on ext4, on every run. Cached.
local SMALL_SHM_KB = 256 * 1024
function M.run_dir_base()
  if cache.run_dir_base then return cache.run_dir_base end
  local base = "/tmp"
  local f = io.open("/proc/self/mountinfo", "r")
  if f then
    for line in f:lines() do
      -- ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
      local mnt, fstype, super = line:match("^%S+ %S+ %S+ %S+ (%S+) .- %- (%S+) %S+ (%S+)")
      if mnt == "/dev/shm" then
        local size = super and super:match("size=(%d+)k")
        base = (fstype == "tmpfs" and (not size or tonumber(size) >= SMALL_SHM_KB)
                and core.access("/dev/shm", "w")) and "/dev/shm" or "/tmp"
      end
    end
    f:close()
  end
  cache.run_dir_base = base
  return base
end

--- Remove run directories left in `tmp_dir` by controllers that died without cleaning up
-- (killed with SIGKILL). Each live run holds an flock on its directory's `.lock`; a directory
-- whose lock can be taken has no live owner, in this process or any other, whatever its pid
-- namespace. Done once per process and directory.
-- @return the number of directories removed
function M.sweep_stale(tmp_dir)
  local key = "swept\0" .. tmp_dir
  if cache[key] then return 0 end
  cache[key] = true
  local names = core.listdir(tmp_dir)
  local removed = 0
  for _, name in ipairs(names or {}) do
    if name:match("^corral%-[%w]+$") and #name == 13 then
      local dir = tmp_dir .. "/" .. name
      local st = core.lstat(dir)
      -- the flock is on the directory itself, or (run directories of earlier versions) on its
      -- .lock; one younger than a minute may belong to a run that has not taken its flock yet
      local lst = st and st.type == "directory" and st.uid == core.geteuid() and core.lstat(dir .. "/.lock")
      local target = lst and lst.type == "file" and dir .. "/.lock" or dir
      local age_of = (lst and lst.type == "file") and lst or st
      if st and st.type == "directory" and st.uid == core.geteuid() and core.time() - age_of.mtime > 60 then
        local lock = core.lock(target)
        if lock then
          if core.rmtree(dir) then removed = removed + 1 end
          lock:close()
        end
      end
    end
  end
  return removed
end

--- Forget cached probe results (tests and `corral probe --fresh`).
function M.reset()
  cache = {}
end

-- ---- the shared network namespace ----

local READY_WAIT_S = 2    -- the holder execs itself twice and unshares: milliseconds, normally

--- Whether policies with `network = "shared"` share one namespace in this process (default) or
-- give each run its own. The CLI (one run per process) turns it off: a holder would only cost.
function M.set_share_network(on)
  share_network = on and true or false
end

--- Whether policies with `network = "shared"` share one namespace in this process.
function M.share_network()
  return share_network
end

local function own_netns()
  if not cache.netns then cache.netns = core.readlink("/proc/self/ns/net") end
  return cache.netns
end

-- The holder's network namespace while it is alive and in it; nil, code otherwise ("ENOENT":
-- gone or a zombie; "EACCES": not yet in its own user namespace).
local function holder_netns(pid)
  local ns, _, code = core.readlink("/proc/" .. pid .. "/ns/net")
  if not ns then return nil, code end
  if ns == own_netns() then return nil, "EAGAIN" end
  return ns
end

--- The pid of the process that keeps this controller's shared network namespace, for runs under
-- user namespace mode `userns` ("auto", "never", "always"), started on first use and again when
-- it died. It runs `corral-launch --hold-net`, does not keep the loop running (`ref = false`),
-- dies with the controller (PR_SET_PDEATHSIG, and the loop kills it when it is collected).
-- @return pid, or nil and a message when none can be had (runs then make their own namespace)
function M.net_holder(userns)
  if not share_network then return nil, "not shared in this process" end
  local h = holders[userns]
  if h and h.failed then return nil, h.failed end
  if h and holder_netns(h.pid) == h.netns then return h.pid end
  if h then h.proc:kill() end
  local basics, err = M.basics()
  if not basics then return nil, err end
  local proc, serr = core.spawn {
    file = basics.launcher,
    args = { "--hold-net", "--userns", userns, "--parent-pid", tostring(core.getpid()) },
    stdout_cap = 1024, stderr_cap = 1024, grace = 0, ref = false,
    on_exit = function(res)
      local cur = holders[userns]
      if not cur or cur.pid ~= res.pid then return end       -- already replaced
      -- a fatal line (exit 125): the namespaces are refused here; do not try again
      local said = res.stdout:match("fatal (%S+ %S+[^\n]*)")
      holders[userns] = said and { failed = "the holder could not make its namespace: " .. said } or nil
    end,
  }
  if not proc then return nil, serr end
  local pid = proc:pid()
  h = { proc = proc, pid = pid }
  holders[userns] = h
  -- wait (busy: this may run inside a loop callback) until it is in its namespace
  local deadline = core.hrtime() + READY_WAIT_S
  repeat
    local ns, code = holder_netns(pid)
    if ns then h.netns = ns return pid end
    if code ~= "EACCES" and code ~= "EAGAIN" then break end
  until core.hrtime() > deadline
  proc:kill()
  holders[userns] = { failed = "the holder did not make its namespace" }
  return nil, holders[userns].failed
end

--- A run could not join the holder's namespace (`refused shared-netns ERRNO message` in its
-- report). Gone or not ready: the next run starts another. Refused for good (setns() denied by a
-- container's seccomp profile, no pidfd, a Landlock too old to scope): stop asking.
function M.net_holder_refused(userns, pid, errno, message)
  local h = holders[userns]
  if not h or h.pid ~= pid then return end
  h.proc:kill()
  if errno == "ESRCH" or errno == "EAGAIN" then
    holders[userns] = nil
  else
    holders[userns] = { failed = errno .. " " .. tostring(message) }
  end
end

return M
