--- The pool of launches started ahead of their runs (a policy's `prestart`).
--
-- A launch started ahead is corral-launch --prestart (or a warm interpreter's A and init, with
-- the same argument), with its run directory (no code yet), uid, namespaces and mounts made,
-- waiting in the init for a byte on its report socket. A run whose policy and options match one
-- takes it: its code goes into the directory, proc:go() starts the program, and another is
-- started for the next run while this one runs. What matches: the same policy (the same table,
-- which the launch keeps alive) and every option but stdin's bytes and the timeout (which go()
-- gives) and the files' contents, the same kind of stdin (none, or a pipe) and of code (with a NUL byte or not); then, to
-- be exact whatever a policy's launch_args does, the launcher arguments the run would be given in
-- that directory, and the spawn's own settings, must be the launch's, or it is let go and the run
-- starts cold. Where the policy's program can wait for files given late (files_wait: through
-- the prelude, not warm), a launch has an empty --files-in and its interpreter starts ahead and
-- waits: a run's records (none of the run that started it) go in with its code. A run with
-- `args` takes none. A key's first run starts none (a one-run controller would only waste it); at most
-- PRESTART_MAX wait in all, the oldest let go first, and a key whose launch was let go unused
-- starts none for its next BACKOFF runs (options that vary run to run do not churn launches).
-- A controller that ends without corral.close() has its waiting launches killed and their
-- directories removed when its Lua state closes (corral.run's sentinel).
local core = require "corral.core"
local runmod = require "corral.run"
local warm = require "corral.warm"

local M = {}

--- false: start no launch ahead of its run. One-shot processes (the CLI) turn it off.
M.enabled = true

--- true: a run that comes after a pause (none in flight, none ended in the last PAUSE seconds)
-- has the next launch started once it has ended, on the loop's next turn, rather than while it
-- runs, where its set-up takes CPU from the run's own end. For a controller whose loop runs
-- between runs (`corral serve`). A `run_python` caller's loop stands still between its calls:
-- a launch started while the run runs is ready at the next call; one left for the next turn
-- would only start then.
M.after_pause = false

local PRESTART_MAX, BACKOFF, PAUSE = 8, 8, 0.005

-- list: oldest first; seen: policy table → key → runs (weak: a key's string names the table by
-- its address, which a new table may get once the old one is collected; counted by the table
-- itself, a one-off policy made per run is never taken for a repeated one); inflight, last_end:
-- runs in flight and when the last one ended; deferred: the launch a run that ended left for the
-- loop's next turn ({ fill = fn, timer = core.timer }); epoch: counts let_go_all().
local function new_seen() return setmetatable({}, { __mode = "k" }) end
-- unseparated: a run of this controller was not walled off (`refused separation`)
local pool = { list = {}, seen = new_seen(), nseen = 0, inflight = 0, last_end = -math.huge, epoch = 0 }

--- The launch left for the next turn: started now (run_now), or dropped.
function M.flush_deferred(run_now)
  local d = pool.deferred
  if not d then return end
  pool.deferred = nil
  d.timer:close()
  if run_now then d.fill() end
end

local function defer_fill(fill)
  M.flush_deferred(true)
  local d = { fill = fill }
  d.timer = core.timer(0, function()
    if pool.deferred == d then
      pool.deferred = nil
      d.fill()
    end
  end)
  pool.deferred = d
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

--- The key of the launches a run of plan `p` for `code` (nil: code without a NUL byte) can
-- take, or nil when it takes none. It names the policy table and the caller's options (fewer
-- than the prepared ones, so cheaper to put in canonical form): runs whose options are spelt
-- alike go together, and take() checks what the waiting launch was made with against what this
-- run gets anyway.
function M.key(p, code, extra)
  local pol = p.pol
  -- a run with arguments has a launch of its own: they are in its command line. One with files
  -- takes a launch whose program waits for them (files_wait: not a warm one's), which has read
  -- none yet: they go in with the code.
  local o = p.opts
  if not (M.enabled and not pool.broken and (pol.prestart or 0) > 0 and pol.pid_namespace
          and not pool.unseparated
          and not pol.wrapper_isolates_network) or o.args
      or (o.files and (p.use_zygote or not pol:files_wait({ files_in = true })))
      or (extra and extra.session) then
    return nil
  end
  local copy = {}
  for k, v in pairs(p.opts) do
    -- (the policy is `pol` itself, a table of its own: serve passes it)
    if k ~= "stdin" and k ~= "timeout" and k ~= "policy" and k ~= "files" then copy[k] = v end
  end
  local c = canon(copy, 0)
  if not c then return nil end
  return table.concat({ tostring(pol), p.opts.stdin and "stdin" or "-",
    (code or ""):find("\0", 1, true) and "nul" or "-", (extra and extra.kill_on_overflow) and "kill" or "-", c,
    p.use_zygote and "warm" or "-", o.files and "files" or "-" }, "|")
end

local function same_args(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function drop(slot)
  for i, x in ipairs(pool.list) do
    if x == slot then table.remove(pool.list, i) break end
  end
end

-- Killed at once, its end cleans up; `unused`: its key starts none for a while.
local function let_go(slot, unused)
  drop(slot)
  slot.finish = nil
  local per = pool.seen[slot.pol]
  if unused and per and per[slot.key] then per[slot.key] = -BACKOFF end
  slot.proc:kill()
end

-- Start one launch ahead for `key` (through the policy's warm interpreter when `use_zygote`).
-- Failures are silent: the next run starts as without.
local function start_one(key, pol, o, host, has_nul, extra, use_zygote)
  local zygote
  if use_zygote then
    zygote = warm.get(pol, o)
    if not zygote then return end
  end
  local run = runmod.make(pol, nil, host, has_nul)
  if not run then return end
  run.zygote = use_zygote or nil
  -- Empty files: the launcher opens them now, the run's records go in with its code (take).
  -- Where the program can wait for its files (files_wait), every launch has them, files or
  -- not: its interpreter starts ahead, and only the run's code is left to run once it is taken.
  local ahead = not use_zygote and pol:files_wait({ files_in = true })
  if (ahead or o.files or o.collect) and not runmod.write_files(run, { files = (ahead or o.files) and {}, collect = o.collect }, true) then
    runmod.cleanup(run)
    return
  end
  local slot = { key = key, run = run, pol = pol, settings = runmod.spawn_settings(pol, o, extra) }
  local ok, proc, _, ecode = pcall(function()
    slot.args = pol:launch_args(o, run, host)
    local so = runmod.spawn_options(pol, o, host, extra, zygote)
    so.args = { "--prestart", table.unpack(slot.args) }
    so.hold = true
    so.stdin = o.stdin and "" or nil
    so.on_exit = function(raw)
      if slot.finish then return slot.finish(raw) end
      -- let go of, or gone before its run came: nothing ran
      drop(slot)
      runmod.cleanup(run)
    end
    return core.spawn(so)
  end)
  if not ok or not proc then
    runmod.cleanup(run)
    -- not again in this process where it cannot work (no pidfd, a policy's launch_args that
    -- raises); a passing failure (EAGAIN, EMFILE) only skips this one
    if not ok or ecode == "ENOSYS" then pool.broken = true end
    return
  end
  slot.proc = proc
  run.proc = proc
  local list = pool.list
  list[#list + 1] = slot
  while #list > PRESTART_MAX do let_go(list[1], true) end
end

--- Starts the launches `key` lacks (up to the policy's `prestart`) for plan `p`.
-- @return how many wait now
function M.fill(key, p, has_nul, extra)
  local n = 0
  for _, slot in ipairs(pool.list) do if slot.key == key then n = n + 1 end end
  for _ = n + 1, p.pol.prestart do
    start_one(key, p.pol, p.o, p.host, has_nul, extra, p.use_zygote)
  end
  n = 0
  for _, slot in ipairs(pool.list) do if slot.key == key then n = n + 1 end end
  return n
end

--- The run's code into a matching launch, and the program started.
-- @return the process handle, or nil when none matches (the run starts cold)
function M.take(key, p, code, on_done, extra)
  local pol, o, host = p.pol, p.o, p.host
  local slot
  for i = #pool.list, 1, -1 do
    local s = pool.list[i]
    if s.key == key and rawequal(s.pol, pol) then slot = s break end
  end
  if not slot then return nil end
  drop(slot)
  local run = slot.run
  local ok, args = pcall(pol.launch_args, pol, o, run, host)
  if not ok or not same_args(args, slot.args) or runmod.spawn_settings(pol, o, extra) ~= slot.settings then
    let_go(slot, false)     -- the policy changed under it: the run starts cold (and says why)
    return nil
  end
  if not runmod.write_code(run, code) then let_go(slot, false) return nil end
  -- the program waits for its files (files_wait): their records, before the byte
  if run.in_file then
    run.files_later = o.files and require("corral.workspace").pack(o.files) or ""
    if not runmod.append_later(run) then
      let_go(slot, false)
      return nil
    end
  end
  slot.finish = runmod.finisher(pol, o, run, host, on_done)
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

--- The bookkeeping of a run about to start: returns the `on_done` to give it (which counts its
-- end and starts what was left for then) and a ticket for `started`.
function M.begin(on_done)
  local ticket = { paused = M.after_pause and pool.inflight == 0 and core.hrtime() - pool.last_end > PAUSE }
  local function ended(...)
    pool.inflight = pool.inflight - 1
    pool.last_end = core.hrtime()
    local epoch = pool.epoch
    on_done(...)
    -- (not when on_done let go of the launches started ahead: a server that stops)
    if ticket.fill_at_end and pool.epoch == epoch then defer_fill(ticket.fill_at_end) end
  end
  return ended, ticket
end

--- A run has started (from a launch of `key`, or cold): from a key's second run on, the next
-- run's launches start, while this one runs or, after a pause, once it has ended.
function M.started(key, p, code, extra, ticket)
  pool.inflight = pool.inflight + 1
  if not key then return end
  local pol = p.pol
  local per = pool.seen[pol]
  local seen = (per and per[key] or 0) + 1
  if not (per and per[key]) then
    -- a controller whose every run has options of its own: forget, rather than grow
    pool.nseen = pool.nseen + 1
    if pool.nseen > 256 then pool.seen, pool.nseen, per = new_seen(), 1, nil end
  end
  if not per then
    per = {}
    pool.seen[pol] = per
  end
  per[key] = seen
  if seen > 1 then
    local has_nul = code:find("\0", 1, true) ~= nil
    if ticket.paused then
      ticket.fill_at_end = function() pcall(M.fill, key, p, has_nul, extra) end
    else
      M.fill(key, p, has_nul, extra)
    end
  end
end

--- A run was not walled off from the controller and other runs (its policy's separation =
-- "auto"): its program reaches the run directories of the controller's uid, of whatever policy. A
-- launch started ahead would wait there, made before the run that takes it exists: none is
-- started again by this controller, and the waiting ones are let go.
function M.unseparated()
  if pool.unseparated then return end
  pool.unseparated = true
  for _, slot in ipairs({ table.unpack(pool.list) }) do let_go(slot, false) end
end

--- Let go of the launches started ahead: each is killed, and cleaned up once the loop has seen
-- its end.
-- @return their procs
function M.let_go_all()
  M.flush_deferred(false)
  pool.epoch = pool.epoch + 1
  local procs = {}
  for _, slot in ipairs(pool.list) do procs[#procs + 1] = slot.proc end
  for _, slot in ipairs({ table.unpack(pool.list) }) do let_go(slot, false) end
  pool.seen, pool.nseen = new_seen(), 0
  -- (corral.close(): the runs without the wall have ended with the rest)
  pool.unseparated = nil
  return procs
end

--- Let go of the launches started ahead and wait for their ends (running the loop, so not from
-- a callback) for at most `seconds` (default 5).
-- @return true, or nil and a message
function M.release(seconds)
  local procs = M.let_go_all()
  local all_done = runmod.loop_until(function()
    for _, p in ipairs(procs) do if not p:done() then return false end end
    return true
  end, core.hrtime() + (seconds or 5))
  if not all_done then return nil, "ETIMEDOUT: a launch started ahead is still running" end
  return true
end

return M
