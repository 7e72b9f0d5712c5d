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

    it("removes a held directory wherever it went, and follows no link put in its place", function()
      local outside = assert(core.mkdtemp("/tmp/outside-XXXXXX"))
      for _, d in ipairs({ "/code", "/work" }) do assert(core.mkdir(outside .. d, 448)) end
      assert(core.write_file(outside .. "/code/main.py", "k", 420))
      local top = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      local held = assert(core.lock(top))
      assert(core.mkdir(top .. "/code", 448))
      assert(core.mkdir(top .. "/work", 448))
      assert(core.write_file(top .. "/code/main.py", "x", 420))
      assert(os.rename(top, top .. ".moved"))
      assert(core.symlink(outside, top))
      assert(core.chmod(top .. ".moved", 0))
      assert(core.rmtree(top, held))
      held:close()
      assert.is_nil(core.lstat(top))
      assert.is_nil(core.lstat(top .. ".moved"))
      assert.is_truthy(core.lstat(outside .. "/code/main.py"))
      assert.is_truthy(core.lstat(outside .. "/work"))
      -- a directory put in its place is left: it may be another's by then
      top = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      held = assert(core.lock(top))
      assert(os.rename(top, top .. ".moved"))
      assert(core.mkdir(top, 448))
      assert(core.rmtree(top, held))
      assert.is_nil(core.lstat(top .. ".moved"))
      assert.are.equal("directory", core.lstat(top).type)
      held:close()
      -- a closed lock: by the path, as without one
      assert(core.rmtree(top, held))
      assert.is_nil(core.lstat(top))
      assert(core.rmtree(outside))
    end)

    it("removes the names it is given first, and walks what they leave", function()
      local names = { "code/main.py", "code/", "work/" }
      for _, extra in ipairs({ false, "/work/x", "/y" }) do
        local top = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
        local held = assert(core.lock(top))
        assert(core.mkdir(top .. "/code", 448))
        assert(core.mkdir(top .. "/work", 448))
        assert(core.write_file(top .. "/code/main.py", "x", 420))
        if extra then assert(core.write_file(top .. extra, "x", 420)) end
        assert(os.rename(top, top .. ".moved"))
        assert(core.rmtree(top, held, names))
        held:close()
        assert.is_nil(core.lstat(top .. ".moved"))
      end
      local top = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      local held = assert(core.lock(top))
      for _, bad in ipairs({ { "/x" }, { "../x" }, { "a/./b" }, { "a//b" }, { "" }, { {} } }) do
        assert.has_error(function() core.rmtree(top, held, bad) end)
      end
      assert(core.rmtree(top, held, {}))
      held:close()
      assert.is_nil(core.lstat(top))
    end)
  end)

  describe("records_unpack and records_read", function()
    -- a record of a run's collection (csrc/launch/records.h)
    local function rec(kind, path, size, mode, bytes)
      return kind .. "\0" .. path .. "\0" .. size .. "\0" .. mode .. "\0" .. #bytes .. "\0" .. bytes
    end
    local function rec_end(seen, flags) return "end\0" .. seen .. "\0" .. flags .. "\0" end
    local F1 = rec("f", "b.txt", 3, "644", "b\0\255")
    local F2 = rec("f", "a/c.bin", 10, "100600", "12345")
    local L1 = rec("l", "a/link", 11, "777", "/etc/shadow")
    local E1 = rec("e", "secret", 7, "0", "EACCES")
    local WANT = {
      { path = "a/c.bin", type = "file", size = 10, mode = 384, content = "12345", truncated = true },
      { path = "a/link", type = "link", mode = 511, target = "/etc/shadow" },
      { path = "b.txt", type = "file", size = 3, mode = 420, content = "b\0\255", truncated = false },
      { path = "secret", type = "error", size = 7, mode = 0, error = "EACCES" },
    }
    local ALL = F1 .. F2 .. L1 .. E1
    -- { records, entries wanted (the first n of WANT's order, or a list), complete, seen, flags }
    local cases = {
      { ALL .. rec_end(9, "files,bytes"), WANT, true, 9, "files,bytes" },
      { "", {}, false, 0, "" },
      { rec_end(0, ""), {}, true, 0, "" },
      { "end\0", {}, false, 0, "" },                                  -- an end without its fields
      { "end\0" .. "3\0", {}, false, 3, "" },                         -- nor its flags
      { "end\0x\0", {}, false, 0, "" },                              -- nor a number of entries
      { ALL, WANT, false, 0, "" },                                     -- killed before the end
      { F1 .. F2:sub(1, -3), { WANT[3] }, false, 0, "" },              -- content cut short
      { F1 .. "f\0a/c.bin\010\0", { WANT[3] }, false, 0, "" },        -- a head cut short
      { F1 .. rec("f", "x", "1x", "644", "x"), { WANT[3] }, false, 0, "" },
      { F1 .. rec("f", "x", "", "644", "x"), { WANT[3] }, false, 0, "" },
      { F1 .. rec("f", "x", "-1", "644", "x"), { WANT[3] }, false, 0, "" },
      { F1 .. rec("f", "x", "1", "9", "x"), { WANT[3] }, false, 0, "" }, -- not octal
      { F1 .. rec("f", "x", "99999999999999999999", "644", "x"), { WANT[3] }, false, 0, "" },
      { F1 .. "f\0x\0" .. "1\0" .. "644\0" .. "9223372036854775807\0x", { WANT[3] }, false, 0, "" },
      { F1 .. "file!!!!\0x\01\0644\01\0x" .. rec_end(1, ""), { WANT[3] }, false, 0, "" }, -- a kind too long
      { F1 .. "\0\0\0\0\0" .. rec_end(1, ""), { WANT[3] }, false, 0, "" },  -- empty fields: no numbers
      -- a kind of no meaning, the path of no file: an error entry (the caller bounds the list)
      { F1 .. rec("?", "", 0, "0", ""), { { path = "", type = "error", size = 0, mode = 0, error = "" }, WANT[3] },
        false, 0, "" },
    }

    local function same(want, list)
      assert.are.equal(#want, #list)
      for i, w in ipairs(want) do assert.are.same(w, list[i]) end
    end

    local dir
    before_each(function() dir = assert(core.mkdtemp("/tmp/corral-test-XXXXXX")) end)
    after_each(function() assert(core.rmtree(dir)) end)

    for i, c in ipairs(cases) do
      it("reads records #" .. i .. " from a string and from a file alike", function()
        local list, complete, seen, flags = core.records_unpack(c[1])
        same(c[2], list)
        assert.are.same({ c[3], c[4], c[5] }, { complete, seen, flags })
        assert(core.write_file(dir .. "/r", c[1]))
        list, complete, seen, flags = core.records_read(dir .. "/r", 1 << 30)
        same(c[2], list)
        assert.are.same({ c[3], c[4], c[5] }, { complete, seen, flags })
      end)
    end

    it("gives a file that holds what it was given the given string itself, and nothing else", function()
      local given = { ["in/a"] = ("a"):rep(5000), ["b"] = "", ["c"] = "ccc" }
      local data = rec("s", "in/a", 5000, "644", "") .. rec("s", "b", 0, "600", "") .. F1 .. rec_end(3, "")
      local want = {
        { path = "b", type = "file", size = 0, mode = 384, content = "", truncated = false },
        WANT[3],
        { path = "in/a", type = "file", size = 5000, mode = 420, content = given["in/a"], truncated = false },
      }
      for _, list in ipairs({ { core.records_unpack(data, given) }, (function()
        assert(core.write_file(dir .. "/r", data))
        return { core.records_read(dir .. "/r", 1 << 30, given) }
      end)() }) do
        same(want, list[1])
        assert.is_true(list[2])
        assert.is_true(rawequal(given["in/a"], list[1][3].content))
      end
      -- not given, another size, bytes stored with it, no table: the list stops there
      for _, bad in ipairs({ rec("s", "x", 1, "644", ""), rec("s", "c", 2, "644", ""), rec("s", "c", 3, "644", "ccc") }) do
        local list, complete = core.records_unpack(F1 .. bad .. rec_end(2, ""), given)
        same({ WANT[3] }, list)
        assert.is_false(complete)
      end
      local list, complete = core.records_unpack(F1 .. rec("s", "c", 3, "644", "") .. rec_end(2, ""))
      same({ WANT[3] }, list)
      assert.is_false(complete)
      assert.has_error(function() core.records_unpack(data, "given") end)
    end)

    it("sorts by the bytes of the paths", function()
      local names = { "b", "a/b", "a", "B", "a0", "\255", "a\1" }
      local data = {}
      for i, n in ipairs(names) do data[i] = rec("f", n, 1, "644", "x") end
      local list = core.records_unpack(table.concat(data))
      local got = {}
      for i, e in ipairs(list) do got[i] = e.path end
      assert.are.same({ "B", "a", "a\1", "a/b", "a0", "b", "\255" }, got)
    end)

    it("reads contents across and beyond its 64 KiB buffer, and stops at max", function()
      local parts, big = {}, ("0123456789"):rep(20000) .. "!"
      for i = 1, 40 do parts[#parts + 1] = rec("f", ("f%02d"):format(i), 7777 + i, "644", ("y"):rep(7777 + i)) end
      parts[#parts + 1] = rec("f", "g-big", #big, "644", big)
      parts[#parts + 1] = rec("f", "h-after", 1, "644", "z")
      parts[#parts + 1] = rec_end(42, "")
      local data = table.concat(parts)
      assert(core.write_file(dir .. "/r", parts))
      local a = { core.records_unpack(data) }
      local b = { core.records_read(dir .. "/r", #data) }
      assert.are.equal(42, #b[1])
      assert.are.same(a, b)
      assert.are.equal(big, b[1][41].content)
      -- at most max bytes: the list stops where they do, not complete
      local cut = #table.concat(parts, "", 1, 40) + 100
      local list, complete = core.records_read(dir .. "/r", cut)
      assert.are.equal(40, #list)
      assert.is_false(complete)
      list, complete = core.records_read(dir .. "/r", 0)
      assert.are.same({}, list)
      assert.is_false(complete)
    end)

    it("stops at a field longer than its buffer in a file, and at a content the file does not hold", function()
      local long = ("p"):rep(70000)
      assert(core.write_file(dir .. "/r", F1 .. rec("f", long, 1, "644", "x") .. rec_end(2, "")))
      local list, complete = core.records_read(dir .. "/r", 1 << 30)
      same({ WANT[3] }, list)
      assert.is_false(complete)
      list = core.records_unpack(F1 .. rec("f", long, 1, "644", "x"))
      assert.are.equal(long, list[2].path)
      -- a content said to be 1 GiB: nothing is allocated for it
      assert(core.write_file(dir .. "/r2", F1 .. "f\0x\0" .. "1073741824\0644\0" .. "1073741824\0abc"))
      list, complete = core.records_read(dir .. "/r2", 1 << 40)
      same({ WANT[3] }, list)
      assert.is_false(complete)
    end)

    -- from a string and from a file alike: { list, complete, seen, flags }
    local function both(data, given, caps)
      local a = { core.records_unpack(data, given, caps) }
      os.remove(dir .. "/r")
      assert(core.write_file(dir .. "/r", data))
      local b = { core.records_read(dir .. "/r", 1 << 30, given, caps) }
      assert.are.same(a, b)
      return a
    end

    it("makes at most the caps' entries, in the records' order, and passes over the rest", function()
      local parts = {}
      for i = 1, 250 do parts[i] = rec(i % 2 == 0 and "f" or "l", ("p%03d"):format(251 - i), 1, "644", "x") end
      local body = table.concat(parts)
      -- { records, caps, entries made, complete, flags }
      for _, c in ipairs({
        { body .. rec_end(250, ""), { files = 100 }, 100, true, "files" },
        { body .. rec_end(250, "scan"), { files = 100 }, 100, true, "scan,files" },
        { body .. rec_end(250, "bytes,files"), { files = 100 }, 100, true, "bytes,files" },
        { body .. rec_end(250, ""), { files = 250 }, 250, true, "" },          -- exactly the cap
        { body .. rec_end(250, ""), { files = 0 }, 0, true, "files" },
        { body, { files = 100 }, 100, false, "files" },                       -- no end record
        -- past the cap, a record is still read as one: cut short or not well formed, it ends the list
        { body .. rec("f", "z", "1x", "644", "x") .. rec_end(251, ""), { files = 100 }, 100, false, "files" },
        { body .. "f\0z\0" .. "1\0" .. "644\0" .. "9\0xx", { files = 100 }, 100, false, "files" },
        { body .. rec("s", "z", 1, "644", "") .. rec_end(251, ""), { files = 100 }, 100, false, "files" },
      }) do
        local r = both(c[1], nil, c[2])
        assert.are.equal(c[3], #r[1])
        assert.are.same({ c[4], c[5] }, { r[2], r[4] })
        -- the first records, sorted: p250 down to p151
        if c[3] == 100 then
          assert.are.same({ "p151", "p250" }, { r[1][1].path, r[1][100].path })
        end
      end
    end)

    it("cuts contents to the caps, each and in all, and flags what the sum cut", function()
      local given = { ["in/g"] = "given!" }
      local data = rec("s", "in/g", 6, "644", "") .. rec("f", "a", 8, "644", "abcdefgh")
        .. rec("l", "b", 0, "777", "a-long-target") .. rec("f", "c", 8, "644", "12345678")
        .. rec("f", "d", 1, "644", "xyz") .. rec("f", "e", 1, "644", "q") .. rec("e", "f", 1, "0", "EACCES")
        .. rec_end(6, "")
      local r = both(data, given, { file_bytes = 4, bytes = 13 })
      local got = {}
      for _, e in ipairs(r[1]) do got[e.path] = { e.content or e.target or e.error, e.size, e.truncated } end
      assert.are.same({
        ["in/g"] = { "give", 6, true },      -- 4 of 13: cut by file_bytes, not flagged
        a = { "abcd", 8, true },             -- 8 of 13
        b = { "a-long-target" },             -- a link's target is no content
        c = { "1234", 8, true },             -- 12 of 13
        d = { "x", 3, true },                -- 1 left: cut by the sum; its size said 1, 3 stored
        e = { "", 1, true },                 -- none left
        f = { "EACCES", 1 },
      }, got)
      assert.are.same({ true, 6, "bytes" }, { r[2], r[3], r[4] })
      -- within the caps: as without them; a given content is the given string itself
      r = both(data, given, { file_bytes = 8, bytes = 100 })
      assert.are.same({ r[1], true, "" }, { core.records_unpack(data, given), r[2], r[4] })
      assert.is_true(rawequal(given["in/g"], r[1][7].content))
    end)

    it("passes over a content past the caps across and beyond the buffer of a file", function()
      local big = ("0123456789"):rep(20000)
      local data = rec("f", "a-big", #big, "644", big) .. rec("f", "b-big", #big, "644", big)
        .. rec("f", "c", 1, "644", "z") .. rec("f", "d", 2, "644", "zz") .. rec_end(4, "")
      local r = both(data, nil, { files = 3, file_bytes = 70000, bytes = 100000 })
      assert.are.equal(3, #r[1])
      assert.are.equal(big:sub(1, 70000), r[1][1].content)
      assert.are.equal(big:sub(1, 30000), r[1][2].content)
      assert.are.same({ "", #big, true }, { r[1][3].content, r[1][2].size, r[1][2].truncated })
      assert.are.same({ true, 4, "files,bytes" }, { r[2], r[3], r[4] })
    end)

    it("refuses caps that are not whole numbers of 0 or more, by name", function()
      for _, bad in ipairs({ { file = 1 }, { files = -1 }, { bytes = 1.5 }, { file_bytes = "10" }, { [1] = 5 }, "caps" }) do
        assert.has_error(function() core.records_unpack("", nil, bad) end)
        assert.has_error(function() core.records_read(dir .. "/none", 10, nil, bad) end)
      end
      local ok, err = pcall(core.records_unpack, "", nil, { files = 1, bites = 2 })
      assert.is_false(ok)
      assert.matches("bites", err)
      assert.are.equal(0, #core.records_unpack(rec_end(0, ""), nil, { files = 1.0, bytes = 0 }))
    end)

    it("refuses what is not a regular file, never through a link, and leaks no fd", function()
      local fds = #core.fds()
      assert(core.write_file(dir .. "/r", ALL))
      assert(core.symlink(dir .. "/r", dir .. "/link"))
      local list, err, code = core.records_read(dir .. "/link", 100)
      assert.is_nil(list)
      assert.are.equal("ELOOP", code, err)
      list, err, code = core.records_read(dir, 100)
      assert.is_nil(list)
      assert.are.equal("EINVAL", code, err)
      list, err, code = core.records_read(dir .. "/missing", 100)
      assert.is_nil(list)
      assert.are.equal("ENOENT", code, err)
      assert.has_error(function() core.records_read(dir .. "/r\0x", 100) end)
      assert.has_error(function() core.records_read(dir .. "/r", -1) end)
      assert.has_error(function() core.records_unpack({}) end)
      assert.are.equal(fds, #core.fds())
    end)
  end)

  describe("write_file", function()
    it("writes a list of strings as one, in as many writes as it takes", function()
      local dir = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      local parts = {}
      for i = 1, 3000 do parts[i] = i % 3 == 0 and "" or tostring(i) .. ("-"):rep(i % 7) end
      assert(core.write_file(dir .. "/f", parts, 384))
      assert.are.equal(table.concat(parts), H.read(dir .. "/f"))
      assert.are.equal(384, core.lstat(dir .. "/f").mode)
      assert.is_nil((core.write_file(dir .. "/f", parts)))
      assert.has_error(function() core.write_file(dir .. "/g", { "a", 1, {} }) end)
      assert.is_false(core.exists(dir .. "/g"))
      assert(core.rmtree(dir))
    end)

    it("appends to a file that exists, one another process may hold open, never through a link", function()
      local dir = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      local f = dir .. "/f"
      assert(core.write_file(f, "", 384))
      local held = assert(io.open(f, "rb"))
      assert(core.append_file(f, "a"))
      assert(core.append_file(f, { "b", "", "cd" }))
      assert.are.equal("abcd", held:read("a"))
      held:close()
      assert.are.equal(384, core.lstat(f).mode)
      local ok, err, code = core.append_file(dir .. "/missing", "x")
      assert.is_nil(ok)
      assert.are.equal("ENOENT", code, err)
      assert.is_false(core.exists(dir .. "/missing"))
      assert(core.symlink(f, dir .. "/link"))
      ok, err, code = core.append_file(dir .. "/link", "x")
      assert.is_nil(ok)
      assert.are.equal("ELOOP", code, err)
      ok, err, code = core.append_file(dir, "x")
      assert.is_nil(ok)
      assert.are.equal("EISDIR", code, err)
      assert.are.equal("abcd", H.read(f))
      assert(core.rmtree(dir))
    end)
  end)

  describe("create_file", function()
    it("keeps a file open for appending and reading back once its name is gone", function()
      local dir = assert(core.mkdtemp("/tmp/corral-test-XXXXXX"))
      local fds = #core.fds()
      local f = assert(core.create_file(dir .. "/f", 256))
      assert.are.equal(256, core.lstat(dir .. "/f").mode)
      assert.is_nil((core.create_file(dir .. "/f")))
      local other = assert(io.open(dir .. "/f", "rb"))
      assert(os.remove(dir .. "/f"))
      local rec = "f\0a\0" .. "1\0" .. "644\0" .. "1\0" .. "A"
      assert(f:append(rec))
      assert(f:append({ "end\0", "1\0", "\0" }))
      assert.are.equal(rec .. "end\0" .. "1\0" .. "\0", other:read("a"))
      other:close()
      for _ = 1, 2 do
        local list, complete = core.records_read(f, 1 << 20)
        assert.is_true(complete)
        assert.are.equal(1, #list)
        assert.are.equal("A", list[1].content)
      end
      f:close()
      f:close()
      assert.has_error(function() f:append("x") end)
      assert.has_error(function() core.records_read(f, 10) end)
      assert.are.equal(fds, #core.fds())
      assert(core.symlink(dir .. "/g", dir .. "/link"))
      local ok, err, code = core.create_file(dir .. "/link")
      assert.is_nil(ok)
      assert.are.equal("EEXIST", code, err)
      assert.is_false(core.exists(dir .. "/g"))
      assert(core.rmtree(dir))
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
