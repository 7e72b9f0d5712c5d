-- eval_in_sandbox: seed 003's semantics under the bwrap policy.
local corral = require "corral"
local H = require "helper"

local function raises(kind, fn)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected a SandboxError")
  assert.is_true(corral.is_sandbox_error(e), tostring(e))
  assert.are.equal(kind, e.kind, tostring(e))
  return e
end

describe("eval_in_sandbox", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("gives seed 003's self-test outputs", function()
    local code = [[
print('Hello World from stdout!')

import os
import json
print("My UID is", os.getuid())
print("My GID is", os.getgid())
print("My PID is", os.getpid())
print("My CWD is", os.getcwd())
print("My environment is", json.dumps(dict(**os.environ), indent=4))

try:
    with open("./foo.txt", "w") as f:
        f.write("EVIL\n")
except BaseException as e:
    print(f"Writing to a file failed with: {e}")

try:
    os.unlink("code.py")
except BaseException as e:
    print(f"Deleting a file failed with: {e}")


import sys
sys.stderr.write('Hello World from stderr!')

sys.exit(42)
]]
    local r = corral.eval_in_sandbox(code)
    assert.are.equal(42, r.returncode)
    assert.is_false(r.ok)
    assert.are.equal("Hello World from stderr!", r.stderr)
    -- seed 003's own output on this machine, but for the ids (which are the caller's there) and
    -- the pid (the launcher's PID namespace is the run's: bwrap's monitor and the relay come first)
    local expected = {
      "Hello World from stdout!", "My UID is %d+", "My GID is %d+", "My PID is %d+", "My CWD is /home",
      "My environment is {", '    "PWD": "/home",', '    "LC_CTYPE": "C%.UTF%-8"', "}",
      "Writing to a file failed with: %[Errno 30%] Read%-only file system: '%./foo%.txt'",
      "Deleting a file failed with: %[Errno 30%] Read%-only file system: 'code%.py'",
    }
    local lines = {}
    for l in r.stdout:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(#expected, #lines, r.stdout)
    for i, pat in ipairs(expected) do
      assert.is_truthy(lines[i]:match("^" .. pat .. "$"), "line " .. i .. ": " .. lines[i])
    end
  end)

  it("strips the output", function()
    local r = corral.eval_in_sandbox("print('  padded  \\n\\n')")
    assert.are.equal("padded", r.stdout)
    assert.are.equal(0, r.returncode)
    assert.is_true(r.ok)
  end)

  it("raises a timeout SandboxError", function()
    raises("timeout", function() corral.eval_in_sandbox("import time; time.sleep(30)", { timeout_max_time_sec = 1 }) end)
  end)

  it("raises an output SandboxError past io_max_kb", function()
    raises("output", function() corral.eval_in_sandbox("print('x' * 5000)", { io_max_kb = 4 }) end)
  end)

  it("raises an encoding SandboxError on output that is not UTF-8", function()
    raises("encoding", function() corral.eval_in_sandbox("import sys; sys.stdout.buffer.write(b'\\xff')") end)
  end)

  it("applies the CPU limit", function()
    local r = corral.eval_in_sandbox("while True: pass", { cpu_max_time_sec = 1, timeout_max_time_sec = 5 })
    assert.are_not.equal(0, r.returncode)
  end)

  it("applies the memory limit", function()
    local r = corral.eval_in_sandbox("x = bytearray(300 * 1024 * 1024)", { mem_max_mb = 100 })
    assert.are_not.equal(0, r.returncode)
    assert.is_truthy(r.stderr:find("MemoryError", 1, true), r.stderr)
  end)

  it("has no network inside", function()
    local r = corral.eval_in_sandbox("import socket; print(socket.if_nameindex())")
    assert.are.equal("[(1, 'lo')]", r.stdout)
  end)

  it("raises an unavailable SandboxError when bubblewrap is missing", function()
    local pol = corral.load_policy("bwrap"):extend { bwrap_path = "/nonexistent" }
    raises("unavailable", function() corral.eval_in_sandbox("print(1)", { policy = pol }) end)
  end)
end)
