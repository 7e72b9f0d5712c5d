--- Machinery shared by the hostile-program suite (spec/hostile_spec.lua), its child controller
-- (spec/hostile/controller.lua) and the same programs as session cells
-- (spec/hostile_session_spec.lua): markers, the scatter prologue, the inspector program, the
-- policy variants with the per-run checks hooked in, host-side scans, the runner's loop.
--
-- Markers. Each case gets a unique marker, `<prefix>m<NNN>z`; everything a hostile program
-- tries to leave behind carries it in its name (files, directories, sockets, IPC keys, kernel
-- keys), so a leak is found by name on the host and by the next run, and attributed to its case.
-- What the test itself makes on the host (sentinels, listeners) is named `<prefix>h<NNN>z`,
-- which never contains a marker.
local core = require "corral.core"
local policy = require "corral.policy"

local S = {}

-- A run (or cell) must return within its timeout + SLACK: a case that would hold the result
-- holds it for 30 s or more (a sleeping escapee, an open pipe), and on a busy machine the end of
-- a run (the kill, the last reads, the clean-up) takes a second or two of its own.
S.SLACK = 3

S.PY = "/usr/bin/python3"       -- host-side helpers: never a pyenv shim from the caller's PATH
S.LUA = "lua5.4"

--- A Python string literal for `s` (ASCII paths and markers; other bytes escaped).
function S.pystr(s)
  return "'" .. tostring(s):gsub("[^%w%s%-%._/:@+=,]", function(c)
    return string.format("\\x%02x", c:byte())
  end):gsub("\n", "\\n"):gsub("\t", "\\t"):gsub("\r", "\\r") .. "'"
end

--- Random hex from the kernel.
function S.random_hex(n)
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(n)
  f:close()
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

function S.marker(prefix, i) return string.format("%sm%03dz", prefix, i) end
function S.host_token(prefix, i) return string.format("%sh%03dz", prefix, i) end

--- Directories on the host a run could write to if nothing stopped it, where the runner looks for
-- markers after each case: the scratch dirs the sandbox replaces, the caller's HOME, every
-- world-writable directory outside them (found on this host: /run/lock on Debian), and the tree.
function S.host_places(tree)
  local places, seen = {}, {}
  local function add(p)
    if p and p ~= "" and not seen[p] and core.exists(p) then
      seen[p] = true
      places[#places + 1] = p
    end
  end
  for _, p in ipairs({ "/tmp", "/var/tmp", "/dev/shm", os.getenv("HOME"), tree }) do add(p) end
  for _, p in ipairs(S.world_writable()) do add(p) end
  return places
end

local world_writable
--- World-writable directories of the host outside /tmp, /var/tmp and /dev/shm (which the sandbox
-- replaces), on every writable disk or tmpfs mount (cached; the child controller gets the list
-- in HOSTILE_WORLD_WRITABLE instead of walking the disks again).
function S.world_writable()
  if world_writable then return world_writable end
  local given = os.getenv("HOSTILE_WORLD_WRITABLE")
  if given then
    world_writable = require("cjson").decode(given)
    return world_writable
  end
  world_writable = {}
  local skip = { ["/tmp"] = true, ["/var/tmp"] = true, ["/dev/shm"] = true }
  local fstypes = { ext2 = true, ext3 = true, ext4 = true, xfs = true, btrfs = true, tmpfs = true,
                    overlay = true, zfs = true, f2fs = true }
  local roots, seen = {}, {}
  local m = assert(io.open("/proc/self/mounts", "r"))
  for line in m:lines() do
    local mp, fstype, mopts = line:match("^%S+ (%S+) (%S+) (%S+)")
    if mp and fstypes[fstype] and mopts:match("^rw") and not skip[mp]
      and not mp:match("^/proc") and not mp:match("^/sys") and not seen[mp] then
      seen[mp] = true
      roots[#roots + 1] = "'" .. mp:gsub("'", "'\\''") .. "'"
    end
  end
  m:close()
  if #roots == 0 then return world_writable end
  local f = io.popen("find " .. table.concat(roots, " ") .. " -xdev \\( -path /tmp -o -path /var/tmp -o -path /dev/shm"
    .. " -o -path /proc -o -path /sys \\) -prune -o -type d -perm -0002 -print 2>/dev/null")
  local found = {}
  for line in f:lines() do
    if not found[line] then
      found[line] = true
      world_writable[#world_writable + 1] = line
    end
  end
  f:close()
  table.sort(world_writable)
  return world_writable
end

--- Where the test puts host files a run must be able to see (sentinels, a socket): the first
-- world-writable host directory the sandbox does not replace (as nobody, /tmp is the only other
-- choice, and the run sees its own /tmp there).
function S.host_scratch()
  return S.world_writable()[1] or "/tmp"
end

--- A host directory `<scratch>/<token>-sentinel` (0755) holding `keep` (0644, "precious"), made
-- by the test: what a clean-up that follows links would destroy. Setup values: `sentinel_dir`,
-- `sentinel`.
function S.make_sentinel(ctx)
  -- on the run directories' filesystem, so that a hard link to it is not refused for crossing one
  local dir = require("corral.host").run_dir_base() .. "/" .. ctx.token .. "-sentinel"
  assert(core.mkdir(dir, 493))
  assert(core.write_file(dir .. "/keep", "precious", 420))
  return { sentinel_dir = dir, sentinel = dir .. "/keep" }
end

--- Is the sentinel as the test made it? Returns true, or false and what changed.
function S.sentinel_intact(ctx)
  local f = io.open(ctx.sentinel, "r")
  if not f then return false, "the sentinel is gone" end
  local data = f:read("a")
  f:close()
  if data ~= "precious" then return false, "the sentinel was changed: " .. data end
  local names = core.listdir(ctx.sentinel_dir) or {}
  if #names ~= 1 then return false, "the sentinel dir holds " .. table.concat(names, " ") end
  local h = io.popen("stat -c %h '" .. ctx.sentinel .. "'")
  local links = h:read("l")
  h:close()
  if links ~= "1" then return false, "the sentinel has " .. tostring(links) .. " links" end
  return true
end

--- Python source prepended to every case (unless `prologue = false`): silently try to leave a file
-- and a directory named with the marker in every place the next run or the host could see.
function S.prologue(ctx)
  return string.format([[
def _hostile_scatter(marker, host_home):
    import os
    cwd = os.getcwd()
    top = os.path.dirname(cwd)
    for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ.get("HOME", cwd), host_home, top,
              os.path.join(top, "code"), cwd):
        try:
            with open(os.path.join(d, marker + "-scatter-file"), "w") as f:
                f.write(marker)
        except OSError:
            pass
        try:
            os.mkdir(os.path.join(d, marker + "-scatter-dir"))
        except OSError:
            pass
_hostile_scatter(%s, %s)
del _hostile_scatter
]], S.pystr(ctx.marker), S.pystr(ctx.host_home))
end

--- The inspector: a run after the case (as root: under the case's uid) that looks for anything
-- of the case: names with its marker in the scratch dirs, HOME, cwd, the run directory, the
-- world-writable host dirs; unix sockets (abstract included) in its network namespace; processes
-- in sight; SysV IPC objects, POSIX message queues and user-keyring keys named by the marker
-- (each removed once reported, so nothing stays on the host). Prints one JSON object.
function S.inspector_code(markers, ctx)
  local list = {}
  for i, m in ipairs(markers) do list[i] = S.pystr(m) end
  local ww = {}
  for i, p in ipairs(S.world_writable()) do ww[i] = S.pystr(p) end
  return string.format([[
import ctypes, json, os, sys, zlib
MARKERS = [%s]
HOST_HOME = %s
WORLD_WRITABLE = [%s]
found = []
def hit(s):
    return any(m in s for m in MARKERS)
def scan(d, depth):
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in names:
        p = os.path.join(d, n)
        if hit(n):
            found.append(p)
        if depth > 0 and os.path.isdir(p) and not os.path.islink(p):
            scan(p, depth - 1)
cwd = os.getcwd()
# the run's directory on the host: its code's (the work dir has a path of its own), where the
# code is at its host path (under code_path the run's directory is out of sight: the cwd again)
top = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))
if not os.path.basename(top).startswith("corral-"):
    top = cwd
for d in ["/tmp", "/var/tmp", "/dev/shm", cwd, os.environ.get("HOME", cwd), top, HOST_HOME] + WORLD_WRITABLE:
    scan(d, 3)
try:
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        if hit(line.replace("\0", "@")):
            found.append("unix socket: " + line.split()[-1])
except OSError as e:
    found.append("cannot read /proc/net/unix: %%s" %% e)
procs = []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) not in (1, os.getpid()):
        try:
            procs.append(p + " " + open("/proc/%%s/cmdline" %% p, "rb").read().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            pass
libc = ctypes.CDLL(None, use_errno=True)
try:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
except OSError:
    rt = libc
IPC_RMID = 0
for m in MARKERS:
    key = zlib.crc32(m.encode()) & 0x7fffffff
    i = libc.shmget(key, 0, 0)
    if i >= 0:
        found.append("sysv shm " + m)
        libc.shmctl(i, IPC_RMID, None)
    i = libc.semget(key, 0, 0)
    if i >= 0:
        found.append("sysv sem " + m)
        libc.semctl(i, 0, IPC_RMID)
    i = libc.msgget(key, 0)
    if i >= 0:
        found.append("sysv msg " + m)
        libc.msgctl(i, IPC_RMID, None)
    q = rt.mq_open(("/" + m).encode(), os.O_RDONLY)
    if q >= 0:
        found.append("posix mq /" + m)
        rt.mq_close(q)
        rt.mq_unlink(("/" + m).encode())
    # keyctl(KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, "user", m, 0): no request-key upcall
    k = libc.syscall(250, 10, ctypes.c_long(-4), b"user", m.encode(), 0)
    if k >= 0:
        found.append("user-keyring key " + m)
        libc.syscall(250, 9, ctypes.c_long(k), ctypes.c_long(-4))   # KEYCTL_UNLINK
listing = {}
for d in ("/var/tmp", "/dev/shm", cwd):
    try:
        # the run's own directory (its code bound back read-only) when run directories are
        # on /dev/shm: the mount point the launcher made in this run's fresh /dev/shm
        listing[d] = sorted(n for n in os.listdir(d) if os.path.join(d, n) != top)
    except PermissionError:
        listing[d] = []     # no run may look there (Landlock): nothing to be seen
    except OSError as e:
        listing[d] = ["<%%s>" %% e]
print(json.dumps({"found": found, "procs": procs, "listing": listing, "uid": os.getuid()}))
]], table.concat(list, ", "), S.pystr(ctx.host_home), table.concat(ww, ", "))
end

-- Policy variants a case may ask for (`variant = NAME`).
S.variants = {
  default = {},
  -- no PID namespace: the subreaper fallback; the run sees the host's /proc
  ["no-pidns"] = { pid_namespace = false, separation = "auto" },
  -- no namespace at all (as root: still the network namespace and a run uid; as nobody, whose
  -- namespaces need a user namespace: none), the run in the controller's own uid
  bare = { pid_namespace = false, user_namespace = "never", separation = "auto" },
  -- the host's network: only Landlock's network rules can stop a connection
  ["host-net"] = { network = "host", deny_tcp = "always" },
  -- no seccomp filter: what the supervisor does when the program may ptrace
  ["no-seccomp"] = { seccomp = "off" },
  -- the network namespace (one of the run's own: a shared one comes with the seccomp socket
  -- filter) as the only network wall (no Landlock TCP denial)
  ["netns-only"] = { deny_tcp = false, network = "new" },
  -- no Landlock (which refuses mq_open): what RLIMIT_MSGQUEUE alone bounds. Without Landlock
  -- and without root nothing walls the run off from the controller: such variants accept it
  -- (separation = "auto"), as an operator would
  ["no-landlock"] = { filesystem = "off", separation = "auto" },
  -- no private mounts and no Landlock: the suite's own checks must see what a run leaves
  ["host-work-open"] = { tmpfs = {}, work_mb = false, filesystem = "off", separation = "auto" },
  -- no scratch mounts and the work dir on the host: the clean-up faces what the program planted
  ["host-work"] = { tmpfs = {}, work_mb = false },
  -- no mount namespace and no Landlock (gVisor, or a container without user namespaces): the
  -- run directory on the host is in the program's reach, and as nobody its uid's
  exposed = { pid_namespace = false, filesystem = "off", separation = "auto" },
}

--- Processes of a run still alive: running its code (its code dir is in every interpreter's
-- argv, forks included), carrying its marker in argv (escapees that exec something else are
-- written to do so), or (as root) owned by its uid. `ignore` holds pids of host-side helpers.
function S.strays(uid, code_dir, marker, ignore)
  -- zombies are dead (see spec/helper.lua): left out
  local f = io.popen("ps -e -o pid=,uid=,stat=,args=")
  local out = {}
  for line in f:lines() do
    local pid, puid, stat, args = line:match("^%s*(%d+)%s+(%d+)%s+(%S+)%s+(.*)$")
    pid, puid = tonumber(pid), tonumber(puid)
    if pid and pid ~= core.getpid() and not (ignore and ignore[pid]) and not stat:match("^Z")
      and not args:match("^ps ") then
      if (uid and puid == uid) or (code_dir and args:find(code_dir, 1, true))
        or (marker and args:find(marker, 1, true)) then
        out[#out + 1] = pid .. " (uid " .. puid .. "): " .. args:sub(1, 80)
      end
    end
  end
  f:close()
  return out
end

-- Walk `dir` (no symlink followed), calling fn(relative path, lstat) for each entry.
local function walk(dir, rel, fn, depth)
  if depth > 64 then return end
  for _, name in ipairs(core.listdir(dir) or {}) do
    local p, r = dir .. "/" .. name, rel == "" and name or (rel .. "/" .. name)
    local st = core.lstat(p)
    if st then
      fn(r, st)
      if st.type == "directory" then walk(p, r, fn, depth + 1) end
    end
  end
end

--- What the run left in its host directory besides `.lock`, `code/<code_name>` and `work/`: the
-- code dir and the run directory itself are off limits; the work dir too when it was a tmpfs in
-- the sandbox (then the host's `work/` must stay empty).
function S.scan_top(top, work_tmpfs, code_name)
  local extra = {}
  -- (a link the program put in place of the directory is not followed: where it leads is the
  -- case's to check)
  local top_st = top and core.lstat(top)
  if not top_st or top_st.type ~= "directory" then return extra end
  walk(top, "", function(rel, st)
    if rel == ".lock" or rel == "code" or rel == "work" or rel == "code/" .. code_name then return end
    if rel:sub(1, 5) == "work/" and not work_tmpfs then return end
    extra[#extra + 1] = rel .. " (" .. st.type .. ")"
  end, 0)
  return extra
end

local function has(list, v)
  for _, x in ipairs(list or {}) do if x == v then return true end end
  return false
end
S.has = has

--- The policy a case runs under: the variant, plus hooks that record, per run, its directory and
-- uid when it starts, and, when it has ended (before its clean-up), the processes it left and
-- what it wrote into its host directory. `sink` receives them.
-- The policy the variants are made from: "default", or "warm" (the same sandbox, each run forked
-- from a zygote), which must pass every case exactly as "default" does.
S.base = "default"

function S.test_policy(variant, sink)
  local spec = S.variants[variant or "default"]
  assert(spec, "unknown variant " .. tostring(variant))
  local base = policy.load(S.base)
  local copy = {}
  for k, v in pairs(spec) do copy[k] = v end
  local mid = base:extend(copy)
  return mid:extend {
    launch_args = function(self, opts, run, host)
      sink.top, sink.uid, sink.code_dir = run.top, run.uid, run.code_dir
      -- processes of the uid from before the run are not the run's (a controller of another
      -- tree on this machine that hands out uids of the same range without our locks)
      if run.uid then
        sink.ignore = sink.ignore or {}
        for _, line in ipairs(S.strays(run.uid, nil, nil, nil)) do
          sink.ignore[tonumber(line:match("^(%d+)"))] = true
        end
      end
      if sink.on_start then sink.on_start(run) end
      return mid.launch_args(self, opts, run, host)
    end,
    result = function(self, raw, opts, run, host)
      sink.strays = S.strays(run.uid, run.code_dir, sink.marker, sink.ignore)
      -- a survivor is reported, then ended: it must not outlive the suite
      for _, line in ipairs(sink.strays) do core.kill(tonumber(line:match("^(%d+)")), 9) end
      local res, err, code = mid.result(self, raw, opts, run, host)
      sink.top_extra = S.scan_top(run.top, res and has(res.limits, "work-tmpfs"), self.code_name or "main.py")
      return res, err, code
    end,
  }
end

-- The last line of `s` that parses as a JSON object.
function S.last_json(s)
  local cjson = require "cjson"
  local found
  for line in (s or ""):gmatch("[^\n]+") do
    if line:sub(1, 1) == "{" then
      local ok, v = pcall(cjson.decode, line)
      if ok then found = v end
    end
  end
  return found
end

--- Callbacks waiting for something a later loop turn brings (a uid free again, a warm run's
-- pid): the runner calls `S.retry_waiting()` between loop turns, since a callback may not run
-- the loop itself.
S.waiting = {}

function S.retry_waiting()
  local now = S.waiting
  S.waiting = {}
  for _, retry in ipairs(now) do retry() end
end

--- Run `list` with at most `concurrency` cases at a time, each by `start_case(case, prefix,
-- done)`, which calls done(outcome) when all of the case is over; returns outcomes by case name.
function S.run_cases(list, start_case, prefix, concurrency)
  local outcomes, running, next_i = {}, 0, 1
  local function start_more()
    while running < concurrency and next_i <= #list do
      local case = list[next_i]
      next_i = next_i + 1
      running = running + 1
      local t0 = core.hrtime()
      start_case(case, prefix, function(o)
        o.wall = core.hrtime() - t0
        outcomes[case.name] = o
        running = running - 1
        start_more()
      end)
    end
  end
  start_more()
  while running > 0 do
    core.run("once")        -- returns at once when nothing else is running
    S.retry_waiting()
  end
  return outcomes
end

--- Start the inspector for a finished case (`o.sink`: its run's), pinned to the case's uid as
-- root. Calls back with the parsed report, or nil and a problem.
function S.start_inspector(case, ctx, o, cb, deadline)
  local corral = require "corral"
  local uid = o.sink and math.tointeger(o.sink.uid)   -- a float when it came through JSON
  local pol = policy.load("default")
  if case.inspector_variant then pol = S.test_policy(case.inspector_variant, {}) end
  if uid then pol = pol:extend { uid_range = { uid, uid } } end
  local code = S.inspector_code({ ctx.marker }, ctx)
  local proc, err = corral.start(code, { policy = pol, timeout = 5 }, function(r, rerr)
    if not r then return cb(nil, "the inspector failed: " .. tostring(rerr)) end
    local rep = S.last_json(r.stdout)
    if not rep then return cb(nil, "the inspector printed no report: " .. r.stdout .. r.stderr) end
    cb(rep)
  end)
  if proc then return end
  -- EBUSY: another case of this process took the lowest free uid, this one, in the moment it
  -- was free: wait for it to end (up to its timeout). A launch started ahead for the next case
  -- may hold it too, until a run takes it: those are let go, once
  if not deadline then require("corral.prestart").let_go_all() end
  deadline = deadline or core.hrtime() + 10
  if core.hrtime() > deadline then
    return cb(nil, "the inspector could not start under uid " .. tostring(uid) .. ": " .. tostring(err))
  end
  S.waiting[#S.waiting + 1] = function() S.start_inspector(case, ctx, o, cb, deadline) end
end

--- What the run of `sink` (S.test_policy's) left: processes alive at its end, files written into
-- its host directory, the directory itself. Each is passed to `bad(fmt, ...)`, after `label`.
function S.sink_problems(sink, label, bad)
  if not sink then return end
  for _, s in ipairs(sink.strays or {}) do bad("%sprocess alive after the run: %s", label, s) end
  for _, s in ipairs(sink.top_extra or {}) do bad("%swritten into the run directory on the host: %s", label, s) end
  if sink.top and core.exists(sink.top) then bad("%srun directory left: %s", label, sink.top) end
end

--- What was found after the case (`o.host_leaks`, `o.inspector`, `o.inspector_error`): each
-- passed to `bad(fmt, ...)`.
function S.after_problems(o, bad)
  for _, p in ipairs(o.host_leaks or {}) do bad("left on the host: %s", p) end
  if o.inspector_error then bad("%s", o.inspector_error) end
  local rep = o.inspector
  if not rep then return end
  for _, f in ipairs(rep.found or {}) do bad("the next run saw: %s", f) end
  for _, p in ipairs(rep.procs or {}) do bad("the next run saw a process: %s", p) end
  for d, names in pairs(rep.listing or {}) do
    if #names > 0 then bad("the next run found %s not empty: %s", d, table.concat(names, " ")) end
  end
  if o.sink and o.sink.uid and rep.uid ~= math.tointeger(o.sink.uid) then
    bad("the inspector ran as uid %s, not the case's %s", tostring(rep.uid), tostring(o.sink.uid))
  end
end

--- Entries named with `marker` in the host places (top level, plus one level below the tree);
-- each found is removed, so a leak is reported once and not left behind.
function S.host_leaks(marker, places)
  local found = {}
  for _, dir in ipairs(places) do
    for _, name in ipairs(core.listdir(dir) or {}) do
      if name:find(marker, 1, true) then
        local p = dir .. "/" .. name
        found[#found + 1] = p
        core.rmtree(p)
      end
    end
  end
  return found
end

--- The values a case's code and checks are built from. `extra` (from the case's `setup`) is
-- merged in.
function S.make_ctx(case, prefix, tree, extra)
  local ctx = {
    name = case.name,
    marker = S.marker(prefix, case.index),
    token = S.host_token(prefix, case.index),
    host_home = os.getenv("HOME") or "/",
    tree = tree,
    controller_pid = core.getpid(),
    root = core.geteuid() == 0,
    host_uid = core.getuid(),
    world_writable = S.world_writable(),
  }
  for k, v in pairs(extra or {}) do ctx[k] = v end
  return ctx
end

--- A case's start: its ctx (S.make_ctx), its setup run (an error is the outcome's setup_error)
-- and what the setup gives merged into ctx, and the set of host helper pids not to count as
-- survivors. @return outcome, ctx, extra, ignore
function S.case_start(case, prefix, tree)
  local o = {}
  local ctx = S.make_ctx(case, prefix, tree)
  local extra = {}
  if case.setup then
    local ok, e = pcall(case.setup, ctx)
    if ok then extra = e or {} else o.setup_error = tostring(e) end
    for k, v in pairs(extra) do ctx[k] = v end
  end
  local ignore = {}
  for _, pid in ipairs(extra.helper_pids or {}) do ignore[pid] = true end
  return o, ctx, extra, ignore
end

--- The program a case runs: its code (or what its function makes of ctx), after the prologue.
function S.case_code(case, ctx)
  local code = case.code
  if type(code) == "function" then code = code(ctx) end
  if case.prologue == false then return code end
  return S.prologue(ctx) .. code
end

--- The options a case runs with (its `opts`, a table or a function of ctx), under its policy.
function S.case_opts(case, ctx, sink)
  local o = case.opts
  if type(o) == "function" then o = o(ctx) end
  local out = {}
  for k, v in pairs(o or {}) do out[k] = v end
  out.policy = S.test_policy(case.variant, sink)
  return out
end

--- Every case, from the case files, in order; each gets its index.
S.CASE_FILES = { "limits", "processes", "output", "files", "environment", "network", "programs", "pending",
                 "tenancy" }
function S.load_cases()
  local all, names = {}, {}
  for _, file in ipairs(S.CASE_FILES) do
    for _, c in ipairs(require("hostile." .. file)) do
      assert(type(c.name) == "string" and not names[c.name], "case name missing or used twice: " .. tostring(c.name))
      names[c.name] = true
      c.file = file
      all[#all + 1] = c
    end
  end
  for i, c in ipairs(all) do c.index = i end
  -- HOSTILE_ONLY=pattern: only the cases whose name matches (a Lua pattern), to look at one
  local only = os.getenv("HOSTILE_ONLY")
  if only and only ~= "" then
    local some = {}
    for _, c in ipairs(all) do if c.name:find(only) then some[#some + 1] = c end end
    return some
  end
  return all
end

--- Start a host process (a listener, a victim) from Python source; returns its pid and the
-- second line it printed (its first line must be its pid). `env` values reach it in its
-- environment, never in argv, so no marker or path shows in `ps`. `S.stop_helper(pid)` ends it.
local helpers = {}
function S.start_helper(source, env)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(source)
  f:close()
  local prefix = ""
  for k, v in pairs(env or {}) do prefix = prefix .. k .. "='" .. v:gsub("'", "'\\''") .. "' " end
  local h = io.popen("exec env " .. prefix .. S.PY .. " -u " .. script .. " 2>&1", "r")
  local pid = tonumber(h:read("l"))
  local line = h:read("l")
  os.remove(script)
  if not pid then
    h:close()
    error("the helper did not start: " .. tostring(line))
  end
  helpers[pid] = h
  return pid, line
end

function S.stop_helper(pid)
  if not pid or not helpers[pid] then return end
  core.kill(pid, 9)
  helpers[pid]:close()
  helpers[pid] = nil
end

--- Is process `pid` alive (not a zombie)?
function S.alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  if not f then return false end
  local stat = f:read("a")
  f:close()
  return stat:match("^%d+ %b() (%a)") ~= "Z"
end

--- A host process of the test's own uid that sleeps: a victim for signals. Returns the setup
-- values `victim_pid`, `helper_pids`.
function S.victim()
  local pid = S.start_helper("import os, time\nprint(os.getpid())\nprint('ready')\ntime.sleep(60)\n")
  return { victim_pid = pid, helper_pids = { pid } }
end

return S
