-- Soak: many runs at a fixed concurrency through the Lua API, well-behaved and hostile programs
-- mixed, then a check that the controller is as it was: no extra fd, no process left by a run, no
-- run directory left, and resident memory grown by less than 5 MB (measured after a warm-up, so
-- that lazily built caches and the allocator's first growth do not count).
--   lua5.4 bench/soak.lua [RUNS] [CONCURRENCY]      (make soak: 5000 runs at 8)
-- Prints the figures; exits 1 when a check fails.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local core = require "corral.core"
local corral = require "corral"

local RUNS = tonumber(arg[1]) or 5000
local CONC = tonumber(arg[2]) or 8
local WARMUP = math.min(200, RUNS // 5)

-- { name, code, options, check(result) → true or a message }
local function exited(want)
  return function(r) return r.reason == want or ("reason " .. tostring(r.reason)) end
end
local programs = {
  { "hello", "print('hello')", {}, function(r) return r.stdout == "hello\n" or "stdout " .. r.stdout end },
  { "compute", "print(sum(i * i for i in range(200000)))", {}, exited("exit") },
  { "imports", "import json, re, collections; print(json.dumps({'a': 1}))", {}, exited("exit") },
  { "exit-3", "import os; os._exit(3)", {}, function(r) return r.returncode == 3 or "rc " .. r.returncode end },
  { "stderr", "import sys; sys.stderr.write('x' * 1000)", {}, exited("exit") },
  { "syntax-error", "def (:", {}, function(r) return r.returncode == 1 or "rc " .. r.returncode end },
  { "files", "for i in range(50):\n  open('f%d' % i, 'w').write('x' * 1000)", {}, exited("exit") },
  { "flood", "import sys\nwhile True: sys.stdout.write('y' * 65536)", { timeout = 0.5, max_output = 4096 },
    function(r) return r.truncated or "not truncated" end },
  { "cpu-loop", "while True: pass", { timeout = 0.4 }, exited("timeout") },
  { "memory-bomb", "a = []\nwhile True: a.append(b'x' * 10**6)", { memory_mb = 64 }, exited("memory") },
  { "fork-bomb", "import os\nfor _ in range(100):\n  try: os.fork()\n  except OSError: pass\nimport time; time.sleep(5)",
    { timeout = 0.4, processes = 8 }, function() return true end },
  { "setsid-escapee", "import os, time\nif os.fork() == 0:\n  os.setsid()\n  time.sleep(30)\nprint('parent out')",
    {}, exited("exit") },
  { "ignores-sigterm", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(30)",
    { timeout = 0.3 }, exited("timeout") },
  { "segfault", "import ctypes; ctypes.string_at(0)", {}, exited("signal") },
}

local function fd_count()
  return #(core.listdir("/proc/self/fd") or {})
end
local function rss_kb()
  local f = io.open("/proc/self/statm")
  local pages = f and f:read("n") and f:read("n")
  if f then f:close() end
  return pages and pages * 4 or 0
end
local function run_dirs()
  local n = 0
  for _, name in ipairs(core.listdir("/tmp") or {}) do
    if name:match("^corral%-%w%w%w%w%w%w$") then n = n + 1 end
  end
  return n
end
-- processes of a run: a run uid (as root), a run's code path in argv, or a launcher of ours
local function run_processes()
  local n = 0
  local me = tostring(core.getpid())
  -- zombies are dead and hold nothing but a pid (a container's pid 1 may never reap them)
  local f = io.popen("ps -e -o pid=,uid=,stat=,args=")
  for line in f:lines() do
    local pid, uid, stat, args = line:match("^%s*(%d+)%s+(%d+)%s+(%S+)%s+(.*)$")
    uid = tonumber(uid)
    if pid and pid ~= me and not stat:match("^Z") and not args:match("^ps ") and ((uid >= 60000 and uid <= 60999)
        or args:find("/corral%-%w%w%w%w%w%w/code/")
        or (args:find("corral-launch ", 1, true) and args:find("--parent-pid " .. me .. " ", 1, true))) then
      n = n + 1
    end
  end
  f:close()
  return n
end

local started, done, failures = 0, 0, {}
local by_reason = {}
local function start_next()
  if started >= RUNS then return end
  started = started + 1
  local p = programs[(started - 1) % #programs + 1]
  local opts = {}
  for k, v in pairs(p[3]) do opts[k] = v end
  opts.timeout = opts.timeout or 5
  local proc, err = corral.start(p[2], opts, function(r, e, c)
    done = done + 1
    if not r then
      failures[#failures + 1] = p[1] .. ": sandbox error " .. tostring(c) .. " " .. tostring(e)
    else
      by_reason[r.reason] = (by_reason[r.reason] or 0) + 1
      local ok = p[4](r)
      if ok ~= true then failures[#failures + 1] = p[1] .. ": " .. tostring(ok) end
    end
    start_next()
  end)
  if not proc then
    done = done + 1
    failures[#failures + 1] = p[1] .. ": could not start: " .. tostring(err)
    start_next()
  end
end

local function settle()
  -- the launches started ahead of the next runs (prestart) and the run uids a controller keeps
  -- locked between runs (as root; up to 16): corral.close() lets them go, they are not a leak
  assert(corral.release_prestarted())
  require("corral.host").release_idle_uids()
  collectgarbage("collect")
  collectgarbage("collect")
end

-- libuv keeps a spare fd per loop from its first spawn on: one run before the baseline
assert(corral.run_python("pass"))
settle()
local fds0, dirs0, procs0 = fd_count(), run_dirs(), run_processes()
local t0 = core.hrtime()
local rss_warm
for _ = 1, CONC do start_next() end
while done < RUNS do
  core.run("once")
  if not rss_warm and done >= WARMUP then settle(); rss_warm = rss_kb() end
end
local wall = core.hrtime() - t0
settle()
local fds1, dirs1, procs1, rss1 = fd_count(), run_dirs(), run_processes(), rss_kb()

local reasons = {}
for k, v in pairs(by_reason) do reasons[#reasons + 1] = k .. "=" .. v end
table.sort(reasons)
print(string.format("soak: %d runs at concurrency %d in %.1f s (%.0f runs/s)", RUNS, CONC, wall, RUNS / wall))
print("reasons: " .. table.concat(reasons, " "))
print(string.format("extra fds: %d   left processes: %d   left run dirs: %d", fds1 - fds0, procs1 - procs0, dirs1 - dirs0))
print(string.format("controller RSS: %d KB after %d warm-up runs, %d KB at the end (growth %d KB)",
  rss_warm, WARMUP, rss1, rss1 - rss_warm))
print(string.format("unexpected outcomes: %d", #failures))
for i = 1, math.min(10, #failures) do print("  " .. failures[i]) end

local bad = fds1 ~= fds0 or procs1 > procs0 or dirs1 > dirs0 or rss1 - rss_warm >= 5 * 1024 or #failures > 0
print(bad and "soak: FAILED" or "soak: ok")
os.exit(bad and 1 or 0)
