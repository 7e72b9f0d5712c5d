-- corral-zygote against bare Python (make bench-zygote): the wall time of a warm run, from `run`
-- sent to `exit` received by spec/zygote_driver.py, with the default policy's whole plan
-- (namespaces, mounts, Landlock, seccomp, budgets; a run uid as root), next to `python3 -I -c`
-- spawned by the same driver. The cases are interleaved, N rounds after a warm-up, so that the
-- machine's noise hits them alike. corral-launch on a cold run's plan is measured after (through
-- the host module).
--   lua5.4 bench/zygote.lua [N]
package.path = "lua/?.lua;lua/?/init.lua;spec/?.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local core = require "corral.core"
local Z = require "zygote_support"

local N = tonumber(arg[1]) or 200
local HELLO = "print('hello')"
local MODULES = "json, decimal, fractions, statistics, datetime, collections, re, email, csv"
local HEAVY = "import " .. MODULES .. "\nprint('ok')"
-- an object whose finalization runs code: the run ends with Py_FinalizeEx()
local FINALIZE = "class A:\n    def __del__(self):\n        pass\na = A()\nprint('hello')"
local PRELOAD = MODULES:gsub(" ", "")

local function pct(t, p)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  return s[math.max(1, math.ceil(#s * p))]
end

-- warm runs' plans and zygotes, as the warm policy makes them (the file run itself, the flush
-- handlers in the zygote); corral-launch runs a cold run's plan (through the prelude)
local hello, heavy, finalize = Z.plan(HELLO, nil, true), Z.plan(HEAVY, nil, true), Z.plan(FINALIZE, nil, true)
local cold = Z.plan(HELLO)
local zargs, plain_args = {}, {}
for i, a in ipairs(Z.zygote_args) do zargs[i], plain_args[i] = a, a end
zargs[#zargs + 1] = "--flush-handlers"
plain_args[#plain_args + 1] = "--flush-handlers"
zargs[#zargs + 1] = "--preload"
zargs[#zargs + 1] = PRELOAD

local cases = {
  { name = "bare", argv = { Z.python, "-I", "-c", HELLO } },
  { name = "hello", args = hello.args },
  { name = "finalize", args = finalize.args },
  { name = "new-filter", args = hello.args, new_filter = true },
  { name = "bare-heavy", argv = { Z.python, "-I", "-c", HEAVY } },
  { name = "heavy", args = heavy.args },
}
local out = Z.drive({
  { op = "ready" },
  { op = "bench", n = 10, cases = cases },
  { op = "bench", n = N, cases = cases },
  { op = "close" },
}, zargs)
for _, m in ipairs(out.messages) do io.stderr:write("driver: ", m, "\n") end
-- a zygote without preloaded modules (a smaller process to fork)
local plain_cases = { { name = "bare", argv = cases[1].argv }, { name = "plain", args = hello.args } }
local plain = Z.drive({
  { op = "ready" },
  { op = "bench", n = 10, cases = plain_cases },
  { op = "bench", n = N, cases = plain_cases },
  { op = "close" },
}, plain_args)
for _, m in ipairs(plain.messages) do io.stderr:write("driver: ", m, "\n") end

-- corral-launch on the same plan, through the host module
local launch = {}
for i = 1, N do
  local t0 = core.hrtime()
  local r = Z.launch(cold.args)
  launch[i] = core.hrtime() - t0
  assert(r.status == 0, r.stderr)
end
hello.close()
cold.close()
heavy.close()
finalize.close()

local t = out.times
local base = pct(t.bare, 0.5)
print(string.format("N=%d rounds, default policy plan (%s), zygote preloads %s",
  N, core.geteuid() == 0 and "root: run uid" or "unprivileged: user namespace", PRELOAD))
print(string.format("%-52s %10s %10s %8s", "case", "median ms", "p99 ms", "ratio"))
local function row(name, times, ref)
  print(string.format("%-52s %10.3f %10.3f %8.3f", name, pct(times, 0.5) * 1000,
    pct(times, 0.99) * 1000, pct(times, 0.5) / ref))
end
row("bare python3 -I -c print('hello')", t.bare, base)
row("zygote: print('hello')", t.hello, base)
row("zygote without preloads: print('hello')", plain.times.plain, pct(plain.times.bare, 0.5))
row("zygote: print('hello'), ends by Py_FinalizeEx()", t.finalize, base)
row("zygote: print('hello'), a new seccomp filter", t["new-filter"], base)
row("corral-launch: print('hello') (host module)", launch, base)
row("bare python3 -I -c 'import " .. MODULES:sub(1, 12) .. "...'", t["bare-heavy"], base)
row("zygote, preloaded: import ...   (ratio to bare import)", t.heavy, pct(t["bare-heavy"], 0.5))
