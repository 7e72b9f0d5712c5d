-- The hostile-program suite: every case of spec/hostile/*.lua (the machinery is in
-- spec/hostile/support.lua), run a few at a time on one loop. Besides its own
-- expectation, every case is checked for:
--   1. time: the run returned within its timeout + S.SLACK;
--   2. survivors: no process of the run is alive when it has ended (its code dir or marker in
--      argv, or, as root, its uid), looked up before its clean-up;
--   3. host leaks: nothing named with its marker in /tmp, /var/tmp, /dev/shm, $HOME, the tree or
--      a world-writable host dir, nothing but .lock, code/main.py and work/ in its run directory
--      (the code dir and the parent of the work dir), and the run directory gone afterwards;
--   4. the next run: an inspector program, run right after it (as root under the same uid), sees
--      nothing of it: no marker-named file, socket (abstract ones included), IPC object or key,
--      no process, an empty /var/tmp, /dev/shm and work dir;
--   5. every protection named in its `needs` is in result.limits (never skipped: a case that needs
--      a protection not yet merged fails until it is);
--   6. a case with `known_hole` fails with that description, whatever else happens.
-- A case (fields, all but name and code optional):
--   name       unique; also the test's name
--   code       Python source, or function(ctx) returning it (ctx: marker, token, tree,
--              host_home, controller_pid, root, host_uid, world_writable, + what setup returned)
--   prologue   false: do not prepend the scatter prologue (S.prologue)
--   opts       run_python options (a table, or function(ctx)); `policy` is set by the runner
--   variant    a policy variant of S.variants ("default", "no-pidns", "bare", "host-net",
--              "host-work")
--   controller "child": run in a controller process of its own (spec/hostile/controller.lua),
--              with CORRAL_HOSTILE_SECRET in its environment; ctx.controller_pid is that process
--   setup      function(ctx) -> extra ctx values (host helpers: list their pids in helper_pids)
--   teardown   function(ctx)
--   companion  {code = string|function(ctx), opts = {...}}: a run started alongside (a victim),
--              its result in o.companion.res for `check`
--   expect     {reason, returncode, signal (false: none), ok, timed_out, truncated, stdout,
--              stderr (Lua patterns, or lists of them), stdout_not, stderr_not, stdout_exact,
--              max_elapsed}; or function(ctx) returning it
--   needs      limit names that must be in result.limits
--   check      function(r, ctx, o): extra luassert checks (o: the whole outcome)
--   known_hole description of a hole corral has: the case fails with it until it is fixed
local corral = require "corral"
local core = require "corral.core"
local cjson = require "cjson"
local H = require "helper"
local S = require "hostile.support"

local paths = require "corral.paths"

local CONCURRENCY = 4
local SLACK = S.SLACK       -- a run must return within its timeout + SLACK
local DEFAULT_TIMEOUT = 5   -- the default policy's

local tree = assert(core.realpath("."))
local places = S.host_places(tree)

local function case_timeout(case, ctx)
  local o = case.opts
  if type(o) == "function" then o = o(ctx) end
  return (o and o.timeout) or DEFAULT_TIMEOUT
end

local function as_list(v)
  if v == nil then return {} end
  if type(v) == "table" then return v end
  return { v }
end

-- Every way `o` (the outcome of `case`) falls short; an empty list when it passed.
local function evaluate(case, ctx, o)
  local P = {}
  local function bad(fmt, ...) P[#P + 1] = string.format(fmt, ...) end
  if case.known_hole then bad("KNOWN HOLE (fix corral, then drop known_hole): %s", case.known_hole) end
  if o.setup_error then bad("setup failed: %s", o.setup_error) end
  local r = o.res
  if not r then
    bad("no result: %s (%s)", tostring(o.err), tostring(o.code))
  else
    local limit = case_timeout(case, ctx) + SLACK
    if o.elapsed > limit then bad("took %.2f s, more than timeout + %.1f s = %.2f s", o.elapsed, SLACK, limit) end
    for _, n in ipairs(case.needs or {}) do
      if not S.has(r.limits, n) then bad("result.limits lacks %q, which this case needs", n) end
    end
    if r.cleanup_error then bad("clean-up failed: %s", r.cleanup_error) end
    local e = case.expect
    if type(e) == "function" then e = e(ctx) end
    e = e or {}
    for _, k in ipairs({ "reason", "returncode", "ok", "timed_out", "truncated" }) do
      if e[k] ~= nil and r[k] ~= e[k] then bad("%s is %s, expected %s", k, tostring(r[k]), tostring(e[k])) end
    end
    if e.signal ~= nil and r.signal ~= (e.signal or nil) then
      bad("signal is %s, expected %s", tostring(r.signal), tostring(e.signal or nil))
    end
    for _, stream in ipairs({ "stdout", "stderr" }) do
      for _, pat in ipairs(as_list(e[stream])) do
        if not r[stream]:find(pat) then bad("%s does not match %q: %q", stream, pat, r[stream]:sub(1, 400)) end
      end
      for _, pat in ipairs(as_list(e[stream .. "_not"])) do
        if r[stream]:find(pat) then bad("%s matches %q: %q", stream, pat, r[stream]:sub(1, 400)) end
      end
    end
    if e.stdout_exact and r.stdout ~= e.stdout_exact then
      bad("stdout is %q, expected %q", r.stdout:sub(1, 400), e.stdout_exact)
    end
    if e.max_elapsed and o.elapsed > e.max_elapsed then
      bad("took %.2f s, expected at most %.2f s", o.elapsed, e.max_elapsed)
    end
    if case.check then
      local ok, err = pcall(case.check, r, ctx, o)
      if not ok then bad("check: %s", tostring(err)) end
    end
  end
  -- survivors and what the run left in its own directory, for the run and its companion
  S.sink_problems(o.sink, "", bad)
  S.sink_problems(o.companion and o.companion.sink, "companion: ", bad)
  if o.companion and not o.companion.res then
    bad("companion: no result: %s", tostring(o.companion.err))
  elseif o.companion then
    local limit = ((case.companion.opts or {}).timeout or DEFAULT_TIMEOUT) + SLACK
    if o.companion.elapsed > limit then bad("companion: took %.2f s, more than its timeout + %.1f s", o.companion.elapsed, SLACK) end
  end
  S.after_problems(o, bad)
  return P
end

-- Run `case` (and its companion and inspector); calls done(outcome) when all is over.
local function start_case(case, prefix, done)
  local o, ctx, extra, ignore = S.case_start(case, prefix, tree)
  local pending = 0
  local companion_proc

  -- the checks run before the teardown, which ends the host helpers they may look at
  local function finish()
    local ok, problems = pcall(evaluate, case, ctx, o)
    o.problems = ok and problems or { "the runner failed to evaluate the case: " .. tostring(problems) }
    if case.teardown then
      local tok, e = pcall(case.teardown, ctx)
      if not tok then o.problems[#o.problems + 1] = "teardown failed: " .. tostring(e) end
    end
    if o.not_taken then o.problems[#o.problems + 1] = o.not_taken end
    done(o)
  end
  local function after_runs()
    S.start_inspector(case, ctx, o, function(rep, err)
      o.inspector, o.inspector_error = rep, err
      o.host_leaks = S.host_leaks(ctx.marker, places)
      finish()
    end)
  end
  local function one_done()
    pending = pending - 1
    if pending == 0 then after_runs() end
  end

  -- the companion first: the case's code may name its launcher's pid
  if case.companion then
    pending = pending + 1
    local c = case.companion
    local csink = { marker = ctx.marker .. "c", ignore = ignore }
    o.companion = { sink = csink }
    local copts = {}
    for k, v in pairs(c.opts or {}) do copts[k] = v end
    copts.policy = S.test_policy(c.variant, csink)
    local t0 = core.hrtime()
    local started, proc, err, ecode = pcall(function()
      local code = type(c.code) == "function" and c.code(ctx) or c.code
      return corral.start(code, copts, function(r, rerr, rcode)
        o.companion.res, o.companion.err, o.companion.code = r, rerr, rcode
        o.companion.elapsed = core.hrtime() - t0
        one_done()
      end)
    end)
    if not started then proc, err = nil, "the runner could not start it: " .. tostring(proc) end
    if proc then
      ctx.companion_pid = proc:pid()
      companion_proc = proc
    else
      o.companion.err = tostring(err) .. " " .. tostring(ecode)
      pending = pending - 1
    end
  end

  local function start_main()
    pending = pending + 1
    if case.controller == "child" then
      ctx.secret = "hostile-secret-" .. S.random_hex(8)
      extra.companion_pid = ctx.companion_pid
      local env = { "CORRAL_HOSTILE_SECRET=" .. ctx.secret, "HOSTILE_CTX=" .. cjson.encode(next(extra) and extra or { none = true }),
                    "HOME=" .. ctx.host_home, "PATH=/usr/bin:/bin",
                    "HOSTILE_WORLD_WRITABLE=" .. cjson.encode(S.world_writable()), "HOSTILE_BASE=" .. S.base }
      if S.zygote then env[#env + 1] = "CORRAL_ZYGOTE=" .. S.zygote end
      local timeout = case_timeout(case, ctx)
      local spawned, err = core.spawn {
        file = "/usr/bin/" .. S.LUA,
        args = { "spec/hostile/controller.lua", case.name, prefix, tree },
        env = env,
        timeout = timeout + 15,
        on_exit = function(raw)
          local out = S.last_json(raw.stdout)
          if out then
            o.res, o.err, o.code, o.elapsed = out.res, out.err, out.code, out.elapsed
            o.sink = out.sink
            for _, k in ipairs({ "strays", "top_extra" }) do
              if o.sink and type(o.sink[k]) ~= "table" then o.sink[k] = {} end
            end
            o.child_pid = out.controller_pid
          else
            o.err = string.format("the child controller died (exit %d, signal %d) without a result: %s",
              raw.exit_status, raw.term_signal, (raw.stdout .. raw.stderr):sub(1, 300))
            o.elapsed = raw.wall_s
            -- it could not clean up: do it here, after its launcher (PDEATHSIG) is gone
            local top = raw.stderr:match("top (%S+)")
            o.sink = { top = top, strays = {}, top_extra = {} }
            if top then
              H.eventually(function() return #S.strays(nil, top .. "/code", ctx.marker, ignore) == 0 end, 10)
              o.sink.strays = S.strays(nil, top .. "/code", ctx.marker, ignore)
              for _, line in ipairs(o.sink.strays) do core.kill(tonumber(line:match("^(%d+)")), 9) end
              core.rmtree(top)
            end
          end
          one_done()
        end,
      }
      if not spawned then
        o.err = "cannot start the child controller: " .. tostring(err)
        pending = pending - 1
      end
    else
      local sink = { marker = ctx.marker, ignore = ignore }
      o.sink = sink
      local t0
      local started, proc, err, ecode = pcall(function()
        local code = S.case_code(case, ctx)
        local opts = S.case_opts(case, ctx, sink)
        -- every other case runs in a launch started ahead for it (corral.prestart), and the
        -- other base's run of the case does the opposite: each program meets both paths
        -- (a variant without a PID namespace starts none). The launches the library started
        -- ahead by itself (for the inspector's repeated runs, as nobody) go first: what waits
        -- after the start is then this case's, not taken.
        o.ahead = (case.index + (S.base == "warm" and 1 or 0)) % 2 == 0 and not code:find("\0", 1, true)
        if o.ahead then
          corral.let_go_prestarted()
          o.ahead = assert(corral.prestart(opts)) > 0
        end
        t0 = core.hrtime()
        local p, e, c = corral.start(code, opts, function(r, rerr, rcode)
          o.res, o.err, o.code = r, rerr, rcode
          o.elapsed = core.hrtime() - t0
          one_done()
        end)
        -- the run takes it; one left would hold a uid meanwhile
        if o.ahead and #corral.let_go_prestarted() > 0 then
          o.not_taken = "the run did not take the launch started ahead for it"
        end
        return p, e, c
      end)
      if not started then proc, err, ecode = nil, "the runner could not start the case: " .. tostring(proc), "ERUNNER" end
      if not proc then
        o.err, o.code, o.elapsed = err, ecode, 0
        pending = pending - 1
      end
    end
    if pending == 0 then after_runs() end
  end

  -- a warm run's pid comes from its zygote a moment after the start, and the case's code may
  -- name it: wait for it between loop turns
  local function when_pid_known()
    if companion_proc:pid() == 0 and not companion_proc:done() then
      S.waiting[#S.waiting + 1] = when_pid_known
      return
    end
    ctx.companion_pid = companion_proc:pid()
    start_main()
  end
  if companion_proc and companion_proc:pid() == 0 then
    S.waiting[#S.waiting + 1] = when_pid_known
  else
    start_main()
  end
  return ctx
end

local function run_cases(list, prefix, concurrency)
  return S.run_cases(list, start_case, prefix, concurrency)
end

-- A zygote that takes the spawner path for every run: a copy of corral-zygote in a directory
-- without corral-init, which the direct path execs (csrc/zygote/direct.c). Its runs go as those
-- of a run cgroup and of a kernel that refuses the direct clone do: launcher, init, joiner,
-- midwife, program. Returns the copy's path and a function that removes it.
local function spawner_zygote()
  local src = assert(paths.zygote())
  local dir = assert(core.mkdtemp("/tmp/corral-spawner-path.XXXXXX"))
  assert(os.execute("cp '" .. src .. "' '" .. dir .. "/corral-zygote' && chmod 0755 '" .. dir .. "' '" ..
    dir .. "/corral-zygote'"))
  return dir .. "/corral-zygote", function() os.execute("rm -rf '" .. dir .. "'") end
end

-- "warm-spawner": the warm policy, every run by the spawner path (the direct path is the warm
-- policy's usual one): an untested confinement path would be a hole.
for _, base in ipairs({ "default", "warm", "warm-spawner" }) do
  describe("hostile programs (" .. base .. ")", function()
    local cases = S.load_cases()
    local outcomes, snap, t_all
    local prefix = "hst" .. S.random_hex(4)
    local real_zygote, remove_copy = paths.zygote, nil

    lazy_setup(function()
      S.base = base == "warm-spawner" and "warm" or base
      if base == "warm-spawner" then
        S.zygote, remove_copy = spawner_zygote()
        paths.zygote = function() return S.zygote end
      end
      snap = H.snapshot()
      local t0 = core.hrtime()
      outcomes = run_cases(cases, prefix, CONCURRENCY)
      t_all = core.hrtime() - t0
      if os.getenv("HOSTILE_VERBOSE") then
        for _, c in ipairs(cases) do
          local o = outcomes[c.name]
          io.stderr:write(string.format("%6.2f s run %6.2f s all  %s%s\n", o.elapsed or -1, o.wall or -1, c.name,
            #o.problems > 0 and "  [FAILS]" or ""))
        end
      end
    end)

    if base == "warm-spawner" then
      it("took the spawner path: the run's pid 1 is the launcher's init, not corral-init", function()
        local r = assert(corral.run_python("print(open('/proc/1/comm').read().strip())", { policy = "warm" }))
        assert.are.equal("corral-spawner\n", r.stdout, r.stderr)
      end)
    end

    it("has at least 50 cases with distinct names", function()
      assert.is_true(#cases >= 50 or (os.getenv("HOSTILE_ONLY") or "") ~= "", #cases .. " cases")
    end)

    for _, case in ipairs(cases) do
      it(case.name, function()
        local o = outcomes[case.name]
        assert.is_truthy(o, "the case did not run")
        if #o.problems > 0 and o.res then
          -- context for whoever reads the failure
          o.problems[#o.problems + 1] = string.format("(%sreason %s, returncode %s, limits: %s)\n  stdout: %q\n  stderr: %q",
            o.ahead and "started ahead; " or "",
            tostring(o.res.reason), tostring(o.res.returncode), table.concat(o.res.limits or {}, " "),
            o.res.stdout:sub(1, 300), o.res.stderr:sub(-300))
        end
        assert(#o.problems == 0, "\n  " .. table.concat(o.problems, "\n  "))
      end)
    end

    it("leaves no process, fd or temp dir behind after all cases, within 60 s", function()
      assert(corral.close())  -- the warm interpreters, with their sockets
      -- the per-case checks are exact; this one sees every run on the machine: give runs of other
      -- test suites a moment to end
      H.eventually(function()
        if #H.stray_processes() > 0 then return false end
        for _, d in ipairs(H.temp_dirs()) do if not snap.dirs[d] then return false end end
        return true
      end, 5)
      H.assert_clean(snap)
      assert.is_true(t_all < 60, string.format("the cases took %.1f s", t_all))
    end)

    lazy_teardown(function()
      S.base = "default"
      if remove_copy then
        paths.zygote, S.zygote = real_zygote, nil
        remove_copy()
      end
    end)
  end)
end

describe("the hostile suite's own checks", function()
  local prefix = "hst" .. S.random_hex(4)

  it("see a file left on the host, and the next run seeing it", function()
    -- the host-work-open variant has no private /tmp and no Landlock: a file written there is on
    -- the host
    finally(function() os.remove("/tmp/" .. S.marker(prefix, 1) .. "-leak") end)
    local case = { name = "self-test leak", index = 1, variant = "host-work-open", inspector_variant = "host-work-open",
                   prologue = false, opts = { timeout = 2 },
                   code = function(ctx) return "open('/tmp/" .. ctx.marker .. "-leak', 'w').write('x')" end }
    local o = run_cases({ case }, prefix, 1)[case.name]
    local text = table.concat(o.problems, "\n")
    assert.is_truthy(text:find("left on the host: /tmp/" .. S.marker(prefix, 1) .. "-leak", 1, true), text)
    assert.is_truthy(text:find("the next run saw: /tmp/" .. S.marker(prefix, 1) .. "-leak", 1, true), text)
    assert.is_false(core.exists("/tmp/" .. S.marker(prefix, 1) .. "-leak"))
  end)

  it("fail a case on time, expectation, needs and known_hole", function()
    local case = { name = "self-test fail", index = 2, opts = { timeout = 0.5 },
                   code = "import time; time.sleep(5)",
                   expect = { reason = "exit", stdout = "never" }, needs = { "no-such-protection" },
                   known_hole = "a described hole" }
    local o = run_cases({ case }, prefix, 1)[case.name]
    local text = table.concat(o.problems, "\n")
    for _, want in ipairs({ "reason is timeout, expected exit", "stdout does not match", 'lacks "no-such-protection"',
                            "KNOWN HOLE (fix corral, then drop known_hole): a described hole" }) do
      assert.is_truthy(text:find(want, 1, true), "missing '" .. want .. "' in: " .. text)
    end
  end)

  it("find a surviving process by marker in its argv, and a file in the run directory", function()
    local marker = S.marker(prefix, 3)
    local pid = tonumber((H.sh("bash -c 'exec -a sleep-" .. marker .. " sleep 30' >/dev/null 2>&1 & echo $!")))
    assert.is_true(H.eventually(function() return #S.strays(nil, nil, marker) == 1 end, 10))
    core.kill(pid, 9)
    assert.is_true(H.eventually(function() return #S.strays(nil, nil, marker) == 0 end, 10))
    local top = core.mkdtemp("/tmp/hostile-selftest-XXXXXX")
    assert(core.mkdir(top .. "/code"))
    assert(core.write_file(top .. "/code/main.py", ""))
    assert(core.mkdir(top .. "/work"))
    assert(core.write_file(top .. "/work/x", ""))
    assert(core.write_file(top .. "/code/" .. marker, ""))
    assert.are.same({ "code/" .. marker .. " (file)", "work/x (file)" }, (function()
      local l = S.scan_top(top, true, "main.py")
      table.sort(l)
      return l
    end)())
    assert.are.same({ "code/" .. marker .. " (file)" }, S.scan_top(top, false, "main.py"))
    assert(core.rmtree(top))
  end)
end)
