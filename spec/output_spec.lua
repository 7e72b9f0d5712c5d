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
    { "no-pidns", policy.load("default"):extend { pid_namespace = false } },
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
  after_each(function() H.assert_clean(snap) end)

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
      }
      for _, code in ipairs(cases) do
        same_as_bare(code, run(code, { policy = pol }))
      end
    end)
  end

  it("a stopped run's forked processes flush their output too", function()
    local code = "import os, time\nif os.fork() == 0:\n    print('child')\nelse:\n    print('parent')\n"
      .. "time.sleep(60)\n"
    for _, name in ipairs({ "default", "warm" }) do
      local r = run(code, { policy = name, timeout = 1 })
      assert.are.equal("timeout", r.reason)
      local lines = {}
      for line in r.stdout:gmatch("[^\n]+") do lines[#lines + 1] = line end
      table.sort(lines)
      assert.are.same({ "child", "parent" }, lines, name)
    end
  end)

  it("with -u in python_args, runs the file itself, unbuffered", function()
    local pol = policy.load("default"):extend { python_args = { "-I", "-u" } }
    local r = run("import sys\nprint(type(sys.stdout.buffer).__name__, sys.orig_argv[1:3])\n",
      { policy = pol })
    assert.are.equal("FileIO ['-I', '-u']\n", r.stdout)
  end)
end)
