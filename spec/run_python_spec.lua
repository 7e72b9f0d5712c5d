-- Every protection of run_python, attacked by a real program.
local corral = require "corral"
local core = require "corral.core"
local H = require "helper"

local function run(code, opts)
  local t0 = core.hrtime()
  local res, err, code_ = corral.run_python(code, opts)
  assert.is_truthy(res, tostring(err) .. " " .. tostring(code_))
  res.elapsed = core.hrtime() - t0
  return res
end

describe("run_python", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("runs a program and reports seed 000's fields and more", function()
    local r = run("print('hello')")
    assert.is_true(r.ok)
    assert.are.equal("hello\n", r.stdout)
    assert.are.equal("", r.stderr)
    assert.are.equal(0, r.returncode)
    assert.is_false(r.timed_out)
    assert.is_false(r.truncated)
    assert.are.equal("exit", r.reason)
    assert.is_nil(r.signal)
    for _, name in ipairs({ "cpu", "memory", "file-size", "no-core", "open-files", "timeout", "empty-env", "temp-dir" }) do
      assert.is_true(H.has(r.limits, name), "limits lacks " .. name)
    end
    assert.is_number(r.usage.wall_s)
    assert.is_true(r.usage.cpu_user_s + r.usage.cpu_sys_s > 0)
    assert.is_true(r.usage.max_rss_kb > 1000)
  end)

  it("reports sys.exit(42) as returncode 42", function()
    local r = run("import sys; sys.exit(42)")
    assert.are.equal(42, r.returncode)
    assert.is_false(r.ok)
    assert.are.equal("exit", r.reason)
  end)

  it("reports SIGSEGV as returncode -11", function()
    local r = run("import ctypes; ctypes.string_at(0)")
    assert.are.equal(-11, r.returncode)
    assert.are.equal(11, r.signal)
    assert.are.equal("signal", r.reason)
  end)

  it("ends a CPU loop with reason cpu", function()
    local r = run("while True: pass", { cpu_seconds = 1, timeout = 5 })
    assert.are.equal("cpu", r.reason)
    assert.is_false(r.timed_out)
    assert.is_true(r.returncode < 0)
    assert.is_true(r.usage.cpu_user_s + r.usage.cpu_sys_s >= 0.9)
  end)

  -- the refused request leaves no trace the sandbox can see: it reads as the program's own exit
  -- (see "reason, from what the sandbox saw")
  it("refuses one allocation past memory_mb with MemoryError, reason exit", function()
    local r = run("x = bytearray(512 * 1024 * 1024)\nprint('allocated')", { memory_mb = 128 })
    assert.are.equal("exit", r.reason)
    assert.is_false(r.ok)
    assert.are.equal("", r.stdout)
    assert.is_truthy(r.stderr:find("MemoryError", 1, true))
  end)

  it("ends a growing memory bomb with reason memory", function()
    local r = run("a = []\nwhile True: a.append(' ' * 10**6)", { memory_mb = 128, timeout = 10 })
    assert.are.equal("memory", r.reason)
  end)

  it("times out a sleep within timeout + 0.5 s", function()
    local r = run("import time; time.sleep(100)", { timeout = 1 })
    assert.is_true(r.timed_out)
    assert.are.equal("timeout", r.reason)
    assert.is_false(r.ok)
    assert.is_true(r.elapsed < 1.5, "took " .. r.elapsed)
  end)

  it("returns on time and leaves nothing when a grandchild calls setsid and holds the pipe", function()
    local code = [[
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("escapee alive", flush=True)
        time.sleep(1000)
    os._exit(0)
time.sleep(0.2)
print("parent done", flush=True)
]]
    local r = run(code, { timeout = 3 })
    assert.is_false(r.timed_out)
    assert.is_true(r.elapsed < 3.5, "took " .. r.elapsed)
    assert.is_truthy(r.stdout:find("parent done", 1, true))
    assert.is_truthy(r.stdout:find("escapee alive", 1, true))
    assert.are.same({}, H.stray_processes())
  end)

  it("kills a setsid escapee that outlives a timeout", function()
    local code = [[
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(1000)
time.sleep(1000)
]]
    local r = run(code, { timeout = 1 })
    assert.is_true(r.timed_out)
    assert.is_true(r.elapsed < 1.5, "took " .. r.elapsed)
  end)

  it("contains a fork bomb", function()
    local code = [[
import os, time
n = 0
for i in range(10000):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    except OSError:
        break
print("forked", n)
]]
    local r = run(code, { processes = 16, timeout = 5 })
    local n = tonumber(r.stdout:match("forked (%d+)"))
    assert.is_truthy(n, r.stdout .. r.stderr)
    assert.is_true(n < 16, "forked " .. tostring(n))
    assert.is_true(H.has(r.limits, "processes"))
  end)

  it("keeps host memory bounded under 100 MB of output and truncates", function()
    local before = core.rusage().maxrss_kb
    local r = run("import sys\nb = b'x' * 1000000\nfor i in range(100): sys.stdout.buffer.write(b)", { timeout = 20 })
    assert.is_true(r.truncated)
    assert.are.equal(20000, #r.stdout)
    assert.are.equal(100000000, r.stdout_bytes)
    assert.is_true(core.rusage().maxrss_kb - before < 20000, "host RSS grew by " .. (core.rusage().maxrss_kb - before) .. " kB")
  end)

  it("does not truncate exactly max_output bytes, and truncates one more", function()
    local exact = run("import sys; sys.stdout.write('a' * 1000)", { max_output = 1000 })
    assert.is_false(exact.truncated)
    assert.are.equal(1000, #exact.stdout)
    local over = run("import sys; sys.stdout.write('a' * 1001)", { max_output = 1000 })
    assert.is_true(over.truncated)
    assert.are.equal(1000, #over.stdout)
    local err = run("import sys; sys.stderr.write('e' * 1001)", { max_output = 1000 })
    assert.is_true(err.truncated)
    assert.are.equal(1000, #err.stderr)
  end)

  it("replaces invalid UTF-8 with U+FFFD", function()
    local r = run("import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end \\xe2\\x82')")
    assert.are.equal("ok \xEF\xBF\xBD\xEF\xBF\xBD end \xEF\xBF\xBD", r.stdout)
  end)

  it("refuses a write past file_mb", function()
    local r = run("open('big', 'wb').write(b'x' * (3 * 1024 * 1024))", { file_mb = 1 })
    assert.are.equal("file-size", r.reason)
    assert.is_truthy(r.stderr:find("File too large", 1, true))
  end)

  it("refuses to open more files than open_files", function()
    local code = [[
fs = []
try:
    for i in range(1000):
        fs.append(open('/dev/null'))
except OSError as e:
    print("stopped at", len(fs), e.errno)
]]
    local r = run(code, { open_files = 32 })
    local n = tonumber(r.stdout:match("stopped at (%d+) 24"))
    assert.is_truthy(n, r.stdout .. r.stderr)
    assert.is_true(n < 32)
  end)

  it("gives an empty environment with only PATH, LANG, HOME and TMPDIR", function()
    local r = run("import os, json; print(json.dumps(sorted(os.environ)))")
    assert.are.equal('["HOME", "LANG", "PATH", "TMPDIR"]\n', r.stdout)
  end)

  it("does not let the program read the controller's environment", function()
    local code = string.format([[
try:
    data = open('/proc/%d/environ', 'rb').read()
    print("read", len(data))
except OSError as e:
    print("denied", type(e).__name__)
]], core.getpid())
    local r = run(code)
    assert.is_truthy(r.stdout:find("^denied"), r.stdout .. r.stderr)
  end)

  it("does not pass on an fd the controller has open", function()
    local f = assert(io.open("/etc/hostname", "r"))
    local r = run("import os; print(sorted(int(x) for x in os.listdir('/proc/self/fd')))")
    f:close()
    assert.are.equal("[0, 1, 2, 3]\n", r.stdout) -- 3 is listdir's own directory fd
  end)

  it("gives EOF at once on stdin", function()
    local r = run("import sys; print(repr(sys.stdin.read()))", { timeout = 2 })
    assert.are.equal("''\n", r.stdout)
    assert.is_true(r.elapsed < 1.5)
  end)

  it("passes stdin bytes when asked", function()
    local r = run("import sys; print(len(sys.stdin.buffer.read()))", { stdin = string.rep("z", 300000) })
    assert.are.equal("300000\n", r.stdout)
  end)

  it("isolates the network: a TCP connect to a port this test listens on fails", function()
    local probe = corral.probe()
    if not probe.network_isolation then
      pending("no network isolation on this host")
      return
    end
    local server = io.popen("exec python3 -c \"import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\nprint(s.getsockname()[1],flush=True)\ntime.sleep(3)\"", "r")
    local port = tonumber(server:read("l"))
    local code = string.format([[
import socket
try:
    socket.create_connection(('127.0.0.1', %d), timeout=1)
    print("connected")
except OSError as e:
    print("failed", e.errno)
]], port)
    local r = run(code)
    assert.is_true(r.network_isolated)
    assert.is_true(H.has(r.limits, "no-network"))
    assert.is_truthy(r.stdout:find("^failed"), r.stdout .. r.stderr)
    -- the same program with the host network does connect: the test can fail
    local open = run(code, { policy = require("corral.policy").load("default"):extend { network = "host" } })
    assert.are.equal("connected\n", open.stdout)
    assert.is_false(open.network_isolated)
    server:close()
  end)

  it("cleans up without following a symlink planted to a directory outside", function()
    -- the default policy's work dir is a tmpfs that vanishes with the run; a policy without it
    -- leaves the planted links on the host for the clean-up to face
    local on_host = require("corral.policy").load("default"):extend { tmpfs = {}, work_mb = false }
    for _, pol in ipairs({ "default", on_host }) do
      local outside = core.mkdtemp("/tmp/outside-XXXXXX")
      assert(core.write_file(outside .. "/keep", "precious", 420))
      assert(core.chmod(outside, 511)) -- 0777 so any run uid can plant links to it
      local code = string.format([[
import os
os.symlink(%q, 'link')
os.makedirs('a/b/c')
os.symlink(%q, 'a/b/c/deeper')
os.symlink(%q, 'file-link')
os.chmod('a/b', 0)
print("planted")
]], outside, outside, outside .. "/keep")
      local r = run(code, { policy = pol })
      assert.are.equal("planted\n", r.stdout, r.stderr)
      assert.are.equal(pol == "default", H.has(r.limits, "work-tmpfs"))
      local f = assert(io.open(outside .. "/keep"))
      assert.are.equal("precious", f:read("a"))
      f:close()
      assert(core.rmtree(outside))
    end
  end)

  it("runs 10 MB of source and reports NUL bytes with Python's own error", function()
    local big = "s = '" .. string.rep("a", 10 * 1000 * 1000) .. "'\n" .. string.rep("x = len(s)\n", 10000) .. "print(x)\n"
    assert.is_true(#big > 10 * 1000 * 1000)
    local r = run(big, { timeout = 30, cpu_seconds = 20, memory_mb = 512 })
    assert.are.equal("10000000\n", r.stdout, r.stderr)
    local nul = run("print('a')\0print('b')")
    assert.is_false(nul.ok)
    assert.is_truthy(nul.stderr:find("null bytes", 1, true), nul.stderr)
  end)

  it("runs nothing when the launcher is refused the network namespace that was required", function()
    if H.root then pending("root is never refused a network namespace") return end
    local marker = core.mkdtemp("/tmp/marker-XXXXXX")
    -- (no user namespace, so no PID namespace: a run without the wall, accepted)
    local pol = require("corral.policy").load("default"):extend { user_namespace = "never", separation = "auto" }
    local res, err, code = corral.run_python(string.format("open(%q + '/ran', 'w')", marker),
      { require_network_isolation = true, policy = pol })
    assert.is_nil(res)
    assert.are.equal("ENOTSUP", code)
    assert.is_truthy(err:find("nothing ran", 1, true), err)
    assert.is_false(core.exists(marker .. "/ran"))
    -- without the requirement the same policy runs, on the host network, and says so
    local r = run("print('ran')", { policy = pol })
    assert.are.equal("ran\n", r.stdout)
    assert.is_false(r.network_isolated)
    assert.is_false(H.has(r.limits, "no-network"))
    assert.is_truthy(r.refused and r.refused["no-network"])
    assert(core.rmtree(marker))
  end)

  it("runs the interpreter as a distinct uid when the controller is root", function()
    local r = run("import os; print(os.getuid(), os.getgid())")
    local uid = tonumber(r.stdout:match("^(%d+)"))
    if H.root then
      assert.is_true(uid >= 60000 and uid <= 60999, r.stdout)
      assert.is_true(H.has(r.limits, "run-uid"))
    else
      assert.are.equal(core.getuid(), uid)
    end
  end)

  it("fails with a clear error and runs nothing when required isolation is impossible", function()
    local marker = core.mkdtemp("/tmp/marker-XXXXXX")
    local pol = require("corral.policy").load("default"):extend { network = "host" }
    local res, err, code = corral.run_python(
      string.format("open(%q + '/ran', 'w')", marker), { require_network_isolation = true, policy = pol })
    assert.is_nil(res)
    assert.are.equal("ENOTSUP", code)
    assert.is_truthy(err:find("network isolation", 1, true))
    assert.is_false(core.exists(marker .. "/ran"))
    assert(core.rmtree(marker))
  end)
end)

-- A limit is the reason only when the sandbox saw it reached: what a program prints, or a signal
-- it sends itself, is a claim. Each case under the three process structures: the launcher's init
-- (default), corral-init forked from a zygote (warm), bubblewrap inside the launcher (bwrap).
local GROW = "a = []\nwhile True: a.append(b'x' * 10**6)"
local FORKS = [[
import os, sys, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except BlockingIOError as e:
    print("stopped", n, e.errno, flush=True)
time.sleep(HOLD)
sys.exit(1)
]]
local reason_cases = {
  { "a clean exit 0 after printing MemoryError is not memory", "exit",
    "import sys\nprint('Traceback (most recent call last):\\nMemoryError', file=sys.stderr)",
    { memory_mb = 128 } },
  { "exit 1 after printing MemoryError, holding little, is not memory", "exit",
    "import sys\nprint('Traceback (most recent call last):\\nMemoryError', file=sys.stderr)\nsys.exit(1)",
    { memory_mb = 128 } },
  { "a real allocation past memory_mb is memory", "memory", GROW, { memory_mb = 128, timeout = 10 },
    stderr = "MemoryError" },
  { "printing [Errno 27] File too large and exiting 1 is not file-size", "exit",
    "import sys\nprint(\"OSError: [Errno 27] File too large: 'big'\", file=sys.stderr)\nsys.exit(1)",
    { file_mb = 1 } },
  -- the code bound back into a scratch mount is not a file the run wrote, however big
  { "a code file over file_mb, then exit 1 after printing [Errno 27], is not file-size", "exit",
    "import sys\n#" .. string.rep("x", 1100000) .. "\n"
      .. "print(\"OSError: [Errno 27] File too large: 'big'\", file=sys.stderr)\nsys.exit(1)",
    { file_mb = 1 } },
  { "SIGXFSZ sent to itself is signal, not file-size", "signal",
    "import os, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_DFL)\nos.kill(os.getpid(), signal.SIGXFSZ)",
    { file_mb = 1 } },
  -- under bwrap the program has no writable directory
  { "a real write past file_mb is file-size", "file-size",
    "open('big', 'wb').write(b'x' * (3 * 1024 * 1024))", { file_mb = 1 }, stderr = "File too large",
    skip = { bwrap = true } },
  { "a real write past file_mb, SIGXFSZ at its default, is file-size", "file-size",
    "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_DFL)\nopen('big', 'wb').write(b'x' * (3 << 20))",
    { file_mb = 1 }, skip = { bwrap = true } },
  -- exit at once: the supervisor's walk at the program's exit sees its zombie and children.
  -- Under bwrap they die with bwrap's own PID namespace before that walk: only the budget's
  -- 10 ms ticks see them, so the program stays at the limit a while. Without a run uid (not
  -- root), bwrap's own user namespace changes what the kernel counts: not asserted there
  { "forks until EAGAIN at processes=8, then exit 1, is processes", "processes",
    function(pol) return (FORKS:gsub("HOLD", pol == "bwrap" and "2" or "0")) end,
    { processes = 8, timeout = 10 }, stdout = "stopped %d+ 11", needs = "processes" },
  { "printing BlockingIOError: [Errno 11] without forking is not processes", "exit",
    "import sys\nprint('BlockingIOError: [Errno 11] Resource temporarily unavailable', file=sys.stderr)\nsys.exit(1)",
    { processes = 8 } },
}

describe("the work dir", function()
  local policy = require "corral.policy"
  local PROG = [[
import os
print(os.getcwd() == os.environ["HOME"] == os.environ["TMPDIR"], os.getcwd())
print(os.listdir("/home"))
open("f", "w").write("x")
raise ValueError("where")
]]

  for _, name in ipairs({ "default", "warm" }) do
    it("is /home/sandbox, cwd, HOME and TMPDIR, under " .. name .. ", and no host path shows", function()
      local r = run(PROG, { policy = name })
      assert.are.equal("True /home/sandbox\n['sandbox']\n", r.stdout, r.stderr)
      assert.is_truthy(r.stderr:find("ValueError: where", 1, true), r.stderr)
      assert.is_nil(r.refused and r.refused["work-at"])
      assert.is_true(H.has(r.limits, "work-tmpfs"))
    end)
  end

  it("stays at the host path without a PID namespace, where --work-at is not asked for", function()
    local r = run(PROG, { policy = policy.load("default"):extend { pid_namespace = false, separation = "auto" } })
    local cwd = r.stdout:match("^True (%S+)\n")
    assert.is_truthy(cwd and cwd:match("/corral%-%w+/work$"), r.stdout .. r.stderr)
    assert.is_nil(r.refused and r.refused["work-at"])
  end)

  it("stays at the host path, and says why, where no scratch mount holds work_path", function()
    local r = run(PROG, { policy = policy.load("default"):extend { tmpfs = { ["/tmp"] = 16 } } })
    local cwd = r.stdout:match("^True (%S+)\n")
    assert.is_truthy(cwd and cwd:match("/corral%-%w+/work$"), r.stdout .. r.stderr)
    assert.is_truthy(r.refused and r.refused["work-at"], r.stdout)
    assert.is_true(H.has(r.limits, "work-tmpfs"))
  end)

  it("rejects a work_path that is not a clean absolute path, naming it", function()
    for _, w in ipairs({ "home/sandbox", "/home/../etc", "/home/sandbox/", "/home//x", 7 }) do
      local ok, err = pcall(policy.load, policy.load("default"):extend { work_path = w })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("work_path", 1, true), tostring(err))
    end
  end)
end)

describe("the code file", function()
  local policy = require "corral.policy"
  local PROG = [[
import os, sys
print(__file__ == sys.argv[0], __file__)
try:
    open(__file__, "a").write("x")
    print("written")
except OSError as e:
    print("not written")
print(os.listdir("/tmp") + os.listdir("/dev/shm"))
raise ValueError("where")
]]

  for _, name in ipairs({ "default", "warm" }) do
    it("is /run/code/main.py, read-only, under " .. name .. ", and no host path shows", function()
      local r = run(PROG, { policy = name })
      assert.are.equal("True /run/code/main.py\nnot written\n[]\n", r.stdout, r.stderr)
      assert.is_truthy(r.stderr:find('File "/run/code/main.py", line 9', 1, true), r.stderr)
      assert.is_truthy(r.stderr:find("ValueError: where", 1, true), r.stderr)
      local all = r.stdout .. r.stderr
      assert.is_nil(all:find("/dev/shm/", 1, true), all)
      assert.is_nil(all:find("corral-", 1, true), all)
      assert.is_nil(r.refused and r.refused["code-at"])
    end)
  end

  it("stays at the host path without a PID namespace, where --code-at is not asked for", function()
    local r = run(PROG, { policy = policy.load("default"):extend { pid_namespace = false, separation = "auto" } })
    local file = r.stdout:match("^True (%S+)\n")
    assert.is_truthy(file and file:match("/corral%-%w+/code/main%.py$"), r.stdout .. r.stderr)
    assert.is_truthy(r.stderr:find('File "' .. file .. '"', 1, true), r.stderr)
    assert.is_nil(r.refused and r.refused["code-at"])
  end)

  it("stays at the host path, and says why, where no scratch mount holds code_path", function()
    local r = run(PROG, { policy = policy.load("default"):extend { tmpfs = { ["/tmp"] = 16 } } })
    local file = r.stdout:match("^True (%S+)\n")
    assert.is_truthy(file and file:match("/corral%-%w+/code/main%.py$"), r.stdout .. r.stderr)
    assert.is_truthy(r.stdout:find("\nnot written\n", 1, true), r.stdout)
    assert.is_truthy(r.stderr:find('File "' .. file .. '"', 1, true), r.stderr)
    assert.is_truthy(r.refused and r.refused["code-at"], r.stdout)
  end)

  it("rejects a code_path that is not a clean absolute path or overlaps work_path, naming it", function()
    for _, w in ipairs({ "run/corral", "/run/../etc", "/run/code/", "/run//x", 7, "/home/sandbox/code", "/home" }) do
      local ok, err = pcall(policy.load, policy.load("default"):extend { code_path = w })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("code_path", 1, true), tostring(err))
    end
  end)
end)

describe("reason, from what the sandbox saw", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  -- the warm interpreter a case started is let go of first: its socket is not a leak
  after_each(function() assert(corral.close()) H.assert_clean(snap) end)

  for _, pol in ipairs({ "default", "warm", "bwrap" }) do
    for _, c in ipairs(reason_cases) do
      local name, want, code, opts = c[1], c[2], c[3], c[4]
      if type(want) == "table" then want = want[pol] end
      if not (c.skip and c.skip[pol]) then
        it(pol .. ": " .. name, function()
          local o = { policy = pol }
          for k, v in pairs(opts) do o[k] = v end
          local r = run(type(code) == "function" and code(pol) or code, o)
          if c.needs then assert.is_true(H.has(r.limits, c.needs), "limits lack " .. c.needs) end
          assert.are.equal(want, r.reason, r.stdout .. r.stderr)
          if c.stderr then assert.is_truthy(r.stderr:find(c.stderr, 1, true), r.stderr) end
          if c.stdout then assert.is_truthy(r.stdout:find(c.stdout), r.stdout) end
        end)
      end
    end
  end
end)

describe("a controller killed with SIGKILL", function()
  -- (this pass's: spec/run.sh runs another as nobody meanwhile, see spec/helper.lua)
  local UID = core.geteuid()
  local INTERPRETERS = "ps -e -o uid=,args= | awk '" .. (UID == 0 and "$1 != 65534" or ("$1 == " .. UID))
    .. " && $2 ~ /python3$/ && $0 ~ /main[.]py/ { n++ } END { print n + 0 }'"

  -- Start `lua` in a controller process of its own; return its pid once `n` sandboxed
  -- interpreters run.
  local function start_controller(lua, n)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write('package.path = "lua/?.lua;lua/?/init.lua;" .. package.path\n' ..
            'package.cpath = "csrc/?.so;" .. package.cpath\n' .. lua)
    f:close()
    local pid = tonumber((H.sh("lua5.4 " .. script .. " >/dev/null 2>&1 & echo $!")))
    -- killed whatever happens below: a failed wait must not leave it, and its runs, running
    finally(function() core.kill(pid, 9) end)
    assert.is_true(H.eventually(function() return H.sh(INTERPRETERS) == tostring(n) end, 5),
      "the sandboxed program did not start")
    os.remove(script)
    return pid
  end

  it("leaves no sandboxed process behind", function()
    local before = H.temp_dirs()
    local pid = start_controller([[require("corral").run_python(
  "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(100)", { timeout = 60 })]], 2)
    core.kill(pid, 9)
    assert.is_true(H.eventually(function()
      return H.sh(INTERPRETERS) == "0"
    end, 2), "sandboxed processes survived their controller")
    -- the dead controller could not remove its run directory: the next controller sweeps it
    local seen, left = {}, {}
    for _, d in ipairs(before) do seen[d] = true end
    for _, d in ipairs(H.temp_dirs()) do if not seen[d] then left[#left + 1] = d end end
    assert.are.equal(1, #left)
    -- a lock younger than a minute is spared (its run may not hold it yet): age it
    H.sh("touch -d '2 minutes ago' " .. left[1] .. "/.lock")
    local out = H.sh("lua5.4 -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path; " ..
      "package.cpath = \"csrc/?.so;\" .. package.cpath; io.write(require(\"corral\").run_python(\"print(1)\").stdout)'")
    assert.are.equal("1", out)
    assert.is_false(core.exists(left[1]))
  end)

  it("leaves no survivor under a run uid for the next controller, even without a pid namespace", function()
    if not H.root then pending("run uids need root") return end
    local before = H.temp_dirs()
    local pid = start_controller([[
local pol = require("corral.policy").load("default"):extend { pid_namespace = false, separation = "auto" }
require("corral").run_python("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\ntime.sleep(100)",
  { timeout = 60, policy = pol })]], 2)
    core.kill(pid, 9)
    -- without a pid namespace the setsid escapee outlives its dead controller ...
    assert.is_true(H.eventually(function() return H.sh(INTERPRETERS) == "1" end, 10))
    -- ... until the next run that takes its uid ends it
    local r = run("print('next')")
    assert.are.equal("next\n", r.stdout)
    assert.are.equal("0", H.sh(INTERPRETERS))
    local seen = {}
    for _, d in ipairs(before) do seen[d] = true end
    for _, d in ipairs(H.temp_dirs()) do if not seen[d] then core.rmtree(d) end end
  end)
end)

describe("the shared network namespace (network = \"shared\", the default's)", function()
  local host = require "corral.host"
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  -- Landlock ABI 6 (abstract unix sockets scoped) is what lets runs share a namespace.
  local function can_share()
    local abi = tonumber(H.sh("./csrc/corral-launch --probe"):match("probe landlock yes abi (%d+)"))
    return abi and abi >= 6
  end

  local function gone(pid)
    local st = H.sh("cat /proc/" .. pid .. "/stat 2>/dev/null")
    return st == "" or st:match("^%d+ %b() Z") ~= nil
  end

  local ISOLATED = [[
import os, socket
print("netns", os.readlink("/proc/self/ns/net"))
print("ifaces", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]))
print("routes", len(open("/proc/net/route").read().splitlines()[1:]))
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    print("CONNECTED")
except OSError as e:
    print("connect refused", e.errno)
]]

  it("isolates each run: no route out, only lo, no inet socket, and says it is shared", function()
    if not can_share() then pending("Landlock below ABI 6: each run gets its own namespace") return end
    local a, b = run(ISOLATED), run(ISOLATED)
    for _, r in ipairs({ a, b }) do
      assert.is_true(r.network_isolated)
      assert.is_true(H.has(r.limits, "no-network"))
      assert.is_true(H.has(r.limits, "shared-netns"))
      assert.is_true(H.has(r.limits, "deny-sockets"))
      assert.is_truthy(r.stdout:find("ifaces ['lo']\n", 1, true), r.stdout)
      assert.is_truthy(r.stdout:find("routes 0\n", 1, true), r.stdout)
      assert.is_truthy(r.stdout:find("connect refused 1\n", 1, true), r.stdout)    -- EPERM
    end
    -- one namespace for both runs, not the controller's
    local ns = a.stdout:match("netns (%S+)")
    assert.are.equal(ns, b.stdout:match("netns (%S+)"))
    assert.are_not.equal(core.readlink("/proc/self/ns/net"), ns)
  end)

  it("keeps two concurrent runs apart: no inet socket, no unix socket name of the other", function()
    if not can_share() then pending("Landlock below ABI 6: each run gets its own namespace") return end
    local name = "corral-share-" .. core.getpid() .. "-" .. math.random(1e9)
    -- the first tries to name a socket in the namespace (a listener of its own, or a socket
    -- pair bound to the name), the second to see or reach that name
    local listener = string.format([[
import os, socket, time
print("netns", os.readlink("/proc/self/ns/net"), flush=True)
try:
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0%s")
    s.listen()
    print("LISTENING")
except OSError as e:
    print("unix", e.errno)
a, b = socket.socketpair()
try:
    a.bind("\0%s")
    print("BOUND")
except OSError as e:
    print("bind", e.errno)
time.sleep(1.5)
for fam in (socket.AF_INET, socket.AF_INET6):
    try:
        socket.socket(fam, socket.SOCK_STREAM)
        print("inet socket made")
    except OSError as e:
        print("inet", e.errno)
]], name, name)
    local connector = string.format([[
import os, socket, time
print("netns", os.readlink("/proc/self/ns/net"), flush=True)
errs = set()
end = time.monotonic() + 1.5
while time.monotonic() < end:
    if "%s" in open("/proc/net/unix").read():
        print("SAW the name")
    try:
        c = socket.socket(socket.AF_UNIX)
        c.connect("\0%s")
        print("CONNECTED")
        break
    except OSError as e:
        errs.add(e.errno)
    time.sleep(0.05)
print("connect errors", sorted(errs))
]], name, name)
    local results = corral.run_many({ listener, connector }, { concurrency = 2 })
    local l, c = results[1], results[2]
    assert.is_true(l.ok, l.stderr)
    assert.is_true(c.ok, c.stderr)
    -- the same namespace: the seccomp filter keeps them apart (Landlock's scope behind it)
    assert.are.equal(l.stdout:match("netns (%S+)"), c.stdout:match("netns (%S+)"))
    assert.is_truthy(l.stdout:find("unix 1\nbind 1\n", 1, true), l.stdout)
    assert.is_truthy(l.stdout:find("inet 1\ninet 1\n", 1, true), l.stdout)
    assert.is_falsy(c.stdout:find("SAW", 1, true), c.stdout)
    assert.is_falsy(c.stdout:find("CONNECTED", 1, true), c.stdout)
    assert.is_truthy(c.stdout:find("connect errors [1]\n", 1, true), c.stdout)
  end)

  it("replaces a dead holder on the next run", function()
    if not can_share() then pending("Landlock below ABI 6: no holder") return end
    run("pass")
    local pid = assert(host.net_holder("auto"))
    assert(core.kill(pid, 9))
    assert.is_true(H.eventually(function() return gone(pid) end, 10))
    local r = run(ISOLATED)
    assert.is_true(H.has(r.limits, "shared-netns"), table.concat(r.limits, " "))
    assert.is_nil(r.refused and r.refused["shared-netns"], r.refused and r.refused["shared-netns"] and r.refused["shared-netns"].message)
    local again = assert(host.net_holder("auto"))
    assert.are_not.equal(pid, again)
    assert.is_truthy(r.stdout:find("netns " .. core.readlink("/proc/" .. again .. "/ns/net"), 1, true))
  end)

  it("does not keep run_loop() running", function()
    local done = false
    assert(corral.start("pass", {}, function() done = true end))
    local t0 = core.hrtime()
    corral.run_loop()
    assert.is_true(done)
    assert.is_true(core.hrtime() - t0 < 3)
  end)

  -- A controller of its own that makes its holder, says its pid, then ends as `how` says.
  local function controller_holder(how)
    local script = os.tmpname()
    local out = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write('package.path = "lua/?.lua;lua/?/init.lua;" .. package.path\n' ..
            'package.cpath = "csrc/?.so;" .. package.cpath\n' ..
            'local corral = require "corral"\n' ..
            'assert(corral.run_python("pass"))\n' ..
            'io.write(tostring(require("corral.host").net_holder("auto")), "\\n") io.flush()\n' ..
            (how == "kill" and 'local core = require "corral.core"\ncore.timer(30, function() end)\ncore.run()\n' or ''))
    f:close()
    local pid = tonumber((H.sh("lua5.4 " .. script .. " >" .. out .. " 2>&1 & echo $!")))
    local holder
    H.eventually(function()
      local g = io.open(out)
      local text = g and g:read("a") or ""
      if g then g:close() end
      holder = tonumber(text:match("^(%d+)\n"))
      return holder ~= nil
    end, 5)
    os.remove(script)
    os.remove(out)
    return pid, holder
  end

  it("ends the holder when its controller is killed with SIGKILL", function()
    if not can_share() then pending("Landlock below ABI 6: no holder") return end
    local pid, holder = controller_holder("kill")
    assert.is_truthy(holder, "the controller did not report its holder")
    assert.is_false(gone(holder))
    assert.is_truthy(H.sh("cat /proc/" .. holder .. "/cmdline | tr '\\0' ' '"):find("--hold-net", 1, true))
    core.kill(pid, 9)
    assert.is_true(H.eventually(function() return gone(holder) end, 10), "the holder outlived its controller")
  end)

  it("ends the holder when its controller exits", function()
    if not can_share() then pending("Landlock below ABI 6: no holder") return end
    local _, holder = controller_holder("exit")
    assert.is_truthy(holder, "the controller did not report its holder")
    assert.is_true(H.eventually(function() return gone(holder) end, 10), "the holder outlived its controller")
  end)
end)

-- A run that fills its scratch mounts (/tmp, /var/tmp, /dev/shm, /run, the work dir: tmpfs
-- mounts of its own) leaves the kernel one inode per file to free when its mount namespace goes,
-- a few microseconds each. That teardown must delay neither this run's result nor any other run.
describe("a run that fills its scratch mounts with files", function()
  local policy = require "corral.policy"
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function()
    assert(corral.close())    -- the warm interpreters, which must leave nothing either
    -- the result does not wait for the teardown: the run's last process may still be freeing
    -- the inodes as it exits, which takes seconds on a busy machine
    H.eventually(function() return #H.stray_processes() == 0 end, 30)
    H.assert_clean(snap)
  end)

  -- Two processes (one per CPU) make empty files (mknod: one call each) until every mount is
  -- full or `secs` have passed; then each sleeps `rest` seconds (nil: the child exits, and the
  -- program once it has; it prints time.monotonic() last, the host's core.hrtime() clock).
  local function filler(secs, rest)
    return string.format([[
import os, time
SECS, REST = %s, %s
t = time.monotonic()
def fill(dirs):
    for d in dirs:
        i = 0
        try:
            while time.monotonic() - t < SECS:
                os.mknod("%%s/f%%d" %% (d, i))
                i += 1
        except OSError:
            pass
pid = os.fork()
if pid == 0:
    fill(["/dev/shm", "/var/tmp"])
    if REST:
        time.sleep(REST)
    os._exit(0)
fill([os.getcwd(), "/tmp", "/run"])
print("filled", flush=True)
if REST:
    time.sleep(REST)
os.waitpid(pid, 0)
print(time.monotonic())
]], tostring(secs), rest and tostring(rest) or "None")
  end

  local function median(t)
    local s = {}
    for i, v in ipairs(t) do s[i] = v end
    table.sort(s)
    return s[(#s + 1) // 2]
  end

  -- /dev/shm of 1 GiB: a mount that lets the program make files for as long as it runs (a
  -- million with one inode per KiB of size, the old bound)
  local function big(name)
    return policy.load(name):extend { tmpfs = { ["/tmp"] = 16, ["/var/tmp"] = 16, ["/dev/shm"] = 1024, ["/run"] = 1 } }
  end

  it("does not stall the other runs of its warm interpreter while its mounts are torn down", function()
    local warm = big("warm")
    local function hi()
      local t0 = core.hrtime()
      local r = run("print('hi')", { policy = warm })
      assert.are.equal("hi\n", r.stdout)
      return core.hrtime() - t0
    end
    -- the baseline, on this machine now: a warm run of print('hi')
    local base = {}
    for i = 1, 15 do base[i] = hi() end
    table.sort(base)
    local bound = math.max(0.3, 10 * base[1])
    local done
    assert(corral.start(filler(3, nil), { policy = warm, timeout = 30, cpu_seconds = 30 },
      function(r, err) done = { r = r, err = err } end))
    while not done do corral.run_loop("once") end
    assert.is_truthy(done.r, tostring(done.err))
    assert.are.equal("filled\n", done.r.stdout:match("^filled\n"))
    -- right after the filler's result, the zygote frees its namespace: runs meanwhile are timed
    local worst, t1, n = 0, core.hrtime(), 0
    repeat
      worst = math.max(worst, hi())
      n = n + 1
    until core.hrtime() - t1 > 1.5 and n >= 10
    assert.is_true(worst < bound, string.format("a run of print('hi') took %.3f s after the filler's end "
      .. "(bound %.3f s, baseline best %.3f s)", worst, bound, base[1]))
  end)


  for _, name in ipairs({ "default", "warm", "bwrap" }) do
    it("that then sleeps gets its result within timeout + 0.5 s (" .. name .. ")", function()
      if name == "bwrap" and not require("corral.host").which("bwrap", "/usr/bin:/bin") then
        pending("no bwrap") return
      end
      local pol = big(name)
      if name == "warm" then run("print('warm')", { policy = pol }) end   -- its zygote is started
      local t0 = core.hrtime()
      local r = run(filler(1.8, 60), { policy = pol, timeout = 2, cpu_seconds = 30 })
      local took = core.hrtime() - t0
      assert.is_true(r.timed_out)
      if name ~= "bwrap" then assert.are.equal("filled\n", r.stdout) end  -- bwrap: nothing writable
      assert.is_true(took < 2.5, string.format("the result came %.2f s after the start", took))
    end)
  end

  -- How long after the program's last act its result came (both on CLOCK_MONOTONIC).
  local function lag(pol, code)
    local r = run(code, { policy = pol, timeout = 10, cpu_seconds = 30 })
    local at = core.hrtime()
    local last = tonumber(r.stdout:match("([%d.]+)\n$"))
    assert.is_truthy(last, r.stdout .. r.stderr)
    return at - last
  end

  for _, name in ipairs({ "default", "warm" }) do
    it("that exits normally gets its result without waiting for the teardown (" .. name .. ")", function()
      local pol = big(name)
      local base = {}
      for i = 1, 5 do base[i] = lag(pol, "import time\nprint(time.monotonic())") end
      local bound = 0.2 + 5 * median(base)
      local took = lag(pol, filler(1.5, nil))
      assert.is_true(took < bound, string.format("the result came %.3f s after the program's end "
        .. "(bound %.3f s, baseline median %.3f s)", took, bound, median(base)))
    end)
  end
end)

-- A run ended by its timeout reports what it used. Ending a large tree (killing and reaping
-- every process) can outlast the host's grace, after which the host kills the supervisor: the
-- usage must not wait for the end of that teardown.
describe("the usage of a run ended by its timeout", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  -- the result may come while the kernel still tears down the run's hundreds of killed processes
  after_each(function()
    assert(corral.close())
    H.eventually(function() return #H.stray_processes() == 0 end, 15)
    H.assert_clean(snap)
  end)

  local SLEEPERS = [[
import os, time
for i in range(200):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
print("forked", flush=True)
while True:
    pass
]]
  local BOMB = [[
import os
print("bomb", flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
]]
  local cases = {
    { "200 sleeping children and a busy parent", SLEEPERS, { processes = 300 } },
    -- 200 processes that never sleep, and a budget tick that reads each one's PSS: the stop
    -- must cut the tick short, and the report must not compete with them for the CPU. On a
    -- machine busy with other work the supervisor may still miss the host's grace: the usage it
    -- wrote while the run went on is then what the run reports (4 s: its first tick of 200
    -- processes can take a second or more there): lower bounds, whose CPU, counted in clock
    -- ticks per process, can be 0 when each of 200 new processes has had less than one
    { "a fork bomb under processes", BOMB, { processes = 200 }, timeout = 4, lower = true },
    -- the same with a grace the busiest machine leaves the supervisor: the stop is heard during
    -- a tick and the run stops before it is measured
    { "a fork bomb under processes, with a grace of 5 s", BOMB, { processes = 200 }, grace = 5 },
  }
  for _, pol in ipairs({ "default", "warm", "bwrap" }) do
    for _, c in ipairs(cases) do
      it(pol .. ": " .. c[1], function()
        if pol == "bwrap" and not require("corral.host").which("bwrap", "/usr/bin:/bin") then
          pending("no bwrap") return
        end
        local o = { policy = c.grace and require("corral.policy").load(pol):extend { grace = c.grace } or pol,
                    timeout = c.timeout or 2, cpu_seconds = 30 }
        for k, v in pairs(c[3]) do o[k] = v end
        local r = run(c[2], o)
        assert.are.equal("timeout", r.reason, r.stdout .. r.stderr)
        local u = r.usage
        local what = string.format("cpu_user_s %s cpu_sys_s %s max_rss_kb %s cpu_total_s %s memory_peak_kb %s",
          tostring(u.cpu_user_s), tostring(u.cpu_sys_s), tostring(u.max_rss_kb), tostring(u.cpu_total_s),
          tostring(u.memory_peak_kb))
        -- (how far the forking got in 2 s depends on the machine: only that CPU was used does not)
        -- Under bwrap the program's usage before the teardown is bwrap's own process's: ~0
        if pol ~= "bwrap" and not c.lower then assert.is_true(u.cpu_user_s + u.cpu_sys_s > 0, what) end
        assert.is_true(u.max_rss_kb > 0, what)
        assert.is_true(H.has(r.limits, "budget-cpu"), "limits lack budget-cpu")
        assert.is_true(u.cpu_total_s ~= nil and (u.cpu_total_s > 0 or c.lower and u.cpu_total_s == 0), what)
        assert.is_true(u.memory_peak_kb ~= nil and u.memory_peak_kb > 0, what)
      end)
    end
  end
end)
