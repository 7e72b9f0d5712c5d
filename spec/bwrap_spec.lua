-- The bwrap policy runs what the default policy runs, and reports it the same way.
local corral = require "corral"
local H = require "helper"

local function run(policy, code, opts)
  opts = opts or {}
  opts.policy = policy
  local r, err = corral.run_python(code, opts)
  assert.is_table(r, tostring(err))
  return r
end

describe("the bwrap policy", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("imports numpy, whose BLAS is a symlink through /etc/alternatives", function()
    local r = run("bwrap", "import numpy; print(int(numpy.ones(3).dot(numpy.ones(3))))")
    assert.are.equal("3\n", r.stdout, r.stderr)
    assert.are.equal(0, r.returncode)
  end)

  -- table-driven: how the program ended, as default reports it
  local endings = {
    { "a SIGSEGV it sends itself", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", {} },
    { "os.abort()", "import os; os.abort()", {} },
    { "an exit 139", "import sys; sys.exit(139)", {} },
    { "an exit 137", "import sys; sys.exit(137)", {} },
    { "a CPU loop past cpu_seconds", "while True: pass", { cpu_seconds = 1, timeout = 10 } },
  }
  for _, case in ipairs(endings) do
    it("reports " .. case[1] .. " as default does", function()
      local d = run("default", case[2], case[3])
      local b = run("bwrap", case[2], case[3])
      for _, k in ipairs({ "returncode", "reason", "signal", "ok", "timed_out" }) do
        assert.are.equal(d[k], b[k], k .. ": default " .. tostring(d[k]) .. ", bwrap " .. tostring(b[k]))
      end
    end)
  end

  it("gives the program a read-only /dev with the usual devices and a small /dev/shm", function()
    local r = run("bwrap", [[
import os
open("/dev/null", "w").write("x")
assert open("/dev/zero", "rb").read(4) == b"\0" * 4
assert len(open("/dev/urandom", "rb").read(8)) == 8
assert len(open("/dev/random", "rb").read(8)) == 8
for p in ("/dev/x", "/dev/shm/../y"):
    try:
        open(p, "w")
        print("wrote", p)
    except OSError as e:
        assert e.errno == 30, e
open("/dev/shm/sem", "w").write("ok")
import multiprocessing
multiprocessing.Lock()
st = os.statvfs("/dev/shm")
print(st.f_blocks * st.f_frsize // 1048576)
]])
    assert.are.equal(0, r.returncode, r.stderr)
    assert.are.equal("16\n", r.stdout)
  end)
end)
