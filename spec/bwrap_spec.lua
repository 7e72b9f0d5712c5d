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

-- bwrap with a PID namespace of its own, as where a container masks /proc (policies/bwrap.lua,
-- proc_masked): its pid 1 stands between the relay and bwrap. Forced here, whatever this host's
-- /proc is like.
local B = corral.load_policy("bwrap")
local own_pidns = B:extend { name = "bwrap-own-pidns" }
function own_pidns:prepare(opts, h)
  local o, err, code = B.prepare(self, opts, h)
  if o and not o.bwrap_refused then o.bwrap_pidns = true end
  return o, err, code
end
local variants = { { "bwrap", "bwrap" }, { "bwrap in its own PID namespace", own_pidns } }

-- what the program does to write a wait status of its own on any fd it has, or can take from a
-- process of its PID namespace (pidfd_getfd), before it exits 139
local FORGE = [[
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fake = struct.pack("i", 11)
fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
print("open", fds)
for pid in (1, 2, 3):
    pidfd = libc.syscall(434, pid, 0)
    for n in range(3, 64):
        if pidfd >= 0:
            got = libc.syscall(438, pidfd, n, 0)
            if got >= 0:
                fds.append(got)
for fd in fds:
    try:
        os.write(fd, fake)
    except OSError:
        pass
sys.stdout.flush()
os._exit(139)
]]

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
    { "a SIGKILL it sends itself", "import os; os.kill(os.getpid(), 9)", {} },
    { "a SIGKILL to its own process group", "import os; os.kill(0, 9)", {} },
    { "an exit 139", "import sys; sys.exit(139)", {} },
    { "an exit 137", "import sys; sys.exit(137)", {} },
    { "a CPU loop past cpu_seconds", "while True: pass", { cpu_seconds = 1, timeout = 10 } },
  }
  for _, case in ipairs(endings) do
    it("reports " .. case[1] .. " as default does", function()
      local d = run("default", case[2], case[3])
      for _, v in ipairs(variants) do
        local b = run(v[2], case[2], case[3])
        for _, k in ipairs({ "returncode", "reason", "signal", "ok", "timed_out" }) do
          assert.are.equal(d[k], b[k], k .. ": default " .. tostring(d[k]) .. ", " .. v[1] .. " " .. tostring(b[k]))
        end
      end
    end)
  end

  it("reports a SIGSEGV in bwrap's own PID namespace as returncode -11, an exit 139 as 139", function()
    local r = run(own_pidns, "import ctypes; ctypes.string_at(0)")
    local limits = table.concat(r.limits, " ")
    -- really bwrap, with its own PID namespace
    assert.is_truthy(limits:find("read-only-root", 1, true), limits)
    assert.is_truthy(limits:find("pid-namespace", 1, true), limits)
    assert.are.equal(-11, r.returncode, r.stderr)
    assert.are.equal("signal", r.reason)
    assert.are.equal(11, r.signal)
    r = run(own_pidns, "import sys; sys.exit(139)")
    assert.are.equal(139, r.returncode)
    assert.are.equal("exit", r.reason)
  end)

  for _, v in ipairs(variants) do
    it("gives the interpreter no fd to forge a death by signal with (" .. v[1] .. ")", function()
      local r = run(v[2], FORGE)
      assert.are.equal("open []\n", r.stdout, r.stderr)
      assert.are.equal(139, r.returncode, r.stderr)
      assert.are.equal("exit", r.reason)
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
