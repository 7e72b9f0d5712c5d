-- The hostile programs (spec/hostile/*.lua) as session cells: every guarantee of a run holds for a
-- session too. Each case's code, after the scatter prologue as the hostile suite adds it, is the
-- first cell of a fresh session of the case's policy (under the "default" and the "warm" base, as
-- the suite runs them), the case's timeout the cell's; then the session is closed. A few cases
-- run at a time on one loop. Each case is checked for:
--   1. time: the cell returned within its timeout + the session's grace + SLACK;
--   2. survivors: no process of the session is alive when it has ended (S.strays, before its
--      clean-up), nothing written into its run directory on the host, the directory gone;
--   3. host leaks: nothing named with its marker in the host places (S.host_leaks);
--   4. the next run: the inspector, run right after the close (as root under the session's uid),
--      sees nothing of it;
--   5. the cell's reason is one of the documented cell reasons, and where the case expects a
--      limit (or a signal) the session reported it or the cell raised its Python error (LIMITS);
--      OUTCOMES lists the cases whose session outcome legitimately differs.
-- Skipped (SKIP): cases with a `controller` (a controller process of its own runs a run, not a
-- session), with a `companion` (the runner starts a run beside the case, with its own
-- expectations), with a variant other than "default" (a session takes a policy by name, not the
-- suite's variants, which turn a protection off to test the fallback a run takes without it), and
-- with `stdin` (a run's option, refused by a session: a cell's stdin is /dev/null).
-- Tagged #hostile, not #fast: `make check` leaves it out, `make test` runs it.
local corral = require "corral"
local core = require "corral.core"
local session = require "corral.session"
local H = require "helper"
local S = require "hostile.support"

local CONCURRENCY = 4
local SLACK = S.SLACK       -- a cell must return within its timeout + GRACE + SLACK
local GRACE = 1             -- each session's grace
local DEFAULT_TIMEOUT = 5   -- the hostile suite's default (the default policy's)

local tree = assert(core.realpath("."))
local places = S.host_places(tree)

-- Every reason a cell may end with (docs/sessions.md): its own, or the session's end by a limit.
local CELL_REASONS = {}
for _, r in ipairs({ "ok", "error", "timeout", "interrupted", "cpu", "exit", "lost", "memory", "processes",
                     "file-size", "output", "signal" }) do
  CELL_REASONS[r] = true
end

-- A run's expected reason, as a session shows it: the cell's reason, the reason the session ended
-- with, or the error the cell raised when the kernel refused the program's request (the program
-- goes on, unlike a run ended at its limit). Each returns true or what it saw instead.
local function raised(r, types, message)
  local e = r.error
  if not e or not types[e.type] then return false end
  return not message or (e.message or ""):find(message, 1, true) ~= nil
end
local LIMITS = {
  memory = function(r, ended)
    return r.reason == "memory" or ended == "memory" or raised(r, { MemoryError = true })
      or raised(r, { OSError = true }, "Cannot allocate memory")
  end,
  cpu = function(r, ended) return r.reason == "cpu" or ended == "cpu" end,
  processes = function(r, ended)
    return r.reason == "processes" or ended == "processes" or raised(r, { BlockingIOError = true })
      or raised(r, { OSError = true }, "Resource temporarily unavailable")
      or raised(r, { RuntimeError = true }, "can't start new thread")
  end,
  ["file-size"] = function(r, ended)
    return r.reason == "file-size" or ended == "file-size" or raised(r, { OSError = true }, "File too large")
  end,
  output = function(r, ended) return r.reason == "output" or ended == "output" or r.truncated end,
  timeout = function(r) return r.reason == "timeout" and raised(r, { KeyboardInterrupt = true }) end,
  signal = function(r, ended) return r.reason == "signal" or ended == "signal" end,
}

-- Cases whose session outcome legitimately differs from the run's: the cell reasons taken besides
-- what LIMITS maps the run's reason to, and why.
local OUTCOMES = {
  ["a program whose whole tree ignores SIGTERM is killed at the timeout"] = { reasons = { "lost" },
    why = "it ignores and blocks SIGINT: the interrupt cannot stop the cell, the grace ends the session" },
  ["a program that stops itself with SIGSTOP is killed at the timeout"] = { reasons = { "lost" },
    why = "the interpreter itself is stopped: it cannot take the interrupt, the grace ends the session" },
  ["an exponential fork bomb is ended at the timeout and nothing survives"] = { reasons = { "lost" },
    why = "the interrupt stops the cell, not the bomb's copies of the interpreter, which outlive it "
      .. "as a cell's processes may and keep the kernel from the CPU past the grace: the session is lost" },
  ["a growing memory bomb ends with reason memory"] = { reasons = { "timeout" },
    why = "its 128 MiB take about 2 s of page faults on a loaded machine: the 2 s timeout may come first" },
}

-- Why a case does not run as a session cell, or nil.
local function skip_reason(case)
  if case.controller then return "runs in a controller process of its own" end
  if case.companion then return "has a companion run" end
  if (case.variant or "default") ~= "default" then return "variant " .. case.variant end
  local o = case.opts
  if type(o) == "function" then o = o(S.make_ctx(case, "skip", tree)) end
  for _, k in ipairs({ "stdin", "args", "collect" }) do
    if o and o[k] ~= nil then return "takes " .. k .. ", a run's option" end
  end
  return nil
end

-- The reason a session that is gone ended with, from what its next request is told
-- ("ESESSION: the session is gone (WHY)"); nil while it lives.
local function ended_with(s)
  if s:alive() then return nil end
  local ok, err = s:exec_async("pass", {}, function() end)
  if ok then return "alive after all" end
  return tostring(err):match("%(([^()]*)%)$") or tostring(err)
end

-- Every way `o` (the outcome of `case`) falls short; an empty list when it passed.
local function evaluate(case, ctx, o)
  local P = {}
  local function bad(fmt, ...) P[#P + 1] = string.format(fmt, ...) end
  if o.setup_error then bad("setup failed: %s", o.setup_error) end
  local r = o.res
  if not r then
    bad("no result: %s (%s)", tostring(o.err), tostring(o.code))
  else
    local limit = o.timeout + GRACE + SLACK
    if o.elapsed > limit then
      bad("the cell took %.2f s, more than timeout + grace + %.1f s = %.2f s", o.elapsed, SLACK, limit)
    end
    if not CELL_REASONS[r.reason] then bad("the cell's reason %s is not a documented one", tostring(r.reason)) end
    local e = case.expect
    if type(e) == "function" then e = e(ctx) end
    local want = e and e.reason
    local differs = OUTCOMES[case.name]
    if want and LIMITS[want] and not LIMITS[want](r, o.ended) and not (differs and S.has(differs.reasons, r.reason)) then
      bad("the run's reason %s is not in the session's outcome: the cell's reason %s, the session %s, error %s%s",
        want, tostring(r.reason), o.ended and ("ended with " .. o.ended) or "alive",
        r.error and (tostring(r.error.type) .. ": " .. tostring(r.error.message)) or "none",
        differs and (" (nor one of " .. table.concat(differs.reasons, " ") .. ": " .. differs.why .. ")") or "")
    end
  end
  if o.close_error then bad("close failed: %s", o.close_error) end
  S.sink_problems(o.sink, "", bad)
  S.after_problems(o, bad)
  return P
end

-- Run `case` as the first cell of a fresh session, then close it and run the inspector; calls
-- done(outcome) when all is over.
local function start_case(case, prefix, done)
  local o, ctx, _, ignore = S.case_start(case, prefix, tree)
  local sink = { marker = ctx.marker, ignore = ignore }
  o.sink = sink

  -- the checks run before the teardown, which ends the host helpers they may look at
  local function finish()
    local ok, problems = pcall(evaluate, case, ctx, o)
    o.problems = ok and problems or { "the runner failed to evaluate the case: " .. tostring(problems) }
    if case.teardown then
      local tok, e = pcall(case.teardown, ctx)
      if not tok then o.problems[#o.problems + 1] = "teardown failed: " .. tostring(e) end
    end
    done(o)
  end
  -- the session's uid may be taken by another case's session the moment it is free: the
  -- inspector waits for it as long as the longest case may hold it
  local function after_close()
    S.start_inspector(case, ctx, o, function(rep, err)
      o.inspector, o.inspector_error = rep, err
      o.host_leaks = S.host_leaks(ctx.marker, places)
      finish()
    end, core.hrtime() + 30)
  end
  -- close runs the loop: not from the cell's callback, but between the runner's loop turns
  local function close_later(s)
    S.waiting[#S.waiting + 1] = function()
      local ok, err = pcall(s.close, s)
      if not ok then o.close_error = tostring(err) end
      after_close()
    end
  end

  local started, err = pcall(function()
    local opts = S.case_opts(case, ctx, sink)
    o.timeout = opts.timeout or DEFAULT_TIMEOUT
    opts.timeout, opts.grace = nil, GRACE
    local s, oerr, ocode = session.open(opts)
    if not s then
      o.err, o.code = oerr, ocode
      return after_close()
    end
    local t0 = core.hrtime()
    local ok, xerr, xcode = s:exec_async(S.case_code(case, ctx), { timeout = o.timeout }, function(r)
      o.res, o.elapsed = r, core.hrtime() - t0
      o.ended = ended_with(s)
      close_later(s)
    end)
    if not ok then
      o.err, o.code = xerr, xcode
      close_later(s)
    end
  end)
  if not started then
    o.err = "the runner could not start the case: " .. tostring(err)
    after_close()
  end
end

local function run_cases(list, prefix, concurrency)
  return S.run_cases(list, start_case, prefix, concurrency)
end

-- CORRAL_HOSTILE_SESSION_BASES (e.g. "warm"): the bases to run, both when unset; spec/run.sh
-- runs each in one of its two passes
local bases = {}
for b in (os.getenv("CORRAL_HOSTILE_SESSION_BASES") or "default warm"):gmatch("%S+") do bases[#bases + 1] = b end
for _, base in ipairs(bases) do
  describe("hostile programs as session cells (" .. base .. ") #hostile", function()
    local cases, skipped = {}, {}
    for _, c in ipairs(S.load_cases()) do
      local why = skip_reason(c)
      if why then skipped[#skipped + 1] = c.name .. ": " .. why else cases[#cases + 1] = c end
    end
    local outcomes, snap
    local prefix = "hss" .. S.random_hex(4)

    lazy_setup(function()
      S.base = base
      -- a session started ahead holds a uid and a run dir: the checks of a case's end (the
      -- inspector under the session's uid, its run dir gone) need none beside it
      session.spares_enabled = false
      snap = H.snapshot()
      outcomes = run_cases(cases, prefix, CONCURRENCY)
      if os.getenv("HOSTILE_VERBOSE") then
        for _, c in ipairs(cases) do
          local o = outcomes[c.name]
          io.stderr:write(string.format("%6.2f s cell %6.2f s all  %-9s %-10s %s%s\n", o.elapsed or -1, o.wall or -1,
            o.res and o.res.reason or "-", o.ended or "alive", c.name, #o.problems > 0 and "  [FAILS]" or ""))
        end
        for _, s in ipairs(skipped) do io.stderr:write("skipped: " .. s .. "\n") end
      end
    end)

    it("runs at least 40 cases as cells", function()
      assert.is_true(#cases >= 40 or (os.getenv("HOSTILE_ONLY") or "") ~= "", #cases .. " cases")
    end)

    for _, case in ipairs(cases) do
      it(case.name, function()
        local o = outcomes[case.name]
        assert.is_truthy(o, "the case did not run")
        if #o.problems > 0 and o.res then
          -- context for whoever reads the failure
          o.problems[#o.problems + 1] = string.format("(cell reason %s, session %s, error %s)\n  stdout: %q\n  stderr: %q",
            tostring(o.res.reason), o.ended and ("ended with " .. o.ended) or "alive",
            o.res.error and tostring(o.res.error.type) or "none", o.res.stdout:sub(1, 300), o.res.stderr:sub(-300))
        end
        assert(#o.problems == 0, "\n  " .. table.concat(o.problems, "\n  "))
      end)
    end

    it("leaves no process, fd or temp dir behind after all cases, within 60 s", function()
      assert(corral.close())  -- the warm interpreters, with their sockets
      H.eventually(function()
        if #H.stray_processes() > 0 then return false end
        for _, d in ipairs(H.temp_dirs()) do if not snap.dirs[d] then return false end end
        return true
      end, 5)
      H.assert_clean(snap)
    end)

    lazy_teardown(function()
      S.base = "default"
      session.spares_enabled = true
    end)
  end)
end
