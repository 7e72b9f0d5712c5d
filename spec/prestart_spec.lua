-- Launches started ahead of their runs (policy `prestart`, corral-launch --prestart): the next
-- run with the same options takes one, with exactly a cold run's result; nothing runs in it
-- before; other options do not take it; a dead one is not taken; corral.close() lets it go.
local corral = require "corral"
local core = require "corral.core"
local H = require "helper"

local L = "./csrc/corral-launch"

-- The idle launches started ahead by this process (A, whose argv starts with --prestart).
local function prestarted()
  local pids = {}
  for _, pid in ipairs(H.pids_with("corral-launch --prestart ")) do
    local f = io.open("/proc/" .. pid .. "/status")
    local st = f and f:read("a") or ""
    if f then f:close() end
    if tonumber(st:match("PPid:%s*(%d+)")) == core.getpid() then pids[#pids + 1] = pid end
  end
  return pids
end

-- Start a run; wait for it. Returns its proc's pid and the result.
local function run(code, opts)
  local res, rerr
  local proc, err = corral.start(code, opts or {}, function(r, e) res, rerr = r, e or false end)
  assert.is_truthy(proc, tostring(err))
  while res == nil and rerr == nil do core.run("once") end
  assert.is_truthy(res, tostring(rerr))
  -- (after the run: a warm run's pid comes from its interpreter a moment after the start)
  return proc:pid(), res
end

describe("prestarted launches", function()
  local snap
  before_each(function()
    assert(corral.release_prestarted())
    snap = H.snapshot()
  end)
  after_each(function() H.assert_clean(snap) end)

  it("start from a key's second run on, and the next run takes one", function()
    run("print(1)")
    assert.are.same({}, prestarted(), "a key's first run started one")
    run("print(2)")
    local idle = prestarted()
    assert.are.equal(1, #idle)
    -- nothing of a program runs in it meanwhile: under the launcher its init, and the
    -- interpreter, which waits in the prelude for the run (files_wait) and has no code yet
    local init = tonumber((H.sh("ps -o pid= --ppid " .. idle[1])))
    assert.are.equal("corral-launch", H.sh("ps -o comm= -p " .. init))
    assert.is_truthy(H.eventually(function() return H.sh("ps -o comm= --ppid " .. init) == "python3" end, 30),
      "no interpreter waits in the launch")
    local pid, r = run("import os\nprint('taken', sorted(os.listdir('.')), open(__file__).read().count('taken'))")
    assert.are.equal(idle[1], pid, "the run did not take the launch started ahead")
    assert.are.equal("taken [] 2\n", r.stdout)
    assert.is_true(r.ok)
    -- and another is started for the run after
    local again = prestarted()
    assert.are.equal(1, #again)
    assert.are_not.equal(idle[1], again[1])
  end)

  it("are started on request by corral.prestart(opts), and the next run with those options takes it", function()
    local pol = require("corral.policy").load("default"):extend { name = "asked" }
    assert.are.equal(1, corral.prestart { policy = pol, max_output = 5000 })
    assert.are.equal(1, corral.prestart { policy = pol, max_output = 5000 }, "a second call started another")
    local idle = prestarted()
    assert.are.equal(1, #idle)
    -- other options do not take it
    local other = run("print('other')", { policy = pol, max_output = 6000 })
    assert.are_not.equal(idle[1], other)
    local pid, r = run("print('asked')", { policy = pol, max_output = 5000 })
    assert.are.equal(idle[1], pid, "the run did not take the launch started on request")
    assert.are.equal("asked\n", r.stdout)
    -- that was the key's first run: none is started for the next
    assert.are.same({}, prestarted())
    assert.are.equal(0, corral.prestart { policy = pol:extend { prestart = 0 } })
    assert.has_error(function() corral.prestart { max_outptu = 1 } end)
    assert.has_error(function() corral.prestart { policy = "no-such-policy" } end)
  end)

  it("start after the run, on the loop's next turn, for a run that came after a pause, with prestart_after_pause", function()
    corral.configure { prestart_after_pause = true }
    finally(function() corral.configure { prestart_after_pause = false } end)
    local function pause(s)
      local f = false
      local t = core.timer(s, function() f = true end)
      while not f do core.run("once") end
      t:close()
    end
    local slow = "import time\ntime.sleep(0.4)\nprint(1)"
    run(slow)
    pause(0.02)
    -- the key's second run: none is started while it runs, one once it has ended
    local res
    assert(corral.start(slow, {}, function(r) res = r end))
    pause(0.2)
    assert.are.same({}, prestarted(), "a launch was started while the run after a pause ran")
    while not res do core.run("once") end
    core.run("nowait")
    local idle = prestarted()
    assert.are.equal(1, #idle)
    pause(0.02)
    -- back to back (no pause): the next, started from this one's end, has its next launch
    -- started while it runs, as without the setting (started from the callback: a busy
    -- machine may make anything in between longer than a pause)
    local r, p4
    res = nil
    local p3 = assert(corral.start(slow, {}, function(x)
      r = x
      p4 = assert(corral.start(slow, {}, function(y) res = y end))
    end))
    while not p4 do core.run("once") end
    assert.are.equal(idle[1], p3:pid(), "the run after the pause did not take the launch")
    assert.are.equal("1\n", r.stdout)
    pause(0.2)
    local waiting = {}
    for _, w in ipairs(prestarted()) do if w ~= p4:pid() then waiting[#waiting + 1] = w end end
    assert.are.equal(1, #waiting, "a run right after another left its launch for later")
    while not res do core.run("once") end
    -- a run after a pause whose on_done lets go of the launches (a server that stops) leaves
    -- none to start after it
    assert(corral.release_prestarted())
    run(slow)               -- (letting go forgot the key's runs: its first again)
    pause(0.02)
    res = nil
    assert(corral.start(slow, {}, function(x) res = x corral.let_go_prestarted() end))
    while not res do core.run("once") end
    pause(0.02)
    assert.are.same({}, prestarted(), "a launch was started after on_done let them go")
  end)

  it("are not started for a policy table made per run, even at the address of a collected one", function()
    -- a key names its policy table by address, which a new table gets once the old one is
    -- collected: counted by that, every such run but the first would start a launch
    local base = require("corral.policy").load("default")
    local seen, reused = {}, nil
    for i = 1, 60 do
      collectgarbage()
      collectgarbage()
      local p = base:extend { name = "one-off" }
      if seen[tostring(p)] then reused = reused or i end
      seen[tostring(p)] = true
      run("print(1)", { policy = p })
      if reused and i >= reused + 2 then break end
    end
    if not reused then pending("no address was reused in 60 tables") return end
    assert.are.same({}, prestarted())
  end)

  it("give the run exactly a cold run's result: limits, stdin, timeout from the run on", function()
    local pol = require("corral.policy").load("default"):extend { name = "no-prestart", prestart = 0 }
    local code = "import sys\nprint(sys.stdin.read().upper())"
    local _, a = run(code, { stdin = "one" })
    run(code, { stdin = "two" })
    assert.are.equal(1, #prestarted())
    -- a launch idle for a second: the run's wall time and its timeout count from the run
    H.sh("sleep 1")
    local _, b = run(code, { stdin = "three" })
    local _, c = run(code, { stdin = "three", policy = pol })
    assert.are.equal("THREE\n", b.stdout)
    assert.are.same(c.limits, b.limits)
    assert.are.same(a.limits, b.limits)
    assert.is_true(b.usage.wall_s < 0.9, "wall " .. b.usage.wall_s)
    run("import time\ntime.sleep(3)", { timeout = 0.5 })
    run("import time\ntime.sleep(3)", { timeout = 0.5 })
    H.sh("sleep 1")
    local _, t = run("import time\ntime.sleep(3)", { timeout = 0.5 })
    assert.is_true(t.timed_out)
    assert.is_true(t.usage.wall_s < 1.2, "the timeout counted the idle time: wall " .. t.usage.wall_s)
  end)

  it("are taken by a run with files, whose program starts ahead and runs its code only once they are in", function()
    local function files(tag)
      return { { path = "data/" .. tag .. ".txt", content = tag }, { path = "same.txt", content = "s" } }
    end
    local code = "import os\nprint(sorted(os.listdir('data')), open('same.txt').read())\nopen('out.txt', 'w').write('o')"
    run(code, { files = files("first"), collect = true })
    run(code, { files = files("second"), collect = true })
    local idle = prestarted()
    assert.are.equal(1, #idle)
    -- the launch was made while the second run ran, with none of its files: the interpreter is
    -- up and waits for the run's files (files_wait)
    local init = tonumber((H.sh("ps -o pid= --ppid " .. idle[1])))
    assert.is_truthy(init)
    assert.is_truthy(H.eventually(function() return H.sh("ps -o comm= --ppid " .. init) == "python3" end, 30),
      "no interpreter waits in the launch")
    local pid, r = run(code, { files = files("third"), collect = true })
    assert.are.equal(idle[1], pid, "the run with files did not take the launch started ahead")
    assert.is_true(r.ok, r.stderr)
    assert.are.equal("['third.txt'] s\n", r.stdout)
    -- what it was given and left alone does not come back; what it made does
    assert.are.equal(1, #r.files)
    assert.are.equal("out.txt", r.files[1].path)
    -- a run with globs takes its own; what it was given comes back as given
    run(code, { files = files("a"), collect = { "**" } })
    run(code, { files = files("b"), collect = { "**" } })
    local g = prestarted()
    local gpid, gr = run(code, { files = files("c"), collect = { "**" } })
    assert.is_truthy(H.has(g, gpid), "the run with globs did not take its launch")
    local got = {}
    for _, f in ipairs(gr.files) do got[f.path] = f.content end
    assert.are.same({ ["data/c.txt"] = "c", ["same.txt"] = "s", ["out.txt"] = "o" }, got)
  end)

  it("are not taken by a run of other options, nor by a run with stdin for one without", function()
    run("print(1)")
    run("print(1)")
    local idle = prestarted()
    assert.are.equal(1, #idle)
    local p1 = run("print(1)", { memory_mb = 128 })
    local p2 = run("print(1)", { stdin = "x" })
    local p3 = run("print(1)\n# a NUL byte: \0")
    assert.are_not.equal(idle[1], p1)
    assert.are_not.equal(idle[1], p2)
    assert.are_not.equal(idle[1], p3)
    assert.is_truthy(H.has(prestarted(), idle[1]), "the idle launch was let go")
  end)

  it("are not taken once dead: the run starts cold and succeeds", function()
    run("print(1)")
    run("print(1)")
    local idle = prestarted()
    assert.are.equal(1, #idle)
    core.kill(idle[1], 9)
    assert.is_true(H.eventually(function()
      core.run("nowait")
      return not H.has(prestarted(), idle[1])
    end, 3))
    local pid, r = run("print('cold')")
    assert.are_not.equal(idle[1], pid)
    assert.are.equal("cold\n", r.stdout)
  end)

  it("are not taken when the policy changed in place: the run gets the policy as it is now", function()
    local pol = require("corral.policy").load("default"):extend { name = "mutable", env = { STAGE = "one" } }
    local code = "import os\nprint(os.environ['STAGE'])"
    run(code, { policy = pol })
    run(code, { policy = pol })
    local idle = prestarted()
    assert.are.equal(1, #idle)
    pol.env = { STAGE = "two" }
    local pid, r = run(code, { policy = pol })
    assert.are.equal("two\n", r.stdout)
    assert.are_not.equal(idle[1], pid)
    assert.is_false(H.has(prestarted(), idle[1]), "the stale launch was kept")
  end)

  it("leave nothing behind a controller that ends without corral.close()", function()
    local out = H.sh("lua5.4 -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path; "
      .. "package.cpath = \"csrc/?.so;\" .. package.cpath; local c = require(\"corral\"); "
      .. "for i = 1, 3 do io.write(c.run_python(\"print(1)\").stdout) end'")
    assert.are.equal("1\n1\n1", out)
    -- its waiting launch died with it (PR_SET_PDEATHSIG), and its directory went with its Lua state
    assert.is_true(H.eventually(function() return #H.pids_with("corral-launch --prestart ") == 0 end, 10))
  end)

  -- A controller whose Lua state closes (its script ends, os.exit(code, true)) with a run in
  -- flight, or right after it let go of its launches (killed, not yet reaped): every run
  -- directory it made goes with its state. The runs' directories go to a directory of this
  -- test's own (the policy's tmp_dir), so that another controller's cannot be taken for one.
  for _, base in ipairs({ "default", "warm" }) do
    for _, ending in ipairs({ "mid-run", "after letting go" }) do
      it("leave no run directory behind a controller that ends " .. ending .. " (" .. base .. ")", function()
        local d = assert(core.mkdtemp("/tmp/corral-ends.XXXXXX"))
        core.chmod(d, 493) -- 0755: run uids pass through to their code
        local act = ending == "mid-run"
          and "assert(c.start(\"import time\\ntime.sleep(30)\", {policy = pol}, function() end)) "
          or "assert(c.prestart({policy = pol}) > 0) c.let_go_prestarted() "
        local out = H.sh("timeout 20 lua5.4 -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path; "
          .. "package.cpath = \"csrc/?.so;\" .. package.cpath; local c = require(\"corral\"); "
          .. "local pol = c.load_policy(\"" .. base .. "\"):extend{name = \"ends\", tmp_dir = \"" .. d .. "\"} "
          .. act .. "io.write(#require(\"corral.core\").listdir(\"" .. d .. "\")) os.exit(0, true)'; echo \" rc=$?\"")
        local left = core.listdir(d) or {}
        for _, name in ipairs(left) do
          H.eventually(function() return #H.stray_processes() == 0 end, 5)
          core.rmtree(d .. "/" .. name)
        end
        core.rmtree(d)
        assert.are.equal("1 rc=0", out)
        assert.are.same({}, left, "run directories left behind")
      end)
    end
  end

  it("do not keep corral.run_loop() going once the runs are done, warm ones neither", function()
    -- two runs each (the second starts a launch ahead), then the loop in its default mode must
    -- return: a launch waiting for a run that may never come is nothing pending
    local out = H.sh("timeout 20 lua5.4 -e 'package.path = \"lua/?.lua;lua/?/init.lua;\" .. package.path; "
      .. "package.cpath = \"csrc/?.so;\" .. package.cpath; local c = require(\"corral\"); local n = 0; "
      .. "for _, p in ipairs({\"default\", \"default\", \"warm\", \"warm\"}) do "
      .. "assert(c.start(\"print(1)\", {policy = p}, function(r) n = n + #r.stdout end)) c.run_loop() end "
      .. "io.write(n, \" \", #c.let_go_prestarted()) c.close()'; echo \" rc=$?\"")
    assert.are.equal("8 2 rc=0", out)
  end)

  it("start ahead in a warm interpreter too: the next warm run takes one", function()
    local function zygote_children()
      local set = {}
      local z = H.sh("ps -o pid= -o comm= --ppid " .. core.getpid() .. " | awk '$2 == \"corral-zygote\" {print $1}'")
      if z == "" then return set end
      for pid in H.sh("ps -o pid= --ppid " .. z):gmatch("%d+") do set[tonumber(pid)] = true end
      return set
    end
    local code = "import os\nprint('warm', os.getpid())"
    local _, r1 = run(code, { policy = "warm" })
    if not r1.stdout:find("warm 2", 1, true) then
      pending("no warm interpreter here: " .. r1.stdout .. r1.stderr)
      return
    end
    run(code, { policy = "warm" })
    -- its spawner, and the launch started ahead: the init of its namespaces (corral-init),
    -- which the interpreter starts a moment later
    local before
    assert.is_true(H.eventually(function()
      core.run("nowait")
      before = zygote_children()
      local n = 0
      for _ in pairs(before) do n = n + 1 end
      return n >= 2
    end, 5), "no launch was started ahead")
    -- its program too: forked from the interpreter into the launch's namespaces, confined, and
    -- waiting for the run (the code is not there yet), a child of the launch's init
    local waiting
    assert.is_true(H.eventually(function()
      for a in pairs(before) do
        if H.sh("cat /proc/" .. a .. "/comm 2>/dev/null") == "corral-init" then
          waiting = H.sh("ps -o pid= -o comm= --ppid " .. a):match("(%d+)%s+python3") or waiting
        end
      end
      return waiting ~= nil
    end, 5), "the launch started ahead has no program waiting")
    local st = H.sh("cat /proc/" .. waiting .. "/status")
    assert.matches("NoNewPrivs:%s*1", st)
    assert.matches("Seccomp:%s*2", st)
    local pid, r = run(code, { policy = "warm" })
    assert.are.equal("warm 2\n", r.stdout)
    assert.is_true(before[pid] == true, "the warm run did not take the launch started ahead")
    assert(corral.close())
  end)

  it("run a warm program in a session and process group of its own, not the interpreter's", function()
    local _, r1 = run("import os\nprint(os.getpid())", { policy = "warm" })
    if r1.stdout ~= "2\n" then pending("no direct warm run here: " .. r1.stdout .. r1.stderr) return end
    local z = require("corral.warm").list()[1].pid
    local res
    local proc = assert(corral.start("import time\nprint('up', flush=True)\ntime.sleep(2)",
      { policy = "warm", timeout = 5 }, function(r, e) res = r or e end))
    local init, prog
    assert.is_true(H.eventually(function()
      core.run("nowait")
      init = proc:pid()
      prog = init and tonumber(H.sh("ps -o pid= -o comm= --ppid " .. init):match("(%d+)%s+python3"))
      return prog ~= nil
    end, 5), "no program under the run's init")
    -- /proc/PID/stat after the name: state, ppid, pgrp, session (the program leads its own, so
    -- that the scheduler's autogroup of its processes is not its supervisor's)
    local pgrp, sid = H.sh("cat /proc/" .. prog .. "/stat"):match("%) %S+ %d+ (%d+) (%d+)")
    assert.are.equal(prog, tonumber(pgrp))
    assert.are.equal(prog, tonumber(sid))
    assert.are_not.equal(z, tonumber(pgrp))
    -- the host's kill of the run's group ends the init, and with it the namespace's program
    core.kill(-init, 9)
    while res == nil do core.run("once") end
    assert.is_truthy(core.kill(z, 0), "the warm interpreter died with the run")
    assert(corral.close())
  end)

  it("let corral.close(seconds) end at its deadline while a warm run still holds its interpreter", function()
    local r1 = select(2, run("print('warm')", { policy = "warm" }))
    if r1.stdout ~= "warm\n" then pending("no warm interpreter here: " .. r1.stderr) return end
    local zygotes = require("corral.warm").list()
    assert.are.equal(1, #zygotes)
    local res
    assert(corral.start("import time\ntime.sleep(2)\nprint('slept')", { policy = "warm", timeout = 5 },
      function(r, e) res = r or e end))
    -- the interpreter exits once its run is done: close() waits 0.3 s for it, on a loop where
    -- nothing else happens until the run's end 2 s from now
    local t0 = core.hrtime()
    local ok, err = corral.close(0.3)
    local took = core.hrtime() - t0
    assert.is_nil(ok)
    assert.is_truthy(tostring(err):find("ETIMEDOUT", 1, true), tostring(err))
    assert.is_true(took < 1.2, string.format("close(0.3) took %.2f s", took))
    while res == nil do core.run("once") end
    assert.are.equal("slept\n", res.stdout)
    -- its run done, the interpreter exits; the loop sees it go (its socket closed)
    assert.is_true(H.eventually(function()
      core.run("nowait")
      return not core.kill(zygotes[1].pid, 0)
    end, 5))
    core.run("nowait")
  end)

  it("have their mount namespace held by the warm interpreter from the program's fork to their end only", function()
    local code = "import os\nprint(os.readlink('/proc/self/ns/mnt'))"
    local _, r1 = run(code, { policy = "warm" })
    if not r1.stdout:find("^mnt:") then pending("no warm interpreter here: " .. r1.stderr) return end
    local z = require("corral.warm").list()[1].pid
    if H.sh("ls /proc/" .. z .. "/fd 2>/dev/null") == "" then
      assert(corral.close())
      pending("the interpreter's fds cannot be read here")
      return
    end
    -- the interpreter holds a run's mount namespace from the fork of its program to the run's
    -- end (a namespace's number is reused once it is freed: so with no launch started ahead
    -- left, it must hold none)
    local _, r2 = run(code, { policy = "warm" })
    assert.matches("^mnt:%[%d+%]", r2.stdout)
    -- the launch started ahead for the next run: its program forked, the interpreter holds its
    -- namespace
    assert.is_true(H.eventually(function()
      core.run("nowait")
      return H.sh("ls -l /proc/" .. z .. "/fd"):find("mnt:", 1, true) ~= nil
    end, 5), "the interpreter holds no mount namespace of a launch started ahead")
    assert(corral.release_prestarted())
    assert.is_true(H.eventually(function()
      core.run("nowait")
      return not H.sh("ls -l /proc/" .. z .. "/fd"):find("mnt:", 1, true)
    end, 5), "the interpreter still holds a mount namespace")
    assert(corral.close())
  end)

  it("are not started for runs that are not walled off from each other (separation auto), whose programs would reach them", function()
    -- What a controller that is not root gets where user namespaces are refused and there is no
    -- Landlock, when its policy accepts it (separation = "auto"; "require", the default, runs
    -- nothing there): the program has the controller's uid, and no mount namespace hides the run
    -- directories. A launch started ahead would wait in the launcher with its run directory on
    -- the host, made while the previous run runs. (As root each run has a uid of its own.)
    local pol = require("corral.policy").load("default"):extend { name = "exposed-ahead",
      user_namespace = "never", filesystem = "off", separation = "auto" }
    local elsewhere = assert(core.mkdtemp("/tmp/corral-spec-elsewhere-XXXXXX"))
    local F = { { path = "given.txt", content = "given" } }
    local attacker = ([[
import os, time
mine = os.path.dirname(os.getcwd())
base = os.path.dirname(mine)
hit = 0
deadline = time.time() + 3
while not hit and time.time() < deadline:
    for n in os.listdir(base):
        top = os.path.join(base, n)
        if not n.startswith('corral-') or top == mine:
            continue
        try:
            if os.listdir(top + '/code'):
                continue
            # a file for the next run's work dir, and its code written where this run says
            open(top + '/work/planted.txt', 'w').write('not the run')
            os.rename(top + '/code', top + '/code.gone')
            os.symlink('ELSEWHERE', top + '/code')
            hit += 1
        except OSError:
            pass
    time.sleep(0.01)
print('hit', hit)
]]):gsub("ELSEWHERE", elsewhere)
    run("print('first')", { policy = pol, files = F, collect = true })
    local _, a = run(attacker, { policy = pol, files = F, collect = true, timeout = 10 })
    local _, v = run("import os\nSECRET = 'the next run'\nprint(sorted(os.listdir('.')))",
      { policy = pol, files = F, collect = true })
    local left = core.listdir(elsewhere)
    assert(corral.close())
    assert(core.rmtree(elsewhere))
    assert.is_true(v.ok, v.stderr)
    assert.are.equal("['given.txt']\n", v.stdout, "the run saw another run's file (" .. a.stdout .. ")")
    for _, f in ipairs(v.files or {}) do
      assert.are_not.equal("planted.txt", f.path, "the run's result carries another run's file")
    end
    assert.are.same({}, left, "the run's code was written outside its run directory")
  end)

  it("of a walled-off policy are out of reach of runs of another policy that is not (separation auto)", function()
    -- One controller, two policies: `default` (separated: Landlock with the PID namespace, its
    -- launches started ahead) and one that accepts runs without the wall. Such a run has the
    -- controller's uid and no mount namespace: the waiting launch's run directory is in its
    -- reach. It moves the code dir the launch already mounted aside, fills it, and leaves an empty
    -- one for the controller to write the next run's code into; it has ended before that run
    -- starts. (As root each run has a uid of its own.)
    if H.root then return end
    local exposed = require("corral.policy").load("default"):extend { name = "exposed-beside",
      user_namespace = "never", filesystem = "off", separation = "auto" }
    run("print(1)")
    run("print(1)")
    assert.are.equal(1, #prestarted())
    local _, a = run([[
import glob, os
mine = os.path.dirname(os.getcwd())
for top in glob.glob('/dev/shm/corral-*') + glob.glob('/tmp/corral-*'):
    try:
        if top == mine or os.listdir(top + '/code'):
            continue
        os.rename(top + '/code', top + '/held')
        os.mkdir(top + '/code', 0o700)
        open(top + '/held/main.py', 'w').write("print('planted')\n")
        print('planted', top)
    except OSError:
        pass
]], { policy = exposed })
    local _, v = run("print('its own')")
    assert(corral.close())
    assert.is_true(H.has(v.limits, "separated"), table.concat(v.limits, " "))
    assert.are.equal("its own\n", v.stdout, "a separated run ran code an earlier run of another policy left ("
      .. a.stdout .. ")")
  end)

  it("are let go by corral.close(): no process, directory or fd left", function()
    run("print(1)")
    run("print(1)")
    assert.are.equal(1, #prestarted())
    assert(corral.close())
    assert.are.same({}, prestarted())
  end)

  it("are not started by a policy with prestart = 0, and prestart is checked", function()
    local pol = require("corral.policy").load("default"):extend { name = "cold", prestart = 0 }
    run("print(1)", { policy = pol })
    run("print(1)", { policy = pol })
    run("print(1)", { policy = pol })
    assert.are.same({}, prestarted())
    assert.has_error(function()
      require("corral.policy").load("default"):extend({ name = "bad", prestart = 9 }):check()
    end, "policy 'bad': field 'prestart' must be an integer in 0..4")
  end)
end)

describe("corral-launch --prestart", function()
  -- The launcher with its report fd on a socketpair: `go` (bytes to send, or nil to close our
  -- end) after `wait` seconds; returns whether the program ran, the exit status and the report.
  local function launch(go, wait)
    local marker = os.tmpname()
    os.remove(marker)
    local script = [[
import os, socket, subprocess, sys, time
launcher, marker, go, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ours, theirs = socket.socketpair()
def child():
    os.dup2(theirs.fileno(), 3)
p = subprocess.Popen([launcher, "--prestart", "--pidns", "--report-fd", "3", "--",
                      "/bin/sh", "-c", "echo ran > " + marker], preexec_fn=child, pass_fds=(3,))
theirs.close()
time.sleep(wait)
early = os.path.exists(marker)
if go == "close":
    ours.shutdown(socket.SHUT_WR)
else:
    ours.send(go.encode())
status = p.wait(10)
report = b""
ours.settimeout(2)
try:
    while True:
        b = ours.recv(65536)
        if not b: break
        report += b
except OSError:
    pass
print(int(early), int(os.path.exists(marker)), status)
sys.stdout.write(report.decode(errors="replace"))
]]
    local f = assert(io.open(marker .. ".py", "w"))
    f:write(script)
    f:close()
    local out = H.sh("python3 " .. marker .. ".py " .. L .. " " .. marker .. " " .. (go or "close") .. " " .. wait)
    os.remove(marker .. ".py")
    os.remove(marker)
    local early, ran, status = out:match("^(%d) (%d) (%-?%d+)")
    return early == "1", ran == "1", tonumber(status), out
  end

  it("starts the program once a byte comes on the report socket, not before", function()
    local early, ran, status, out = launch("g", 0.5)
    assert.is_false(early, out)
    assert.is_true(ran, out)
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("applied pid-namespace", 1, true), out)
  end)

  it("runs nothing when its host closes the report socket instead", function()
    local early, ran, status, out = launch(nil, 0.3)
    assert.is_false(early, out)
    assert.is_false(ran, out)
    assert.are_not.equal(0, status, out)
  end)
end)
