-- Embedding corral in a Lua program: grade several model-written answers at once.
--   lua5.4 examples/embed.lua        (from any directory, after `make` in the source tree)
-- The modules are found in the source tree this script lies in; an installed corral (make
-- install, luarocks) is on Lua's own path and needs none of this.
local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = root .. "/csrc/?.so;" .. package.cpath
local corral = require "corral"

local answers = {
  { name = "correct",   code = "def f(n): return n * (n + 1) // 2\nprint(f(100))" },
  { name = "slow",      code = "def f(n):\n    while True: pass\nprint(f(100))" },
  { name = "greedy",    code = "x = [b'x' * 10**6 for _ in range(2000)]\nprint(5050)" },
  { name = "chatty",    code = "for i in range(10**6): print('thinking', i)\nprint(5050)" },
  { name = "escapee",   code = "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(999)\nprint(5050)" },
}

local jobs = {}
for i, a in ipairs(answers) do
  jobs[i] = { code = a.code, timeout = 3, cpu_seconds = 1, memory_mb = 256, max_output = 2000 }
end

local results = corral.run_many(jobs, { concurrency = 4 })
for i, r in ipairs(results) do
  if r.error then
    print(string.format("%-8s sandbox failed: %s", answers[i].name, r.error.message))
  else
    local passed = r.ok and r.stdout:match("5050%s*$") ~= nil
    print(string.format("%-8s %-6s reason=%-9s rc=%-4s cpu=%.2fs rss=%dkB%s", answers[i].name,
      passed and "PASS" or "FAIL", r.reason, tostring(r.returncode),
      r.usage.cpu_user_s + r.usage.cpu_sys_s, r.usage.max_rss_kb, r.truncated and " (output truncated)" or ""))
  end
end
