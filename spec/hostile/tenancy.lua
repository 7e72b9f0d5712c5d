--- Hostile cases: what runs of one controller have in common. Without root every run has the
-- controller's uid, and the kernel counts some resources per uid for the whole machine: one run
-- that takes them all would starve a concurrent run. And what a run's own /proc tells it about
-- the host. See spec/hostile_spec.lua for the fields.
local assert = require "luassert"
local cjson = require "cjson"

-- How long the hog holds what it took, and how long the victim keeps trying: the windows
-- overlap by seconds, and the check asserts that they did.
local HOLD_S, TRY_S = 6, 10

-- The hog (the companion): workers take every inotify instance, queued signal (what a POSIX timer
-- needs one of) and pipe page (pipes grown to 1 MiB) they can, and hold them; it prints when all of them
-- held, and when it let go. (POSIX message queues, which RLIMIT_MSGQUEUE bounds per run too,
-- cannot be made at all under Landlock: mq_open's file in the queues' own mount is refused.)
local HOG = string.format([[
import ctypes, fcntl, json, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
F_SETPIPE_SZ = 1031
def inotify():
    n = 0
    while libc.inotify_init() >= 0:
        n += 1
    return n
def signals():
    # each queued real-time signal takes a slot, as each POSIX timer does (timer_create takes
    # its slot up front; taking them that way slows down quadratically)
    rt = list(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    signal.pthread_sigmask(signal.SIG_BLOCK, rt)
    n, pid = 0, os.getpid()
    while n < 200000 and libc.sigqueue(pid, rt[n %% len(rt)], ctypes.c_void_p(0)) == 0:
        n += 1
    return n
def pipes():
    n = 0
    while True:
        try:
            r, w = os.pipe()
        except OSError:
            break
        os.close(w)
        try:
            fcntl.fcntl(r, F_SETPIPE_SZ, 1 << 20)
            n += 1
        except OSError:
            pass
    return n
jobs = [inotify, inotify, inotify, signals, signals, pipes, pipes, pipes]
rd, wr = os.pipe()
for job in jobs:
    if os.fork() == 0:
        os.close(rd)
        got = job()
        os.write(wr, ("%%s %%d\n" %% (job.__name__, got)).encode())
        time.sleep(60)
        os._exit(0)
os.close(wr)
buf = b""
while buf.count(b"\n") < len(jobs):
    buf += os.read(rd, 4096)
took = {}
for line in buf.decode().split("\n"):
    if line:
        name, got = line.split()
        took[name] = took.get(name, 0) + int(got)
t1 = time.time()
time.sleep(%d)
print(json.dumps({"took": took, "held_from": t1, "held_to": time.time()}), flush=True)
]], HOLD_S)

-- The victim (the case): one of each, every 50 ms for TRY_S seconds; each failure with its time.
local VICTIM = string.format([[
import ctypes, fcntl, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
F_GETPIPE_SZ = 1032
def inotify():
    fd = libc.inotify_init()
    if fd < 0:
        return os.strerror(ctypes.get_errno())
    os.close(fd)
def timer():
    t = ctypes.c_long()
    if libc.timer_create(1, None, ctypes.byref(t)) != 0:
        return os.strerror(ctypes.get_errno())
    libc.timer_delete(t)
def pipe():
    r, w = os.pipe()
    size = fcntl.fcntl(r, F_GETPIPE_SZ)
    os.close(r)
    os.close(w)
    if size != 65536:
        return "a pipe of %%d bytes" %% size
# compact, well under max_output: times in ms after t0, one reason per kind
t0 = time.time()
tries, failed, why_of = [], {}, {}
while time.time() < t0 + %d:
    t = time.time()
    tries.append(int((t - t0) * 1000))
    for f in (inotify, timer, pipe):
        why = f()
        if why:
            failed.setdefault(f.__name__, []).append(tries[-1])
            why_of[f.__name__] = why
    time.sleep(0.05)
print(json.dumps({"t0": t0, "tries": tries, "failed": failed, "why": why_of}))
]], TRY_S)

-- POSIX message queues: the hog makes queues of the default size until refused and holds them;
-- the victim, under the same variant, makes and removes one every 50 ms.
local MQ_HOG = string.format([[
import ctypes, json, os, time
rt = ctypes.CDLL("librt.so.1", use_errno=True)
n = 0
while n < 1000:
    q = rt.mq_open(("/hog%%d" %% n).encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    if q < 0:
        break
    os.close(q)
    n += 1
t1 = time.time()
time.sleep(%d)
print(json.dumps({"took": {"queues": n}, "held_from": t1, "held_to": time.time()}), flush=True)
]], HOLD_S)

local MQ_VICTIM = string.format([[
import ctypes, json, os, time
rt = ctypes.CDLL("librt.so.1", use_errno=True)
t0 = time.time()
tries, failed, why_of = [], {}, {}
while time.time() < t0 + %d:
    tries.append(int((time.time() - t0) * 1000))
    q = rt.mq_open(b"/victim", os.O_CREAT | os.O_RDWR, 0o600, None)
    if q < 0:
        failed.setdefault("queue", []).append(tries[-1])
        why_of["queue"] = os.strerror(ctypes.get_errno())
    else:
        os.close(q)
        rt.mq_unlink(b"/victim")
    time.sleep(0.05)
print(json.dumps({"t0": t0, "tries": tries, "failed": failed, "why": why_of}))
]], TRY_S)

local function last_json(s)
  local found
  for line in (s or ""):gmatch("[^\n]+") do
    if line:sub(1, 1) == "{" then
      local ok, v = pcall(cjson.decode, line)
      if ok then found = v end
    end
  end
  return found
end

-- The victim (r) made its attempts while the hog (the companion) held what it took, and none
-- was refused.
local function starved_not(r, o)
  local c = o.companion.res or {}
  local hog = last_json(c.stdout)
  assert(hog, string.format("the hog printed nothing (reason %s): %s", tostring(c.reason), tostring(c.stderr)))
  local v = assert(last_json(r.stdout), "the victim printed nothing")
  local function held(ms)
    local t = v.t0 + ms / 1000
    return t > hog.held_from and t < hog.held_to
  end
  local during = 0
  for _, ms in ipairs(v.tries) do
    if held(ms) then during = during + 1 end
  end
  assert(during > 0, "the victim made no attempt while the hog held its quotas")
  local bad = {}
  for kind, times in pairs(v.failed) do
    local n = 0
    for _, ms in ipairs(times) do
      if held(ms) then n = n + 1 end
    end
    if n > 0 then bad[#bad + 1] = string.format("%s (%d of %d tries): %s", kind, n, during, v.why[kind]) end
  end
  table.sort(bad)
  assert(#bad == 0, "while the hog held " .. cjson.encode(hog.took) .. ", the victim was refused: "
    .. table.concat(bad, "; "))
end

-- Strings of the host the program must not find, with what each is.
local function host_facts(ctx, o)
  local facts = {
    { "--parent-pid", "the launcher's options" }, { "--plan", "the request's number" },
    { ctx.tree, "the install path" },
  }
  local lock = require("corral.host").lock_dir()
  if lock then facts[#facts + 1] = { lock, "the lock directory" } end
  return facts
end

return {
  {
    name = "a run that takes every per-uid quota and holds it does not starve a concurrent run",
    -- (the hog may need a few seconds of CPU to take every signal slot of a uid)
    companion = { code = HOG, opts = { timeout = HOLD_S + 10, cpu_seconds = 10 } },
    code = VICTIM,
    opts = { timeout = TRY_S + 3 },
    expect = { reason = "exit", returncode = 0 },
    check = function(r, _, o) starved_not(r, o) end,
  },
  {
    name = "a run that takes every byte of POSIX message queue it may does not starve a concurrent run",
    variant = "no-landlock",
    prologue = false,
    companion = { code = MQ_HOG, variant = "no-landlock", opts = { timeout = HOLD_S + 10 } },
    code = MQ_VICTIM,
    opts = { timeout = TRY_S + 3 },
    expect = { reason = "exit", returncode = 0 },
    check = function(r, _, o) starved_not(r, o) end,
  },
  {
    -- why file locks are not refused (THREAT-MODEL.md: file locks as a channel between runs):
    -- the run's own files need them
    name = "sqlite3 and flock work on the run's own files in its work dir",
    code = [[
import fcntl, sqlite3
a = sqlite3.connect("db.sqlite", timeout=0)
a.execute("create table t (x)")
a.commit()
a.execute("begin immediate")
a.execute("insert into t values (1)")
b = sqlite3.connect("db.sqlite", timeout=0)
try:
    b.execute("begin immediate")
    print("no lock")
except sqlite3.OperationalError as e:
    print("locked:", e)
a.commit()
print("rows", b.execute("select count(*) from t").fetchone()[0])
f, g = open("lock", "w"), open("lock", "w")
fcntl.flock(f, fcntl.LOCK_EX)
try:
    fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("no flock")
except OSError:
    print("flock held")
]],
    opts = { timeout = 5 },
    expect = { reason = "exit", returncode = 0, stdout_exact = "locked: database is locked\nrows 1\nflock held\n" },
  },
  {
    name = "the run's own /proc shows neither the controller's pid, the install path, the lock dir nor the plan",
    code = [[
import json
out = {}
for p in ("/proc/1/cmdline", "/proc/1/environ", "/proc/1/mountinfo", "/proc/self/mountinfo",
          "/proc/1/status", "/proc/1/stat", "/proc/self/cgroup", "/proc/1/cgroup"):
    try:
        out[p] = open(p, "rb").read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError as e:
        out[p] = "<%s>" % e.strerror
print(json.dumps(out))
]],
    opts = { timeout = 5 },
    expect = { reason = "exit", returncode = 0 },
    check = function(r, ctx, o)
      local seen = assert(last_json(r.stdout), "no report: " .. r.stderr)
      local bad = {}
      for path, text in pairs(seen) do
        for _, f in ipairs(host_facts(ctx, o)) do
          if text:find(f[1], 1, true) then bad[#bad + 1] = path .. " shows " .. f[2] .. " (" .. f[1] .. ")" end
        end
        -- the controller's pid, as a number of its own
        if text:find("%f[%d]" .. ctx.controller_pid .. "%f[%D]") then
          bad[#bad + 1] = path .. " shows the controller's pid " .. ctx.controller_pid
        end
      end
      -- the run directory is the program's own cwd (its name is random): only the init's
      -- command line and environment must not show it
      local top = o.sink and o.sink.top
      for _, path in ipairs({ "/proc/1/cmdline", "/proc/1/environ" }) do
        if top and (seen[path] or ""):find(top, 1, true) then bad[#bad + 1] = path .. " shows the run directory" end
      end
      table.sort(bad)
      assert(#bad == 0, table.concat(bad, "\n"))
    end,
  },
}
