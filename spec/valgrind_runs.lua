-- Driven under valgrind by spec/valgrind.sh: the host module through a few kinds of run.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = (os.getenv("CORRAL_CPATH") or "csrc/?.so") .. ";" .. package.cpath
local corral = require "corral"
local function check(cond, what) if not cond then io.stderr:write("failed: " .. what .. "\n") os.exit(1) end end
local r = corral.run_python("print('hi')")
check(r and r.stdout == "hi\n", "plain run")
r = corral.run_python("import time; time.sleep(5)", { timeout = 0.5 })
check(r and r.timed_out, "timeout")
r = corral.run_python("import sys\nfor i in range(200): sys.stdout.write('x' * 10000)", { max_output = 1000 })
check(r and r.truncated, "flood")
r = corral.run_python("import sys; print(len(sys.stdin.read()))", { stdin = string.rep("a", 100000) })
check(r and r.stdout == "100000\n", "stdin")
local res = corral.run_python("print(1)", { python = "/nonexistent" })
check(res == nil, "bad interpreter")
local results = corral.run_many({ "print(1)", "print(2)", "import time; time.sleep(3)" }, { concurrency = 3 })
check(#results == 3, "run_many")
collectgarbage()
