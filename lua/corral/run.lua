--- One run: its directory and uid, the spawn that starts it, and its end.
--
-- A run table holds what a run owns on the host (`top`, the lock on it, `uid`) from `make` to
-- `cleanup`. Every run that holds a directory is in `live` until its cleanup: when the Lua state
-- closes without their ends having been seen, the sentinel below kills their processes and removes
-- their directories, whatever path made them (a run in flight, a launch started ahead, one let go).
local core = require "corral.core"
local hostmod = require "corral.host"
local warm = require "corral.warm"

local M = {}

local live = {}
-- a held launch could not be watched here (no pidfd: before Linux 5.3): files in are written
-- before the spawn from then on
local hold_broken = false

--- Remove the run's directory and give back its uid.
-- @return an error message, or nil
function M.cleanup(run)
  local err
  live[run] = nil
  if run.in_file then run.in_file:close() run.in_file = nil end
  if run.out_file then run.out_file:close() run.out_file = nil end
  if run.top then
    -- Through the fd of the lock taken on the directory when it was made, never by its path:
    -- where a program shares our uid (no run uid, no mount namespace, no Landlock) it may have
    -- renamed the directory away and put a link to elsewhere in its place. The directory is
    -- removed wherever it is now; a link at its path goes, unfollowed. What make made, when
    -- that is all there is (the launcher removed in and out; the work dir is a tmpfs of the
    -- run's own mount namespace, so empty here), goes a call each, without a walk.
    local top = run.top
    local names = run.code_path and { run.code_path:sub(#top + 2), "code/", "work/" } or nil
    local ok, e = core.rmtree(top, run.lock, names)
    if not ok then err = e end
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
local cleanup = M.cleanup

--- The code into the run's directory: readable by the run's group only when it has a uid.
-- @return true, or nil, message, code
function M.write_code(run, code)
  local ok, err, ecode = core.write_file(run.code_path, code, run.uid and 288 or 256) -- 0440 / 0400
  if ok and run.uid then ok, err, ecode = core.chown(run.code_path, -1, run.gid) end
  return ok, err, ecode
end

--- Make the run's directory: <tmp>/corral-XXXXXX/{code/<code_name>, work/}. The code is handed
-- over in a file, never in argv (no E2BIG, no size limit but the disk's); `work` is the cwd, HOME
-- and TMPDIR, owned by the run's uid when there is one.
-- @param code the code; nil for a launch started ahead of its run, whose code comes with the run:
-- `has_nul` then says whether that code will hold a NUL byte (the interpreter's argv differs)
-- @return the run table, or nil, message, code
function M.make(pol, code, host, has_nul)
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
    code and function() return M.write_code(run, code) end,
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

--- The run's files (`files`, `collect`: corral.workspace) beside its code: the records the
-- launcher unpacks, and the empty file it writes what it collects into. `o.main`: the file of
-- `files` that runs instead of the code (args[1]).
-- @param later the records are written once the launcher is started (M.start_cold): an empty
-- file now, which the launcher opens, and `run.files_later` the records
-- @return true, or nil, message, code
function M.write_files(run, o, later)
  local ws = require "corral.workspace"
  run.main = o.main
  -- The launcher opens both, then removes their names (--unlink-files) before the program
  -- exists: the records held late and the collection are reached through the host's own fds.
  if o.files then
    run.files_in = run.top .. "/in"
    local records = ws.pack(o.files)
    if later then
      run.files_later = records
      local f, err, ecode = core.create_file(run.files_in, 256)                   -- 0400
      if not f then return nil, err, ecode end
      run.in_file = f
    else
      local ok, err, ecode = core.write_file(run.files_in, records, 256)          -- 0400
      if not ok then return nil, err, ecode end
    end
  end
  if o.collect then
    run.files_out = run.top .. "/out"
    local f, err, ecode = core.create_file(run.files_out, 384)                    -- 0600
    if not f then return nil, err, ecode end
    run.out_file = f
  end
  return true
end

--- The records held back for a launch that has the file open already (M.start_cold, and a
-- launch started ahead: corral.prestart); the host's fd is done with then.
function M.append_later(run)
  local records = run.files_later
  run.files_later = nil
  local ok, err, ecode = run.in_file:append(records)
  run.in_file:close()
  run.in_file = nil
  return ok, err, ecode
end

--- What the launcher collected, read back: the result's `files`, and how the list was cut.
-- At most what the policy's caps let the launcher write (workspace.records_max), and entries
-- within the same caps; a file that holds the bytes it was given gets them from `o.files`. The
-- launcher runs in the program's reach where there is no mount namespace, no Landlock and no run
-- uid: whatever the records say, the list holds relative paths of the work dir, each once.
local function read_collected(pol, o, run)
  local ws = require "corral.workspace"
  local caps = ws.caps(pol)
  local list, info = ws.read(run.out_file, ws.records_max(caps), o.files, caps)
  return ws.bound(list), info
end

--- The end of a run: its result from the policy, its directory and uid given back, then
-- `done(result, message, code, raw)`.
function M.finisher(pol, o, run, host, done)
  return function(raw)
    -- a policy's result() is operator code: whatever it does, the run is cleaned up
    local pok, res, rerr, rcode
    if run.failed then
      pok, rerr, rcode = true, run.failed[1], run.failed[2]
    elseif raw.launch_error then
      pok, rerr, rcode = true, "EZYGOTE: the warm interpreter did not run the program: " .. raw.launch_error, "EZYGOTE"
    else
      pok, res, rerr, rcode = pcall(pol.result, pol, raw, o, run, host)
    end
    if pok and res and run.files_out then
      local info
      res.files, info = read_collected(pol, o, run)
      -- what cut the list short; "lost": the launcher was killed while it wrote
      res.files_truncated = #info.flags > 0 and info.flags or nil
      if not info.complete then res.files_truncated = { "lost", table.unpack(info.flags) } end
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

--- core.spawn's options for a run, but its arguments, stdin and on_exit. `extra` carries
-- settings that are not public options (eval_in_sandbox's kill-on-overflow); `zygote`: the warm
-- interpreter that forks it.
function M.spawn_options(pol, o, host, extra, zygote)
  if extra and extra.on_output then
    -- a session (corral.session): its stdin stays open, its output goes to on_output as it comes
    return {
      file = not zygote and host.launcher or nil, zygote = zygote, stream = true, stdin = "",
      on_output = extra.on_output, report = true, timeout = o.timeout, grace = pol.grace or 0.2,
      tail_bytes = pol.tail_bytes or 1024,
    }
  end
  return {
    file = not zygote and host.launcher or nil,
    zygote = zygote,
    stdout_cap = o.max_output,
    stderr_cap = o.max_output,
    tail_bytes = pol.tail_bytes or 1024,
    kill_on_overflow = (extra and extra.kill_on_overflow) or pol.kill_on_overflow or false,
    report = true,
    timeout = o.timeout,
    -- collecting happens after the run's last process, a stop's included: time for it
    grace = (pol.grace or 0.2) + (o.collect and 1 or 0),
  }
end

--- What a run is spawned with, besides its arguments, timeout and stdin's bytes, as one string.
function M.spawn_settings(pol, o, extra)
  local so = M.spawn_options(pol, o, {}, extra)
  return table.concat({ tostring(o.stdin ~= nil), tostring(so.stdout_cap), tostring(so.tail_bytes),
    tostring(so.kill_on_overflow), tostring(so.grace) }, "|")
end

--- A run started on request: its directory, then corral-launch or its warm interpreter.
-- @return the process handle, or nil, message, code (nothing left behind)
function M.start_cold(pol, o, host, code, on_done, extra, use_zygote)
  local run, err, ecode = M.make(pol, code, host)
  if not run then return nil, err, ecode end
  local zygote
  if use_zygote then
    zygote, err, ecode = warm.get(pol, o)
    if not zygote then cleanup(run) return nil, err, ecode end
    run.zygote = true
  end
  -- A cold run whose program waits for its files (the policy's files_wait: the launcher makes
  -- them while the interpreter starts) is spawned as a launch ahead of its run (--prestart,
  -- held): its records are written while the launcher starts, and the byte says they are all
  -- there. (Not a session's, whose output streams.)
  local later = o.files and not hold_broken and pol.pid_namespace and not (extra and extra.on_output)
    and pol:files_wait({ files_in = true, zygote = run.zygote })
  if o.files or o.collect or o.main then
    local ok
    ok, err, ecode = M.write_files(run, o, later)
    if not ok then cleanup(run) return nil, err, ecode end
  end
  -- from here on the run holds a directory, a lock and maybe a uid: any error (a policy's
  -- launch_args is operator code) must give them back
  local function spawn()
    local so = M.spawn_options(pol, o, host, extra, zygote)
    so.args = pol:launch_args(o, run, host)
    so.stdin = so.stdin or o.stdin
    if later then
      table.insert(so.args, 1, "--prestart")
      so.hold = true
      so.stdin = o.stdin and "" or nil
    end
    so.on_exit = M.finisher(pol, o, run, host, on_done)
    return core.spawn(so)
  end
  local spawn_ok, proc, serr, scode = pcall(spawn)
  if later and spawn_ok and not proc and scode == "ENOSYS" then
    -- no pidfd to watch a held launch: the records first, then a plain spawn
    hold_broken, later = true, false
    local ok, aerr, acode = M.append_later(run)
    if not ok then cleanup(run) return nil, aerr, acode end
    spawn_ok, proc, serr, scode = pcall(spawn)
  end
  if not spawn_ok then
    cleanup(run)
    return nil, "EPOLICY: policy '" .. tostring(pol.name) .. "' failed to build the launch plan: " .. tostring(proc),
      "EPOLICY"
  end
  if not proc then cleanup(run) return nil, serr, scode end
  run.proc = proc
  if later then
    local ok, aerr, acode = M.append_later(run)
    if not ok then
      -- the launch is let go: nothing of the run ran, its end cleans up
      run.failed = { aerr, acode }
      proc:kill()
    elseif not proc:go { stdin = o.stdin, timeout = o.timeout } then
      proc:kill()    -- gone meanwhile: its exit says why
    end
  end
  return proc
end

--- Run the loop until `done()` or the deadline (core.hrtime()); a timer wakes the loop at the
-- deadline, so that waiting for something that never comes still ends. Not from a callback.
-- @return done()
function M.loop_until(done, deadline)
  if done() then return true end
  -- (the timer's clock is the loop's, in whole milliseconds: it may fire before hrtime() is
  -- past the deadline, so its firing ends the wait)
  local fired = false
  local t = core.timer(math.max(0, deadline - core.hrtime()), function() fired = true end)
  while not done() and not fired do core.run("once") end
  t:close()
  return done()
end

-- A controller that ends without corral.close(), or with runs in flight: its Lua state's close
-- kills their processes (the loop's teardown; here first, with their groups) and removes the
-- directories of every run whose end the loop has not seen. Kept in the module table, which
-- package.loaded holds until the state closes.
M._sentinel = setmetatable({}, { __gc = function()
  for run in pairs(live) do
    -- (a warm interpreter's launch has no pid until the zygote named it: kill(-0) would be ours)
    local pid = run.proc and run.proc:pid() or 0
    if pid > 0 then pcall(core.kill, -pid, 9) end
  end
  for run in pairs(live) do pcall(cleanup, run) end
end })

return M
