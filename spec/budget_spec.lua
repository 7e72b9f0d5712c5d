-- Whole-run budgets of corral-launch (csrc/launch/budget.c): --budget-cpu-ms and
-- --budget-memory-kb bound the run as a whole, where the rlimits bound each process; --cgroup
-- asks for a run cgroup and falls back to polling when it cannot have one.
local H = require "helper"
local core = require "corral.core"
local report = require "corral.report"

local L = "./csrc/corral-launch"

-- The budget lines of a report: `exceeded NAME USED LIMIT` (the first) and `total CPU_US PEAK_KB`.
local function budget_lines(text)
  local exceeded, total
  for line in text:gmatch("[^\n]+") do
    local name, used, limit = line:match("^exceeded (%a+) (%d+) (%d+)$")
    if name and not exceeded then exceeded = { name = name, used = tonumber(used), limit = tonumber(limit) } end
    local cpu, peak = line:match("^total (%d+) (%d+)$")
    if cpu then total = { cpu_us = tonumber(cpu), peak_kb = tonumber(peak) } end
  end
  return exceeded, total
end

-- Runs `code` under the launcher, from a run directory shaped like the library's
-- (/tmp/corral-budgetXXXXXX/code/prog.py), so that the stray check finds any process of it that
-- survives; the longer name keeps it out of H.temp_dirs(), which other specs sweep. Returns
-- {code = exit status, out = stdout and stderr, rep = the parsed report, text = the report,
-- exceeded = {name, used, limit} or nil, total = {cpu_us, peak_kb} or nil, wall = seconds}.
local function launch(opts, code, args)
  local dir = assert(core.mkdtemp("/tmp/corral-budgetXXXXXX"))
  assert(core.mkdir(dir .. "/code"))
  local prog = dir .. "/code/prog.py"
  assert(core.write_file(prog, code, tonumber("644", 8)))
  local t0 = core.hrtime()
  local out = H.sh(("%s --report-fd 3 %s -- %s -I %s %s 3>%s/report; echo \"<$?>\""):format(
    L, opts, H.python, prog, args or "", dir))
  local wall = core.hrtime() - t0
  local f = assert(io.open(dir .. "/report"))
  local text = f:read("a")
  f:close()
  assert(core.rmtree(dir))
  local exceeded, total = budget_lines(text)
  return { code = tonumber(out:match("<(%d+)>$")), out = out, rep = report.parse(text), text = text,
           exceeded = exceeded, total = total, wall = wall }
end

local function has_line(r, pattern)
  for line in r.text:gmatch("[^\n]+") do
    if line:find(pattern) then return true end
  end
  return false
end

-- Eight children, each touching every page of 100 MB (argv[1]: how long they then hold it).
local EIGHT_CHILDREN = [[
import os, sys, time
hold = float(sys.argv[1])
pids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        b = bytearray(100 * 1024 * 1024)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(hold)
        os._exit(0)
    pids.append(pid)
ok = all(os.waitpid(p, 0)[1] == 0 for p in pids)
print("done", ok)
]]

-- A chain: each link burns 0.4 s of CPU, forks its successor and exits, so that none of them
-- comes near RLIMIT_CPU; the program itself waits.
local CHAIN = [[
import os, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
if os.fork() == 0:
    for i in range(10):
        burn(0.4)
        if os.fork() > 0:
            os._exit(0)
    os._exit(0)
time.sleep(30)
]]

-- Two threads that burn CPU outside the GIL (hashlib releases it for large buffers).
local TWO_THREADS = [[
import hashlib, threading, time
data = b"x" * (1 << 22)
def burn():
    while True:
        hashlib.sha256(data).digest()
for _ in range(2):
    threading.Thread(target=burn, daemon=True).start()
time.sleep(30)
]]

-- Workers of a parent that ignores SIGCHLD: the kernel reaps them, and their CPU is in no
-- getrusage() and no cutime; only the polls that saw them running count it.
local AUTOREAPED = [[
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
for i in range(10):
    pid = os.fork()
    if pid == 0:
        burn(0.4)
        os._exit(0)
    while os.path.exists("/proc/%d" % pid):
        time.sleep(0.01)
print("done")
]]

local MEMORY = "--rlimit as=268435456 --budget-memory-kb 307200"

describe("whole-run budgets", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  for _, mode in ipairs({ { "--pidns", "with a PID namespace" }, { "--no-pidns", "without a PID namespace" } }) do
    local m = mode[1]
    describe(mode[2], function()
      it("kills eight children that each stay under RLIMIT_AS but together pass the memory budget", function()
        local r = launch(m .. " " .. MEMORY, EIGHT_CHILDREN, "30")
        assert.are.equal(128 + 9, r.code, r.text)
        assert.are.same({ kind = "signal", code = 9 }, r.rep.status)
        assert.are.equal("memory", r.exceeded and r.exceeded.name, r.text)
        assert.are.equal(307200, r.exceeded.limit)
        assert.is_true(r.exceeded.used > 307200, r.text)
        -- one 10 ms interval of eight children allocating on two loaded cores
        assert.is_true(r.exceeded.used < 307200 * 1.75, "far over the budget: " .. r.text)
        assert.is_true(r.total.peak_kb >= r.exceeded.used, r.text)
        assert.is_true(r.wall < 10, "took " .. r.wall .. " s")
        assert.is_falsy(r.out:find("done", 1, true))
      end)

      it("lets the same eight children finish under a 1 GB budget", function()
        local r = launch(m .. " --rlimit as=268435456 --budget-memory-kb 1048576", EIGHT_CHILDREN, "0.5")
        assert.are.equal(0, r.code, r.out .. "\n" .. r.text)
        assert.is_truthy(r.out:find("done True", 1, true))
        assert.is_nil(r.exceeded)
        -- their summed peak is over what the small budget allowed (all eight at once, 800 MB,
        -- only when each touched its 100 MB before the first one's hold was over: not on a busy
        -- machine)
        assert.is_true(r.total.peak_kb > 307200, r.text)
        assert.is_true(r.total.peak_kb <= 1048576, r.text)
      end)

      it("kills a chain of processes that each stay under RLIMIT_CPU", function()
        local r = launch(m .. " --rlimit cpu=1 --budget-cpu-ms 1000", CHAIN)
        assert.are.equal(128 + 9, r.code, r.text)
        assert.are.equal("cpu", r.exceeded and r.exceeded.name, r.text)
        assert.are.equal(1000, r.exceeded.limit)
        assert.is_true(r.exceeded.used > 1000, r.text)
        -- the whole run, not the 4 s the chain would burn: near the budget
        assert.is_true(r.total.cpu_us >= 1000000, r.text)
        assert.is_true(r.total.cpu_us < 1600000, r.text)
        assert.is_true(r.wall < 10, "took " .. r.wall .. " s")
      end)

      it("counts the CPU of every thread", function()
        local r = launch(m .. " --budget-cpu-ms 1000", TWO_THREADS)
        assert.are.equal(128 + 9, r.code, r.text)
        assert.are.equal("cpu", r.exceeded and r.exceeded.name, r.text)
        assert.is_true(r.total.cpu_us >= 1000000 and r.total.cpu_us < 1600000, r.text)
        assert.is_true(r.wall < 10, "took " .. r.wall .. " s")
      end)

      it("counts the CPU of workers the kernel reaps for a parent that ignores SIGCHLD", function()
        local r = launch(m .. " --budget-cpu-ms 1000", AUTOREAPED)
        assert.are.equal(128 + 9, r.code, r.out .. "\n" .. r.text)
        assert.are.equal("cpu", r.exceeded and r.exceeded.name, r.text)
        assert.is_true(r.total.cpu_us >= 1000000 and r.total.cpu_us < 1600000, r.text)
        assert.is_falsy(r.out:find("done", 1, true))
      end)

      it("leaves a well-behaved program alone and reports a sane total", function()
        local r = launch(m .. " --budget-cpu-ms 10000 --budget-memory-kb 1048576 --budget-poll-ms 5",
          "import os\nif os.fork() == 0:\n    os._exit(0)\nos.wait()\nprint(sum(range(10**6)))")
        assert.are.equal(0, r.code, r.out .. "\n" .. r.text)
        assert.is_truthy(r.out:find("499999500000", 1, true))
        assert.are.equal("10000", r.rep.applied["budget-cpu"])
        assert.are.equal("1048576", r.rep.applied["budget-memory"])
        assert.are.equal("5", r.rep.applied["budget-poll"])
        assert.is_nil(r.exceeded)
        local u = r.rep.usage
        -- with every process reaped, the total CPU is the usage (the polls saw no more)
        assert.is_true(r.total.cpu_us >= u.user_us + u.sys_us, r.text)
        assert.is_true(r.total.cpu_us < 10000000, r.text)
        assert.is_true(r.total.peak_kb >= u.maxrss_kb, r.text)
        assert.is_true(r.total.peak_kb < 1048576, r.text)
        -- the lines come in order: the exceeded line (none here) before status, total after
        -- usage, what the walks observed last
        assert.is_truthy(r.text:find("\nusage [^\n]+\ntotal %d+ %d+\nobserved tasks %d+\nobserved vm %d+\n$"), r.text)
      end)

      it("reports its usage while it runs, so that a supervisor killed at the end loses none", function()
        -- The host kills the supervisor a grace after its stop; on a busy machine the supervisor
        -- may not run within it. What the run used must be in the report before that.
        local dir = assert(core.mkdtemp("/tmp/corral-budgetXXXXXX"))
        assert(core.mkdir(dir .. "/code"))
        assert(core.write_file(dir .. "/code/prog.py",
          "print('busy', flush=True)\nwhile True:\n    pass\n", tonumber("644", 8)))
        -- The launcher dies with its parent (PR_SET_PDEATHSIG): a subshell that waits for it is
        -- that parent, and writes its pid.
        H.sh(("(%s --report-fd 3 %s --budget-cpu-ms 60000 -- %s -I %s/code/prog.py >%s/out 2>&1 3>%s/report "
          .. "& echo $! >%s/pid; wait) </dev/null >/dev/null 2>&1 &"):format(L, m, H.python, dir, dir, dir, dir))
        local pid
        H.eventually(function()
          pid = tonumber(H.try_read(dir .. "/pid") or "")
          return pid ~= nil
        end, 30)
        assert(pid, "no pid written")
        local function running_usage()
          local rep = report.parse(H.try_read(dir .. "/report") or "")
          return rep.usage and rep.usage.user_us + rep.usage.sys_us > 0 and rep.total and rep.total.cpu_us > 0
        end
        local seen = H.eventually(running_usage, 30)
        -- the launcher called setsid: its group is the run (and the init dies with it)
        H.sh("kill -9 -- -" .. pid .. " 2>/dev/null; kill -9 " .. pid .. " 2>/dev/null")
        H.eventually(function() return #H.stray_processes() == 0 end)
        local text = H.try_read(dir .. "/report") or ""
        local out = H.try_read(dir .. "/out") or ""
        assert(core.rmtree(dir))
        assert.is_true(seen, "no usage while the program ran:\n" .. text .. out)
        assert.is_truthy(out:find("busy", 1, true), out)
        assert.is_falsy(text:find("\nstatus "), text)       -- it never ended by itself
        -- each line replaces the one before: the CPU never goes down
        local last = -1
        for cpu in text:gmatch("\ntotal (%d+) %d+") do
          assert.is_true(tonumber(cpu) >= last, text)
          last = tonumber(cpu)
        end
      end)

      it("reports its usage while it runs at most a few dozen times, and its end last", function()
        -- a 32nd of the run so far apart, at least 100 ms: about 20 lines in 2 s
        local r = launch(m .. " --budget-cpu-ms 60000",
          "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end:\n    pass\nprint('done')")
        assert.are.equal(0, r.code, r.out .. "\n" .. r.text)
        local n = select(2, r.text:gsub("\nusage ", ""))
        assert.is_true(n >= 2 and n <= 2 + 2000 / 100, n .. " usage lines:\n" .. r.text)
        -- the end's lines come last, and hold the whole run
        assert.is_truthy(r.text:find("\nstatus exit 0\nusage [^\n]+\ntotal %d+ %d+\nobserved"), r.text)
        local u = r.rep.usage
        assert.is_true(u.user_us + u.sys_us > 0 and r.total.cpu_us >= u.user_us + u.sys_us, r.text)
      end)

      it("writes no budget line without a budget", function()
        local r = launch(m, "print(1)")
        assert.are.equal(0, r.code, r.out)
        assert.is_nil(r.rep.applied["budget-cpu"])
        assert.is_nil(r.rep.applied["budget-poll"])
        assert.is_nil(r.total)
        assert.is_nil(r.exceeded)
        assert.is_truthy(r.rep.usage)
      end)

      it("ends a run with more tasks than one poll can walk", function()
        -- 4200 threads: the walk reads the children of each, and stops at 4096
        local r = launch(m .. " --budget-memory-kb 10485760",
          "import threading, time\nfor i in range(4200):\n    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n" ..
          "print('started', flush=True)\ntime.sleep(30)\nprint('slept', flush=True)")
        assert.are.equal(128 + 9, r.code, r.out .. "\n" .. r.text)
        assert.are.equal("tasks", r.exceeded and r.exceeded.name, r.text)
        assert.are.equal(4096, r.exceeded.limit)
        -- ended by the budget, not at its own end (a busy machine takes long to start 4200 threads)
        assert.is_nil(r.out:find("slept", 1, true), r.out)
      end)
    end)
  end

  describe("--cgroup", function()
    it("refuses a directory that does not exist, naming it, and polls instead", function()
      local r = launch("--no-pidns --cgroup /nonexistent/corral-runs --budget-memory-kb 1048576", "print(1)")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("ENOENT", r.rep.refused.cgroup and r.rep.refused.cgroup.errno, r.text)
      assert.is_truthy(r.rep.refused.cgroup.message:find("/nonexistent/corral-runs", 1, true))
      assert.is_truthy(r.rep.refused.cgroup.message:find("Delegate=yes", 1, true))
      assert.is_nil(r.rep.applied.cgroup)
      assert.are.equal("10", r.rep.applied["budget-poll"])
      assert.is_truthy(r.total)
    end)

    it("refuses a directory that is not in a cgroup2 file system", function()
      local r = launch("--pidns --cgroup /tmp --budget-cpu-ms 10000", "print(1)")
      assert.are.equal(0, r.code, r.out)
      assert.are.equal("EINVAL", r.rep.refused.cgroup and r.rep.refused.cgroup.errno, r.text)
      assert.is_truthy(r.rep.applied["budget-poll"])
    end)

    it("refuses a cgroup2 directory without the memory and pids controllers", function()
      -- a hybrid host: cgroup2 at /sys/fs/cgroup/unified, every controller bound to v1
      local U = "/sys/fs/cgroup/unified"
      local ctl = io.open(U .. "/cgroup.controllers")
      local have = ctl and ctl:read("a")
      if ctl then ctl:close() end
      if not have or have:find("memory", 1, true) then
        pending("needs a cgroup2 directory without the memory controller at " .. U)
        return
      end
      for _, m in ipairs({ "--pidns", "--no-pidns" }) do
        local r = launch(m .. " --cgroup " .. U .. " --budget-memory-kb 1048576", "print(1)")
        assert.are.equal(0, r.code, r.out)
        assert.are.equal("EOPNOTSUPP", r.rep.refused.cgroup and r.rep.refused.cgroup.errno, r.text)
        assert.is_truthy(r.rep.refused.cgroup.message:find("memory controller", 1, true), r.text)
        assert.is_truthy(r.rep.applied["budget-poll"])
        assert.are.same({ kind = "exit", code = 0 }, r.rep.status)
      end
      assert.are.equal("", H.sh("ls -d " .. U .. "/corral-* 2>/dev/null"), "a run cgroup was left")
    end)

    it("makes a refused cgroup fatal with --cgroup-require: nothing runs", function()
      local marker = os.tmpname()
      os.remove(marker)
      local r = launch("--pidns --cgroup /nonexistent/corral-runs --cgroup-require --budget-cpu-ms 1000",
        ("open(%q, 'w').close()"):format(marker))
      assert.are.equal(125, r.code, r.out)
      assert.are.same({ step = "cgroup", errno = "ENOENT", message = r.rep.fatal and r.rep.fatal.message },
        r.rep.fatal)
      assert.is_nil(r.rep.status)
      assert.is_nil(r.rep.pid)
      assert.is_nil(r.rep.applied["budget-cpu"])
      assert.is_falsy(core.exists(marker), "the program ran")
    end)

    it("is bad usage in the forms the parser refuses", function()
      for _, c in ipairs({ "--cgroup-require", "--cgroup relative/dir", "--budget-poll-ms 0",
                           "--budget-cpu-ms 0", "--budget-memory-kb x" }) do
        local out = H.sh(L .. " " .. c .. " -- /bin/true; echo \"<$?>\"")
        assert.are.equal("2", out:match("<(%d+)>$"), c .. ": " .. out)
      end
    end)
  end)

  it("keeps the report lines in order", function()
    local r = launch("--no-pidns --budget-cpu-ms 1000", CHAIN)
    local order, ended = {}, false
    for line in r.text:gmatch("[^\n]+") do
      local kind = line:match("^(%a+)")
      ended = ended or kind == "exceeded" or kind == "status"
      -- usage and total while the run goes on (none, or a few: how many depends on the machine),
      -- and a second total of the lines before the teardown (one more walk) count once
      local running = not ended and (kind == "usage" or kind == "total")
      local again = kind == "total" and (order[#order] or ""):sub(1, 5) == "total"
      if (kind ~= "applied" or line:find("^applied budget")) and not running and not again then
        order[#order + 1] = line:match("^(%S+ ?%a*)")
      end
    end
    -- a run ended before the program was reaped writes usage and total before the teardown too
    local want = { "corral-launch", "applied budget", "applied budget", "pid", "exceeded cpu", "usage", "total",
                   "status signal", "usage", "total" }
    for i, w in ipairs(want) do
      assert.are.equal(w, order[i] and order[i]:sub(1, #w), r.text)
    end
    assert.is_true(has_line(r, "^exceeded cpu %d+ 1000$"), r.text)
  end)
end)
