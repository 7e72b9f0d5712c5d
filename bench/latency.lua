-- Per-run latency of corral against bare `python3 -I -c`, measured in the same run, interleaved
-- so that machine noise hits both alike. Prints medians, p90 and the ratio.
--   lua5.4 bench/latency.lua [N]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local core = require "corral.core"
local corral = require "corral"

local N = tonumber(arg[1]) or 50
local python = "/usr/bin/python3"
local code = "print('hello')"
local tmp = os.tmpname()
local f = assert(io.open(tmp, "w")) f:write(code) f:close()

local cases = {
  { "bare python3 -I -c", function() os.execute(python .. " -I -c \"" .. code .. "\" >/dev/null") end },
  { "corral run --json (CLI)", function() os.execute("lua5.4 bin/corral run --json " .. tmp .. " >/dev/null") end },
  { "corral.run_python (library)", function() assert(corral.run_python(code).ok) end },
}

local times = {}
for i = 1, #cases do times[i] = {} end
for _ = 1, 3 do for _, c in ipairs(cases) do c[2]() end end -- warm-up
for _ = 1, N do
  for i, c in ipairs(cases) do
    local t0 = core.hrtime()
    c[2]()
    times[i][#times[i] + 1] = core.hrtime() - t0
  end
end
os.remove(tmp)

local function pct(t, p)
  table.sort(t)
  return t[math.max(1, math.ceil(#t * p))]
end
local base = pct(times[1], 0.5)
print(string.format("%-30s %10s %10s %8s", "case (N=" .. N .. ")", "median ms", "p90 ms", "ratio"))
for i, c in ipairs(cases) do
  local m = pct(times[i], 0.5)
  print(string.format("%-30s %10.2f %10.2f %7.2fx", c[1], m * 1000, pct(times[i], 0.9) * 1000, m / base))
end
