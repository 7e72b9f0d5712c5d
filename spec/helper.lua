--- Shared helpers for the specs: paths, leak checks, small process utilities.
-- Every spec that starts runs checks afterwards that nothing is left behind: no process of the
-- run, no extra fd in this process, no temp dir.
local core = require "corral.core"
local assert = require "luassert"

local H = {}

H.python = "/usr/bin/python3"
H.root = (core.geteuid() == 0)

--- A whole file's bytes, or nil and io.open's message when it cannot be opened.
function H.try_read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("a")
  f:close()
  return s
end

--- A whole file's bytes (raises when it cannot be read).
function H.read(path)
  return (assert(H.try_read(path)))
end

--- Run a shell command, return its stdout (trimmed) and exit status.
function H.sh(cmd)
  local f = io.popen("(" .. cmd .. ") 2>&1")
  local out = f:read("a")
  local _, _, status = f:close()
  return (out:gsub("%s+$", "")), status
end

--- Run directories corral made (under /tmp or /dev/shm: host.run_dir_base).
-- spec/run.sh runs the suite twice at once, as root and as nobody: each pass judges only what is
-- its own. As root, a process or directory of nobody's is the other pass's; as any other user,
-- only its own uid's are its own (root's runs, under run uids, are the other pass's).
local NOBODY = 65534
local MY_UID = core.geteuid()
local function ours(uid)
  if MY_UID == 0 then return uid ~= NOBODY end
  return uid == MY_UID
end

function H.temp_dirs()
  local out = H.sh("ls -1d /tmp/corral-?????? /dev/shm/corral-?????? 2>/dev/null")
  local t = {}
  for line in out:gmatch("[^\n]+") do
    local st = core.lstat(line)
    if st and ours(st.uid) then t[#t + 1] = line end
  end
  return t
end

--- Pids of processes whose command line contains `marker` (other than the look-up itself), of
-- this pass's uids (the other pass runs the same specs at the same time).
function H.pids_with(marker)
  local f = io.popen("ps -e -o pid=,uid=,args=")
  local pids = {}
  for line in f:lines() do
    local pid, uid, args = line:match("^%s*(%d+)%s+(%d+)%s+(.*)$")
    if pid and args:find(marker, 1, true) and tonumber(pid) ~= core.getpid() and ours(tonumber(uid)) then
      pids[#pids + 1] = tonumber(pid)
    end
  end
  f:close()
  return pids
end

--- Processes a run may have left: anything running a run's code (its path is in every
-- sandboxed interpreter's argv, forks included: /run/code/... where the run has its own mounts,
-- else /tmp/corral-XXXXXX/code/... (or under /dev/shm), or /home/code.py under bwrap), any launcher, and (as root) anything owned by a run uid. Found by a scan of every
-- process, not only our descendants: a setsid escapee is re-parented away from us. Left out: the
-- processes of another test session on the machine, those whose parents lead to another busted
-- before pid 1 and never to us; an escapee's, and those of a controller a spec started apart
-- (its parents lead to pid 1), lead there without one.
--- Whether `args` (a process's command line) is a launch started ahead that no run took yet:
-- corral-launch --prestart whose code dir (--ro-bind DIR --code-at) holds no code.
function H.idle_launch(args)
  if not (args and args:find("corral-launch --prestart ", 1, true)) then return false end
  local dir = args:match("%-%-ro%-bind (%S+) %-%-code%-at ")
  return dir ~= nil and core.exists(dir) and #(core.listdir(dir) or {}) == 0
end

function H.stray_processes()
  -- zombies are left out: dead, holding nothing but a pid, and on a machine whose pid 1 does not
  -- reap (a container's), an escapee killed after its run stays one for good
  local f = io.popen("ps -e -o pid=,ppid=,uid=,stat=,args=")
  local procs, parent, is_lua = {}, {}, {}
  for line in f:lines() do
    local pid, ppid, uid, stat, args = line:match("^%s*(%d+)%s+(%d+)%s+(%d+)%s+(%S+)%s+(.*)$")
    if pid then
      pid = tonumber(pid)
      parent[pid] = tonumber(ppid)
      is_lua[pid] = args:find("busted", 1, true) ~= nil and args:find("lua5%.4") ~= nil
      procs[#procs + 1] = { pid = pid, uid = tonumber(uid), stat = stat, args = args }
    end
  end
  f:close()
  local me = core.getpid()
  local args_of = {}
  for _, p in ipairs(procs) do args_of[p.pid] = p.args end
  -- a launch started ahead waits with its interpreter up and no code yet (files_wait): what runs
  -- under it is no run's until its code is there
  local function idle(pid)
    local seen = 0
    pid = parent[pid]
    while pid and pid > 1 and seen < 8 do
      if H.idle_launch(args_of[pid]) then return true end
      pid, seen = parent[pid], seen + 1
    end
    return false
  end
  local function foreign(pid)
    local other, seen = false, 0
    pid = parent[pid]
    while pid and pid > 1 and seen < 64 do
      if pid == me then return false end
      if is_lua[pid] then other = true end
      pid, seen = parent[pid], seen + 1
    end
    return other
  end
  local strays = {}
  for _, p in ipairs(procs) do
    local pid, uid, stat, args = p.pid, p.uid, p.stat, p.args
    if pid ~= me and not stat:match("^Z") and not args:match("^ps ")
      and not args:match("^sh %-c") and ours(uid) then
      local run_uid = uid >= 60000 and uid <= 60999
      -- (a launch started ahead of a run, --prestart, holds a run directory but no run: a
      -- controller keeps it until corral.close(); its program, once it runs, is found here)
      local prestarted = args:find("corral-launch --prestart ", 1, true)
      local runs_code = not prestarted
        and (args:find("/corral%-%w%w%w%w%w%w/code/") or args:find("/home/code.py", 1, true)
             or args:find(" /run/code/", 1, true))
      -- launchers of this process (another corral on the machine is not ours to judge); not the
      -- holder of its shared network namespace (--hold-net), which lives as long as the process
      local launcher = args:find("corral-launch ", 1, true) and args:find("--parent-pid " .. me .. " ", 1, true)
        and not args:find("--hold-net", 1, true) and not prestarted
      if (run_uid or runs_code or launcher) and not foreign(pid) and not (runs_code and idle(pid)) then
        strays[#strays + 1] = { pid = pid, uid = uid, comm = args:sub(1, 60) }
      end
    end
  end
  return strays
end

-- libuv keeps one spare fd per loop from its first spawn on: take it before any snapshot.
do
  local done = false
  assert(core.spawn { file = "/bin/true", args = {}, on_exit = function() done = true end })
  while not done do core.run("once") end
end

local function fd_set()
  local set = {}
  for _, fd in ipairs(core.fds()) do set[fd] = true end
  return set
end

--- Snapshot of what a run could leak; `H.assert_clean(snap)` compares against it.
-- fds are compared as a set of new numbers: loops of earlier spec files, collected at any time,
-- may close theirs.
function H.snapshot()
  local dirs = {}
  for _, d in ipairs(H.temp_dirs()) do dirs[d] = true end
  return { fds = fd_set(), dirs = dirs }
end

-- Whether pid belongs to another test session: its parents lead to another busted before pid 1,
-- and never to this process.
local function foreign_pid(pid)
  local me, other = core.getpid(), false
  for _ = 1, 64 do
    if pid == me then return false end
    if not pid or pid <= 1 then break end
    local f = io.open("/proc/" .. pid .. "/cmdline", "rb")
    local args = f and f:read("a") or ""
    if f then f:close() end
    if args:find("busted", 1, true) and args:find("lua5.4", 1, true) then other = true end
    local st = io.open("/proc/" .. pid .. "/stat", "rb")
    local text = st and st:read("a") or ""
    if st then st:close() end
    pid = tonumber(text:match("^%d+ %b() %S+ (%d+)"))
  end
  return other
end

function H.assert_clean(snap)
  -- what a controller keeps between runs is let go of by corral.close(): the launches started
  -- ahead, the run uids (as root)
  assert(require("corral").release_prestarted())
  require("corral.host").release_idle_uids()
  local strays = H.stray_processes()
  local names = {}
  for i, r in ipairs(strays) do
    if i > 10 then names[#names + 1] = "... " .. (#strays - 10) .. " more" break end
    names[#names + 1] = r.pid .. ":" .. r.comm .. "(uid " .. r.uid .. ")"
  end
  assert.are.equal("", table.concat(names, " "), "processes left behind")
  local new = {}
  for fd in pairs(fd_set()) do
    if not snap.fds[fd] then new[#new + 1] = fd .. " -> " .. tostring(core.readlink("/proc/self/fd/" .. fd)) end
  end
  assert.are.equal("", table.concat(new, ", "), "fds leaked in the host")
  -- new ones only: a stale one from before may be swept meanwhile (by a controller's first run);
  -- not one whose lock a live controller of another test session holds
  local holder = {}
  local lf = io.open("/proc/locks", "r")
  for line in (lf and lf:read("a") or ""):gmatch("[^\n]+") do
    local pid, ino = line:match("FLOCK%s+%S+%s+%S+%s+(%d+)%s+%x+:%x+:(%d+)")
    if pid then holder[tonumber(ino)] = tonumber(pid) end
  end
  if lf then lf:close() end
  local left = {}
  for _, d in ipairs(H.temp_dirs()) do
    local st = core.lstat(d)
    local by = st and holder[st.ino]
    -- (kill(by, 0) fails with EPERM, not ESRCH, for a live holder of another uid)
    local alive = by and (core.kill(by, 0) or select(3, core.kill(by, 0)) == "EPERM")
    if not snap.dirs[d] and not (by and by ~= core.getpid() and alive and foreign_pid(by)) then
      left[#left + 1] = d
    end
  end
  assert.are.equal("", table.concat(left, " "), "temp dirs left behind")
end

--- Remove the run directories new since `snap` whose controller is dead (their flock is free:
-- a live controller holds its runs' and its waiting launches'). A killed controller leaves them
-- for the next controller's sweep, a minute later; a spec that kills one does it at once.
function H.sweep_dead_run_dirs(snap)
  for _, d in ipairs(H.temp_dirs()) do
    if not snap.dirs[d] then
      local lock = core.lock(d)
      if lock then
        core.rmtree(d)
        lock:close()
      end
    end
  end
end

--- Wait until `pred()` holds or `seconds` pass (default 10: it returns as soon as it holds, and
-- a busy machine may take seconds to kill and reap what a spec waits on); returns whether it held.
function H.eventually(pred, seconds)
  local deadline = core.hrtime() + (seconds or 10)
  repeat
    if pred() then return true end
    H.sh("sleep 0.05")
  until core.hrtime() > deadline
  return pred()
end

--- Path of the corral CLI in this tree.
H.cli = "lua5.4 bin/corral"

function H.has(list, value)
  for _, v in ipairs(list) do if v == value then return true end end
  return false
end

return H
