--- corral: run untrusted Python under hard limits and report exactly what happened.
--
-- Conventions: bad options (unknown key, wrong type, out-of-range value, a value over the policy's
-- maximum) raise an error that names the option, before anything starts. Runtime failures of the
-- sandbox itself (launcher missing, work dir cannot be made, a protection that was required cannot
-- be had, the launcher's setup failed) return `nil, message, code`, where `code` is a symbolic
-- name such as "ENOENT", "ENOTSUP" or "EPERM" and `message` starts with it. `eval_in_sandbox`
-- follows eval_in_sandbox's instead and raises a SandboxError table.
local core = require "corral.core"
local options = require "corral.options"
local schema = require "corral.schema"
local policy = require "corral.policy"
local hostmod = require "corral.host"
local warm = require "corral.warm"

local M = { _VERSION = "corral 0.1.0" }

--- false: run the policies with `warm` set cold, each run through a fresh corral-launch (the
-- same sandbox, but not the program's view of a warm run: an embedder's choice, not the CLI's).
M.warm_interpreters = true

--- false: start no launch ahead of its run (a policy's `prestart`). The CLI sets it: a one-shot
-- process has no next run to start ahead.
M.prestart_launches = true

--- true: a run that comes after a pause (none in flight, none ended in the last 5 ms) has the
-- next launch started once it has ended, on the loop's next turn, rather than while it runs,
-- where its set-up takes CPU from the run's own end. For a controller whose loop runs between
-- runs: `corral serve` sets it. (A `run_python` caller's loop stands still between its calls:
-- a launch started while the run runs is ready at the next call; one left for the next turn
-- would only start then.)
M.prestart_after_pause = false

local SandboxError = { __name = "SandboxError" }
SandboxError.__index = SandboxError
SandboxError.__tostring = function(e) return "SandboxError(" .. e.kind .. "): " .. e.message end
M.SandboxError = SandboxError

--- Is `e` an error raised by `eval_in_sandbox`?
function M.is_sandbox_error(e)
  return getmetatable(e) == SandboxError
end

local function sandbox_error(kind, message)
  return setmetatable({ kind = kind, message = message }, SandboxError)
end

-- Every run that holds a directory, from make_run to its cleanup: a run in flight, a launch
-- started ahead, one let go of and not reaped yet. The sentinel below removes them all when the
-- Lua state closes without their ends having been seen, whatever the path that made them.
local live = {}

-- Remove the run's directory and give back its uid. Returns an error message or nil.
local function cleanup(run)
  local err
  live[run] = nil
  if run.top then
    -- what make_run made, when that is all there is (the work dir is a tmpfs of the run's own
    -- mount namespace, so empty here): four calls, not a walk of the tree
    local top = run.top
    if not (run.code_path and (os.remove(run.code_path) or not run.code_written)
            and os.remove(run.code_dir) and os.remove(run.workdir) and os.remove(top)) then
      local ok, e = core.rmtree(top)
      if not ok then err = e end
    end
    run.top = nil
  end
  if run.lock then
    run.lock:close()
    run.lock = nil
  end
  if run.uid then
    hostmod.release_uid(run.uid)
    run.uid = nil
  end
  return err
end

-- Make the run's directory: <tmp>/corral-XXXXXX/{code/<code_name>, work/}. The code is handed
-- over in a file, never in argv (no E2BIG, no size limit but the disk's); `work` is the cwd, HOME
-- and TMPDIR, owned by the run's uid when there is one.
local function write_code(run, code)
  local ok, err, ecode = core.write_file(run.code_path, code, run.uid and 288 or 256) -- 0440 / 0400
  run.code_written = ok and true
  if ok and run.uid then ok, err, ecode = core.chown(run.code_path, -1, run.gid) end
  return ok, err, ecode
end

-- `code` nil: a launch started ahead of its run (`prestart`), whose code comes with the run;
-- `has_nul` then says whether that code will hold a NUL byte (the interpreter's argv differs).
local function make_run(pol, opts, code, host, has_nul)
  local run = { euid = host.euid }
  if code then has_nul = code:find("\0", 1, true) ~= nil end
  run.has_nul = has_nul
  if host.root and host.setuid and pol.uid_range then
    local uid, err, ecode = hostmod.take_uid(pol.uid_range[1], pol.uid_range[2])
    if not uid then return nil, err, ecode end
    run.uid, run.gid = uid, uid
  end
  local tmp_dir = pol.tmp_dir or "auto"
  if tmp_dir == "auto" then tmp_dir = hostmod.run_dir_base() end
  hostmod.sweep_stale(tmp_dir)
  local top, err, ecode = core.mkdtemp(tmp_dir .. "/corral-XXXXXX")
  if not top then cleanup(run) return nil, err, ecode end
  run.top = top
  live[run] = true
  -- held for the run's life on the directory itself: tells a later sweep that it has a live owner
  run.lock, err, ecode = core.lock(top)
  if not run.lock then cleanup(run) return nil, err, ecode end
  run.code_dir = top .. "/code"
  run.code_path = run.code_dir .. "/" .. (pol.code_name or "main.py")
  run.workdir = top .. "/work"
  -- with a run uid, the code is readable by the run's group only (0750 dir, 0440 file, group
  -- = run gid): a concurrent run, under another uid, cannot read it
  local ok
  local steps = {
    function() return core.mkdir(run.code_dir, run.uid and 488 or 448) end, -- 0750 / 0700
    code and function() return write_code(run, code) end,
    function() return core.mkdir(run.workdir, 448) end,                     -- 0700
    run.uid and function() return core.chown(run.code_dir, -1, run.gid) end,
    run.uid and function() return core.chmod(top, 457) end,                 -- 0711: pass, not list
    run.uid and function() return core.chown(run.workdir, run.uid, run.gid) end,
  }
  for i = 1, 6 do
    if steps[i] then
      ok, err, ecode = steps[i]()
      if not ok then cleanup(run) return nil, err, ecode end
    end
  end
  return run
end

-- The end of a run: its result from the policy, its directory and uid given back, on_done.
local function finisher(pol, o, run, host, done)
  return function(raw)
    -- a policy's result() is operator code: whatever it does, the run is cleaned up
    local pok, res, rerr, rcode
    if raw.launch_error then
      pok, rerr, rcode = true, "EZYGOTE: the warm interpreter did not run the program: " .. raw.launch_error, "EZYGOTE"
    else
      pok, res, rerr, rcode = pcall(pol.result, pol, raw, o, run, host)
    end
    local cerr = cleanup(run)
    if not pok then
      res, rerr, rcode = nil, "EPOLICY: policy '" .. tostring(pol.name) .. "' failed to build the result: "
        .. tostring(res), "EPOLICY"
    end
    if res and cerr then res.cleanup_error = cerr end
    done(res, rerr, rcode, raw)
  end
end

-- Launches started ahead of their runs (a policy's `prestart`): corral-launch --prestart (or a
-- warm interpreter's A and init, with the same argument), with
-- its run directory (no code yet), uid, namespaces and mounts made, waiting in the init for a
-- byte on its report socket. A run whose policy and options match one takes it: its code goes
-- into the directory, proc:go() starts the program, and another is started for the next run
-- while this one runs. What matches: the same policy (the same table, which the launch keeps
-- alive) and every option but stdin's bytes and the timeout (which go() gives), the same kind of
-- stdin (none, or a pipe) and of code (with a NUL byte or not); then, to be exact whatever a
-- policy's launch_args does, the launcher arguments the run would be given in that directory,
-- and the spawn's own settings, must be the launch's, or it is let go and the run starts cold.
-- A key's first run starts none (a one-run controller would only waste it); at most
-- PRESTART_MAX wait in all, the oldest let go first, and a key whose launch was let go unused
-- starts none for its next BACKOFF runs (options that vary run to run do not churn launches).
-- A controller that ends without corral.close() has its waiting launches killed and their
-- directories removed when its Lua state closes.
local PRESTART_MAX, BACKOFF = 8, 8
-- list: oldest first; seen: policy table → key → runs (weak: a key's string names the table by
-- its address, which a new table may get once the old one is collected; counted by the table
-- itself, a one-off policy made per run is never taken for a repeated one)
local function new_seen() return setmetatable({}, { __mode = "k" }) end
local prestarted = { list = {}, seen = new_seen(), nseen = 0 }

-- M.prestart_after_pause: runs in flight, when the last one ended, and the launch a run that
-- ended left for the loop's next turn ({ fill = fn, timer = core.timer }).
local PAUSE = 0.005
prestarted.inflight, prestarted.last_end, prestarted.epoch = 0, -math.huge, 0

-- The launch left for the next turn: started now (run_now), or dropped.
local function flush_deferred(run_now)
  local d = prestarted.deferred
  if not d then return end
  prestarted.deferred = nil
  d.timer:close()
  if run_now then d.fill() end
end

local function defer_fill(fill)
  flush_deferred(true)
  local d = { fill = fill }
  d.timer = core.timer(0, function()
    if prestarted.deferred == d then
      prestarted.deferred = nil
      d.fill()
    end
  end)
  prestarted.deferred = d
end

local function canon(v, depth)
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if t == "number" or t == "boolean" then return tostring(v) end
  if t ~= "table" or depth > 4 then return nil end
  local keys, parts = {}, {}
  for k in pairs(v) do
    if type(k) ~= "string" and type(k) ~= "number" then return nil end
    keys[#keys + 1] = k
  end
  table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
  for _, k in ipairs(keys) do
    local c = canon(v[k], depth + 1)
    if not c then return nil end
    parts[#parts + 1] = tostring(k) .. "=" .. c
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

-- The key names the policy table and the caller's options (fewer than the prepared ones, so
-- cheaper to put in canonical form: 2 against 20-30 us): runs whose options are spelt alike go
-- together, and prestart_take checks what the waiting launch was made with against what this run
-- gets anyway.
local function prestart_key(pol, o, code, extra)
  local copy = {}
  for k, v in pairs(o) do
    -- (the policy is `pol` itself, a table of its own: serve passes it)
    if k ~= "stdin" and k ~= "timeout" and k ~= "policy" then copy[k] = v end
  end
  local c = canon(copy, 0)
  if not c then return nil end
  return table.concat({ tostring(pol), o.stdin and "stdin" or "-", code:find("\0", 1, true) and "nul" or "-",
    (extra and extra.kill_on_overflow) and "kill" or "-", c }, "|")
end

-- core.spawn's options for a run, but its arguments, stdin and on_exit.
local function spawn_options(pol, o, host, extra, zygote)
  return {
    file = not zygote and host.launcher or nil,
    zygote = zygote,
    stdout_cap = o.max_output,
    stderr_cap = o.max_output,
    tail_bytes = pol.tail_bytes or 1024,
    kill_on_overflow = (extra and extra.kill_on_overflow) or pol.kill_on_overflow or false,
    report = true,
    timeout = o.timeout,
    grace = pol.grace or 0.2,
  }
end

-- What a launch started ahead was spawned with, besides its arguments, as one string.
local function spawn_settings(pol, o, extra)
  local so = spawn_options(pol, o, {}, extra)
  return table.concat({ tostring(o.stdin ~= nil), tostring(so.stdout_cap), tostring(so.tail_bytes),
    tostring(so.kill_on_overflow), tostring(so.grace) }, "|")
end

local function same_args(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function prestart_drop(slot)
  for i, x in ipairs(prestarted.list) do
    if x == slot then table.remove(prestarted.list, i) break end
  end
end

-- Killed at once, its end cleans up; `unused`: its key starts none for a while.
local function let_go(slot, unused)
  prestart_drop(slot)
  slot.finish = nil
  local per = prestarted.seen[slot.pol]
  if unused and per and per[slot.key] then per[slot.key] = -BACKOFF end
  slot.proc:kill()
end

-- A controller that ends without corral.close(), or with runs in flight: its Lua state's close
-- kills their processes (the loop's teardown; here first, with their groups) and removes the
-- directories of every run whose end the loop has not seen (a waiting launch, one let go of, a
-- run in flight).
prestarted.sentinel = setmetatable({}, { __gc = function()
  for run in pairs(live) do
    -- (a warm interpreter's launch has no pid until the zygote named it: kill(-0) would be ours)
    local pid = run.proc and run.proc:pid() or 0
    if pid > 0 then pcall(core.kill, -pid, 9) end
  end
  for run in pairs(live) do pcall(cleanup, run) end
end })

-- Start one launch ahead for `key` (through the policy's warm interpreter when `use_zygote`).
-- Failures are silent: the next run starts as without.
local function prestart_one(key, pol, o, host, has_nul, extra, use_zygote)
  local zygote
  if use_zygote then
    zygote = warm.get(pol, o)
    if not zygote then return end
  end
  local run = make_run(pol, o, nil, host, has_nul)
  if not run then return end
  run.zygote = use_zygote or nil
  local slot = { key = key, run = run, pol = pol, settings = spawn_settings(pol, o, extra) }
  local ok, proc, _, ecode = pcall(function()
    slot.args = pol:launch_args(o, run, host)
    local so = spawn_options(pol, o, host, extra, zygote)
    so.args = { "--prestart", table.unpack(slot.args) }
    so.hold = true
    so.stdin = o.stdin and "" or nil
    so.on_exit = function(raw)
      if slot.finish then return slot.finish(raw) end
      -- let go of, or gone before its run came: nothing ran
      prestart_drop(slot)
      cleanup(run)
    end
    return core.spawn(so)
  end)
  if not ok or not proc then
    cleanup(run)
    -- not again in this process where it cannot work (no pidfd, a policy's launch_args that
    -- raises); a passing failure (EAGAIN, EMFILE) only skips this one
    if not ok or ecode == "ENOSYS" then prestarted.broken = true end
    return
  end
  slot.proc = proc
  run.proc = proc
  local list = prestarted.list
  list[#list + 1] = slot
  while #list > PRESTART_MAX do let_go(list[1], true) end
end

-- The run's code into a matching launch, and the program started; nil when there is none.
local function prestart_take(key, pol, o, host, code, on_done, extra)
  local slot
  for i = #prestarted.list, 1, -1 do
    local s = prestarted.list[i]
    if s.key == key and rawequal(s.pol, pol) then slot = s break end
  end
  if not slot then return nil end
  prestart_drop(slot)
  local run = slot.run
  local ok, args = pcall(pol.launch_args, pol, o, run, host)
  if not ok or not same_args(args, slot.args) or spawn_settings(pol, o, extra) ~= slot.settings then
    let_go(slot, false)     -- the policy changed under it: the run starts cold (and says why)
    return nil
  end
  if not write_code(run, code) then let_go(slot, false) return nil end
  slot.finish = finisher(pol, o, run, host, on_done)
  local gok, went = pcall(slot.proc.go, slot.proc, { stdin = o.stdin, timeout = o.timeout })
  if not (gok and went) then
    let_go(slot, false)     -- it ended meanwhile, or cannot be told: its exit cleans up
    return nil
  end
  -- The byte woke the init, often on this CPU: let it start the program before this process
  -- goes on to the next run's launch (its directory, then a vfork), which would hold the CPU
  -- for about 0.2 ms first.
  core.yield()
  return slot.proc
end

-- Runs the loop until done() or the deadline (core.hrtime()); a timer wakes the loop at the
-- deadline, so that waiting for something that never comes still ends. Not from a callback.
local function loop_until(done, deadline)
  if done() then return true end
  -- (the timer's clock is the loop's, in whole milliseconds: it may fire before hrtime() is
  -- past the deadline, so its firing ends the wait)
  local fired = false
  local t = core.timer(math.max(0, deadline - core.hrtime()), function() fired = true end)
  while not done() and not fired do core.run("once") end
  t:close()
  return done()
end

--- Let go of the launches started ahead: each is killed, and cleaned up once the loop has seen
-- its end. Returns their procs.
function M.let_go_prestarted()
  flush_deferred(false)
  prestarted.epoch = prestarted.epoch + 1
  local procs = {}
  for _, slot in ipairs(prestarted.list) do procs[#procs + 1] = slot.proc end
  for _, slot in ipairs({ table.unpack(prestarted.list) }) do let_go(slot, false) end
  prestarted.seen, prestarted.nseen = new_seen(), 0
  return procs
end

--- Let go of the launches started ahead and wait for their ends (running the loop, so not from
-- a callback) for at most `seconds` (default 5). corral.close() does it too.
-- @return true, or nil and a message
function M.release_prestarted(seconds)
  local procs = M.let_go_prestarted()
  local all_done = loop_until(function()
    for _, p in ipairs(procs) do if not p:done() then return false end end
    return true
  end, core.hrtime() + (seconds or 5))
  if not all_done then return nil, "ETIMEDOUT: a launch started ahead is still running" end
  return true
end

-- Start one run; `what` names the public function for error messages; `extra` carries settings
-- that are not public options (eval_in_sandbox's kill-on-overflow).
local protected = false
local start_cold

-- What a run of `opts` is started with: its policy, options, host, whether its warm interpreter
-- forks it, and the key of the launches started ahead that it can take (nil: none), for `code`
-- (or, code nil, for code without a NUL byte); or nil, message, code. Raises on bad options.
local function plan_of(what, code, opts, extra)
  local ok, pol = pcall(policy.load, opts.policy or schema.run_by_name.policy.default)
  if not ok then error(what .. ": " .. tostring(pol), 0) end
  -- Where a run shares the controller's uid (no user namespace, no run uid) and Landlock is
  -- missing, a dumpable controller's /proc/PID/environ, fds and memory would be open to it.
  -- Off once, before the first run, unless the policy says the embedding program needs it.
  if not protected and pol.protect_controller ~= false then
    core.set_dumpable(false)
    protected = true
  end
  local host, err, ecode = hostmod.basics()
  if not host then return nil, err, ecode end
  local o
  ok, o, err, ecode = pcall(pol.prepare, pol, opts, host)
  if not ok then error(what .. ": " .. tostring(o), 0) end
  if not o then return nil, err, ecode end
  -- a warm policy's runs are forked by its zygote, with the same launcher arguments
  -- (its program is forked into the run's PID namespace: without one the policy runs cold)
  local probe = pol.warm and M.warm_interpreters and pol.pid_namespace and hostmod.probe()
  local use_zygote = probe and probe.pid_namespace and (probe.root or pol.user_namespace ~= "never"
      or (probe.caps["pid-namespace"] or {}).ok)
  -- launches started ahead: in a PID namespace (corral-launch's, or a warm interpreter's)
  local key = M.prestart_launches and not prestarted.broken
    and (pol.prestart or 0) > 0 and pol.pid_namespace and not pol.wrapper_isolates_network
    and prestart_key(pol, opts, code or "", extra)
  if key and use_zygote then key = key .. "|warm" end
  return { pol = pol, o = o, host = host, key = key or nil, use_zygote = use_zygote }
end

-- Starts the launches `key` lacks (up to the policy's `prestart`); how many wait now.
local function prestart_fill(p, has_nul, extra)
  local n = 0
  for _, slot in ipairs(prestarted.list) do if slot.key == p.key then n = n + 1 end end
  for _ = n + 1, p.pol.prestart do
    prestart_one(p.key, p.pol, p.o, p.host, has_nul, extra, p.use_zygote)
  end
  n = 0
  for _, slot in ipairs(prestarted.list) do if slot.key == p.key then n = n + 1 end end
  return n
end

local function launch(what, code, opts, on_done, extra)
  -- a launch the run before left for the next turn, not started yet: now, for this run to take
  flush_deferred(true)
  local p, err, ecode = plan_of(what, code, opts, extra)
  if not p then return nil, err, ecode end
  local pol, o, host, key, use_zygote = p.pol, p.o, p.host, p.key, p.use_zygote
  local paused = M.prestart_after_pause and prestarted.inflight == 0
    and core.hrtime() - prestarted.last_end > PAUSE
  local fill_at_end
  local function ended(...)
    prestarted.inflight = prestarted.inflight - 1
    prestarted.last_end = core.hrtime()
    local epoch = prestarted.epoch
    on_done(...)
    -- (not when on_done let go of the launches started ahead: a server that stops)
    if fill_at_end and prestarted.epoch == epoch then defer_fill(fill_at_end) end
  end
  local proc
  if key then proc = prestart_take(key, pol, o, host, code, ended, extra) end
  if not proc then
    local perr, pcode
    proc, perr, pcode = start_cold(pol, o, host, code, ended, extra, use_zygote)
    if not proc then return nil, perr, pcode end
  end
  prestarted.inflight = prestarted.inflight + 1
  if key then
    -- the next run's, started while this one runs
    local per = prestarted.seen[pol]
    local seen = (per and per[key] or 0) + 1
    if not (per and per[key]) then
      -- a controller whose every run has options of its own: forget, rather than grow
      prestarted.nseen = prestarted.nseen + 1
      if prestarted.nseen > 256 then prestarted.seen, prestarted.nseen, per = new_seen(), 1, nil end
    end
    if not per then
      per = {}
      prestarted.seen[pol] = per
    end
    per[key] = seen
    if seen > 1 then
      local has_nul = code:find("\0", 1, true) ~= nil
      if paused then
        fill_at_end = function() pcall(prestart_fill, p, has_nul, extra) end
      else
        prestart_fill(p, has_nul, extra)
      end
    end
  end
  return proc
end

--- Start launches ahead for runs with these options now, as the library does from a repeated
-- run's second on (`prestart`): for a caller that knows a run is coming. Up to the policy's
-- `prestart` wait for code without a NUL byte; the next run with exactly these options (stdin's
-- bytes and timeout aside) takes one. Does not count as a run: a key's next run still starts
-- none for the run after it, unless it is that key's second.
-- @return how many wait for these options (0: the policy or this process starts none), or
-- nil, message, code
function M.prestart(opts)
  opts = options.check("prestart", opts or {}, options.run_schema)
  local p, err, ecode = plan_of("prestart", nil, opts)
  if not p then return nil, err, ecode end
  if not p.key then return 0 end
  return prestart_fill(p, false)
end

-- A run started on request: its directory, then corral-launch or its warm interpreter.
function start_cold(pol, o, host, code, on_done, extra, use_zygote)
  local run, err, ecode
  run, err, ecode = make_run(pol, o, code, host)
  if not run then return nil, err, ecode end
  local zygote
  if use_zygote then
    zygote, err, ecode = warm.get(pol, o)
    if not zygote then cleanup(run) return nil, err, ecode end
    run.zygote = true
  end
  -- from here on the run holds a directory, a lock and maybe a uid: any error (a policy's
  -- launch_args is operator code) must give them back
  local spawn_ok, proc, serr, scode = pcall(function()
    local so = spawn_options(pol, o, host, extra, zygote)
    so.args = pol:launch_args(o, run, host)
    so.stdin = o.stdin
    so.on_exit = finisher(pol, o, run, host, on_done)
    return core.spawn(so)
  end)
  if not spawn_ok then
    cleanup(run)
    return nil, "EPOLICY: policy '" .. tostring(pol.name) .. "' failed to build the launch plan: " .. tostring(proc),
      "EPOLICY"
  end
  if not proc then cleanup(run) return nil, serr, scode end
  run.proc = proc
  return proc
end

local function check_code(what, code)
  if type(code) ~= "string" then error(what .. ": code must be a string, got " .. type(code), 0) end
end

--- Start a run without waiting: the loop calls `on_done(result)` or `on_done(nil, message, code)`
-- when it has ended and been cleaned up. Drive the loop with `corral.run_loop()` (the HTTP
-- controller runs it forever). Do not call `run_python` from inside `on_done`: start another run.
-- @return a process handle (`:kill()`, `:pid()`), or nil, message, code
function M.start(code, opts, on_done)
  check_code("start", code)
  if type(on_done) ~= "function" then error("start: on_done must be a function", 0) end
  opts = options.check("start", opts, options.run_schema)
  return launch("start", code, opts, on_done)
end

--- Let go of what the library keeps between runs: the launches started ahead (a policy's
-- `prestart`), the run uids it holds between runs (as root), and the warm interpreters (policy
-- `warm`). Each interpreter finishes the runs it has, then
-- exits; this waits for that (running the loop, so not from a callback) for at most `seconds`
-- (default 10). The next warm run starts a new one.
-- @return true, or nil and a message when one was still there at the deadline
function M.close(seconds)
  local released, rerr = M.release_prestarted(seconds)
  hostmod.release_idle_uids()
  local pids = warm.close_all()
  local deadline = core.hrtime() + (seconds or 10)
  for _, pid in ipairs(pids) do
    if not loop_until(function() return pid <= 0 or not core.kill(pid, 0) end, deadline) then
      return nil, "ETIMEDOUT: warm interpreter " .. pid .. " is still running"
    end
  end
  core.run("nowait")
  if not released then return nil, rerr end
  return true
end

--- Run the loop (see `start`): mode "default" (until nothing is pending), "once" or "nowait".
function M.run_loop(mode)
  return core.run(mode or "default")
end

local function wait(what, code, opts, extra)
  local result, rerr, rcode, raw
  local finished = false
  local proc, err, ecode = launch(what, code, opts, function(r, e, c, x)
    result, rerr, rcode, raw, finished = r, e, c, x, true
  end, extra)
  if not proc then return nil, err, ecode end
  while not finished do core.run("once") end
  if not result then return nil, rerr, rcode, raw end
  return result, nil, nil, raw
end

--- Run Python code under the policy's limits and wait for it.
-- Options (run_python's, with its defaults): timeout=5, cpu_seconds=3, memory_mb=256, file_mb=1,
-- processes=32, max_output=20000, require_network_isolation=false; and policy ("default"; a name,
-- a path or a policy table), python ("python3", looked up in the sandbox's PATH), stdin (bytes),
-- open_files=64, env (extra variables).
-- @return result table (ok, stdout, stderr, returncode, timed_out, truncated, network_isolated,
-- limits, reason, signal, usage), or nil, message, code when the sandbox itself failed
function M.run_python(code, opts)
  check_code("run_python", code)
  opts = options.check("run_python", opts, options.run_schema)
  local res, err, ecode = wait("run_python", code, opts)
  if not res then return nil, err, ecode end
  return res
end

--- Run many programs at once on one loop, at most `concurrency` at a time.
-- @param jobs array; each entry is a code string or a table `{code = "...", <run_python options>}`
-- @param settings optional `{concurrency = n}` (default: the number of CPUs)
-- @return array of results in job order; a job the sandbox could not run gets
-- `{ok = false, error = {kind = code, message = message}}`
function M.run_many(jobs, settings)
  if type(jobs) ~= "table" then error("run_many: jobs must be an array, got " .. type(jobs), 0) end
  settings = settings or {}
  if type(settings) ~= "table" then error("run_many: settings must be a table", 0) end
  for k in pairs(settings) do
    if k ~= "concurrency" then error("run_many: setting '" .. tostring(k) .. "' is not known", 0) end
  end
  local limit = settings.concurrency or core.cpu_count()
  if type(limit) ~= "number" or limit < 1 or math.floor(limit) ~= limit then
    error("run_many: setting 'concurrency' must be a whole number >= 1", 0)
  end
  -- validate every job before starting any, so bad input starts nothing
  local prepared = {}
  for i, job in ipairs(jobs) do
    local code, o
    if type(job) == "string" then
      code, o = job, {}
    elseif type(job) == "table" then
      code = job.code
      o = {}
      for k, v in pairs(job) do if k ~= "code" then o[k] = v end end
    else
      error("run_many: job " .. i .. " must be a string or a table, got " .. type(job), 0)
    end
    if type(code) ~= "string" then error("run_many: job " .. i .. ": code must be a string", 0) end
    prepared[i] = { code = code, opts = options.check("run_many: job " .. i, o, options.run_schema) }
  end
  local results, running, next_job, total = {}, 0, 1, #prepared
  local function failed(i, message, code)
    results[i] = { ok = false, error = { kind = code or "error", message = message } }
  end
  local function start_more()
    while running < limit and next_job <= total do
      local i = next_job
      next_job = next_job + 1
      local ok, proc, err, ecode = pcall(launch, "run_many", prepared[i].code, prepared[i].opts,
        function(res, rerr, rcode)
          running = running - 1
          if res then results[i] = res else failed(i, rerr, rcode) end
          start_more()
        end)
      if not ok then failed(i, tostring(proc), "EINVAL")
      elseif not proc then failed(i, err, ecode)
      else running = running + 1 end
    end
  end
  start_more()
  while running > 0 do core.run("once") end
  return results
end

-- What Python's str.strip() removes: the ASCII whitespace, \x1c-\x1f, and the Unicode spaces
-- and line separators (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
-- U+3000), as UTF-8.
local UNICODE_SPACE = {}
for _, cp in ipairs({ 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000 }) do
  UNICODE_SPACE[utf8.char(cp)] = true
end
for cp = 0x2000, 0x200A do UNICODE_SPACE[utf8.char(cp)] = true end

local function strip(s)
  local first, last = 1, #s
  while first <= last do
    local b = s:byte(first)
    if b <= 0x20 and (b == 0x20 or (b >= 0x09 and b <= 0x0D) or (b >= 0x1C and b <= 0x1F)) then
      first = first + 1
    else
      local n = b >= 0xE0 and 3 or (b >= 0xC0 and 2 or 0)
      if n > 0 and UNICODE_SPACE[s:sub(first, first + n - 1)] then first = first + n else break end
    end
  end
  while last >= first do
    local b = s:byte(last)
    if b <= 0x20 and (b == 0x20 or (b >= 0x09 and b <= 0x0D) or (b >= 0x1C and b <= 0x1F)) then
      last = last - 1
    else
      local matched = false
      for n = 2, 3 do
        if last - n + 1 >= first and UNICODE_SPACE[s:sub(last - n + 1, last)] then
          last, matched = last - n, true
          break
        end
      end
      if not matched then break end
    end
  end
  return s:sub(first, last)
end
M._strip = strip

-- eval_in_sandbox's settings that are not public options.
local EVAL_EXTRA = { kill_on_overflow = true }

-- eval_in_sandbox's options → run options (corral.schema: its names, defaults and units).
local eval_run_options = schema.eval_to_run

-- A run's outcome → eval_in_sandbox's ProcessOutput, or nil and a SandboxError.
local function eval_outcome(res, err, ecode, raw)
  if not res then
    return nil, sandbox_error(ecode == "ENOENT" and "unavailable" or "sandbox", err)
  end
  if res.timed_out then return nil, sandbox_error("timeout", "Process timed out") end
  if res.reason == "output" or res.truncated then return nil, sandbox_error("output", "I/O buffer size exceeded") end
  local _, out_ok = core.utf8_repair(raw.stdout)
  local _, err_ok = core.utf8_repair(raw.stderr)
  if not (out_ok and err_ok) then
    return nil, sandbox_error("encoding", "Subprocess did not produce valid UTF-8")
  end
  return { returncode = res.returncode, stdout = strip(res.stdout), stderr = strip(res.stderr),
           ok = res.returncode == 0 }
end

--- Seed 003's `eval_in_sandbox`: run code under bubblewrap (policy "bwrap") with the given limits.
-- Options: mem_max_mb=100, cpu_max_time_sec=1, timeout_max_time_sec=10, io_max_kb=128 (per stream),
-- and policy, python, stdin.
-- @return `{returncode, stdout, stderr, ok}` with stripped output
-- @raise a SandboxError table `{kind, message}`: kind "timeout", "output" (over io_max_kb),
-- "encoding" (output not UTF-8), "unavailable" (bubblewrap or the launcher missing) or "sandbox"
function M.eval_in_sandbox(code, opts)
  check_code("eval_in_sandbox", code)
  opts = options.check("eval_in_sandbox", opts, options.eval_schema)
  local out, serr = eval_outcome(wait("eval_in_sandbox", code, eval_run_options(opts), EVAL_EXTRA))
  if not out then error(serr, 2) end
  return out
end

--- `eval_in_sandbox` without waiting (for the HTTP controller): the loop calls
-- `on_done(output)` or `on_done(nil, sandbox_error)` when the run has ended and been cleaned up;
-- a third argument is the run's own result (for its `reason` and `usage`), nil when the sandbox
-- failed. Bad options raise, as in `eval_in_sandbox`.
-- @return a process handle (`:kill()`, `:pid()`), or nil and a SandboxError when nothing started
function M.start_eval(code, opts, on_done)
  check_code("start_eval", code)
  if type(on_done) ~= "function" then error("start_eval: on_done must be a function", 0) end
  opts = options.check("start_eval", opts, options.eval_schema)
  local proc, err, ecode = launch("start_eval", code, eval_run_options(opts), function(res, rerr, rcode, raw)
    local out, serr = eval_outcome(res, rerr, rcode, raw)
    on_done(out, serr, res)
  end, EVAL_EXTRA)
  if not proc then return nil, select(2, eval_outcome(nil, err, ecode)) end
  return proc
end

--- The run options `eval_in_sandbox` would use for `opts` (already checked), and the policy it
-- runs under: lets a caller check a request against the policy before queueing it.
function M.eval_run_options(opts)
  local ro = eval_run_options(opts)
  return ro, ro.policy
end

-- The host's side of a probe and the policy's description; the caller adds what the policy
-- applied to a real (empty) run.
local function probe_base(what, name)
  local host, err, ecode = hostmod.probe()
  if not host then return nil, err, ecode end
  local ok, pol = pcall(policy.load, name or "default")
  if not ok then error(what .. ": " .. tostring(pol), 0) end
  local out = {}
  for k, v in pairs(host) do out[k] = v end
  out.policy = { name = pol.name, description = pol.description, network = pol.network,
                 pid_namespace = pol.pid_namespace,
                 run_uid = (host.root and host.setuid and pol.uid_range) and
                   (pol.uid_range[1] .. "-" .. pol.uid_range[2]) or nil }
  return out, pol
end

local function probe_finish(out, res, rerr)
  if res then
    out.policy.limits = res.limits
    out.policy.refused = res.refused
  else
    out.policy.error = rerr
  end
  return out
end

--- What this host supports and what a policy will apply.
-- @param name policy name (default "default")
-- @return table `{launcher, euid, root, network_isolation, pid_namespace, setuid, bwrap, caps,
-- rlimits, policy}`, or nil, message, code
function M.probe(name)
  local out, pol, ecode = probe_base("probe", name)
  if not out then return nil, pol, ecode end
  -- what the policy applies here is what it applied to a real (empty) run, not a prediction
  local res, rerr = wait("probe", "pass", { policy = pol })
  return probe_finish(out, res, rerr)
end

--- `probe` without waiting for its run (for the HTTP controller): the loop calls `on_done(probe)`
-- or `on_done(nil, message, code)`. The host's capabilities are learnt with a short blocking
-- `corral-launch --probe` the first time (then cached).
-- @return true, or nil, message, code when nothing started
function M.start_probe(name, on_done)
  if type(on_done) ~= "function" then error("start_probe: on_done must be a function", 0) end
  local out, pol, ecode = probe_base("start_probe", name)
  if not out then return nil, pol, ecode end
  local proc, err, code = launch("start_probe", "pass", { policy = pol }, function(res, rerr)
    on_done(probe_finish(out, res, rerr))
  end)
  if not proc then
    -- the run could not start: the probe still says what the host supports
    return nil, err, code
  end
  return true
end

--- Policies found on the policy path: array of `{name, path, description}`.
function M.policies()
  return policy.list()
end

M.load_policy = policy.load

return M
