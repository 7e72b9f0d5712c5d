-- Sessions: one sandboxed interpreter for many cells, with a run's confinement; state lasts across
-- cells, a cell's output and result are exactly its own, and nothing of a session outlives it.
local corral = require "corral"
local session = require "corral.session"
local core = require "corral.core"
local H = require "helper"

local function open(opts)
  local s, err, ecode = session.open(opts)
  assert.is_truthy(s, tostring(err) .. " " .. tostring(ecode))
  return s
end

local function exec(s, code, opts)
  local r, err = s:exec(code, opts)
  assert.is_truthy(r, tostring(err))
  return r
end

local function policies()
  return { "default", "warm" }
end

describe("session", function()
  local snap
  local sessions = {}
  before_each(function() snap = H.snapshot() sessions = {} end)
  after_each(function()
    for _, s in ipairs(sessions) do s:close() end
    assert(corral.close())
    H.assert_clean(snap)
  end)
  local function new(opts)
    local s = open(opts)
    sessions[#sessions + 1] = s
    return s
  end

  for _, pol in ipairs(policies()) do
    it("keeps state across cells, gives each its own output, value and error (" .. pol .. ")", function()
      local s = new { policy = pol }
      local r = exec(s, "import math\nx = 41\nprint('one')")
      assert.are.same({ true, "ok", "one\n", "", 1 }, { r.ok, r.reason, r.stdout, r.stderr, r.execution_count })
      assert.is_nil(r.value)
      r = exec(s, "print('two')\nx + 1")
      assert.are.equal("two\n", r.stdout)
      assert.are.equal("42", r.value)
      assert.are.equal(2, r.execution_count)
      r = exec(s, "def f():\n    return 1 / 0\nf()")
      assert.is_false(r.ok)
      assert.are.equal("error", r.reason)
      assert.are.equal("ZeroDivisionError", r.error.type)
      assert.are.equal("division by zero", r.error.message)
      -- the cell's frames, not the kernel's
      assert.matches('^Traceback %(most recent call last%):\n  File "<cell 3>", line 3, in <module>\n', r.error.traceback)
      assert.is_nil(r.error.traceback:find("_corral", 1, true))
      assert.are.equal(r.error.traceback, r.stderr)
      r = exec(s, "open('state.txt', 'w').write(str(math.pi))\nimport os\nos.getcwd() == os.environ['HOME']")
      assert.are.equal("True", r.value)
      local f = s:get("state.txt")
      assert.are.equal(tostring(math.pi):sub(1, 10), f.content:sub(1, 10))
    end)
  end

  it("interrupts a cell at its timeout and keeps the session's state", function()
    local s = new {}
    exec(s, "x = 'kept'")
    local r = exec(s, "import time\nwhile True:\n    time.sleep(0.05)", { timeout = 0.5 })
    assert.are.equal("timeout", r.reason)
    assert.are.equal("KeyboardInterrupt", r.error.type)
    r = exec(s, "x")
    assert.are.equal("'kept'", r.value)
    -- a busy loop in Python too
    r = exec(s, "while True:\n    pass", { timeout = 0.3 })
    assert.are.equal("timeout", r.reason)
    assert.are.equal("'kept'", exec(s, "x").value)
  end)

  it("interrupts a cell on request, even one sent a moment before, and keeps the state", function()
    local s = new {}
    exec(s, "x = 'kept'")
    local r
    -- the interrupt follows the cell at once: the kernel may not have started it yet
    assert(s:exec_async("while True:\n    pass", { timeout = 60 }, function(res) r = res end))
    assert(s:interrupt())
    while not r do core.run("once") end
    assert.are.same({ "interrupted", "KeyboardInterrupt" }, { r.reason, r.error.type })
    assert.are.equal("'kept'", exec(s, "x").value)
    local ok, _, ecode = s:interrupt()
    assert.is_nil(ok)
    assert.are.equal("EIDLE", ecode)
  end)

  it("says whether source is a whole statement, and runs one as Python's REPL does", function()
    local s = new {}
    for _, case in ipairs({ { "x = 1", true }, { "def f():", false }, { "def f():\n    return 1", false },
                            { "def f():\n    return 1\n", true }, { "if (1,", false }, { "1 +* 2", true } }) do
      local c = assert(s:complete(case[1]))
      assert.are.equal(case[2], c.complete, case[1])
    end
    local r = exec(s, "for i in range(3): i * 2\n", { interactive = true })
    assert.are.equal("0\n2\n4\n", r.stdout)
    assert.is_nil(r.value)
    assert.are.equal("'4'", exec(s, "repr(_)").value)
    assert.has_error(function() s:exec("1", { interactive = 1 }) end, "exec: option 'interactive' must be a boolean, got number")
  end)

  it("loses the session when a cell ignores the interrupt, and leaves nothing", function()
    local s = new { grace = 0.5 }
    -- the interpreter is up: the next cell ignores SIGINT before its timeout comes
    exec(s, "import signal")
    local r = exec(s, "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", { timeout = 1 })
    assert.are.equal("lost", r.reason)
    assert.is_false(s:alive())
    local r2, err, ecode = s:exec("1")
    assert.is_nil(r2)
    assert.are.equal("ESESSION", ecode)
    assert.matches("gone %(lost%)", err)
  end)

  it("ends the session on a memory bomb, and on sys.exit with its code", function()
    local s = new { memory_mb = 128 }
    local r = exec(s, "b = []\nwhile True:\n    b.append(bytearray(1 << 20))")
    assert.are.equal("error", r.reason)   -- MemoryError: the cell's, the session lives
    assert.are.equal("MemoryError", r.error.type)
    assert.are.equal("ok", exec(s, "del b\n1").reason)
    r = exec(s, "import sys\nsys.exit(3)")
    assert.are.equal("exit", r.reason)
    assert.are.equal(3, r.returncode)
    assert.is_false(s:alive())
  end)

  it("ends a cell at its own CPU seconds and keeps the session; ends the session at the session's", function()
    local s = new { cpu_seconds = 3 }
    local r = exec(s, "x = 1\nwhile True: pass", { cpu_seconds = 1, timeout = 30 })
    assert.are.equal("cpu", r.reason, r.stderr)
    assert.are.equal("CellCPUExceeded", r.error.type)
    -- the kernel raises the soft limit a second past it and signals again: nothing of that
    -- may reach the kernel's own work once the cell has ended
    r = exec(s, "import time\nt = time.process_time()\nwhile time.process_time() < t + 0.3: pass\nx", { timeout = 30 })
    assert.are.equal("ok", r.reason, r.stderr)
    assert.are.equal("1", r.value)
    assert.is_true(s:alive())
    r = exec(s, "while True: pass", { timeout = 30 })
    assert.are.equal("cpu", r.reason, r.stderr)
    assert.is_false(s:alive())
    assert.are.equal("cpu", s.gone)
  end)

  it("survives a fork bomb within its process limit, and its close ends every process", function()
    local s = new { processes = 8 }
    local r = exec(s, [[
import os
n = 0
for i in range(50):
    try:
        if os.fork() == 0:
            import time
            while True:
                time.sleep(1)
        n += 1
    except OSError:
        pass
n < 8]])
    assert.are.equal("True", r.value, r.stderr)
    assert.are.equal("ok", exec(s, "1").reason)
  end)

  it("gives each cell its channels back: closed or redirected fds 1 and 2, fake boundaries", function()
    local s = new {}
    exec(s, "import os, sys\nos.close(1)\nos.close(2)\nsys.stdout.close()")
    local r = exec(s, "print('back')\nimport sys\nprint('err', file=sys.stderr)")
    assert.are.equal("back\n", r.stdout)
    assert.are.equal("err\n", r.stderr)
    exec(s, "import os\nf = os.open('redir.txt', os.O_WRONLY | os.O_CREAT)\nos.dup2(f, 1)")
    assert.are.equal("again\n", exec(s, "print('again')").stdout)
    -- things that look like the end of a cell are output
    r = exec(s, "import sys\nsys.stdout.write('\\0' + '0' * 32 + '\\0' + '5\\n{\"a\"}')\nsys.stderr.write('\\0\\0')")
    assert.are.equal("\0" .. ("0"):rep(32) .. "\0" .. "5\n{\"a\"}", r.stdout)
    assert.are.equal("\0\0", r.stderr)
    assert.are.equal("ok", r.reason)
  end)

  it("gives what a background thread prints after its cell to the next cell", function()
    local s = new {}
    local r = exec(s, "import threading, time\ndef late():\n    time.sleep(0.3)\n    print('late', flush=True)\n"
      .. "threading.Thread(target=late).start()\nprint('now')")
    assert.are.equal("now\n", r.stdout)
    -- no cell runs while the thread prints
    local waited = false
    local t = core.timer(1, function() waited = true end)
    while not waited do core.run("once") end
    t:close()
    r = exec(s, "print('next')")
    assert.are.equal("late\nnext\n", r.stdout)
    -- while a cell runs, it is that cell's
    exec(s, "threading.Thread(target=late).start()")
    r = exec(s, "time.sleep(0.6)\nprint('mine')")
    assert.are.equal("late\nmine\n", r.stdout)
  end)

  it("ends a cell that kills its own interpreter, and the session with it", function()
    local s = new {}
    local r = exec(s, "import os\nprint('before', flush=True)\nos.kill(os.getpid(), 9)")
    assert.are.equal("before\n", r.stdout)
    assert.is_false(r.ok)
    assert.is_false(s:alive())
  end)

  it("puts and gets files, never through a link, and lists the work dir", function()
    local s = new { files = { { path = "in/data.csv", content = "a,b\n1,2\n" } } }
    assert.are.equal("a,b\n1,2\n", exec(s, "open('in/data.csv').read()").value and s:get("in/data.csv").content)
    assert.is_true(s:put("out/new.bin", "\0\1\2").ok)
    assert.are.equal("b'\\x00\\x01\\x02'", exec(s, "open('out/new.bin', 'rb').read()").value)
    exec(s, "import os\nos.symlink('/etc/passwd', 'link')\nos.symlink('/etc', 'dir')")
    local r = s:get("link")
    assert.is_false(r.ok)
    assert.are.equal("OSError", r.error.type)   -- ELOOP: O_NOFOLLOW
    r = s:get("dir/passwd")
    assert.is_false(r.ok)
    r = s:put("dir/x", "no")
    assert.is_false(r.ok)
    local l = s:list()
    local names = {}
    for _, e in ipairs(l.entries) do names[e.path] = e.type end
    assert.are.equal("file", names["in/data.csv"])
    assert.are.equal("link", names["link"])
    assert.are.equal("directory", names["out"])
    assert.has_error(function() s:get("../x") end, "get: the path '../x' has a '..' segment")
  end)

  it("returns each matplotlib figure a cell leaves open as a PNG", function()
    local ok = os.execute("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null")
    if not ok then pending("python3-matplotlib is not installed") return end
    local s = new { memory_mb = 512 }
    local r = exec(s, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.figure()\nplt.bar([1], [2])\nNone",
      { timeout = 60 })
    assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
    assert.are.equal(2, #r.images)
    for _, png in ipairs(r.images) do assert.are.equal("\137PNG\r\n\26\n", png:sub(1, 8)) end
    assert.are.equal(0, #exec(s, "1").images)
  end)

  it("reports each cell's memory, and ends at its lifetime", function()
    -- a lifetime the two cells fit in on a busy machine
    local s = new { lifetime = 10 }
    local r = exec(s, "b = bytearray(50 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1")
    assert.are.equal("ok", r.reason, r.stderr)
    assert.is_true(r.usage.memory_kb >= 50 * 1024, tostring(r.usage.memory_kb))
    assert.is_true(r.usage.memory_peak_kb >= r.usage.memory_kb)
    r = exec(s, "del b")
    assert.is_true(r.usage.memory_kb < 50 * 1024)
    assert.is_true(H.eventually(function() core.run("once") return not s:alive() end, 60))
    assert.are.equal("lifetime", s.gone)
  end)

  it("ends at its idle timeout; a second request while one runs is refused", function()
    local s = new { idle_timeout = 1 }
    assert(s:exec_async("import time\ntime.sleep(0.5)", {}, function() end))
    local r, err, ecode = s:exec("1")
    assert.is_nil(r)
    assert.are.equal("EBUSY", ecode, err)
    assert.is_true(H.eventually(function() core.run("once") return not s:alive() end, 10))
    assert.are.equal("idle", s.gone)
  end)

  it("opens a session with the options of one before from the kernel started ahead", function()
    local a = new { policy = "warm", memory_mb = 200 }
    assert.are.equal("ok", exec(a, "1").reason)
    local t0 = core.hrtime()
    local b = new { policy = "warm", memory_mb = 200 }
    assert.is_true(b.from_ahead)
    assert.are_not.equal(a.id, b.id)
    -- nothing of one is in the other
    exec(a, "secret = 1")
    assert.are.equal("error", exec(b, "secret").reason)
    -- its lifetime counts from its open, not from its start
    assert.is_true(b.started >= t0)
    assert.is_true(math.abs(b.expires - b.started - b.settings.lifetime) < 1e-6)
  end)

  it("keeps a kernel ahead for start_ahead's options, replaced when unused, whose first cell is 1", function()
    local idle = session.SPARE_IDLE
    session.SPARE_IDLE = 0.5
    local ok, err = pcall(function()
      assert.is_true(session.start_ahead({ policy = "warm", memory_mb = 190 }, true))
      -- a kernel ahead that was not kept would be let go of by now
      local t0 = core.hrtime()
      while core.hrtime() - t0 < 1.5 do core.run("once") end
      local s = new { policy = "warm", memory_mb = 190 }
      assert.is_true(s.from_ahead)
      local r = exec(s, "print('hello')")
      assert.are.same({ "ok", "hello\n", "", 1 }, { r.reason, r.stdout, r.stderr, r.execution_count })
      assert.are.equal("error", exec(s, "_").reason)
    end)
    session.SPARE_IDLE = idle
    assert(ok, err)
  end)

  it("runs 100 sessions at once, each with its own state", function()
    local list = {}
    for i = 1, 100 do list[i] = new { policy = "warm" } end
    local pending = 0
    local function all(code_of, check)
      pending = #list
      for i, s in ipairs(list) do
        assert(s:exec_async(code_of(i), { timeout = 120 }, function(r) check(i, r) pending = pending - 1 end))
      end
      while pending > 0 do core.run("once") end
    end
    all(function(i) return "x = " .. i end, function(i, r) assert.are.equal("ok", r.reason, i .. ": " .. r.stderr) end)
    all(function() return "x * 2" end, function(i, r) assert.are.equal(tostring(i * 2), r.value, r.stderr) end)
  end)

  describe("a cell's collect", function()
    local policy = require "corral.policy"
    local function by_path(files)
      local t = {}
      for _, f in ipairs(files or {}) do t[f.path] = f end
      return t
    end
    local function paths(files)
      local t = {}
      for _, f in ipairs(files or {}) do t[#t + 1] = f.path end
      return t
    end

    it("refuses a bad collect with an error naming it", function()
      local s = new {}
      for _, c in ipairs({
        { "*.png", "exec: option 'collect' must be true or a list of globs, got string" },
        { {}, "exec: option 'collect' is an empty list" },
        { { "/etc/*" }, "exec: option 'collect' entry 1 %('/etc/%*'%) is absolute" },
        { { "a/../b" }, "exec: option 'collect' entry 1 %('a/%.%./b'%) has a '%.%.' segment" },
        { { 5 }, "exec: option 'collect' entry 1 must be a string" },
        { { x = "*" }, "exec: option 'collect' must be true or a list %(keys 1%.%.n%)" },
        { { "**/**/**/x" }, "more than two %*%*" },
      }) do
        local ok, err = pcall(s.exec, s, "1", { collect = c[1] })
        assert.is_false(ok)
        assert.matches(c[2], err)
      end
      -- nothing ran, the session is as it was
      assert.are.equal(1, exec(s, "1").execution_count)
    end)

    for _, pol in ipairs(policies()) do
      it("collects by glob, links as links, never a fifo or what a link names (" .. pol .. ")", function()
        local s = new { policy = pol }
        local r = exec(s, [[
import os
os.makedirs("out/deep/er")
open("out/a.png", "wb").write(b"\x89PNG")
open("out/deep/er/b.txt", "w").write("b" * 10)
open("skip.txt", "w").write("no")
os.symlink("/etc/shadow", "out/shadow.png")
os.symlink("/etc", "out/etc")
os.mkfifo("out/fifo.png")
os.link("out/a.png", "out/hard.png")
open(b"out/caf\xe9.png", "w").write("c")
]], { collect = { "out/*.png", "out/**/*.txt", "out/etc/*" } })
        assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
        assert.are.same({ "out/a.png", "out/caf\233.png", "out/deep/er/b.txt", "out/hard.png", "out/shadow.png" },
          paths(r.files))
        local f = by_path(r.files)
        assert.are.equal("\137PNG", f["out/a.png"].content)
        assert.are.equal("file", f["out/a.png"].type)
        assert.is_false(f["out/a.png"].truncated)
        assert.are.equal("\137PNG", f["out/hard.png"].content)
        assert.are.equal(("b"):rep(10), f["out/deep/er/b.txt"].content)
        assert.are.equal("link", f["out/shadow.png"].type)
        assert.are.equal("/etc/shadow", f["out/shadow.png"].target)
        assert.is_nil(f["out/shadow.png"].content)
        assert.is_nil(r.files_truncated)
        -- a later cell finds them by glob too: a glob is of the work dir, not of the cell
        r = exec(s, "pass", { collect = { "**/*.txt" } })
        assert.are.same({ "out/deep/er/b.txt", "skip.txt" }, paths(r.files))
        -- no collect: no files field
        assert.is_nil(exec(s, "pass").files)
      end)

      it("collect = true: what this cell made or changed, not an earlier cell's or a given file (" .. pol .. ")",
        function()
        local s = new { policy = pol, files = { { path = "same.txt", content = "s" }, { path = "changed.txt", content = "c" },
                                                 { path = "moved.txt", content = "m" } } }
        local r = exec(s, "open('first.txt', 'w').write('1')\nopen('again.txt', 'w').write('a')", { collect = true })
        assert.are.same({ "again.txt", "first.txt" }, paths(r.files))
        r = exec(s, [[
import os
open("changed.txt", "a").write("+")
open("again.txt", "a").write("+")
open("new.txt", "w").write("n")
os.rename("moved.txt", "moved2.txt")
os.symlink("same.txt", "link")
os.mkfifo("fifo")
os.utime("new.txt", (0, 0))
]], { collect = true })
        assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
        assert.are.same({ "again.txt", "changed.txt", "link", "moved2.txt", "new.txt" }, paths(r.files))
        local f = by_path(r.files)
        assert.are.equal("c+", f["changed.txt"].content)
        assert.are.equal("a+", f["again.txt"].content)
        assert.are.equal("m", f["moved2.txt"].content)
        assert.are.equal("same.txt", f["link"].target)
        -- a cell that changes nothing: nothing
        r = exec(s, "x = open('new.txt').read()", { collect = true })
        assert.are.same({}, r.files)
        -- a cell that raised still gives its files
        r = exec(s, "open('err.txt', 'w').write('e')\n1/0", { collect = true })
        assert.are.equal("error", r.reason)
        assert.are.same({ "err.txt" }, paths(r.files))
      end)
    end

    it("reads a file a background process keeps growing once, up to the caps", function()
      local s = new { file_mb = 64 }
      local r = exec(s, [[
import os, time
if os.fork() == 0:
    try:
        with open("grow.txt", "a") as f:
            while True:
                f.write("g" * 4096); f.flush(); time.sleep(0.001)
    finally:
        os._exit(0)
while not os.path.exists("grow.txt") or os.path.getsize("grow.txt") < 9 << 20:
    time.sleep(0.01)
]], { collect = { "grow.txt" }, timeout = 60 })
      assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
      local g = r.files[1]
      assert.are.equal(8 * 1048576, #g.content)
      assert.is_true(g.truncated)
      assert.is_true(g.size >= 9 * 1048576)
      assert.are.equal(("g"):rep(#g.content), g.content)
      -- and again, while it still grows (in this cell: collect = true gives it)
      r = exec(s, "n = os.path.getsize('grow.txt')\nwhile os.path.getsize('grow.txt') == n:\n    time.sleep(0.01)",
        { collect = true, timeout = 60 })
      assert.are.equal(8 * 1048576, #by_path(r.files)["grow.txt"].content)
    end)

    it("keeps to the policy's caps: per file, in all, in count", function()
      local capped = policy.load("default"):extend { name = "capped", max_files_out = 5, max_file_out_mb = 0.001,
                                                     max_files_out_mb = 0.003 }
      local s = new { policy = capped }
      local r = exec(s, "for i in range(4):\n    open('f%d' % i, 'wb').write(bytes([65 + i]) * 2000)", { collect = { "*" } })
      assert.are.equal(4, #r.files)
      local kept = 0
      for _, f in ipairs(r.files) do
        assert.are.equal(2000, f.size)
        assert.is_true(f.truncated)
        assert.is_true(#f.content <= 1048)
        kept = kept + #f.content
      end
      assert.are.equal(math.floor(0.003 * 1048576), kept)
      assert.are.same({ "bytes" }, r.files_truncated)
      r = exec(s, "for i in range(50):\n    open('g%d' % i, 'w').write('x')", { collect = true })
      assert.are.equal(5, #r.files)
      assert.are.same({ "files" }, r.files_truncated)
    end)

    it("as many tiny files as the work dir holds, a huge file, a deep tree", function()
      local s = new { file_mb = 61, memory_mb = 512 }
      local r = exec(s, [[
n = 0
try:
    while True:
        open("t%d" % n, "w").close()
        n += 1
except OSError as e:
    print("stopped", e.errno != 0, n > 1000)
]], { collect = true, timeout = 60 })
      assert.are.equal("stopped True True\n", r.stdout)
      assert.are.equal(100, #r.files)
      assert.are.same({ "files" }, r.files_truncated)
      exec(s, "import os\nfor n in os.listdir('.'):\n    os.remove(n)")
      r = exec(s, "open('huge', 'wb').write(b'h' * (60 << 20))", { collect = { "huge" }, timeout = 60 })
      assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
      local h = r.files[1]
      assert.are.equal(60 * 1048576, h.size)
      assert.are.equal(8 * 1048576, #h.content)
      assert.is_true(h.truncated)
      r = exec(s, [[
import os
os.remove("huge")
p = "."
for i in range(100):
    p = os.path.join(p, "d")
os.makedirs(p)
open(os.path.join(p, "leaf"), "w").write("l")
open(os.path.join("d/d/d", "near"), "w").write("n")
]], { collect = true })
      assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
      assert.are.equal("n", by_path(r.files)["d/d/d/near"].content)
      assert.are.same({ "depth" }, r.files_truncated)
    end)

    it("globs that try every split of a deep tree stop at their cap; the timeout cuts a walk", function()
      local s = new {}
      local globs = {}
      for i = 1, 64 do globs[i] = "**/**/z" .. i end
      local r = exec(s, [[
import os
p = "/".join(["d"] * 60)
os.makedirs(p)
for i in range(2000):
    open(os.path.join(p, "f%d" % i), "w").close()
]], { collect = globs, timeout = 120 })
      assert.are.equal("ok", r.reason, r.stderr .. require("cjson").encode(r.error or {}))
      assert.are.same({}, r.files)
      assert.are.same({ "scan" }, r.files_truncated)
      -- a walk longer than the cell's timeout is cut there, and the session lives
      r = exec(s, "pass", { collect = globs, timeout = 0.05 })
      assert.are.same({ "interrupted" }, r.files_truncated)
      assert.are.equal("ok", exec(s, "pass").reason)
      assert.is_true(s:alive())
    end)
  end)
end)

describe("sessions of a controller killed with SIGKILL", function()
  it("leave no process and nothing running behind", function()
    local before = {}
    for _, d in ipairs(H.temp_dirs()) do before[d] = true end
    local ready = os.tmpname()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write('package.path = "lua/?.lua;lua/?/init.lua;" .. package.path\n'
      .. 'package.cpath = "csrc/?.so;" .. package.cpath\n'
      .. 'local session, core = require "corral.session", require "corral.core"\n'
      .. 'local n = 0\n'
      .. 'for _, pol in ipairs({ "default", "warm", "default" }) do\n'
      .. '  local s = assert(session.open { policy = pol })\n'
      .. '  assert(s:exec_async("import os, time\\nif os.fork() == 0:\\n    os.setsid()\\nprint(1, flush=True)\\ntime.sleep(300)", { timeout = 600 },\n'
      .. '    function() end))\n'
      .. 'end\n'
      .. 'local t = core.timer(1, function() io.open(' .. string.format("%q", ready) .. ', "w"):write("ready") end)\n'
      .. 'while true do core.run("once") end\n')
    f:close()
    os.remove(ready)
    local pid = tonumber((H.sh("lua5.4 " .. script .. " >/dev/null 2>&1 & echo $!")))
    -- the controller is killed whatever happens below: a failed wait must not leave it running
    finally(function() core.kill(pid, 9) end)
    local dirs = {}
    -- the sessions' processes: their mounts name their run directories (the program sees its
    -- code and work dir at paths of its own)
    local function procs()
      local n = 0
      for _, p in ipairs(H.pids_with("python3")) do
        local mounts = H.sh("cat /proc/" .. p .. "/mountinfo 2>/dev/null")
        for _, d in ipairs(dirs) do
          if mounts:find("/" .. d:match("[^/]+$") .. "/code ", 1, true) then n = n + 1 break end
        end
      end
      return n
    end
    -- three sessions, each its kernel and a setsid child
    assert.is_true(H.eventually(function()
      dirs = {}
      for _, d in ipairs(H.temp_dirs()) do if not before[d] then dirs[#dirs + 1] = d end end
      -- (and the sessions started ahead for the next opens: sessions too)
      return #dirs >= 3 and procs() >= 6
    end, 60), "the sessions did not start: " .. #dirs .. " dirs, " .. procs() .. " processes")
    core.kill(pid, 9)
    assert.is_true(H.eventually(function() return procs() == 0 end, 10), "processes of the sessions survived")
    os.remove(script)
    os.remove(ready)
    for _, d in ipairs(dirs) do core.rmtree(d) end
  end)
end)

-- separation = "require" (default's): a session whose program would have the controller's uid
-- without Landlock is refused like a run, with ENOTSUP naming the field, not opened and lost
describe("session separation", function()
  it("a session that cannot be walled off says ENOTSUP, naming the field, and runs nothing", function()
    if H.root then return end   -- as root each run has a uid of its own
    local pol = require("corral.policy").load("default"):extend { name = "exposed-session",
      user_namespace = "never", filesystem = "off" }
    -- the kernel starts after open returns: the first session learns it from its kernel's
    -- launch, and its cell is lost saying why; once known, a session of that policy does not open
    local s, err, ecode = session.open { policy = pol }
    if s then
      local cell = assert(s:exec("print('ran')"))
      s:close()
      assert.are.equal("lost", cell.reason)
      assert.are.equal("", cell.stdout)
      assert.are.equal("ENOTSUP", cell.error and cell.error.type, tostring(cell.error and cell.error.message))
      assert.is_truthy(cell.error.message:find("separation", 1, true), cell.error.message)
      s, err, ecode = session.open { policy = pol }
    end
    assert.is_nil(s, "opened again")
    assert.are.equal("ENOTSUP", ecode, tostring(err))
    assert.is_truthy(tostring(err):find("separation", 1, true), tostring(err))
  end)
end)
