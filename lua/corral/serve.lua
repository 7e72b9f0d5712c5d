--- corral serve: the HTTP/1.1 + JSON controller.
--
-- `serve.start(config)` listens on a unix socket or a TCP address (the HTTP server itself is in
-- the host module, `core.http_listen`) and returns a server object; the caller then drives the
-- loop with `corral.run_loop()` until the server has stopped. Routes:
--
--     POST /v1/run     {"code": ..., run options}  → 200 and the result object of `corral run --json`
--     POST /v1/eval    {"code": ..., eval_in_sandbox's options} → 200 {ok, returncode, stdout, stderr}
--     GET  /healthz    → 200 {"ok": true, ...}, 503 while draining
--     GET  /v1/probe   → corral.probe() of the server's policy (run once, then cached)
--     GET  /metrics    → Prometheus text format
--     POST /v1/sessions, /v1/sessions/{id}/exec, .../files[/{path}], DELETE /v1/sessions/{id}:
--                         sessions (corral.session), docs/http.md
--
-- Every error is a JSON body `{"error": {"code": ..., "message": ..., "field": ...}}`; docs/http.md
-- lists the codes. At most `concurrency` runs at once, then a bounded FIFO
-- queue, then 503 "overloaded" with Retry-After. A client that goes away is dropped from the queue,
-- or its run is killed. SIGTERM and SIGINT drain: stop accepting, finish what is running and
-- queued for up to `drain_seconds`, kill the rest, stop.
local core = require "corral.core"
local corral = require "corral"
local policy = require "corral.policy"
local hostmod = require "corral.host"
local result = require "corral.result"
local schema = require "corral.schema"
local session = require "corral.session"
local workspace = require "corral.workspace"

local M = {}

local SIGINT, SIGTERM = 2, 15
local floor, ceil, hrtime = math.floor, math.ceil, core.hrtime

local cjson
do
  local ok, lib = pcall(require, "cjson")
  if ok then
    -- a private instance: its settings do not change the embedder's cjson
    cjson = lib.new()
    cjson.encode_invalid_numbers(false)
    cjson.decode_invalid_numbers(false)
    cjson.decode_max_depth(32)
  end
end

--- The JSON fields `POST /v1/run` accepts and their JSON types ("integer": a whole number):
-- corral.schema's. `python` and `env` are left out on purpose: the interpreter and the
-- environment are the operator's choice (the policy's), not a caller's.
M.RUN_FIELDS = schema.json_fields("run")

--- The JSON fields `POST /v1/eval` accepts (eval_in_sandbox's names).
M.EVAL_FIELDS = schema.json_fields("eval")

--- The JSON fields `POST /v1/sessions` accepts: a run's, but those that are a run's only
-- (`code`, `stdin`, `args`, `collect`, `timeout`), and the session's `lifetime` and
-- `idle_timeout` (its `grace` is the operator's).
M.SESSION_FIELDS = schema.json_fields("run")
for _, k in ipairs({ "code", "stdin", "args", "collect", "timeout" }) do M.SESSION_FIELDS[k] = nil end
M.SESSION_FIELDS.lifetime, M.SESSION_FIELDS.idle_timeout = "number", "number"

--- The JSON fields `POST /v1/sessions/{id}/exec` accepts.
M.EXEC_FIELDS = { code = "string", timeout = "number", cpu_seconds = "number", collect = "array or boolean" }

local ROUTES = {
  ["/v1/run"] = { POST = "run" },
  ["/v1/eval"] = { POST = "eval" },
  ["/healthz"] = { GET = "health" },
  ["/v1/probe"] = { GET = "probe" },
  ["/metrics"] = { GET = "metrics" },
  ["/v1/sessions"] = { POST = "session_open" },
}

-- A session's routes, after /v1/sessions/{id}: the rest of the path → methods.
local SESSION_ROUTES = {
  [""] = { route = "/v1/sessions/{id}", methods = { DELETE = "session_close" } },
  ["/exec"] = { route = "/v1/sessions/{id}/exec", methods = { POST = "session_exec" } },
  ["/files"] = { route = "/v1/sessions/{id}/files", methods = { GET = "session_list" } },
  ["/files/"] = { route = "/v1/sessions/{id}/files/{path}", methods = { GET = "session_get", PUT = "session_put" } },
}

-- How many ended sessions' ids are remembered, to answer 410 (not 404) for them.
local GONE_KEPT = 4096
-- Why a session ended, listed at 0 from the start.
local SESSION_ENDS = { "closed", "idle", "lifetime", "lost", "exit", "shutdown", "memory", "processes",
                       "cpu", "file-size", "signal" }
-- The largest file GET /v1/sessions/{id}/files/{path} answers.
local MAX_GET = 16 * 1048576

-- the run-duration histogram's upper bounds, seconds
local BUCKETS = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300 }

-- reasons a run can end with, listed at 0 from the start so that rate() sees the first one
local REASONS = { "exit", "timeout", "cpu", "memory", "processes", "file-size", "output", "signal",
                  "cancelled", "shutdown", "error" }
local REJECT_CODES = { "bad_json", "bad_request", "missing_field", "unknown_field", "invalid_field",
                       "over_limit", "policy_not_allowed", "unauthorized", "not_found",
                       "method_not_allowed", "overloaded", "draining", "too_many_sessions",
                       "session_not_found", "session_gone", "busy" }

local CONFIG = {
  listen = "string", policy = "policy", policies = "table", eval_policy = "policy",
  concurrency = "integer", queue = "integer", token = "string", max_body_bytes = "integer",
  drain_seconds = "number", json_log = "boolean", log = "function", unix_mode = "integer",
  signals = "boolean", on_stop = "function", max_connections = "integer",
  header_timeout = "number", body_timeout = "number", idle_timeout = "number",
  max_header_bytes = "integer", backlog = "integer", probe = "boolean",
  max_sessions = "integer", instance = "string",
}

--- Where `corral serve` listens by default: `unix:/run/corral.sock` as root, else
-- `unix:$XDG_RUNTIME_DIR/corral.sock`, else `unix:/tmp/corral-$UID.sock`.
function M.default_listen()
  if core.geteuid() == 0 then return "unix:/run/corral.sock" end
  local xdg = os.getenv("XDG_RUNTIME_DIR")
  if xdg and xdg:sub(1, 1) == "/" then return "unix:" .. xdg .. "/corral.sock" end
  return "unix:/tmp/corral-" .. core.getuid() .. ".sock"
end

--- Parse a listen address: `unix:/path.sock`, `IPV4:PORT`, `[IPV6]:PORT` or `NAME:PORT`. A host
-- name is resolved now (getaddrinfo: /etc/hosts, then DNS) and the server binds its first
-- address; `bind` is that address as `core.http_listen` takes it.
-- @return `{unix = path}` or `{host = address, port = n, loopback = bool, bind = "ADDR:PORT",
-- name = host name or nil}`; or nil and a message
function M.parse_listen(s)
  if type(s) ~= "string" or s == "" then return nil, "the listen address must be a non-empty string" end
  if s:sub(1, 5) == "unix:" then
    local path = s:sub(6)
    if path == "" or path:find("\0", 1, true) then return nil, "'" .. s .. "' names no socket path" end
    return { unix = path }
  end
  local host, port = s:match("^%[([%x:%.]+)%]:(%d+)$")
  if not host then host, port = s:match("^(%d+%.%d+%.%d+%.%d+):(%d+)$") end
  local name
  if not host then
    name, port = s:match("^(%w[%w%.%-]*):(%d+)$")
  end
  port = tonumber(port)
  if not (host or name) or not port or port > 65535 then
    return nil, "'" .. s .. "' is neither unix:/path.sock nor HOST:PORT (localhost:8080, 127.0.0.1:8080, [::1]:8080)"
  end
  if name then
    local addrs, err = core.resolve(name)
    if not addrs or not addrs[1] then
      return nil, "'" .. s .. "': " .. (addrs and ("'" .. name .. "' has no address") or tostring(err):gsub("^[%u_]+: ", ""))
    end
    host = addrs[1]
  end
  local loopback = host:match("^127%.%d+%.%d+%.%d+$") ~= nil or host == "::1"
  return { host = host, port = port, loopback = loopback, name = name,
           bind = (host:find(":", 1, true) and ("[" .. host .. "]") or host) .. ":" .. port }
end

local function config_error(key, msg)
  error("serve: option '" .. key .. "' " .. msg, 0)
end

local function check_config(config)
  if config == nil then config = {} end
  if type(config) ~= "table" then error("serve: config must be a table, got " .. type(config), 0) end
  local c = {}
  for k, v in pairs(config) do
    local kind = CONFIG[k]
    if not kind then config_error(tostring(k), "is not a known option") end
    if kind == "policy" then
      if type(v) ~= "string" and type(v) ~= "table" then config_error(k, "must be a policy name, path or table") end
    elseif kind == "integer" then
      if math.type(v) ~= "integer" and not (type(v) == "number" and floor(v) == v) then
        config_error(k, "must be a whole number, got " .. tostring(v))
      end
      v = floor(v)
    elseif type(v) ~= kind then
      config_error(k, "must be a " .. kind .. ", got " .. type(v))
    end
    c[k] = v
  end
  c.listen = c.listen or M.default_listen()
  local where, err = M.parse_listen(c.listen)
  if not where then config_error("listen", err) end
  c.where = where
  if c.token == "" then config_error("token", "is empty") end
  if c.token and c.token:find("[%s%c]") then config_error("token", "must not hold spaces or control characters") end
  if c.instance and not (c.instance:match("^[%w_%-]+$") and #c.instance <= 64) then
    config_error("instance", "must be letters, digits, _ and -, at most 64 of them, got '" .. c.instance .. "'")
  end
  if where.host and not c.token then
    error("serve: a TCP listener (" .. c.listen .. ") needs a bearer token: give --token-file FILE or set "
      .. "CORRAL_TOKEN" .. (where.loopback and "" or "; it would be open to the network")
      .. " (or listen on a unix socket, whose mode 0660 decides who may connect)", 0)
  end
  -- the settings `corral serve` has flags for: defaults and lower bounds from corral.schema
  for _, e in ipairs(schema.serve) do
    if c[e.name] == nil then c[e.name] = e.default end
    local v = c[e.name]
    if e.min and v ~= nil and (v ~= v or v < e.min) then
      config_error(e.name, "must be at least " .. tostring(e.min) .. ", got " .. tostring(v))
    end
  end
  c.concurrency = c.concurrency or core.cpu_count()
  c.policy = c.policy or "default"
  c.eval_policy = c.eval_policy or "bwrap"
  c.unix_mode = c.unix_mode or 432 -- 0660
  if c.signals == nil then c.signals = true end
  return c
end

-- JSON helpers ---------------------------------------------------------------------------------

local function json_type(v)
  if v == cjson.null then return "null" end
  local t = type(v)
  if t == "table" then return (v[1] ~= nil or next(v) == nil) and "array" or "object" end
  return t
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

-- A request error: status, machine-readable code, message, and the field it is about.
local function reject(status, code, message, field)
  return { status = status, code = code, message = message, field = field }
end

-- The body as a JSON object, or a reject.
local function decode_object(body)
  if body == nil or body:match("^%s*$") then
    return nil, reject(400, "bad_json", "the body is empty: send a JSON object such as {\"code\": \"print(1)\"}")
  end
  local _, valid = core.utf8_repair(body)
  if not valid then return nil, reject(400, "bad_json", "the body is not valid UTF-8") end
  -- RFC 8259 forbids them in strings; lua-cjson would take them
  local at, byte = core.json_raw_control(body)
  if at then
    return nil, reject(400, "bad_json", string.format("the body is not valid JSON: a raw control "
      .. "character (U+%04X) inside a string at byte %d: escape it as \\u%04x", byte, at, byte))
  end
  local ok, obj = pcall(cjson.decode, body)
  if not ok then
    return nil, reject(400, "bad_json", "the body is not valid JSON: " .. tostring(obj):gsub("^.-:%d+: ", ""))
  end
  -- an empty array and an empty object decode alike: the first character tells them apart
  if type(obj) ~= "table" or not body:match("^%s*{") then
    return nil, reject(400, "bad_request", "the body must be a JSON object, got " .. json_type(obj)
      .. (type(obj) == "table" and body:match("^%s*%[") and " (an array)" or ""))
  end
  return obj
end

-- Check the object's fields against `fields` (name → JSON type). null counts as absent.
-- @return code, opts (everything but `code`); or nil, reject
local function check_fields(obj, fields, no_code)
  -- (code false: the file of `files` that args[0] names runs)
  local opts = {}
  for _, k in ipairs(sorted_keys(obj)) do
    local v = obj[k]
    local want = fields[k]
    if not want then
      return nil, reject(400, "unknown_field", "field '" .. tostring(k) .. "' is not known here (known: "
        .. table.concat(sorted_keys(fields), ", ") .. ")", tostring(k))
    end
    if v ~= cjson.null then
      local got = json_type(v)
      local fits = got == want or (want == "integer" and got == "number")
        or (want == "array or boolean" and (got == "array" or got == "boolean"))
      if not fits then
        return nil, reject(400, "invalid_field", "field '" .. k .. "' must be a"
          .. ((want == "integer" or want:sub(1, 1) == "a") and "n " or " ") .. want .. ", got " .. got, k)
      end
      if want == "integer" and (v ~= v or v == math.huge or v == -math.huge or floor(v) ~= v) then
        return nil, reject(400, "invalid_field", "field '" .. k .. "' must be a whole number, got " .. tostring(v), k)
      end
      -- cjson gives floats: 5 is 5.0; whole numbers become integers (and read so in messages)
      if got == "number" then v = math.tointeger(v) or v end
      opts[k] = v
    end
  end
  local code = opts.code
  opts.code = nil
  if opts.files ~= nil then
    -- contents come in base64
    local files, why = workspace.from_json(opts.files)
    if not files then return nil, reject(400, "invalid_field", why, "files") end
    opts.files = files
  end
  if no_code then return true, opts end
  if code == nil then
    -- or the file of `files` that args[0] names
    if not (fields.files and type(opts.args) == "table" and opts.args[1] ~= nil and type(opts.files) == "table") then
      return nil, reject(400, "missing_field", "field 'code' is required: the Python source to run"
        .. (fields.args and " (or `files` and `args`, args[0] naming the file that runs)" or ""), "code")
    end
    local named = false
    for _, e in ipairs(opts.files) do
      if type(e) == "table" and e.path == opts.args[1] then named = true end
    end
    if not named then
      return nil, reject(400, "invalid_field", "field 'args': without 'code', args[0] must name a file of "
        .. "'files' (the program that runs), got " .. cjson.encode(opts.args[1]), "args")
    end
    code = false
  end
  return code, opts
end

-- options.check's and policy.prepare's messages name the option: restated to name the field
-- (`face` "field", or "eval" for eval_in_sandbox's names).
local function option_error(message, face)
  local text, field = schema.restate(message, face)
  local over = text:find("over the maximum", 1, true) ~= nil
  return reject(400, over and "over_limit" or (field and "invalid_field" or "bad_request"), text, field)
end

local function label(v)
  return (tostring(v):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local function iso_now()
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end

local unslash = result.unslash

-- Constant-time comparison: the time depends on the length of `want` only.
local function same_secret(got, want)
  local diff = #got ~ #want
  for i = 1, #want do diff = diff | ((got:byte(i) or 0) ~ want:byte(i)) end
  return diff == 0
end

-- The server ------------------------------------------------------------------------------------

local Server = {}
Server.__index = Server
Server.__name = "corral.serve.Server"
Server.__tostring = function(s) return "corral serve on " .. tostring(s.listen) end

--- Start the controller.
-- Config (all optional): `listen` ("unix:/path.sock" or "HOST:PORT"; default `default_listen()`),
-- `policy` (the default policy: name, path or table; default "default"), `policies` (names a
-- request may choose with "policy"; default only `policy`), `eval_policy` (default "bwrap"),
-- `concurrency` (default the number of CPUs), `queue` (default 64), `token` (bearer token; required
-- for TCP), `max_body_bytes` (default 1 MiB), `drain_seconds` (default 30), `json_log`, `log`
-- (function(line), default: a line to stderr), `unix_mode` (default 0660), `signals` (default true:
-- SIGTERM and SIGINT drain), `on_stop` (called once when the server has stopped), and the HTTP
-- limits passed to `core.http_listen` (`max_connections`, `header_timeout`, `body_timeout`,
-- `idle_timeout`, `max_header_bytes`, `backlog`).
-- A bad config value or a policy that does not load raises, naming it.
-- @return server object, or nil, message, code when it cannot listen
function M.start(config)
  if not cjson then error("serve: corral serve needs lua-cjson (apt-get install lua-cjson)", 0) end
  local c = check_config(config)
  local self = setmetatable({
    config = c, listen = c.listen, token = c.token, concurrency = c.concurrency, queue_max = c.queue,
    queue = {}, in_flight = 0, running = {}, draining = false, stopped = false,
    probe_waiters = {}, avg_run_s = 1.0,
    sessions = {}, sessions_open = 0, session_requests = 0, gone = {}, gone_order = {},
    limits_of = {}, limits_waiters = {},
    metrics = { runs = {}, rejected = {}, http = {}, buckets = {}, sum = 0, count = 0,
                sessions_created = 0, sessions_ended = {} },
  }, Server)
  for _, r in ipairs(REASONS) do self.metrics.runs[r] = 0 end
  for _, r in ipairs(SESSION_ENDS) do self.metrics.sessions_ended[r] = 0 end
  for _, r in ipairs(REJECT_CODES) do self.metrics.rejected[r] = 0 end
  for i = 1, #BUCKETS do self.metrics.buckets[i] = 0 end
  self.log = c.log or function(line) io.stderr:write(line, "\n") end

  -- every policy is loaded now: a typo is an error at start, not at the first request
  local function load(spec, what)
    local ok, p = pcall(policy.load, spec)
    -- policy.load's message names the policy; a policy of `policies` also says which entry
    if not ok then error("serve: " .. (what == "policy" and "" or (what .. ": ")) .. tostring(p), 0) end
    return p
  end
  self.policy = load(c.policy, "policy")
  self.eval_policy = load(c.eval_policy, "eval_policy")
  -- a policy loaded by name or path goes to each run by that name: policy.load() gives the
  -- same table from its cache, without checking it again as it does a table (30 us a run)
  self.spec_of = {}
  if type(c.policy) == "string" then self.spec_of[self.policy] = c.policy end
  self.allowed = {}
  local allow = c.policies or { c.policy }
  for i, spec in ipairs(allow) do
    if type(spec) ~= "string" and type(spec) ~= "table" then config_error("policies", "entry " .. i .. " must be a policy name, path or table") end
    local p = load(spec, "policies[" .. i .. "]")
    if type(spec) == "string" then
      self.allowed[spec] = p
      self.spec_of[p] = spec
    end
    self.allowed[p.name] = p
  end

  local host, herr, hcode = hostmod.basics()
  if not host then return nil, herr, hcode end
  if c.probe or self.policy.require then
    local ok, perr, pcode = self:_protections()
    if not ok then return nil, perr, pcode end
  end

  local srv, err, code = core.http_listen {
    listen = c.where.bind or c.listen, unix_mode = c.unix_mode, backlog = c.backlog,
    max_header_bytes = c.max_header_bytes, max_body_bytes = c.max_body_bytes,
    header_timeout = c.header_timeout, body_timeout = c.body_timeout, idle_timeout = c.idle_timeout,
    max_connections = c.max_connections,
    on_request = function(req, res) self:_request(req, res) end,
    on_error = function(message) self:_event("internal-error", { message = tostring(message) }) end,
  }
  if not srv then return nil, err, code end
  self.srv = srv
  if c.signals then
    local function on_signal(signum)
      return function() self:_guard(self._on_signal, signum) end
    end
    self.signals = { core.signal(SIGTERM, on_signal(SIGTERM)), core.signal(SIGINT, on_signal(SIGINT)) }
  end
  self:_event("listening", { address = self:address(), policy = self.policy.name,
    concurrency = self.concurrency, queue = self.queue_max, auth = self.token and "bearer" or "none" })
  -- the loop runs between requests: after a pause, a run's next launch starts once it ended
  local settings = corral.configure { prestart_after_pause = true }
  -- a warm policy: its interpreter starts now, with a first run, not with the first request
  if self.policy.warm and settings.warm_interpreters then
    pcall(corral.start, "pass", { policy = self.policy }, function(_, perr)
      if perr then self:_event("warm-up-failed", { message = tostring(perr) }) end
    end)
    -- and, with sessions, a session kernel of its policy is kept ready: the first POST
    -- /v1/sessions, as every later one, takes a kernel that has started
    if c.max_sessions > 0 then pcall(session.start_ahead, { policy = self.spec_of[self.policy] or self.policy }, true) end
  end
  return self
end

-- Before listening: one run of the policy (corral.probe) says what every run will get; each
-- protection is logged as applied or refused (with why), and a policy's `require` is enforced.
-- @return true, or nil, message, "ENOTSUP" when a required protection is missing
function Server:_protections()
  local ok, p, perr, pcode = pcall(corral.probe, self.config.policy)
  if not ok or not p then
    local msg = tostring(ok and perr or p)
    if self.policy.require then return nil, "the probe of the policy failed: " .. msg, pcode or "EIO" end
    self:_event("probe-failed", { message = msg })
    return true
  end
  -- a policy this host cannot run at all (the walls its `separation` requires): every request
  -- would fail the same way, so the server does not start
  local perror = p.policy.error
  if perror and tostring(perror):match("^ENOTSUP") then return nil, tostring(perror), "ENOTSUP" end
  if perror then self:_event("probe-failed", { message = tostring(perror) }) end
  local got = {}
  -- what a session of this policy gets too (POST /v1/sessions reports it)
  self.limits_of[self.policy] = p.policy.limits or {}
  for _, name in ipairs(p.policy.limits or {}) do
    got[name] = true
    self:_event("protection", { name = name, applied = "yes" })
  end
  local refused = p.policy.refused or {}
  for _, name in ipairs(sorted_keys(refused)) do
    self:_event("protection", { name = name, applied = "no", errno = refused[name].errno,
      reason = refused[name].message })
  end
  local missing = {}
  for _, name in ipairs(self.policy.require or {}) do
    if not got[name] then
      local r = refused[name]
      missing[#missing + 1] = name .. (r and (" (" .. tostring(r.errno) .. ": " .. tostring(r.message) .. ")") or " (not applied)")
    end
  end
  if #missing > 0 then
    return nil, "ENOTSUP: policy '" .. tostring(self.policy.name) .. "' requires protections this host does not give: "
      .. table.concat(missing, "; "), "ENOTSUP"
  end
  return true
end

--- The address the server listens on ("unix:/path" or "HOST:PORT", with the real port).
function Server:address()
  if self.srv and self.srv.address then
    local ok, a = pcall(self.srv.address, self.srv)
    if ok and a then return a end
  end
  return self.listen
end

-- Call `fn(self, ...)`; an error is logged, never raised into the loop (that would stop it).
function Server:_guard(fn, ...)
  local ok, err = xpcall(fn, debug.traceback, self, ...)
  if not ok then self:_event("internal-error", { message = tostring(err) }) end
  return ok
end

function Server:_event(event, fields)
  local ok = pcall(function()
    if self.config.json_log then
      local e = { time = iso_now(), event = event }
      for k, v in pairs(fields or {}) do e[k] = v end
      self.log(unslash(cjson.encode(e)))
    else
      local parts = { iso_now(), "corral serve:", event }
      for _, k in ipairs(sorted_keys(fields or {})) do parts[#parts + 1] = k .. "=" .. tostring(fields[k]) end
      self.log(table.concat(parts, " "))
    end
  end)
  return ok
end

function Server:_log_request(ctx, status, reason)
  local req = ctx.req
  local dur = hrtime() - ctx.t0
  pcall(function()
    if self.config.json_log then
      self.log(unslash(cjson.encode { time = iso_now(), method = req.method, path = req.path, status = status,
        duration_s = floor(dur * 1e6) / 1e6, reason = reason or cjson.null, peer = req.peer or cjson.null }))
    else
      self.log(string.format("%s %s %s %d %.3fs %s", iso_now(), tostring(req.method), tostring(req.path),
        status, dur, reason or "-"))
    end
  end)
end

-- Send a response once; count and log it.
function Server:_send(ctx, status, body, headers, reason)
  if ctx.sent then return false end
  ctx.sent = true
  headers = headers or {}
  headers["Content-Type"] = headers["Content-Type"] or "application/json"
  local ok = ctx.res:send(status, headers, body)
  local per = self.metrics.http[ctx.route] or {}
  self.metrics.http[ctx.route] = per
  per[status] = (per[status] or 0) + 1
  self:_log_request(ctx, status, reason)
  return ok
end

function Server:_json(ctx, status, obj, headers, reason)
  return self:_send(ctx, status, result.encode(obj, cjson), headers, reason)
end

function Server:_error(ctx, r, headers)
  local e = { code = r.code, message = r.message, field = r.field }
  if r.status < 500 or r.code == "overloaded" or r.code == "draining" then
    self.metrics.rejected[r.code] = (self.metrics.rejected[r.code] or 0) + 1
  end
  return self:_json(ctx, r.status, { error = e }, headers, r.code)
end

function Server:_authorized(req)
  local h = req.headers and req.headers["authorization"]
  if type(h) ~= "string" then return false end
  local tok = h:match("^[Bb][Ee][Aa][Rr][Ee][Rr] +(%S+) *$")
  return tok ~= nil and same_secret(tok, self.token)
end

function Server:_request(req, res)
  local ctx = { req = req, res = res, t0 = hrtime(), route = "other" }
  local ok = self:_guard(self._dispatch, ctx)
  if not ok and not ctx.sent then
    pcall(self._error, self, ctx, reject(500, "internal", "internal error in the controller (see its log)"))
  end
end

function Server:_dispatch(ctx)
  local req = ctx.req
  local route = ROUTES[req.path]
  if route then ctx.route = req.path end
  local sid, rest = req.path:match("^/v1/sessions/([^/]*)(.*)$")
  if sid then
    local sub = rest:sub(1, 7) == "/files/" and "/files/" or rest
    local r = SESSION_ROUTES[sub]
    if r then
      route, ctx.route, ctx.sid = r.methods, r.route, sid
      if sub == "/files/" then ctx.file = rest:sub(8) end
    end
  end
  -- /healthz stays open: load balancers and kubelets probe it without credentials
  if self.token and req.path ~= "/healthz" and not self:_authorized(req) then
    return self:_error(ctx, reject(401, "unauthorized", "this server needs 'Authorization: Bearer <token>'"),
      { ["WWW-Authenticate"] = 'Bearer realm="corral"' })
  end
  if not route then
    return self:_error(ctx, reject(404, "not_found", "no route " .. tostring(req.path)
      .. " (routes: POST /v1/run, POST /v1/eval, GET /healthz, GET /v1/probe, GET /metrics, POST /v1/sessions, "
      .. "DELETE /v1/sessions/{id}, POST /v1/sessions/{id}/exec, GET /v1/sessions/{id}/files, "
      .. "GET or PUT /v1/sessions/{id}/files/{path})"))
  end
  local handler = route[req.method]
  if not handler then
    local allow = table.concat(sorted_keys(route), ", ")
    return self:_error(ctx, reject(405, "method_not_allowed", tostring(req.method) .. " is not allowed on "
      .. req.path .. "; use " .. allow), { Allow = allow })
  end
  if ctx.sid then
    -- the session, by its exact id: an unknown or malformed one is never another session
    ctx.session = self.sessions[ctx.sid]
    if not ctx.session then
      local why = self.gone[ctx.sid]
      if why then
        return self:_error(ctx, reject(410, "session_gone", "session " .. ctx.sid .. " is gone (" .. why .. ")"))
      end
      return self:_error(ctx, reject(404, "session_not_found", "no session " .. ctx.sid .. " here"))
    end
  end
  return self["_handle_" .. handler](self, ctx)
end

-- GET /healthz
function Server:_handle_health(ctx)
  local body = { ok = not self.draining, draining = self.draining, in_flight = self.in_flight,
                 queued = #self.queue, concurrency = self.concurrency, queue = self.queue_max,
                 sessions = self.sessions_open, sessions_busy = self.session_requests,
                 max_sessions = self.config.max_sessions,
                 policy = self.policy.name, version = corral._VERSION }
  if self.draining then
    body.error = { code = "draining", message = "the server is shutting down" }
    return self:_json(ctx, 503, body, nil, "draining")
  end
  return self:_json(ctx, 200, body)
end

-- GET /metrics
function Server:_handle_metrics(ctx)
  return self:_send(ctx, 200, self:metrics_text(), { ["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8" })
end

--- The metrics in Prometheus text format.
function Server:metrics_text()
  local m, out = self.metrics, {}
  local function add(s) out[#out + 1] = s end
  add("# HELP corral_runs_total Runs ended, by reason (the result's; cancelled: the client went away; "
    .. "shutdown: killed at the end of a drain; error: the sandbox failed).")
  add("# TYPE corral_runs_total counter")
  for _, r in ipairs(sorted_keys(m.runs)) do add(string.format('corral_runs_total{reason="%s"} %d', label(r), m.runs[r])) end
  add("# HELP corral_run_duration_seconds Wall time of runs, from start to end (queue wait excluded).")
  add("# TYPE corral_run_duration_seconds histogram")
  for i, le in ipairs(BUCKETS) do
    add(string.format('corral_run_duration_seconds_bucket{le="%s"} %d', string.format("%g", le), m.buckets[i]))
  end
  add(string.format('corral_run_duration_seconds_bucket{le="+Inf"} %d', m.count))
  add(string.format("corral_run_duration_seconds_sum %.6f", m.sum))
  add(string.format("corral_run_duration_seconds_count %d", m.count))
  add("# HELP corral_queue_depth Requests waiting for a run slot.")
  add("# TYPE corral_queue_depth gauge")
  add(string.format("corral_queue_depth %d", #self.queue))
  add("# HELP corral_in_flight Runs in progress.")
  add("# TYPE corral_in_flight gauge")
  add(string.format("corral_in_flight %d", self.in_flight))
  add("# HELP corral_concurrency_limit Runs allowed at once.")
  add("# TYPE corral_concurrency_limit gauge")
  add(string.format("corral_concurrency_limit %d", self.concurrency))
  add("# HELP corral_draining 1 while the server drains before it stops.")
  add("# TYPE corral_draining gauge")
  add(string.format("corral_draining %d", self.draining and 1 or 0))
  add("# HELP corral_sessions_open Sessions open.")
  add("# TYPE corral_sessions_open gauge")
  add(string.format("corral_sessions_open %d", self.sessions_open))
  add("# HELP corral_sessions_created_total Sessions opened.")
  add("# TYPE corral_sessions_created_total counter")
  add(string.format("corral_sessions_created_total %d", m.sessions_created))
  add("# HELP corral_sessions_ended_total Sessions ended, by why (closed: DELETE; shutdown: the server's drain; "
    .. "idle, lifetime, lost, exit, or the limit that ended it).")
  add("# TYPE corral_sessions_ended_total counter")
  for _, k in ipairs(sorted_keys(m.sessions_ended)) do
    add(string.format('corral_sessions_ended_total{why="%s"} %d', label(k), m.sessions_ended[k]))
  end
  add("# HELP corral_rejected_total Requests refused, by error code.")
  add("# TYPE corral_rejected_total counter")
  for _, k in ipairs(sorted_keys(m.rejected)) do
    add(string.format('corral_rejected_total{code="%s"} %d', label(k), m.rejected[k]))
  end
  add("# HELP corral_http_requests_total HTTP requests answered by route and status (499: the client went away).")
  add("# TYPE corral_http_requests_total counter")
  for _, route in ipairs(sorted_keys(m.http)) do
    local per = m.http[route]
    for _, status in ipairs(sorted_keys(per)) do
      add(string.format('corral_http_requests_total{route="%s",status="%d"} %d', label(route), status, per[status]))
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- GET /v1/probe: the first request starts the probe, later ones wait for it, then it is cached.
function Server:_handle_probe(ctx)
  if self.probe_text then return self:_send(ctx, 200, self.probe_text) end
  self.probe_waiters[#self.probe_waiters + 1] = ctx
  if self.probe_pending then return end
  self.probe_pending = true
  local function answer(p, err, code)
    self.probe_pending = false
    local waiters = self.probe_waiters
    self.probe_waiters = {}
    local status, text
    if p then
      self.probe_text = unslash(cjson.encode(p))
      status, text = 200, self.probe_text
    else
      status, text = 500, cjson.encode { error = { code = "sandbox_failed", kind = code or "error", message = tostring(err) } }
    end
    for _, w in ipairs(waiters) do self:_send(w, status, text, nil, p and "probe" or "sandbox_failed") end
  end
  local ok, started, err, code = pcall(corral.start_probe, self.policy, function(p, perr, pcode)
    self:_guard(function() answer(p, perr, pcode) end)
  end)
  if not ok then answer(nil, started, "EPOLICY")
  elseif not started then answer(nil, err, code) end
end

-- POST /v1/run and /v1/eval: parse, check, admit.
function Server:_parse_job(ctx, kind)
  local obj, r = decode_object(ctx.req.body)
  if not obj then return nil, r end
  local code, opts = check_fields(obj, kind == "run" and M.RUN_FIELDS or M.EVAL_FIELDS)
  if code == nil then return nil, opts end
  local pol
  if kind == "run" then
    local why
    pol, why = self:_policy_of(opts)
    if not pol then return nil, why end
  else
    pol = self.eval_policy
  end
  -- checked and prepared once, here, before the request queues: the options, the policy's own
  -- check (maxima, clamping, what this host can do); the run starts from this plan. A policy
  -- loaded by name goes by that name: policy.load() gives it from its cache, unchecked again.
  opts.policy = kind == "run" and self.spec_of[pol] or pol
  local ok, plan, perr, pcode = pcall(kind == "run" and corral.prepare or corral.prepare_eval, opts)
  if not ok then return nil, option_error(plan, kind == "eval" and "eval" or "field") end
  if not plan then return nil, { status = 500, code = "sandbox_failed", kind = pcode, message = perr } end
  return { kind = kind, code = code, plan = plan, ctx = ctx, state = "new" }
end

-- The policy a request's `policy` field names (the server's when absent), or nil, reject.
function Server:_policy_of(opts)
  if opts.policy == nil then return self.policy end
  local pol = self.allowed[opts.policy]
  if not pol then
    return nil, reject(400, "policy_not_allowed", "policy '" .. opts.policy .. "' is not allowed here (allowed: "
      .. table.concat(sorted_keys(self.allowed), ", ") .. ")", "policy")
  end
  return pol
end

function Server:_handle_run(ctx) return self:_job_request(ctx, "run") end
function Server:_handle_eval(ctx) return self:_job_request(ctx, "eval") end

function Server:_retry_after()
  local waiting = #self.queue + self.in_flight + 1
  return math.max(1, math.min(60, ceil(self.avg_run_s * waiting / self.concurrency)))
end

function Server:_job_request(ctx, kind)
  if self.draining then
    return self:_error(ctx, reject(503, "draining", "the server is shutting down; send the request to another instance"))
  end
  if ctx.res:closed() then return self:_gone(ctx, "client-gone") end
  local job, r = self:_parse_job(ctx, kind)
  if not job then
    if r.code == "sandbox_failed" then return self:_sandbox_failed(ctx, kind, r.message, r.kind) end
    return self:_error(ctx, r)
  end
  if self.in_flight < self.concurrency then
    self:_watch(job)
    self:_start(job)
    return self:_pump()
  end
  if #self.queue >= self.queue_max then
    return self:_error(ctx, reject(503, "overloaded", string.format("%d runs in progress and %d queued; retry later",
      self.in_flight, #self.queue)), { ["Retry-After"] = tostring(self:_retry_after()) })
  end
  job.state = "queued"
  self.queue[#self.queue + 1] = job
  self:_watch(job)
end

-- A client went away before its answer: counted and logged as 499 (nginx's "client closed
-- request"), nothing sent.
function Server:_gone(ctx, reason)
  if ctx.sent then return end
  ctx.sent = true
  local per = self.metrics.http[ctx.route] or {}
  self.metrics.http[ctx.route] = per
  per[499] = (per[499] or 0) + 1
  self:_log_request(ctx, 499, reason)
end

-- A client that goes away: dropped from the queue, or its run killed.
function Server:_watch(job)
  job.ctx.res:on_close(function()
    self:_guard(function()
      if job.state == "queued" then
        for i, j in ipairs(self.queue) do
          if j == job then table.remove(self.queue, i) break end
        end
        job.state = "gone"
        self:_gone(job.ctx, "client-gone-queued")
        self:_maybe_stop()
      elseif job.state == "running" then
        job.cancelled = true
        if job.proc then job.proc:kill() end
      end
    end)
  end)
end

-- Start queued runs while there are free slots.
function Server:_pump()
  while self.in_flight < self.concurrency and #self.queue > 0 do
    local job = table.remove(self.queue, 1)
    self:_start(job)
  end
  self:_maybe_stop()
end

function Server:_start(job)
  job.state = "running"
  job.t_start = hrtime()
  self.in_flight = self.in_flight + 1
  self.running[job] = true
  local function on_done(...)
    local args = table.pack(...)
    if not self:_guard(function() self:_finished(job, table.unpack(args, 1, args.n)) end) then
      -- logged as internal-error: the client still gets an answer, never a hung request
      local ctx = job.ctx
      self:_guard(function()
        if not ctx.sent then self:_error(ctx, reject(500, "internal", "the server failed to build the result")) end
      end)
    end
    self:_guard(self._pump)
  end
  local ok, proc, err, ecode
  if job.kind == "run" then
    ok, proc, err, ecode = pcall(corral.start, job.code or nil, job.plan, on_done)
  else
    ok, proc, err = pcall(corral.start_eval, job.code, job.plan, function(out, serr, res)
      on_done(out, serr, res)
    end)
  end
  if ok and proc then
    job.proc = proc
    return
  end
  self.in_flight = self.in_flight - 1
  self.running[job] = nil
  job.state = "done"
  self.metrics.runs.error = self.metrics.runs.error + 1
  if not ok then
    -- checked when it was admitted; a policy whose check depends on time may still refuse it
    return self:_error(job.ctx, option_error(proc, job.kind == "eval" and "eval" or "field"))
  end
  if job.kind == "run" then return self:_sandbox_failed(job.ctx, "run", err, ecode) end
  return self:_sandbox_failed(job.ctx, "eval", err.message, err.kind)
end

function Server:_sandbox_failed(ctx, kind, message, code)
  local body
  if kind == "run" then
    body = result.object(nil, message, code, cjson.null)
    body.error.code = "sandbox_failed"
  else
    body = { ok = false, error = { code = "sandbox_failed", kind = code or "sandbox", message = message } }
  end
  return self:_json(ctx, 500, body, nil, "sandbox_failed")
end

function Server:_observe(reason, seconds)
  local m = self.metrics
  m.runs[reason] = (m.runs[reason] or 0) + 1
  m.sum = m.sum + seconds
  m.count = m.count + 1
  for i, le in ipairs(BUCKETS) do
    if seconds <= le then m.buckets[i] = m.buckets[i] + 1 end
  end
  self.avg_run_s = 0.8 * self.avg_run_s + 0.2 * seconds
end

-- Run option names in eval_in_sandbox's words.
local function eval_names(list)
  local out = {}
  for i, k in ipairs(list) do
    local e = schema.run_by_name[k]
    out[i] = e and e.eval and e.eval.name or k
  end
  return out
end

-- A run has ended: answer, count, log.
function Server:_finished(job, a, b, c)
  self.in_flight = self.in_flight - 1
  self.running[job] = nil
  job.state = "done"
  local seconds = hrtime() - job.t_start
  local ctx = job.ctx
  -- a run ends with (res, err, ecode), an eval with (out, serr, res); a run whose sandbox
  -- failed has no res (and its error code in c)
  local res
  if job.kind == "run" then res = a else res = c end
  local reason = job.cancelled and "cancelled" or job.shutdown and "shutdown" or (res and res.reason or "error")
  self:_observe(reason, seconds)
  if job.cancelled then return self:_gone(ctx, "cancelled") end
  if job.shutdown then
    return self:_error(ctx, reject(503, "shutdown", "the server shut down before the run ended"))
  end
  if job.kind == "run" then
    if not res then return self:_sandbox_failed(ctx, "run", b, c) end
    local obj = result.object(res, nil, nil, cjson.null)
    if res.clamped then obj.clamped = res.clamped end
    return self:_json(ctx, 200, obj, nil, res.reason)
  end
  local out, serr = a, b
  local clamped = res and res.clamped and eval_names(res.clamped) or nil
  if out then
    out.clamped = clamped
    -- what applied to this run (bubblewrap's sandbox, or the launcher's where bwrap cannot run)
    if res then
      local obj = result.object(res, nil, nil, cjson.null)
      out.limits, out.refused = obj.limits, obj.refused
    end
    return self:_json(ctx, 200, out, nil, res and res.reason)
  end
  if serr.kind == "unavailable" or serr.kind == "sandbox" then
    return self:_sandbox_failed(ctx, "eval", serr.message, serr.kind)
  end
  -- what the program did (timed out, too much output, not UTF-8): eval_in_sandbox raises, we answer
  return self:_json(ctx, 200, { ok = false, clamped = clamped,
    error = { code = "sandbox_error", kind = serr.kind, message = serr.message } }, nil, serr.kind)
end

-- Sessions -------------------------------------------------------------------------------------

-- Percent-decoding of a URL path part; nil for a '%' not followed by two hex digits.
local function percent_decode(s)
  if s:find("%%%X") or s:find("%%%x%X") or s:find("%%%x?$") then return nil end
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- When a session slot is likely to free: the nearest idle or lifetime end, 1 s .. 1 h.
function Server:_session_retry_after()
  local now, soonest = hrtime(), math.huge
  for _, s in pairs(self.sessions) do
    local d = s.expires
    if not s.busy and s.idle_deadline and s.idle_deadline < d then d = s.idle_deadline end
    if d < soonest then soonest = d end
  end
  if soonest == math.huge then return 1 end
  return math.max(1, math.min(3600, ceil(soonest - now)))
end

-- A session has ended (closed, idle, a limit, the drain...): forgotten but for its id and why.
function Server:_session_ended(id, s)
  if self.sessions[id] ~= s then return end
  self.sessions[id] = nil
  self.sessions_open = self.sessions_open - 1
  local why = s.gone or "lost"
  local m = self.metrics.sessions_ended
  m[why] = (m[why] or 0) + 1
  self.gone[id] = why
  local order = self.gone_order
  order[#order + 1] = id
  if #order > GONE_KEPT then self.gone[table.remove(order, 1)] = nil end
  self:_event("session-ended", { id = id, why = why })
  self:_maybe_stop()
end

-- The limits a policy's runs get, learnt from one probe run per policy (then kept); `cb(limits)`.
function Server:_limits_of(pol, cb)
  if self.limits_of[pol] then return cb(self.limits_of[pol]) end
  local waiters = self.limits_waiters[pol]
  if waiters then waiters[#waiters + 1] = cb return end
  waiters = { cb }
  self.limits_waiters[pol] = waiters
  local function done(p)
    self.limits_waiters[pol] = nil
    local limits = p and p.policy and p.policy.limits
    -- a failed probe is not kept: the next session asks again
    if limits then self.limits_of[pol] = limits end
    for _, w in ipairs(waiters) do w(limits or {}) end
  end
  local ok, started = pcall(corral.start_probe, self.spec_of[pol] or pol, function(p)
    self:_guard(function() done(p) end)
  end)
  if not ok or not started then done(nil) end
end

-- POST /v1/sessions
function Server:_handle_session_open(ctx)
  if self.draining then
    return self:_error(ctx, reject(503, "draining", "the server is shutting down; open the session on another instance"))
  end
  if self.sessions_open >= self.config.max_sessions then
    return self:_error(ctx, reject(429, "too_many_sessions", string.format("%d sessions are open, the most this "
      .. "server keeps; close one (DELETE /v1/sessions/{id}) or retry later", self.sessions_open)),
      { ["Retry-After"] = tostring(self:_session_retry_after()) })
  end
  local obj, r = decode_object(ctx.req.body)
  if not obj then return self:_error(ctx, r) end
  local _, opts = check_fields(obj, M.SESSION_FIELDS, true)
  if not _ then return self:_error(ctx, opts) end
  local pol
  pol, r = self:_policy_of(opts)
  if not pol then return self:_error(ctx, r) end
  opts.policy = self.spec_of[pol] or pol
  local ok, s, err, ecode = pcall(session.open, opts)
  if not ok then return self:_error(ctx, option_error(s, "field")) end
  if not s then
    return self:_json(ctx, 500, { error = { code = "sandbox_failed", kind = ecode or "error", message = tostring(err) } },
      nil, "sandbox_failed")
  end
  local id = (self.config.instance and (self.config.instance .. "-") or "") .. s.id
  -- the file routes answer with the file alone: what the session printed meanwhile goes to the
  -- next cell
  s.carry_file_output = true
  self.sessions[id] = s
  self.sessions_open = self.sessions_open + 1
  self.metrics.sessions_created = self.metrics.sessions_created + 1
  s.on_end = function() self:_guard(self._session_ended, id, s) end
  self:_limits_of(pol, function(limits)
    if ctx.res:closed() then
      -- nobody learnt its id: nobody could use it
      s:close_async(nil, "closed")
      return self:_gone(ctx, "client-gone")
    end
    self:_json(ctx, 201, { id = id, limits = limits, expires_at = os.date("!%Y-%m-%dT%H:%M:%SZ", s.expires_at) },
      { Location = "/v1/sessions/" .. id }, "created")
  end)
end

-- DELETE /v1/sessions/{id}: answered once the session's processes and work dir are gone.
function Server:_handle_session_close(ctx)
  ctx.session:close_async(function()
    self:_guard(function() self:_send(ctx, 204, nil, nil, "closed") end)
  end, "closed")
end

-- A session refused a request: busy (409) or gone (410).
function Server:_session_refused(ctx, err, ecode)
  if ecode == "EBUSY" then
    return self:_error(ctx, reject(409, "busy", "session " .. ctx.sid .. " is running a request; "
      .. "send one at a time"))
  end
  return self:_error(ctx, reject(410, "session_gone", "session " .. ctx.sid .. " is gone ("
    .. tostring(ctx.session.gone or err) .. ")"))
end

-- Start a request in the session: `start(cb)` as Session:*_async; `answer(result)` sends its
-- answer. It counts as work in flight for the drain until it has answered.
function Server:_session_request(ctx, start, answer)
  if self.draining then
    return self:_error(ctx, reject(503, "draining", "the server is shutting down; its sessions end with it"))
  end
  local s = ctx.session
  local ok, started, err, ecode = pcall(start, function(res)
    self.session_requests = self.session_requests - 1
    self:_guard(function()
      if ctx.res:closed() then return self:_gone(ctx, "client-gone") end
      answer(res)
    end)
    -- draining: the session ends now that its request has been answered
    if self.draining then s:close_async(nil, "shutdown") end
    self:_guard(self._maybe_stop)
  end)
  if not ok then return self:_error(ctx, option_error(started, "field")) end
  if not started then return self:_session_refused(ctx, err, ecode) end
  self.session_requests = self.session_requests + 1
end

-- The JSON object of a cell's result (docs/http.md): every key always present, and `files` and
-- `files_truncated` (as a run's) when the cell collected files.
local function cell_object(res)
  local null = cjson.null
  local images = {}
  for i, png in ipairs(res.images or {}) do images[i] = core.b64encode(png) end
  return {
    ok = res.ok, reason = res.reason, stdout = res.stdout or "", stderr = res.stderr or "",
    truncated = res.truncated or false, execution_count = res.execution_count or null,
    value = res.value or null, value_truncated = res.value_truncated or false,
    error = res.error or null, images = images, returncode = res.returncode or null,
    usage = { wall_s = res.usage and res.usage.wall_s or 0, cpu_s = res.usage and res.usage.cpu_s or null },
    files = res.files and workspace.json_files(res.files) or nil,
    files_truncated = res.files_truncated,
  }
end

-- POST /v1/sessions/{id}/exec
function Server:_handle_session_exec(ctx)
  local obj, r = decode_object(ctx.req.body)
  if not obj then return self:_error(ctx, r) end
  local code, opts = check_fields(obj, M.EXEC_FIELDS)
  if code == nil then return self:_error(ctx, opts) end
  local s = ctx.session
  self:_session_request(ctx, function(cb) return s:exec_async(code, opts, cb) end, function(res)
    if res.reason == "shutdown" then
      return self:_error(ctx, reject(503, "shutdown", "the server shut down before the cell ended"))
    end
    return self:_send(ctx, 200, result.encode(cell_object(res), cjson, { "images", "files" }), nil, res.reason)
  end)
end

-- The file path of a files route, decoded and checked as `files` paths are; or nil, reject.
local function file_path(ctx)
  local path = percent_decode(ctx.file)
  if not path then
    return nil, reject(400, "invalid_path", "the path '" .. ctx.file .. "' has a '%' not followed by two hex digits")
  end
  local why = workspace.path_problem(path)
  if why then return nil, reject(400, "invalid_path", "the path '" .. ctx.file .. "' " .. why) end
  return path
end

-- A file request the kernel could not do: 404 for a missing file, else 400 with its words.
function Server:_file_failed(ctx, path, res)
  if res.reason ~= "error" then
    return self:_error(ctx, reject(410, "session_gone", "session " .. ctx.sid .. " is gone ("
      .. tostring(ctx.session.gone or res.reason) .. ")"))
  end
  local e = res.error or {}
  if e.type == "FileNotFoundError" then
    return self:_error(ctx, reject(404, "file_not_found", "no file '" .. path .. "' in the session's work dir"))
  end
  return self:_error(ctx, reject(400, "file_error", "'" .. path .. "': " .. tostring(e.type) .. ": "
    .. tostring(e.message) .. (e.type == "OSError" and " (a link is never followed)" or "")))
end

-- PUT /v1/sessions/{id}/files/{path}: the body's bytes; 201 when the file is new, else 200.
function Server:_handle_session_put(ctx)
  local path, r = file_path(ctx)
  if not path then return self:_error(ctx, r) end
  local s = ctx.session
  self:_session_request(ctx, function(cb) return s:put_async(path, ctx.req.body or "", nil, cb) end, function(res)
    if not res.ok then return self:_file_failed(ctx, path, res) end
    return self:_json(ctx, res.created and 201 or 200, { path = path, size = #(ctx.req.body or "") }, nil, "put")
  end)
end

-- GET /v1/sessions/{id}/files/{path}: the file's bytes.
function Server:_handle_session_get(ctx)
  local path, r = file_path(ctx)
  if not path then return self:_error(ctx, r) end
  local s = ctx.session
  self:_session_request(ctx, function(cb) return s:get_async(path, MAX_GET, cb) end, function(res)
    if not res.ok then return self:_file_failed(ctx, path, res) end
    if res.truncated then
      return self:_error(ctx, reject(413, "file_too_large", string.format("'%s' has %d bytes, more than the "
        .. "%d this route answers", path, res.size, MAX_GET)))
    end
    return self:_send(ctx, 200, res.content, { ["Content-Type"] = "application/octet-stream" }, "get")
  end)
end

-- GET /v1/sessions/{id}/files: the work dir's entries.
function Server:_handle_session_list(ctx)
  local s = ctx.session
  self:_session_request(ctx, function(cb) return s:list_async(nil, cb) end, function(res)
    if not res.ok then return self:_file_failed(ctx, ".", res) end
    local entries = {}
    for i, e in ipairs(res.entries or {}) do
      local text, valid = core.utf8_repair(e.path)
      entries[i] = { path = text, path_b64 = not valid and core.b64encode(e.path) or nil, type = e.type, size = e.size }
    end
    return self:_send(ctx, 200, result.encode({ entries = entries, truncated = res.truncated or false }, cjson,
      { "entries" }), nil, "list")
  end)
end

-- Lifecycle ------------------------------------------------------------------------------------

function Server:_on_signal(signum)
  local name = signum == SIGTERM and "SIGTERM" or "SIGINT"
  if self.draining then
    -- a second signal: do not wait any longer
    self:_event("signal", { signal = name, action = "kill the rest now" })
    return self:_expire()
  end
  self:_event("signal", { signal = name, action = "drain" })
  return self:shutdown()
end

--- Stop gracefully: stop accepting connections, answer new runs 503 "draining", let the runs in
-- progress and in the queue finish for up to `drain_seconds` (default: the config's), then kill
-- the rest and stop. Idempotent.
function Server:shutdown(drain_seconds)
  if self.draining then return end
  self.draining = true
  drain_seconds = drain_seconds or self.config.drain_seconds
  pcall(self.srv.stop_accepting, self.srv)
  self:_event("draining", { in_flight = self.in_flight, queued = #self.queue, seconds = drain_seconds,
    sessions = self.sessions_open })
  -- a session between requests ends now; one running a request, once it has answered
  for _, s in pairs(self.sessions) do
    if not s.busy then s:close_async(nil, "shutdown") end
  end
  if self.in_flight + #self.queue + self.session_requests == 0 then return self:_maybe_stop() end
  if drain_seconds <= 0 then return self:_expire() end
  self.drain_timer = core.timer(drain_seconds, function() self:_guard(self._expire) end)
end

--- Stop now: kill what runs, refuse what is queued, close.
function Server:close()
  if not self.draining then self:shutdown(0) else self:_expire() end
end

-- The drain time is over: queued requests get 503 "shutdown", running ones are killed (their
-- answer follows when they have been reaped).
function Server:_expire()
  if self.drain_timer then self.drain_timer:close() self.drain_timer = nil end
  local queued = self.queue
  self.queue = {}
  for _, job in ipairs(queued) do
    job.state = "done"
    self:_error(job.ctx, reject(503, "shutdown", "the server shut down before the run started"))
  end
  local killed = 0
  for job in pairs(self.running) do
    if not job.shutdown then
      job.shutdown = true
      killed = killed + 1
      if job.proc then job.proc:kill() end
    end
  end
  for _, s in pairs(self.sessions) do
    if not s.gone then killed = killed + 1 end
    s:close_async(nil, "shutdown")
  end
  if killed > 0 or #queued > 0 then self:_event("drain-expired", { killed = killed, refused = #queued }) end
  self:_maybe_stop()
end

-- How long the last answers get to reach their clients before the connections are cut.
local CLOSE_GRACE = 2

function Server:_maybe_stop()
  if not self.draining or self.stopped or self.in_flight > 0 or #self.queue > 0 then return end
  if self.session_requests > 0 then return end
  if self.sessions_open > 0 then
    -- every session ends with the server; its end (on_end) comes back here
    for _, s in pairs(self.sessions) do s:close_async(nil, "shutdown") end
    return
  end
  self.stopped = true
  if self.drain_timer then self.drain_timer:close() self.drain_timer = nil end
  corral.let_go_prestarted()            -- the launches started ahead are killed
  local sessions = package.loaded["corral.session"]
  if sessions then sessions.let_go_spares() end   -- and the sessions started ahead
  require("corral.warm").close_all()   -- the warm interpreters exit once idle
  for _, s in ipairs(self.signals or {}) do s:close() end
  self.signals = nil
  -- the listener is closed; each connection closes once its answer is written (stop_accepting).
  -- Wait for that a little, so that the last answers are not cut, then close whatever is left.
  local deadline = hrtime() + CLOSE_GRACE
  local function close_when_idle()
    self.close_timer = nil
    if self.srv:connections() == 0 or hrtime() >= deadline then
      self.srv:close()
      self:_event("stopped", {})
      if self.config.on_stop then self.config.on_stop(self) end
    else
      self.close_timer = core.timer(0.02, function() self:_guard(close_when_idle) end)
    end
  end
  close_when_idle()
end

--- Counters for embedders: `{in_flight, queued, draining, stopped, sessions}`.
function Server:stats()
  return { in_flight = self.in_flight, queued = #self.queue, draining = self.draining, stopped = self.stopped,
           sessions = self.sessions_open }
end

--- Run the loop until the server has stopped (what `corral serve` does).
function Server:run()
  while not self.stopped do
    local ok, alive = pcall(core.run, "default")
    if not ok then
      self:_event("internal-error", { message = tostring(alive) })
    elseif not alive and not self.stopped then
      break
    end
  end
  -- let the closes finish, and the launches started ahead end (they were killed at the stop)
  pcall(core.run, "nowait")
  pcall(corral.release_prestarted, 2)
  return self.stopped
end

return M
