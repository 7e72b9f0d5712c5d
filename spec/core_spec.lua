-- corral.core: the host's mechanisms, tested alone with real processes.
local core = require "corral.core"
local H = require "helper"

local function spawn_wait(opts)
  local res
  opts.on_exit = function(r) res = r end
  local proc = assert(core.spawn(opts))
  while not res do core.run("once") end
  return res, proc
end

describe("corral.core", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  describe("spawn", function()
    it("captures stdout and stderr and the exit status", function()
      local r = spawn_wait { file = "/bin/sh", args = { "-c", "echo out; echo err >&2; exit 3" },
                             stdout_cap = 100, stderr_cap = 100 }
      assert.are.equal("out\n", r.stdout)
      assert.are.equal("err\n", r.stderr)
      assert.are.equal(3, r.exit_status)
      assert.are.equal(0, r.term_signal)
    end)

    it("drains and counts bytes past the cap without buffering them", function()
      local before = core.rusage().maxrss_kb
      local r = spawn_wait { file = "/bin/sh", args = { "-c", "head -c 50000000 /dev/zero" },
                             stdout_cap = 10, stderr_cap = 10, tail_bytes = 4 }
      assert.are.equal(10, #r.stdout)
      assert.are.equal(50000000, r.stdout_bytes)
      assert.are.equal("\0\0\0\0", r.stdout_tail)
      assert.is_true(core.rusage().maxrss_kb - before < 10000)
    end)

    it("ends a run on overflow when asked", function()
      local r = spawn_wait { file = "/bin/sh", args = { "-c", "yes" }, stdout_cap = 1000,
                             stderr_cap = 10, kill_on_overflow = true, timeout = 10 }
      assert.are.equal("stdout", r.overflow)
      assert.is_true(r.wall_s < 2)
    end)

    it("times out within the grace period", function()
      local t0 = core.hrtime()
      local r = spawn_wait { file = "/bin/sleep", args = { "100" }, timeout = 0.3, grace = 0.1 }
      assert.is_true(r.timed_out)
      assert.is_true(core.hrtime() - t0 < 1)
    end)

    it("does not wait for a background child holding the pipe", function()
      local t0 = core.hrtime()
      local r = spawn_wait { file = "/bin/sh", args = { "-c", "sleep 30 & echo started" },
                             stdout_cap = 100, grace = 0.2, timeout = 10 }
      assert.are.equal("started\n", r.stdout)
      assert.is_true(core.hrtime() - t0 < 2)
      assert.is_true(H.eventually(function() return #H.pids_with("sleep 30") == 0 end))
    end)

    it("writes stdin and closes it", function()
      local r = spawn_wait { file = "/usr/bin/wc", args = { "-c" }, stdin = string.rep("a", 5000000),
                             stdout_cap = 100 }
      assert.are.equal("5000000", r.stdout:match("%d+"))
    end)

    it("survives a child that never reads its stdin", function()
      local r = spawn_wait { file = "/bin/true", args = {}, stdin = string.rep("a", 5000000) }
      assert.are.equal(0, r.exit_status)
    end)

    it("returns nil, message, code for a missing executable", function()
      local p, err, code = core.spawn { file = "/nonexistent/prog", args = {}, on_exit = function() end }
      assert.is_nil(p)
      assert.are.equal("ENOENT", code)
      assert.is_truthy(err:find("/nonexistent/prog", 1, true))
    end)

    it("raises naming an unknown option", function()
      local ok, err = pcall(core.spawn, { file = "/bin/true", timeuot = 1 })
      assert.is_false(ok)
      assert.is_truthy(err:find("timeuot", 1, true))
    end)

    it("re-raises an error from on_exit out of core.run", function()
      assert(core.spawn { file = "/bin/true", args = {}, on_exit = function() error("boom in callback") end })
      local ok, err = pcall(core.run, "default")
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("boom in callback", 1, true))
    end)
  end)

  describe("spawn with stream", function()
    -- Turn the loop until pred() holds; every run here has a timeout, so the loop has an event
    -- to wake on within it.
    local function until_(pred)
      local deadline = core.hrtime() + 60
      while not pred() and core.hrtime() < deadline do core.run("once") end
      assert.is_truthy(pred())
    end

    local ECHO = [[
import sys
while True:
    line = sys.stdin.readline()
    if not line:
        break
    sys.stdout.write("echo " + line)
    sys.stderr.write("err " + line)
print("eof")
]]

    local function echo(opts)
      local got, order, res = { stdout = "", stderr = "" }, {}, nil
      opts.file, opts.args, opts.stream, opts.timeout = "/usr/bin/python3", { "-u", "-c", ECHO }, true, 60
      opts.on_output = function(name, bytes)
        got[name] = got[name] .. bytes
        order[#order + 1] = name
      end
      opts.on_exit = function(r) res = r end
      local proc = assert(core.spawn(opts))
      return proc, got, order, function() return res end
    end

    it("feeds stdin by proc:write and hands each chunk to on_output as it comes", function()
      local proc, got, order, result = echo { stdin = "first\n" }
      until_(function() return got.stdout == "echo first\n" end)
      local want_out, want_err = "echo first\n", "err first\n"
      for i = 1, 5 do
        local line = "line " .. i .. "\n"
        assert.is_true(proc:write(line))
        want_out, want_err = want_out .. "echo " .. line, want_err .. "err " .. line
        until_(function() return got.stdout == want_out end)
      end
      until_(function() return got.stderr == want_err end)
      for _, name in ipairs(order) do assert.is_truthy(name == "stdout" or name == "stderr") end
      assert.is_nil(result())
      assert.is_true(proc:close_stdin())
      assert.is_false(proc:close_stdin())
      local ok, msg = proc:write("late\n")
      assert.is_false(ok)
      assert.are.equal("stdin is closed", msg)
      until_(result)
      local res = result()
      assert.are.equal(want_out .. "eof\n", got.stdout)
      assert.are.equal(0, res.exit_status)
      assert.are.equal("", res.stdout)
      assert.are.equal("", res.stderr)
      assert.are.equal(#got.stdout, res.stdout_bytes)
      assert.are.equal(#got.stderr, res.stderr_bytes)
      ok, msg = proc:write("after\n")
      assert.is_false(ok)
      assert.are.equal("the run has ended", msg)
      assert.is_false(proc:close_stdin())
    end)

    it("keeps stdin open without `stdin` until close_stdin, queueing writes in order", function()
      local proc, got, _, result = echo {}
      local want = {}
      for i = 1, 200 do
        assert.is_true(proc:write("w" .. i .. "\n"))
        want[#want + 1] = "echo w" .. i .. "\n"
      end
      assert.is_true(proc:write(""))
      assert.is_true(proc:close_stdin()) -- after the queued writes
      until_(result)
      assert.are.equal(table.concat(want) .. "eof\n", got.stdout)
      assert.are.equal(0, result().exit_status)
    end)

    it("closes stdin after a write fails because the child closed its end", function()
      local got, res = "", nil
      local proc = assert(core.spawn {
        file = "/usr/bin/python3", args = { "-c", "import os, time\nos.close(0)\nprint('closed', flush=True)\ntime.sleep(60)" },
        stream = true, timeout = 60, grace = 0.1,
        on_output = function(_, bytes) got = got .. bytes end, on_exit = function(r) res = r end })
      until_(function() return got == "closed\n" end)
      local ok, msg
      until_(function()
        ok, msg = proc:write("x")
        return not ok
      end)
      assert.are.equal("stdin is closed", msg)
      assert.is_false(proc:close_stdin())
      proc:kill()
      until_(function() return res end)
    end)

    it("refuses writes past 16 MiB queued for a child that does not read", function()
      local res
      local proc = assert(core.spawn {
        file = "/usr/bin/python3", args = { "-c", "import time\ntime.sleep(60)" },
        stream = true, timeout = 60, grace = 0.1, on_exit = function(r) res = r end })
      assert.is_true(proc:write(string.rep("a", 8 * 1024 * 1024)))
      assert.is_true(proc:write(string.rep("b", 8 * 1024 * 1024)))
      local ok, msg, code = proc:write("c")
      assert.is_nil(ok)
      assert.are.equal("EAGAIN", code)
      assert.is_truthy(msg:find("queue full", 1, true))
      proc:kill() -- the queued writes are dropped with the run
      until_(function() return res end)
      assert.is_true(res.killed)
    end)

    it("hands every byte of 50 MB to on_output without keeping it", function()
      local before = core.rusage().maxrss_kb
      local n, calls, res = 0, 0, nil
      assert(core.spawn { file = "/bin/sh", args = { "-c", "head -c 50000000 /dev/zero" },
                          stream = true, timeout = 60, stdout_cap = 1000,
                          on_output = function(name, bytes)
                            assert(name == "stdout")
                            n, calls = n + #bytes, calls + 1
                          end,
                          on_exit = function(r) res = r end })
      until_(function() return res end)
      assert.are.equal(50000000, n)
      assert.are.equal(50000000, res.stdout_bytes)
      assert.are.equal("", res.stdout)
      assert.is_true(calls > 1)
      assert.is_true(core.rusage().maxrss_kb - before < 10000)
    end)

    it("re-raises an error from on_output out of core.run, and the run goes on to on_exit", function()
      local seen, res = "", nil
      local proc = assert(core.spawn {
        file = "/bin/sh", args = { "-c", "echo one; read x; echo \"two $x\"" }, stream = true,
        timeout = 60,
        on_output = function(_, bytes)
          seen = seen .. bytes
          if bytes:find("one", 1, true) then error("boom in on_output") end
        end,
        on_exit = function(r) res = r end })
      local ok, err
      local deadline = core.hrtime() + 60
      repeat ok, err = pcall(core.run, "once") until not ok or core.hrtime() > deadline
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("boom in on_output", 1, true))
      assert.is_true(proc:write("2\n"))
      until_(function() return res end)
      assert.are.equal("one\ntwo 2\n", seen)
      assert.are.equal(0, res.exit_status)
    end)

    it("raises naming the options that do not go with stream", function()
      local cases = {
        { { stream = true, kill_on_overflow = true }, "kill_on_overflow" },
        { { on_output = function() end }, "'on_output' needs 'stream'" },
        { { stream = true, on_output = "f" }, "on_output" },
        { { stream = true, hold = true, report = true }, "'hold' does not go with 'stream'" },
        { { stream = 1 }, "stream" },
      }
      for _, c in ipairs(cases) do
        c[1].file, c[1].args = "/bin/true", {}
        local ok, err = pcall(core.spawn, c[1])
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find(c[2], 1, true), err)
      end
    end)

    it("raises for write and close_stdin on a run spawned without stream", function()
      local _, proc = spawn_wait { file = "/bin/true", args = {} }
      local ok, err = pcall(proc.write, proc, "x")
      assert.is_false(ok)
      assert.is_truthy(err:find("not spawned with 'stream'", 1, true))
      ok = pcall(proc.close_stdin, proc)
      assert.is_false(ok)
    end)
  end)

  it("yields the CPU (sched_yield) and returns nothing", function()
    local t0 = core.hrtime()
    assert.are.equal(0, select("#", core.yield()))
    assert.is_true(core.hrtime() - t0 < 1)
  end)

  describe("json_separators", function()
    it("counts the brackets, braces, commas and colons outside strings", function()
      assert.are.equal(0, core.json_separators(""))
      assert.are.equal(0, core.json_separators('"a,b:[{"'))
      assert.are.equal(7, core.json_separators('{"a":[1,2,{"b":"x,y:\\"[{"}]}'))
      -- an escaped backslash ends nothing; the quote after it ends the string
      assert.are.equal(2, core.json_separators('"\\\\",,'))
      assert.are.equal(0, core.json_separators('"\\",,'))      -- still inside the string
    end)

    it("counts a large text without copying it", function()
      local text = "[" .. ("0,"):rep(4 * 1024 * 1024) .. "0]"
      collectgarbage()
      local before = collectgarbage("count")
      assert.are.equal(4 * 1024 * 1024 + 1, core.json_separators(text))
      assert.is_true(collectgarbage("count") - before < 64)    -- KiB: no copy of 8 MiB
    end)
  end)

  describe("utf8_repair", function()
    local cases = {
      { "plain ascii", "plain ascii", true },
      { "caf\xC3\xA9", "caf\xC3\xA9", true },
      { "\xFF", "\xEF\xBF\xBD", false },
      { "a\xE2\x82", "a\xEF\xBF\xBD", false },                 -- truncated 3-byte sequence
      { "\xF0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", false }, -- overlong lead
      { "\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", false }, -- surrogate
      { "\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD", false },        -- overlong slash
      { "\xF4\x90\x80\x80", string.rep("\xEF\xBF\xBD", 4), false }, -- above U+10FFFF
      { "\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80", true },          -- emoji
      { "\xF0\x9F\x98", "\xEF\xBF\xBD", false },
      { "", "", true },
      { "a\0b", "a\0b", true },
    }
    for _, c in ipairs(cases) do
      it(string.format("repairs %q like Python", c[1]), function()
        local out, valid = core.utf8_repair(c[1])
        assert.are.equal(c[2], out)
        assert.are.equal(c[3], valid)
      end)
    end

    it("agrees with Python on random bytes", function()
      math.randomseed(7)
      local parts = {}
      for i = 1, 200 do
        local n = math.random(0, 12)
        local b = {}
        for j = 1, n do b[j] = string.char(math.random(0, 255)) end
        parts[i] = table.concat(b)
      end
      local path = os.tmpname()
      local f = assert(io.open(path, "wb"))
      for _, p in ipairs(parts) do f:write(string.format("%04d", #p), p) end
      f:close()
      local py = io.popen("python3 -c \"import sys\nd=open(sys.argv[1],'rb').read()\ni=0\nwhile i<len(d):\n n=int(d[i:i+4]); s=d[i+4:i+4+n]; i+=4+n\n o=s.decode('utf-8','replace').encode()\n sys.stdout.buffer.write(b'%04d'%len(o)+o)\" " .. path)
      local expected = py:read("a")
      py:close()
      os.remove(path)
      local got = {}
      for _, p in ipairs(parts) do
        local o = core.utf8_repair(p)
        got[#got + 1] = string.format("%04d", #o) .. o
      end
      assert.are.equal(expected, table.concat(got))
    end)
  end)

  describe("rmtree", function()
    it("removes a tree without following symlinks out of it", function()
      local outside = assert(core.mkdtemp("/tmp/outside-XXXXXX"))
      assert(core.write_file(outside .. "/keep", "k", 420))
      local top = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      assert(core.mkdir(top .. "/d", 448))
      assert(core.symlink(outside, top .. "/d/link"))
      assert(core.symlink(outside .. "/keep", top .. "/flink"))
      assert(core.write_file(top .. "/d/f", "x", 420))
      assert(core.chmod(top .. "/d", 0))
      assert(core.rmtree(top))
      assert.is_false(core.exists(top))
      assert.is_true(core.exists(outside .. "/keep"))
      assert(core.rmtree(outside))
    end)

    it("removes deeply nested directories", function()
      local top = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      assert.are.equal(0, select(2, H.sh("cd " .. top .. " && python3 -c \"import os\nfor i in range(3000):\n os.mkdir('d'); os.chdir('d')\"")))
      assert(core.rmtree(top))
      assert.is_false(core.exists(top))
    end)

    it("treats a missing path as done", function()
      assert.is_true(core.rmtree("/tmp/corral-test-does-not-exist"))
    end)
  end)

  describe("lock", function()
    it("is exclusive until closed", function()
      local path = os.tmpname()
      local a = assert(core.lock(path))
      assert.is_nil((core.lock(path)))
      a:close()
      a:close()
      local b = assert(core.lock(path))
      b:close()
      os.remove(path)
    end)
  end)
end)

describe("corral.core timers", function()
  it("count a timeout from the spawn even when the loop stood still before it", function()
    local done = false
    assert(core.spawn { file = "/bin/true", args = {}, on_exit = function() done = true end })
    while not done do core.run("once") end
    -- the loop does not run for 1.5 s: its cached clock goes stale
    H.sh("sleep 1.5")
    local res
    assert(core.spawn { file = "/bin/sleep", args = { "0.5" }, timeout = 1,
                        on_exit = function(r) res = r end })
    while not res do core.run("once") end
    assert.is_false(res.timed_out)
    assert.are.equal(0, res.exit_status)
  end)
end)
