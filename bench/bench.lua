-- corral against bare Python, measured side by side in one run (make bench).
-- Latency: each case run N times, interleaved with the others so that machine noise hits all
-- alike, after a warm-up; median and p99, and the ratio of the median to bare `python3 -I -c`.
-- Throughput: runs per second through the Lua API at concurrency 1, 2 and 8 (median of three
-- rounds), with the controller's own CPU per run and its RSS, for the default policy with its
-- network namespace shared by the runs (network = "shared") and with one per run ("new"). A
-- heavy-import program too.
--   lua5.4 bench/bench.lua [N]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local core = require "corral.core"
local corral = require "corral"
local policy = require "corral.policy"

local N = tonumber(arg[1]) or 40
local PY = "/usr/bin/python3"
local HELLO = "print('hello')"
local HEAVY = "import json, decimal, fractions, statistics, datetime, collections, re, email, csv\n" ..
  "try:\n    import numpy\nexcept ImportError:\n    pass\nprint('ok')"

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function code_file(code)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  return path
end
local hello_file, heavy_file = code_file(HELLO), code_file(HEAVY)
local have_unshare = os.execute("unshare --user --map-root-user --net true 2>/dev/null")
  or os.execute("unshare --net true 2>/dev/null")
local unshare = os.execute("unshare --net true 2>/dev/null") and "unshare --net"
  or "unshare --user --map-root-user --net"

local bwrap = policy.load("bwrap")
local default = policy.load("default")
-- the other network mode than the default's, for comparison
local other_net = default.network == "shared" and "new" or "shared"
local other = default:extend { name = "default-" .. other_net, network = other_net }
local function api(code, pol)
  return function()
    local r = assert(corral.run_python(code, { policy = pol }))
    assert(r.ok, r.stderr)
  end
end
local function cmd(line)
  return function() assert(os.execute(line .. " >/dev/null 2>&1")) end
end

local cases = {
  { "bare python3 -I -c", cmd(PY .. " -I -c " .. sh_quote(HELLO)) },
  have_unshare and { "unshare --net python3 -I -c", cmd(unshare .. " " .. PY .. " -I -c " .. sh_quote(HELLO)) } or nil,
  { "corral default (library)", api(HELLO) },
  { "corral default, network=" .. other_net, api(HELLO, other) },
  { "corral bwrap (library)", api(HELLO, bwrap) },
  { "corral run --json (CLI)", cmd("lua5.4 bin/corral run --json " .. hello_file) },
  { "corral run --json --policy bwrap", cmd("lua5.4 bin/corral run --json --policy bwrap " .. hello_file) },
  { "heavy imports: bare", cmd(PY .. " -I " .. heavy_file) },
  { "heavy imports: corral default", api(HEAVY) },
}
local list = {}
for i = 1, #cases do if cases[i] then list[#list + 1] = cases[i] end end

local function pct(t, p)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  return s[math.max(1, math.ceil(#s * p))]
end

for _ = 1, 3 do for _, c in ipairs(list) do c[2]() end end   -- warm-up (caches, the roots file)
local times = {}
for i = 1, #list do times[i] = {} end
for _ = 1, N do
  for i, c in ipairs(list) do
    local t0 = core.hrtime()
    c[2]()
    times[i][#times[i] + 1] = core.hrtime() - t0
  end
end

local base = pct(times[1], 0.5)
local heavy_base
print(string.format("latency, N=%d (ratios to bare python3 -I -c of the same run)", N))
print(string.format("%-36s %10s %10s %8s", "case", "median ms", "p99 ms", "ratio"))
for i, c in ipairs(list) do
  local m = pct(times[i], 0.5)
  if c[1] == "heavy imports: bare" then heavy_base = m end
  local ratio = m / base
  local extra = ""
  if c[1]:match("^heavy imports: corral") and heavy_base then extra = string.format("  (%.2fx heavy bare)", m / heavy_base) end
  print(string.format("%-36s %10.2f %10.2f %7.2fx%s", c[1], m * 1000, pct(times[i], 0.99) * 1000, ratio, extra))
end

-- Throughput through the library at a fixed concurrency: runs/s, the controller's CPU per run.
local function rss_kb()
  local f = io.open("/proc/self/status")
  local kb = f and f:read("a"):match("VmRSS:%s*(%d+)")
  if f then f:close() end
  return tonumber(kb) or 0
end
local function throughput(conc, total, pol)
  local started, done = 0, 0
  local function next_run()
    if started >= total then return end
    started = started + 1
    assert(corral.start(HELLO, { policy = pol }, function(r)
      assert(r and r.ok)
      done = done + 1
      next_run()
    end))
  end
  local ru0 = core.rusage()       -- this process only: the controller's own CPU
  local t0 = core.hrtime()
  for _ = 1, conc do next_run() end
  while done < total do core.run("once") end
  local wall = core.hrtime() - t0
  local ru1 = core.rusage()
  local cpu = (ru1.user_s + ru1.sys_s) - (ru0.user_s + ru0.sys_s)
  return total / wall, cpu / total
end

-- Each figure is the median of ROUNDS measurements, the two network modes taking turns, so that
-- a machine that gets busier or quieter meanwhile weighs on both alike.
local ROUNDS = 3
local variants = { { default.network, default }, { other_net, other } }
local rates, cpus = {}, {}
for _, conc in ipairs({ 1, 2, 8 }) do
  for _ = 1, ROUNDS do
    for v, variant in ipairs(variants) do
      local rate, cpu = throughput(conc, math.max(20, N), variant[2])
      local key = v .. ":" .. conc
      rates[key] = rates[key] or {}
      cpus[key] = cpus[key] or {}
      table.insert(rates[key], rate)
      table.insert(cpus[key], cpu)
    end
  end
end
for v, variant in ipairs(variants) do
  print("")
  print("throughput through the library (print('hello'), default policy, network = \"" .. variant[1] .. "\")")
  print(string.format("%-16s %10s %14s %18s", "concurrency", "runs/s", "vs conc. 1", "controller CPU/run"))
  local one
  for _, conc in ipairs({ 1, 2, 8 }) do
    local rate, cpu = pct(rates[v .. ":" .. conc], 0.5), pct(cpus[v .. ":" .. conc], 0.5)
    one = one or rate
    print(string.format("%-16d %10.1f %13.2fx %15.2f ms", conc, rate, rate / one, cpu * 1000))
  end
end
collectgarbage("collect")
print(string.format("controller RSS after the benchmark: %d KB", rss_kb()))
os.remove(hello_file)
os.remove(heavy_file)
