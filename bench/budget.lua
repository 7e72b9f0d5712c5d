-- Cost of the whole-run budgets (csrc/launch/budget.c), both supervision modes:
--   1. median wall of N runs of `python3 -I -c pass` under corral-launch, without and with
--      budgets, interleaved so that machine noise hits both alike;
--   2. the supervisor's CPU per tick (from /proc/PID/schedstat) with 1, 10 and 100 processes in
--      the run, polled every 10 ms.
--   lua5.4 bench/budget.lua [N]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local core = require "corral.core"

local N = tonumber(arg[1]) or 200
local L = "./csrc/corral-launch"
local python = "/usr/bin/python3"
local budget = { "--budget-cpu-ms", "10000", "--budget-memory-kb", "1048576" }

local function args_of(mode, with_budget, prog)
  local a = { mode }
  if with_budget then for _, v in ipairs(budget) do a[#a + 1] = v end end
  a[#a + 1] = "--"
  a[#a + 1] = python
  for _, v in ipairs(prog) do a[#a + 1] = v end
  return a
end

local function run(args)
  local done = false
  assert(core.spawn { file = L, args = args, on_exit = function() done = true end })
  while not done do core.run("once") end
end

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end

print(("1. median wall of %d runs of python3 -I -c pass"):format(N))
local cases = {}
for _, mode in ipairs({ "--pidns", "--no-pidns" }) do
  for _, b in ipairs({ false, true }) do
    cases[#cases + 1] = { name = mode .. (b and " with budgets" or " without budgets"),
                          args = args_of(mode, b, { "-I", "-c", "pass" }), t = {} }
  end
end
for _ = 1, 3 do for _, c in ipairs(cases) do run(c.args) end end
for _ = 1, N do
  for _, c in ipairs(cases) do
    local t0 = core.hrtime()
    run(c.args)
    c.t[#c.t + 1] = core.hrtime() - t0
  end
end
for _, c in ipairs(cases) do print(("   %-30s %7.2f ms"):format(c.name, median(c.t) * 1000)) end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function cpu_ns(pid)
  local s = read("/proc/" .. pid .. "/schedstat")
  return s and tonumber(s:match("^(%d+)"))
end

local function count_run(pid)
  -- the supervisor's descendants
  local n, queue = 0, { pid }
  while #queue > 0 do
    local p = table.remove(queue)
    for t in (read("/proc/" .. p .. "/task/" .. p .. "/children") or ""):gmatch("%d+") do
      n = n + 1
      queue[#queue + 1] = t
    end
  end
  return n
end

print("2. the supervisor's CPU per tick (poll 10 ms)")
local SECONDS = 3
for _, mode in ipairs({ "--pidns", "--no-pidns" }) do
  for _, nproc in ipairs({ 1, 10, 100 }) do
    local prog = { "-I", "-c", ("import os, time\nfor i in range(%d):\n  if os.fork() == 0:\n" ..
      "    time.sleep(60); os._exit(0)\ntime.sleep(60)"):format(nproc - 1) }
    local done = false
    local p = assert(core.spawn { file = L, args = args_of(mode, true, prog),
                                  on_exit = function() done = true end })
    local sup = p:pid()
    if mode == "--pidns" then
      core.run("nowait")
      os.execute("sleep 0.2")
      sup = tonumber((read("/proc/" .. sup .. "/task/" .. sup .. "/children") or ""):match("%d+"))
    end
    assert(sup, "no supervisor")
    -- wait for the run to have its processes
    local deadline = core.hrtime() + 10
    while count_run(sup) < nproc and core.hrtime() < deadline do os.execute("sleep 0.1") end
    local n = count_run(sup)
    local c0, w0 = cpu_ns(sup), core.hrtime()
    os.execute("sleep " .. SECONDS)
    local c1, w1 = cpu_ns(sup), core.hrtime()
    p:kill()
    while not done do core.run("once") end
    local cpu = (c1 - c0) / 1e9
    local ticks = (w1 - w0 - cpu) / 0.010
    print(("   %-10s %3d processes: %7.1f us per tick, %5.2f %% of a CPU"):format(
      mode, n, cpu / ticks * 1e6, cpu / (w1 - w0) * 100))
  end
end
