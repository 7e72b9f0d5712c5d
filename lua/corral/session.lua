--- Sessions: one long-lived sandboxed interpreter, with exactly a run's confinement, in which the
-- caller runs cells one after another (docs/sessions.md).
--
-- A session is a run of the session kernel (corral.kernel) started in stream mode: the host writes
-- requests on its stdin and reads its stdout and stderr as they come. Each request carries a
-- random token; the kernel ends its answer with the token on both streams, and the answer's JSON
-- after it on stdout. What came before the tokens is the request's output, kept up to the
-- session's `max_output` per stream. Output that comes while no request runs (a background thread
-- or process) is kept, capped, and given with the next cell's.
--
-- A cell's wall `timeout` first interrupts it (KeyboardInterrupt in the kernel's main thread: the
-- session keeps its state); a cell still running `grace` seconds later loses the session: it is
-- killed, and every later call says it is gone. The session's policy limits (memory, processes,
-- CPU, the budgets) hold for the whole session, its background processes included; `lifetime` is
-- its wall-clock limit and `idle_timeout` ends it after that long without a request.
local core = require "corral.core"
local kernel = require "corral.kernel"
local options = require "corral.options"
local plan = require "corral.plan"
local runmod = require "corral.run"
local workspace = require "corral.workspace"

local M = {}

-- Session settings besides the run options (corral.schema's), with their defaults.
M.SETTINGS = {
  lifetime = { default = 3600, min = 1, max = 7 * 86400 },      -- seconds
  idle_timeout = { default = 600, min = 1, max = 7 * 86400 },   -- seconds
  grace = { default = 2, min = 0.1, max = 60 },                 -- after an interrupt, seconds
}
-- The whole session's CPU seconds unless the options say (a policy's maxima still apply).
M.CPU_SECONDS = 600
-- A cell's settings.
M.CELL = {
  timeout = { default = 30, min = 0.001, max = 86400 },
  cpu_seconds = { min = 1, max = 86400 },
  interactive = { boolean = true },
  collect = { collect = true },
}
-- The largest answer frame a kernel may send (a `get` of a large file, a cell's images).
local MAX_FRAME = 64 * 1048576
-- The most values an answer may hold (each figure of a cell's is one, each entry of a list 8).
local MAX_VALUES = 65536
-- The longest value a cell gives back, in characters (the kernel's repr is cut there too).
M.VALUE_MAX = 10000
local B64 = core.b64encode

local Session = { __name = "corral.Session" }
Session.__index = Session

local function check_number(what, key, v, spec)
  if type(v) ~= "number" or v ~= v then error(what .. ": option '" .. key .. "' must be a number, got " .. type(v), 0) end
  if v < spec.min or v > spec.max then
    error(what .. ": option '" .. key .. "' must be in " .. spec.min .. ".." .. spec.max .. ", got " .. tostring(v), 0)
  end
  return v
end

-- A bounded buffer: the first `cap` bytes kept, the rest counted.
local function buffer(cap)
  return { parts = {}, len = 0, total = 0, cap = cap }
end

local function buf_add(b, s)
  b.total = b.total + #s
  local room = b.cap - b.len
  if room <= 0 then return end
  if #s > room then s = s:sub(1, room) end
  b.parts[#b.parts + 1] = s
  b.len = b.len + #s
end

local function buf_text(b) return table.concat(b.parts) end

-- A session started ahead for the next open with the same options, by their key: a warm
-- kernel is then ready at once. One per key, started when a session of that key opens; let go
-- of after SPARE_IDLE seconds unused, and by corral.close(). At most MAX_SPARES in all (the
-- oldest is let go of for a new one): each is a kernel, and a caller may ask for new options
-- at every open.
local spares = {}
-- keys whose kernel ahead is replaced, not let go of, when unused for SPARE_IDLE (start_ahead's
-- keep: a server's)
local kept = {}
M.SPARE_IDLE = 60
M.MAX_SPARES = 4
--- false: no session is started ahead.
M.spares_enabled = true

-- The options as one string (nil: none are kept ahead for them: a session given files).
local function spare_key(run_opts, settings)
  if run_opts.files then return nil end
  local parts = {}
  for k, v in pairs(run_opts) do
    if type(v) == "table" and k == "env" then
      local e = {}
      for n, val in pairs(v) do e[#e + 1] = n .. "=" .. val end
      table.sort(e)
      v = table.concat(e, "\0")
    end
    parts[#parts + 1] = k .. "=" .. tostring(v)
  end
  for k, v in pairs(settings) do parts[#parts + 1] = "@" .. k .. "=" .. tostring(v) end
  table.sort(parts)
  return table.concat(parts, "\1")
end

-- Start a session's kernel: the session, or nil, message, code. `ahead`: a spare, whose lifetime
-- and idle timeout start when it is taken.
-- `carry_file_output` (false): a file request's output is kept for the next request instead of
-- coming with its answer, for a face that answers a file request with the file alone.
local function start(run_opts, settings, ahead)
  local self = setmetatable({ settings = settings, queue_out = buffer(0), queue_err = buffer(0),
                              count = 0, gone = nil, busy = nil, carry_file_output = false }, Session)
  local ro = {}
  for k, v in pairs(run_opts) do ro[k] = v end
  -- the run's own limit, a backstop: the session's lifetime is the host's timer (Session:_give)
  ro.timeout = math.min(86400 * 8, settings.lifetime + (ahead and M.SPARE_IDLE or 0) + settings.grace + 5)
  local p, err, ecode = plan.of("session", ro, { session = true, on_output = function(name, data)
    self:_output(name, data)
  end })
  if not p then return nil, err, ecode end
  -- a session of a policy whose runs this host cannot start (a run or kernel of it said so)
  local why = require("corral.policy").cannot_run(p.pol)
  if why then return nil, why, "ENOTSUP" end
  self.pol = p.pol
  self.max_output = p.o.max_output
  self.queue_out, self.queue_err = buffer(self.max_output), buffer(self.max_output)
  self.limits_opts = p.o
  -- a cell's collected files: the policy's caps on a run's
  self.caps = workspace.caps(p.pol)
  local proc
  proc, err, ecode = runmod.start_cold(p.pol, p.o, p.host, kernel.source, function(res, e, c)
    self:_ended(res, e, c)
  end, p.extra, p.use_zygote)
  if not proc then return nil, err, ecode end
  self.proc = proc
  return self
end

-- The session is the caller's from now: its id, its lifetime and idle timers.
function Session:_give()
  self.id = core.random_hex(16)
  self.started = core.hrtime()
  self.expires = self.started + self.settings.lifetime
  self.expires_at = os.time() + self.settings.lifetime   -- the same instant, as Unix time
  self.life = core.timer(self.settings.lifetime, function()
    self.life = nil
    self:_lose("lifetime")
  end)
  self:_touch()
  return self
end

--- Let go of the sessions started ahead without waiting (from a callback: a server's stop); each
-- is killed and cleaned up once the loop has seen its end. @return them
function M.let_go_spares()
  local list = {}
  for key in pairs(kept) do kept[key] = nil end
  for key, s in pairs(spares) do
    spares[key] = nil
    if s.spare_timer then s.spare_timer:close() s.spare_timer = nil end
    s:close_async()
    list[#list + 1] = s
  end
  return list
end

--- Let go of the sessions started ahead and wait for their ends (runs the loop: corral.close()
-- does it).
function M.close_spares()
  for _, s in ipairs(M.let_go_spares()) do
    while s.proc do core.run("once") end
  end
end

local function start_spare(key, run_opts, settings)
  if not (key and M.spares_enabled) or spares[key] then return end
  local n, oldest = 0, nil
  -- the oldest goes, one kept for a server last
  local function before(k, o)
    local ok_, kb = kept[k] or false, kept[oldest] or false
    if ok_ ~= kb then return kb end
    return o.ahead_since < spares[oldest].ahead_since
  end
  for k, o in pairs(spares) do
    n = n + 1
    if not oldest or before(k, o) then oldest = k end
  end
  if n >= M.MAX_SPARES then
    local o = spares[oldest]
    spares[oldest] = nil
    if o.spare_timer then o.spare_timer:close() o.spare_timer = nil end
    o:close_async()
  end
  local s = start(run_opts, settings, true)
  if not s then return end
  s.ahead_since = core.hrtime()
  spares[key] = s
  s.spare_timer = core.timer(M.SPARE_IDLE, function()
    s.spare_timer = nil
    if spares[key] == s then
      spares[key] = nil
      s:close_async()
      if kept[key] then start_spare(key, run_opts, settings) end
    end
  end)
end

-- The run options and settings of session options `opts` (raises on bad ones), and their key.
local function prepare(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("session: options must be a table, got " .. type(opts), 0) end
  local run_opts, settings = {}, {}
  for k, v in pairs(opts) do
    if M.SETTINGS[k] then settings[k] = check_number("session", k, v, M.SETTINGS[k])
    elseif k == "stdin" or k == "args" or k == "collect" or k == "timeout" then
      error("session: option '" .. tostring(k) .. "' is a run's, not a session's (a cell's timeout is exec's)", 0)
    else run_opts[k] = v end
  end
  for k, spec in pairs(M.SETTINGS) do
    if settings[k] == nil then settings[k] = spec.default end
  end
  run_opts = options.check("session", run_opts, options.run_schema)
  -- the whole session's CPU: more than one run's by default
  if run_opts.cpu_seconds == nil then run_opts.cpu_seconds = M.CPU_SECONDS end
  -- matplotlib draws without a display; its figures come back as PNG
  local env = { MPLBACKEND = "Agg" }
  for k, v in pairs(run_opts.env or {}) do env[k] = v end
  run_opts.env = env
  return run_opts, settings, spare_key(run_opts, settings)
end

--- Start a session's kernel ahead for options `opts` now (when sessions are started ahead and
-- none is for them yet), so that the first `open` with them takes a kernel that is ready: a
-- server does it at its start. With `keep`, one stays ahead for them: unused for SPARE_IDLE,
-- it is replaced by a new one instead of let go of (until let_go_spares or corral.close()).
-- Options with `files` get none.
-- @return true when one is ahead for them now, false when not; raises on bad options
function M.start_ahead(opts, keep)
  local run_opts, settings, key = prepare(opts)
  if key and keep and M.spares_enabled then kept[key] = true end
  start_spare(key, run_opts, settings)
  return key ~= nil and spares[key] ~= nil
end

--- Open a session. Options: the run options (corral.schema: policy, memory_mb, cpu_seconds for the
-- whole session, processes, open_files, file_mb, max_output per cell and stream, files, env...)
-- and `lifetime`, `idle_timeout`, `grace`. A session opened with the options of one before it
-- (and no files), or of a `start_ahead`, takes the kernel started ahead for them.
-- @return the session, or nil, message, code
function M.open(opts)
  local run_opts, settings, key = prepare(opts)
  local s = key and spares[key]
  if s then
    spares[key] = nil
    if s.spare_timer then s.spare_timer:close() s.spare_timer = nil end
    -- (a spare started before its policy's runs were known not to start here is no session)
    if s:alive() and require("corral.policy").cannot_run(s.pol) then s:close_async(function() end) end
    if not s:alive() then s = nil else s.from_ahead = true end
  end
  local err, ecode
  if not s then
    s, err, ecode = start(run_opts, settings)
    if not s then return nil, err, ecode end
  end
  start_spare(key, run_opts, settings)
  return s:_give()
end

-- The idle timer starts again.
function Session:_touch()
  if self.idle then self.idle:close() end
  self.idle_deadline = core.hrtime() + self.settings.idle_timeout
  self.idle = core.timer(self.settings.idle_timeout, function()
    self.idle = nil
    if not self.busy then self:_lose("idle") end
  end)
end

-- The session ends now: killed, every later call told why.
function Session:_lose(why)
  if not self.gone then self.gone = why end
  if self.proc then self.proc:kill() end
  -- a request in flight is answered now, not when the run's end has been cleaned up: its wait
  -- ends at its timeout and the grace
  if self.busy and why == "lost" then self:_finish(self.busy, {}, "lost") end
end

local function stop_timers(req)
  if req.timer then req.timer:close() req.timer = nil end
end

-- Output from the kernel: the current request's, or kept for the next cell.
function Session:_output(name, data)
  local req = self.busy
  if not req then
    buf_add(name == "stdout" and self.queue_out or self.queue_err, data)
    return
  end
  local st = req[name]
  if st.done then
    if name == "stdout" and not req.frame_done then
      self:_frame(req, data)
    else
      -- after this request's end: the next cell's
      buf_add(name == "stdout" and self.queue_out or self.queue_err, data)
    end
    return
  end
  -- the token may come split over reads: look in what is kept of the last bytes and the new ones
  local scan = st.tail .. data
  local at = scan:find(req.mark, 1, true)
  if not at then
    local keep = #scan - (#req.mark - 1)
    if keep > 0 then
      buf_add(st.buf, scan:sub(1, keep))
      st.tail = scan:sub(keep + 1)
    else
      st.tail = scan
    end
    return
  end
  buf_add(st.buf, scan:sub(1, at - 1))
  st.done = true
  st.tail = ""
  local rest = scan:sub(at + #req.mark)
  if name == "stdout" then
    self:_frame(req, rest)
  elseif rest ~= "" then
    buf_add(self.queue_err, rest)
  end
  self:_maybe_done(req)
end

-- The answer frame after the token on stdout: LENGTH "\n" JSON. Its body is kept in pieces and
-- joined once (a large answer comes in many reads).
function Session:_frame(req, data)
  if data == "" then return end
  if not req.frame_len then
    req.frame = req.frame .. data
    local nl = req.frame:find("\n", 1, true)
    if not nl then
      if #req.frame > 20 then return self:_lose("protocol") end
      return
    end
    -- decimal digits only: the program may have written it
    local digits = req.frame:sub(1, nl - 1)
    req.frame_len = digits:match("^%d+$") and tonumber(digits)
    if not req.frame_len or req.frame_len > (req.max_frame or MAX_FRAME) then return self:_lose("protocol") end
    data = req.frame:sub(nl + 1)
    req.frame, req.parts, req.got = nil, {}, 0
  end
  req.parts[#req.parts + 1] = data
  req.got = req.got + #data
  if req.got >= req.frame_len then
    local all = table.concat(req.parts)
    req.parts = nil
    req.frame = all:sub(1, req.frame_len)
    local extra = all:sub(req.frame_len + 1)
    req.frame_done = true
    if extra ~= "" then buf_add(self.queue_out, extra) end
    self:_maybe_done(req)
  end
end

-- Whether the JSON text has at most `most` values: decoded, each is a Lua value (a table for
-- each array or object), so a frame of small values takes tens of times its bytes. Counted
-- as the '[', '{', ',' and ':' outside strings, in C without a copy of the text; text that is
-- not JSON may be counted wrong, and then fails to decode.
local function values_at_most(text, most)
  return core.json_separators(text) <= most
end

function Session:_maybe_done(req)
  if not (req.stdout.done and req.stderr.done and req.frame_done) then return end
  if not values_at_most(req.frame, req.max_values or MAX_VALUES) then return self:_lose("protocol") end
  local ok, answer = pcall(require("cjson").decode, req.frame)
  if not ok or type(answer) ~= "table" then return self:_lose("protocol") end
  self:_finish(req, answer)
end

-- The request is over: its result to its caller.
function Session:_finish(req, answer, reason)
  if self.busy ~= req then return end
  self.busy = nil
  -- what waited in case a token began there is output after all
  for _, name in ipairs({ "stdout", "stderr" }) do
    local st = req[name]
    if not st.done and st.tail ~= "" then buf_add(st.buf, st.tail) st.tail = "" end
  end
  stop_timers(req)
  self:_touch()
  local res = req.shape(self, req, answer or {}, reason)
  if res.reason == "exit" then
    -- the session ends with its answer: the program may have written it and go on running
    if not self.gone then self.gone = "exit" end
    if self.proc then self.proc:kill() end
  end
  req.cb(res)
end

-- An answer is the kernel's, which the program can rewrite: each field is taken only with its
-- type and within its cap. (lua-cjson decodes every number as a float.)
local function int(v) return type(v) == "number" and math.tointeger(v) or nil end
local function num(v) return type(v) == "number" and v == v and v or nil end
local function bool(v) if type(v) == "boolean" then return v end return nil end
-- A string of at most `bytes` bytes (and `chars` characters), as valid UTF-8 (an invalid byte
-- as U+FFFD, as in stdout); and whether it was cut.
local function text(v, bytes, chars)
  if type(v) ~= "string" then return nil end
  local cut = #v > bytes
  if cut then v = v:sub(1, bytes) end
  v = core.utf8_repair(v)
  if chars and utf8.len(v) > chars then v, cut = v:sub(1, utf8.offset(v, chars + 1) - 1), true end
  return v, cut
end

local function cell_reason(req, answer)
  local s = answer.status
  if s == "ok" then return "ok" end
  if s == "interrupted" then return req.timed_out and "timeout" or "interrupted" end
  if s == "cpu" then return "cpu" end
  if s == "exit" then return "exit" end
  return "error"
end

local function cell_result(self, req, answer, reason)
  local out, err = req.stdout.buf, req.stderr.buf
  local res = {
    reason = reason or cell_reason(req, answer),
    stdout = core.utf8_repair(buf_text(out)),
    stderr = core.utf8_repair(buf_text(err)),
    truncated = out.total > out.cap or err.total > err.cap,
    execution_count = int(answer.execution_count),
    usage = { wall_s = core.hrtime() - req.t0, cpu_s = num(answer.cpu_s), memory_kb = int(answer.memory_kb),
              memory_peak_kb = int(answer.memory_peak_kb) },
  }
  res.ok = res.reason == "ok"
  -- a repr of at most VALUE_MAX characters (4 bytes each at most)
  local value, cut = text(answer.value, 4 * M.VALUE_MAX, M.VALUE_MAX)
  res.value, res.value_truncated = value, value and (cut or bool(answer.value_truncated)) or nil
  -- (a cell lost to a kernel that never ran: why it did not)
  local e = answer.error or (res.reason == "lost" and self.setup_error)
  if type(e) == "table" then
    -- the traceback is on stderr too: each within max_output, as stderr is
    local most = math.max(self.max_output, 1000)
    res.error = { type = text(e.type, 1000), message = text(e.message, most), traceback = text(e.traceback, most) }
  end
  if type(answer.images) == "table" then
    res.images = {}
    for _, b in ipairs(answer.images) do
      if type(b) == "string" then res.images[#res.images + 1] = core.b64decode(b) or "" end
    end
  end
  if res.reason == "exit" then res.returncode = int(answer.exit_code) or self.returncode end
  if req.collect then
    -- the records of a run's collection, bounded again here as they are parsed: the kernel is
    -- the program's too, and may write millions of records
    local list, info = workspace.unpack(type(answer.files) == "string" and core.b64decode(answer.files) or "",
      nil, self.caps)
    local flags = info.flags
    if not info.complete then
      -- no end record: what the caps cut, after why it is missing
      flags = { reason and reason ~= "error" and "lost" or "interrupted", table.unpack(info.flags) }
    end
    res.files = workspace.bound(list)
    res.files_truncated = #flags > 0 and flags or nil
  end
  return res
end

-- Start request `msg` (its token added); `shape(self, req, answer, reason)` makes its result.
function Session:_request(msg, timeout, shape, cb)
  if self.gone then return nil, "ESESSION: the session is gone (" .. self.gone .. ")", "ESESSION" end
  if self.busy then return nil, "EBUSY: the session is running a request", "EBUSY" end
  local token = core.random_hex(16)
  msg.token = token
  local body = require("cjson").encode(msg)
  local req = {
    token = token, mark = "\0" .. token .. "\0", t0 = core.hrtime(), frame = "", shape = shape, cb = cb,
    stdout = { buf = buffer(self.max_output), tail = "" },
    stderr = { buf = buffer(self.max_output), tail = "" },
  }
  -- what came between requests goes first
  buf_add(req.stdout.buf, buf_text(self.queue_out))
  buf_add(req.stderr.buf, buf_text(self.queue_err))
  req.stdout.buf.total = req.stdout.buf.total + (self.queue_out.total - self.queue_out.len)
  req.stderr.buf.total = req.stderr.buf.total + (self.queue_err.total - self.queue_err.len)
  self.queue_out, self.queue_err = buffer(self.max_output), buffer(self.max_output)
  local ok, werr = self.proc:write(#body .. "\n" .. body)
  if not ok then return nil, "ESESSION: the session is gone (" .. tostring(werr) .. ")", "ESESSION" end
  self.busy = req
  if self.idle then self.idle:close() self.idle = nil end
  req.timer = core.timer(timeout, function()
    req.timer = nil
    req.timed_out = true
    self:_interrupt(req)
  end)
  return req
end

-- An interrupt to request `req`, which the session survives; then, if it has not ended after
-- the grace, the session is lost.
function Session:_interrupt(req)
  if req.timer then req.timer:close() end
  req.interrupted = true
  local msg = require("cjson").encode({ op = "interrupt", token = req.token })
  self.proc:write(#msg .. "\n" .. msg)
  req.timer = core.timer(self.settings.grace, function()
    req.timer = nil
    self:_lose("lost")
  end)
end

--- Interrupt the running cell (KeyboardInterrupt in it, as Ctrl-C in Python's REPL): it ends
-- with reason `interrupted` and the session keeps its state; a cell still running `grace`
-- seconds later loses the session, as at a timeout.
-- @return true, or nil, message, code (nothing runs: EIDLE; the session is gone: ESESSION)
function Session:interrupt()
  if self.gone or not self.proc then return nil, "ESESSION: the session is gone (" .. tostring(self.gone) .. ")", "ESESSION" end
  local req = self.busy
  if not req then return nil, "EIDLE: no request is running", "EIDLE" end
  -- a second interrupt does not give the cell a new grace
  if not req.interrupted then self:_interrupt(req) end
  return true
end

-- The kernel ended: a request in flight gets what the run's result says.
function Session:_ended(res, err, code)
  self.proc = nil
  self.result = res
  if self.idle then self.idle:close() self.idle = nil end
  if self.life then self.life:close() self.life = nil end
  if self.spare_timer then self.spare_timer:close() self.spare_timer = nil end
  local reason = self.gone
  if not reason then
    if not res then reason = "lost"
    elseif res.reason == "exit" then reason = "exit"
    elseif res.reason == "timeout" then reason = "lifetime"
    else reason = res.reason end
    self.gone = reason
  end
  self.returncode = res and res.returncode
  self.end_error = err and (tostring(err) .. " " .. tostring(code)) or nil
  -- the kernel never ran (its sandbox could not be set up): what a cell lost to it says
  if not res and err then self.setup_error = { type = tostring(code), message = tostring(err) } end
  local req = self.busy
  if req then
    -- a cell ended by the session's end: memory, cpu, processes... or lost
    local r = reason
    if r == "idle" or r == "lifetime" or r == "protocol" or r == "closed" then r = "lost" end
    self:_finish(req, req.answer_if_any or {}, r)
  end
  if self.on_end then self.on_end(self) end
  for _, cb in ipairs(self.closed_waiters or {}) do cb() end
  self.closed_waiters = nil
end

local function wait_for(_, begin)
  local done, res = false, nil
  local req, err, ecode = begin(function(r) res, done = r, true end)
  if not req then return nil, err, ecode end
  while not done do core.run("once") end
  return res
end

--- Run `code` as the next cell; calls `cb(result)` when it has ended. Options: `timeout` (wall
-- seconds, default 30), `cpu_seconds` (the cell's CPU), `interactive`, `collect` (globs, or true:
-- the files the cell made or changed; `result.files` as a run's, within the policy's caps).
-- @return true, or nil, message, code (the session is gone, or busy)
function Session:exec_async(code, eopts, cb)
  if type(code) ~= "string" then error("exec: code must be a string, got " .. type(code), 0) end
  eopts = eopts or {}
  for k, v in pairs(eopts) do
    if not M.CELL[k] then
      error("exec: option '" .. tostring(k) .. "' is not known (timeout, cpu_seconds, interactive, collect)", 0)
    end
    if M.CELL[k].boolean and type(v) ~= "boolean" then
      error("exec: option '" .. k .. "' must be a boolean, got " .. type(v), 0)
    end
  end
  local timeout = eopts.timeout and check_number("exec", "timeout", eopts.timeout, M.CELL.timeout) or M.CELL.timeout.default
  local cpu = eopts.cpu_seconds and check_number("exec", "cpu_seconds", eopts.cpu_seconds, M.CELL.cpu_seconds)
  local collect = eopts.collect ~= nil and workspace.check_collect("exec", "collect", eopts.collect, 0) or nil
  local msg = { op = "exec", code = code, cpu = cpu, interactive = eopts.interactive }
  if collect then
    local globs
    if collect ~= true then
      globs = {}
      for i, g in ipairs(collect) do globs[i] = B64(g) end
    end
    msg.collect = { globs = globs, files = self.caps.out_files, file_bytes = self.caps.out_file_bytes,
                    bytes = self.caps.out_bytes }
  end
  local req, err, ecode = self:_request(msg, timeout, cell_result, cb)
  if not req then return nil, err, ecode end
  if collect then
    -- the answer carries the records in base64 besides the rest
    req.collect = true
    req.max_frame = MAX_FRAME + (workspace.records_max(self.caps) // 3 + 1) * 4
  end
  return true
end

--- `exec_async`, waiting (runs the loop: not from a callback).
function Session:exec(code, eopts)
  return wait_for(self, function(cb) return self:exec_async(code, eopts, cb) end)
end

local KINDS = { file = true, directory = true, link = true, other = true }

-- A file request's result: `req.most` bytes of a file, entries of a list at most.
-- A request's output goes back to the front of what the next request gets first: for a face
-- that cannot show it with the answer (HTTP answers a file request with the file's bytes).
local function carry_output(self, req)
  for _, name in ipairs({ "stdout", "stderr" }) do
    local q = name == "stdout" and "queue_out" or "queue_err"
    local merged = buffer(self.max_output)
    for _, b in ipairs({ req[name].buf, self[q] }) do
      buf_add(merged, buf_text(b))
      merged.total = merged.total + (b.total - b.len)
    end
    self[q] = merged
  end
end

local function file_result(self, req, answer, reason)
  if reason then return { ok = false, reason = reason } end
  if self.carry_file_output then carry_output(self, req) req.stdout.buf, req.stderr.buf = buffer(0), buffer(0) end
  local res = { ok = answer.status == "ok", reason = answer.status == "ok" and "ok" or "error" }
  local e = answer.error
  if type(e) == "table" then res.error = { type = text(e.type, 1000), message = text(e.message, math.max(self.max_output, 1000)) } end
  if type(answer.content_b64) == "string" then
    local content = core.b64decode(answer.content_b64) or ""
    local cut = #content > (req.most or 0)
    if cut then content = content:sub(1, req.most or 0) end
    res.content, res.mode = content, int(answer.mode)
    res.size = math.max(int(answer.size) or 0, #content)
    res.truncated = cut or bool(answer.truncated) or res.size > #content
  end
  if type(answer.entries) == "table" then
    res.entries, res.truncated = {}, bool(answer.truncated) or false
    for _, en in ipairs(answer.entries) do
      if #res.entries >= (req.most or 0) then res.truncated = true break end
      if type(en) == "table" and type(en.path_b64) == "string" then
        res.entries[#res.entries + 1] = { path = core.b64decode(en.path_b64) or "",
          type = KINDS[en.type] and en.type or "other", size = int(en.size) }
      end
    end
  end
  res.created = bool(answer.created)
  res.stdout, res.stderr = buf_text(req.stdout.buf), buf_text(req.stderr.buf)
  return res
end

--- Whether `source` is a whole statement, as Python's REPL decides when to stop asking for
-- lines (codeop.compile_command in the session's interpreter): true when it compiles or is an
-- error (running it shows the error), false when more lines may complete it.
-- @return the answer ({ok, complete, stdout, stderr}: output that came between cells with it),
-- or nil, message, code
function Session:complete(source)
  if type(source) ~= "string" then error("complete: source must be a string, got " .. type(source), 0) end
  return wait_for(self, function(cb)
    return self:_request({ op = "complete", source = source }, self.settings.grace + 30, function(s, req, answer, reason)
      local res = file_result(s, req, answer, reason)
      res.complete = bool(answer.complete)
      return res
    end, cb)
  end)
end

local function check_path(what, path)
  if type(path) ~= "string" then error(what .. ": path must be a string, got " .. type(path), 0) end
  local why = workspace.path_problem(path)
  if why then error(what .. ": the path '" .. path .. "' " .. why, 0) end
end

-- A file request's settings: how long the kernel may take to answer.
local function file_timeout(self) return self.settings.grace + 30 end

--- Write `bytes` to `path` (relative to the work dir) in the session, never through a link; calls
-- `cb(result)` from the loop (`result.created`: the file did not exist before).
-- @return true, or nil, message, code (the session is gone, or busy)
function Session:put_async(path, bytes, mode, cb)
  check_path("put", path)
  if type(bytes) ~= "string" then error("put: content must be a string, got " .. type(bytes), 0) end
  local req, err, ecode = self:_request({ op = "put", path_b64 = B64(path), content_b64 = B64(bytes),
    mode = mode or 420 }, file_timeout(self), file_result, cb)
  if not req then return nil, err, ecode end
  return true
end

--- `put_async`, waiting (runs the loop: not from a callback).
function Session:put(path, bytes, mode)
  return wait_for(self, function(cb) return self:put_async(path, bytes, mode, cb) end)
end

--- The bytes of `path` in the session (at most `max`, default 16 MiB), never through a link;
-- calls `cb(result)` from the loop.
-- @return true, or nil, message, code (the session is gone, or busy)
function Session:get_async(path, max, cb)
  check_path("get", path)
  max = max or 16 * 1048576
  local req, err, ecode = self:_request({ op = "get", path_b64 = B64(path), max = max },
    file_timeout(self), file_result, cb)
  if not req then return nil, err, ecode end
  req.most = max
  return true
end

--- `get_async`, waiting (runs the loop: not from a callback).
function Session:get(path, max)
  return wait_for(self, function(cb) return self:get_async(path, max, cb) end)
end

--- The work dir's entries (at most `max`, default 1000): {path, type, size}; calls `cb(result)`
-- from the loop.
-- @return true, or nil, message, code (the session is gone, or busy)
function Session:list_async(max, cb)
  max = max or 1000
  local req, err, ecode = self:_request({ op = "list", max = max }, file_timeout(self), file_result, cb)
  if not req then return nil, err, ecode end
  -- each entry is 8 values of its answer's JSON at most
  req.most, req.max_values = max, MAX_VALUES + 8 * max
  return true
end

--- `list_async`, waiting (runs the loop: not from a callback).
function Session:list(max)
  return wait_for(self, function(cb) return self:list_async(max, cb) end)
end

--- End the session without waiting: its interpreter and every process it started are killed now;
-- `cb()` (optional) is called from the loop once its run has been cleaned up (its work dir
-- removed). `why` (default "closed") is what later calls are told.
function Session:close_async(cb, why)
  if not self.gone then self.gone = why or "closed" end
  if self.idle then self.idle:close() self.idle = nil end
  if self.life then self.life:close() self.life = nil end
  if not self.proc then
    if cb then cb() end
    return true
  end
  if cb then self.closed_waiters = self.closed_waiters or {} table.insert(self.closed_waiters, cb) end
  self.proc:kill()
  return true
end

--- End the session: its interpreter and every process it started, its work dir. Waits (runs the
-- loop) for the run to be cleaned up.
function Session:close()
  self:close_async()
  while self.proc do core.run("once") end
  return true
end

function Session:alive() return self.gone == nil end

return M
