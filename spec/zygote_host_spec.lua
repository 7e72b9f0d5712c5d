-- core.zygote and core.spawn{zygote = z}: the controller's side of the warm interpreter's
-- protocol, against spec/zygote_peer.py, a real process that speaks the protocol and execs
-- /bin/sh for each request (it can also refuse a request, die, or be slow to name a pid). The
-- real corral-zygote is tested in spec/zygote_spec.lua and through the `warm` policy.
local core = require "corral.core"
local H = require "helper"

local PEER = "spec/zygote_peer.py"

local function start(extra)
  local args = { PEER, "/bin/sh" }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  return assert(core.zygote { file = "/usr/bin/python3", args = args, env = {} })
end

local function spawn(z, args, opts, results)
  opts = opts or {}
  opts.zygote, opts.args, opts.report = z, args, true
  opts.on_exit = function(r) results[#results + 1] = r end
  return assert(core.spawn(opts))
end

local function wait_for(results, n)
  local deadline = core.hrtime() + 60
  while #results < n and core.hrtime() < deadline do core.run("once") end
  assert.are.equal(n, #results)
end

-- Close the zygote and wait until it has exited and its socket is closed here.
local function settle(z)
  local pid = z:pid()
  z:close()
  assert.is_true(H.eventually(function()
    core.run("nowait")
    return not core.kill(pid, 0)
  end))
  for _ = 1, 3 do core.run("nowait") end
end

describe("core.zygote (host side)", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("runs requests with their stdin, stdout, stderr, report and exit status", function()
    local z = start()
    local results = {}
    spawn(z, { "-c", "cat; echo err >&2; echo line >&3; exit 7" }, { stdin = "in\n", stdout_cap = 100, stderr_cap = 100 }, results)
    wait_for(results, 1)
    local r = results[1]
    assert.are.equal("in\n", r.stdout)
    assert.are.equal("err\n", r.stderr)
    assert.are.equal("line\n", r.report)
    assert.are.equal(7, r.exit_status)
    assert.is_true(r.pid > 1)
    assert.is_nil(r.launch_error)
    assert.are.equal("ready", z:state())
    assert.are.same({ "applied fake" }, z:info())
    settle(z)
  end)

  it("queues requests that do not fit in the socket and runs them all", function()
    local z = start()
    local results = {}
    local big = string.rep("x", 20000) -- 300 requests of 20 kB: several times the socket buffer
    for i = 1, 300 do spawn(z, { "-c", "echo " .. i, big }, { stdout_cap = 20 }, results) end
    wait_for(results, 300)
    local seen = {}
    for _, r in ipairs(results) do
      assert.are.equal(0, r.exit_status)
      seen[tonumber(r.stdout)] = true
    end
    for i = 1, 300 do assert.is_true(seen[i], "run " .. i) end
    settle(z)
  end)

  it("kills on timeout, also a run whose pid came late", function()
    local z = start()
    local results = {}
    spawn(z, { "-c", "exec sleep 30" }, { timeout = 0.2, grace = 0.1 }, results)
    spawn(z, { "--slow-pid", "-c", "exec sleep 30" }, { timeout = 0.05, grace = 0.05 }, results)
    wait_for(results, 2)
    for _, r in ipairs(results) do
      assert.is_true(r.timed_out)
      assert.is_true(r.term_signal == 15 or r.term_signal == 9)
    end
    settle(z)
    assert.is_true(H.eventually(function() return #H.pids_with("sleep 30") == 0 end))
  end)

  it("streams a run: stdin stays open for proc:write, output goes to on_output", function()
    local z = start()
    local results, got = {}, { stdout = "", stderr = "" }
    local proc = spawn(z, { "-c", "while read -r l; do echo \"out $l\"; echo \"err $l\" >&2; done; echo done" },
      { stream = true, stdin = "a\n", timeout = 60,
        on_output = function(name, bytes) got[name] = got[name] .. bytes end }, results)
    local function until_(pred)
      local deadline = core.hrtime() + 60
      while not pred() and core.hrtime() < deadline do core.run("once") end
      assert.is_truthy(pred())
    end
    until_(function() return got.stdout == "out a\n" end)
    assert.is_true(proc:write("b\n"))
    until_(function() return got.stdout == "out a\nout b\n" end)
    assert.is_true(proc:close_stdin())
    wait_for(results, 1)
    local r = results[1]
    assert.are.equal("out a\nout b\ndone\n", got.stdout)
    assert.are.equal("err a\nerr b\n", got.stderr)
    assert.are.equal("", r.stdout)
    assert.are.equal(#got.stdout, r.stdout_bytes)
    assert.are.equal(0, r.exit_status)
    assert.is_false(proc:write("late\n"))
    settle(z)
  end)

  it("gives a refused request a launch error", function()
    local z = start()
    local results = {}
    spawn(z, { "--error" }, {}, results)
    wait_for(results, 1)
    assert.are.equal("refused by the peer", results[1].launch_error)
    settle(z)
  end)

  it("ends every run of a zygote that dies, with a launch error", function()
    local z = start()
    local results = {}
    spawn(z, { "-c", "exec sleep 30" }, { timeout = 20 }, results)
    spawn(z, { "--die" }, { timeout = 20 }, results)
    wait_for(results, 2)
    for _, r in ipairs(results) do assert.matches("warm interpreter", r.launch_error) end
    assert.are.equal("exited", z:state())
    settle(z)
    assert.is_true(H.eventually(function() return #H.pids_with("sleep 30") == 0 end))
  end)

  it("ends a run whose end came early (ended) only once its process is gone", function()
    local z = start()
    local results = {}
    local t0 = core.hrtime()
    -- the status comes with `ended` (exit 7), while the process lives on for 0.3 s (its shell,
    -- the marker in its command line); no `exit`
    spawn(z, { "--ended=1792", "-c", "sleep 0.3; : corral-ended-spec" }, {
      timeout = 20 }, results)
    local deadline = core.hrtime() + 10
    while #results < 1 and core.hrtime() < deadline do core.run("once") end
    local alive = #H.pids_with("corral-ended-spec")
    local wall = core.hrtime() - t0
    assert.are.equal(1, #results)
    assert.are.equal(7, results[1].exit_status)
    assert.is_nil(results[1].launch_error)
    assert.are.equal(0, alive)
    assert.is_true(wall >= 0.3, "ended after " .. wall .. " s, before its process")
    settle(z)
  end)

  it("ends a run that ended early with its status when its zygote then dies", function()
    local z = start()
    local results = {}
    spawn(z, { "--ended=1792", "-c", "exec sleep 30" }, { timeout = 20 }, results)
    -- the peer dies; the run's process with it (its parent-death signal)
    spawn(z, { "--die" }, { timeout = 20 }, results)
    wait_for(results, 2)
    local ended = results[1].launch_error and results[2] or results[1]
    assert.are.equal(7, ended.exit_status)
    assert.is_nil(ended.launch_error)
    settle(z)
    assert.is_true(H.eventually(function() return #H.pids_with("sleep 30") == 0 end))
  end)

  it("ends a run with a pidfd of a zygote that dies only once its process is gone", function()
    local z = start()
    local results, alive = {}, {}
    local function keep(r) results[#results + 1] = r; alive[#alive + 1] = #H.pids_with("corral-pidfd-spec") end
    assert(core.spawn { zygote = z, args = { "--pidfd", "-c", "trap '' TERM; sleep 30; : corral-pidfd-spec" },
      report = true, timeout = 20, on_exit = keep })
    local deadline = core.hrtime() + 5
    while #H.pids_with("corral-pidfd-spec") == 0 and core.hrtime() < deadline do core.run("once") end
    assert(core.spawn { zygote = z, args = { "--die" }, report = true, timeout = 20, on_exit = keep })
    wait_for(results, 2)
    for i, r in ipairs(results) do
      assert.matches("warm interpreter", r.launch_error)
      assert.are.equal(0, alive[i], "a process of the run was alive at its end")
    end
    settle(z)
  end)

  it("does not keep the loop running while idle, and exits when closed", function()
    local z = start()
    local t0 = core.hrtime()
    while z:state() == "starting" and core.hrtime() - t0 < 10 do core.run("once") end
    assert.are.equal("ready", z:state())
    t0 = core.hrtime()
    core.run("default") -- nothing pending: returns at once
    assert.is_true(core.hrtime() - t0 < 0.5)
    local pid = z:pid()
    assert.is_true(core.kill(pid, 0))
    settle(z)
    assert.are.equal("closed", z:state())
    assert.has_error(function() core.spawn { zygote = z, args = {}, report = true } end)
    assert.is_nil(core.kill(pid, 0))
  end)

  it("rejects bad options naming them", function()
    assert.has_error(function() core.spawn { zygote = "x", report = true } end,
      "bad argument #1 to 'spawn' (option 'zygote': corral.zygote expected, got string)")
    local z = start()
    assert.has_error(function() core.spawn { zygote = z, args = {} } end,
      "bad argument #1 to 'spawn' (option 'zygote' needs 'report' (a zygote run always has a report fd))")
    assert.has_error(function() core.zygote { file = "/bin/true", nope = 1 } end)
    settle(z)
  end)

  it("ends the runs of a zygote that failed to start with its message", function()
    local z = start({ "--fail-start" })
    local results = {}
    spawn(z, { "-c", "echo never" }, {}, results)
    wait_for(results, 1)
    assert.are.equal("the warm interpreter failed to start: fatal no-network EPERM the peer was told to fail",
      results[1].launch_error)
    assert.are.equal("failed", z:state())
    assert.are.same({ "fatal no-network EPERM the peer was told to fail" }, z:info())
    settle(z)
  end)

  it("reports a zygote that cannot be started", function()
    local z, err, code = core.zygote { file = "/nonexistent/corral-zygote", args = {} }
    assert.is_nil(z)
    assert.are.equal("ENOENT", code)
    assert.matches("cannot start /nonexistent/corral%-zygote", err)
  end)
end)
