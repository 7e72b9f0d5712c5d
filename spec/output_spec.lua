-- A program's output: buffered as python3's own, and not lost when the run is ended. The
-- program runs through the prelude (lua/corral/prelude.lua), which must be invisible: what
-- python3 -I FILE shows, the run shows.
local corral = require "corral"
local policy = require "corral.policy"
local H = require "helper"

local function run(code, opts)
  local res, err, code_ = corral.run_python(code, opts)
  assert.is_truthy(res, tostring(err) .. " " .. tostring(code_))
  return res
end

-- the policies under test: the default (a PID namespace), warm (a zygote's fork), and the
-- default without a PID namespace (the supervisor is a subreaper)
local function policies()
  return {
    { "default", "default" },
    { "warm", "warm" },
    { "no-pidns", policy.load("default"):extend { pid_namespace = false, separation = "auto" } },
  }
end

-- python3 itself on the same file, the code's path replaced by FILE in what it printed
local function bare(code)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(code)
  f:close()
  local p = io.popen("cd / && /usr/bin/python3 -I " .. path .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("a")
  p:close()
  os.remove(path)
  return (out:gsub(path:gsub("%p", "%%%0"), "FILE"))
end

local function same_as_bare(code, r)
  local path = r.stdout:match("^path=([^\n]+)\n") or r.stderr:match('File "([^"]+)"')
  assert.is_truthy(path, r.stdout .. r.stderr)
  local rc = r.returncode
  if rc < 0 then rc = 128 - rc end
  local out = (r.stdout .. r.stderr .. "rc=" .. rc .. "\n"):gsub(path:gsub("%p", "%%%0"), "FILE")
  assert.are.equal(bare(code), out)
end

describe("output", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  -- the warm interpreter a case started is let go of first: its socket is not a leak
  after_each(function() assert(corral.close()) H.assert_clean(snap) end)

  for _, p in ipairs(policies()) do
    local name, pol = p[1], p[2]

    it("written before a timeout is not lost (" .. name .. ")", function()
      local r = run("print('before the loop')\nwhile True:\n    pass\n", { policy = pol, timeout = 1 })
      assert.are.equal("timeout", r.reason)
      assert.are.equal("before the loop\n", r.stdout)
    end)

    it("written before the CPU limit is not lost (" .. name .. ")", function()
      local r = run("print('before the loop')\nwhile True:\n    pass\n",
        { policy = pol, cpu_seconds = 1, timeout = 20 })
      assert.are.equal("cpu", r.reason)
      assert.are.equal(-24, r.returncode)
      assert.are.equal("before the loop\n", r.stdout)
    end)

    it("a print-heavy program gets all of its lines (" .. name .. ")", function()
      local r = run("for i in range(100000):\n    print(i)\n", { policy = pol, max_output = 1000000 })
      assert.are.equal("exit", r.reason)
      assert.is_false(r.truncated)
      local n, last = 0, nil
      for line in r.stdout:gmatch("[^\n]+") do n, last = n + 1, line end
      assert.are.equal(100000, n)
      assert.are.equal("99999", last)
    end)

    it("shows what python3 -I FILE shows (" .. name .. ")", function()
      local cases = {
        -- what a script sees of itself
        "import sys\nprint('path=' + __file__)\nprint(sorted(globals()), __name__, __doc__)\n"
          .. "print(sys.argv == [__file__], sys.orig_argv[1:] == ['-I', __file__])\n"
          .. "print(type(__loader__).__name__, __spec__, __package__, __cached__)\n"
          .. "print(sys.modules['__main__'] is sys.modules[__name__], type(sys.stdout.buffer).__name__)\n"
          .. "print(sys.stdout.line_buffering, sys.stderr.line_buffering)\n",
        -- an uncaught exception, a chained one, and the exit code
        "print('path=' + __file__)\ndef f():\n    try:\n        1/0\n    except Exception as e:\n"
          .. "        raise ValueError('x') from e\nf()\n",
        -- a syntax error: no traceback header
        "print('path=' + __file__)\nx = (\n",
        -- sys.exit with a message, and exit handlers that print
        "import atexit, sys\nprint('path=' + __file__)\natexit.register(print, 'at exit', file=sys.stderr)\n"
          .. "sys.exit('bye')\n",
        -- an uncaught KeyboardInterrupt ends by SIGINT, after the exit handlers
        "import atexit, sys\nprint('path=' + __file__)\natexit.register(print, 'at exit', file=sys.stderr)\n"
          .. "raise KeyboardInterrupt\n",
        -- a class defined in __main__ pickles
        "import pickle\nprint('path=' + __file__)\nclass A:\n    pass\n"
          .. "print(type(pickle.loads(pickle.dumps(A()))).__name__)\n",
        -- a sys.excepthook that fails, one that is missing, sys.last_value for the exit handlers
        "import sys\nprint('path=' + __file__)\ndef hook(t, v, tb):\n    raise ValueError('hook')\n"
          .. "sys.excepthook = hook\n1/0\n",
        "import sys\nprint('path=' + __file__)\ndel sys.excepthook\n{}['key']\n",
        "import atexit, sys\nprint('path=' + __file__)\n"
          .. "atexit.register(lambda: print('last', repr(sys.last_value), file=sys.stderr))\n"
          .. "raise OSError(5, 'io')\n",
        -- output left in a stdout the program replaced, or deleted
        "import sys\nprint('path=' + __file__)\nprint('result 42')\nsys.stdout = sys.stderr\n",
        "import sys\nprint('path=' + __file__)\nprint('result 43')\ndel sys.stdout\n",
      }
      for _, code in ipairs(cases) do
        same_as_bare(code, run(code, { policy = pol }))
      end
    end)
  end

  -- the prelude's frames are above a cold program's module level; a warm program has none
  it("a warm program has no frame above its module's, as under python3 -I FILE", function()
    local code = "import sys, traceback, warnings\nprint('path=' + __file__)\n"
      .. "print(sys._getframe().f_back)\ntraceback.print_stack(file=sys.stdout)\n"
      .. "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
      .. "    warnings.warn('w', stacklevel=2)\nprint(w[0].filename, w[0].lineno)\n"
      .. "def f(n):\n    try:\n        return f(n + 1)\n    except RecursionError:\n        return n\n"
      .. "print(f(0))\n"
    same_as_bare(code, run(code, { policy = "warm" }))
  end)

  -- three children print, tell the parent over a pipe, and sleep; the parent then sleeps, or exits
  local function forked(after)
    return "import os, time\nr, w = os.pipe()\nfor i in range(3):\n    if os.fork() == 0:\n"
      .. "        print('child', i)\n        os.write(w, b'x')\n        time.sleep(60)\n"
      .. "        os._exit(0)\nn = 0\nwhile n < 3:\n    n += len(os.read(r, 3))\n"
      .. "print('parent')\n" .. after
  end
  local function lines_of(s)
    local t = {}
    for line in s:gmatch("[^\n]+") do t[#t + 1] = line end
    table.sort(t)
    return t
  end

  it("a stopped run's forked processes flush their output too", function()
    for _, name in ipairs({ "default", "warm" }) do
      local r = run(forked("time.sleep(60)\n"), { policy = name, timeout = 2 })
      assert.are.equal("timeout", r.reason, name)
      assert.are.same({ "child 0", "child 1", "child 2", "parent" }, lines_of(r.stdout), name)
    end
  end)

  it("processes left when the program exits flush their output before they are killed", function()
    for _, name in ipairs({ "default", "warm" }) do
      local r = run(forked(""), { policy = name, timeout = 10 })
      assert.are.equal("exit", r.reason, name)
      assert.are.same({ "child 0", "child 1", "child 2", "parent" }, lines_of(r.stdout), name)
    end
  end)

  it("a stop waits for a slow flush up to half the policy's grace", function()
    -- a handler that takes 0.2 s, as the prelude's can under gVisor: the wait ends when the
    -- program is gone, within --flush-ms (half of grace: 1 s here), not at a fixed 50 ms
    local code = [[
import os, signal, sys, time
def slow(signum, frame):
    time.sleep(0.2)
    print("flushed late")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(63, slow)
print("before", flush=True)
while True:
    time.sleep(1)
]]
    for _, name in ipairs({ "default", "warm" }) do
      local pol = policy.load(name):extend { name = name .. "-slow-flush", grace = 2 }
      local r = run(code, { policy = pol, timeout = 1 })
      assert.are.equal("timeout", r.reason, name)
      assert.are.equal("before\nflushed late\n", r.stdout, name)
      assert.are.same({ -9, 9 }, { r.returncode, r.signal }, name)
    end
  end)

  it("a stopped program without the prelude's handler is reported killed, not flushed", function()
    for _, p in ipairs(policies()) do
      local r = run("import os\nos.execv('/bin/sleep', ['sleep', '60'])\n", { policy = p[2], timeout = 1 })
      assert.are.equal("timeout", r.reason, p[1])
      assert.are.same({ -9, 9 }, { r.returncode, r.signal }, p[1])
    end
  end)

  it("with -u in python_args, runs the file itself, unbuffered", function()
    local pol = policy.load("default"):extend { python_args = { "-I", "-u" } }
    local r = run("import sys\nprint(type(sys.stdout.buffer).__name__, sys.orig_argv[1:3])\n",
      { policy = pol })
    assert.are.equal("FileIO ['-I', '-u']\n", r.stdout)
  end)
end)
