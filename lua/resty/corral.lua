--- resty.corral: a client of `corral serve` for OpenResty and lua-nginx-module.
--
-- A run is never started from an nginx worker: the worker talks HTTP/1.1 over a cosocket to a
-- corral controller on a unix socket (or loopback TCP), and the controller runs the code. This
-- file is plain Lua 5.1 (LuaJIT): no integer division, no bit operators, no goto.
--
--     local corral = require "resty.corral"
--     local c = corral.new { socket = "unix:/run/corral.sock", timeout = 30000 }
--     local res, err = c:run { code = "print(1)", timeout = 2 }
--     if not res then ngx.log(ngx.ERR, err) return ngx.exit(502) end
--     ngx.say(res.stdout)
--
-- Each call: connect (or reuse a pooled connection), send one request, read the response, put
-- the connection back in the pool. Returns the decoded result table, or nil, a message, and the
-- decoded error body when the controller answered with one.
local _M = { _VERSION = "0.1" }
local mt = { __index = _M }

local ngx = ngx                                  -- luacheck: ignore (a global under nginx)
local type, tostring, tonumber, pairs, setmetatable = type, tostring, tonumber, pairs, setmetatable
local concat, lower, find, sub = table.concat, string.lower, string.find, string.sub

local DEFAULTS = {
  socket = "unix:/run/corral.sock",  -- "unix:/path" or nil with host and port
  host = nil,
  port = nil,
  connect_timeout = 1000,            -- ms
  send_timeout = 5000,               -- ms
  timeout = 60000,                   -- ms to wait for the response (the run's own timeout + margin)
  keepalive_timeout = 60000,         -- ms a pooled connection may idle
  pool_size = 32,
  token = nil,                       -- bearer token for a TCP controller
  json = nil,                        -- {encode=, decode=}; default: cjson
}

--- A client. `opts` keys are those of DEFAULTS; unknown keys are an error.
function _M.new(opts)
  opts = opts or {}
  local self = {}
  for k, v in pairs(DEFAULTS) do self[k] = v end
  for k, v in pairs(opts) do
    if DEFAULTS[k] == nil and k ~= "host" and k ~= "port" and k ~= "token" and k ~= "json" then
      return nil, "resty.corral: unknown option '" .. tostring(k) .. "'"
    end
    self[k] = v
  end
  if opts.host then self.socket = nil end
  if not self.socket and not (self.host and self.port) then
    return nil, "resty.corral: give socket = \"unix:/path\", or host and port"
  end
  if not self.json then
    local ok, cjson = pcall(require, "cjson.safe")
    if not ok then return nil, "resty.corral: no JSON library (cjson): pass json = {encode=, decode=}" end
    self.json = cjson
  end
  return setmetatable(self, mt)
end

local function connect(self)
  local sock = ngx.socket.tcp()
  sock:settimeouts(self.connect_timeout, self.send_timeout, self.timeout)
  local ok, err
  if self.socket then
    ok, err = sock:connect(self.socket)
  else
    ok, err = sock:connect(self.host, self.port)
  end
  if not ok then return nil, "connect to " .. (self.socket or (self.host .. ":" .. self.port)) .. ": " .. tostring(err) end
  return sock
end

-- Status line and headers: status, headers (lower-case names), or nil, err.
local function read_head(sock)
  local line, err = sock:receive("*l")
  if not line then return nil, "reading the status line: " .. tostring(err) end
  local status = tonumber(line:match("^HTTP/1%.[01] (%d%d%d)"))
  if not status then return nil, "not an HTTP response: " .. sub(line, 1, 80) end
  local headers = {}
  while true do
    line, err = sock:receive("*l")
    if not line then return nil, "reading the headers: " .. tostring(err) end
    if line == "" then break end
    local name, value = line:match("^([^:]+):%s*(.-)%s*$")
    if name then headers[lower(name)] = value end
  end
  return status, headers
end

--- One request: method, path, body (string or nil). Returns status, body, headers, or nil, err.
function _M.request(self, method, path, body)
  local sock, err = connect(self)
  if not sock then return nil, err end
  local req = {
    method, " ", path, " HTTP/1.1\r\n",
    "Host: corral\r\n",
    "User-Agent: resty.corral/", _M._VERSION, "\r\n",
  }
  if self.token then req[#req + 1] = "Authorization: Bearer " .. self.token .. "\r\n" end
  if body then
    req[#req + 1] = "Content-Type: application/json\r\n"
    req[#req + 1] = "Content-Length: " .. #body .. "\r\n"
  end
  req[#req + 1] = "\r\n"
  if body then req[#req + 1] = body end
  local ok
  ok, err = sock:send(concat(req))
  if not ok then sock:close() return nil, "sending the request: " .. tostring(err) end
  local status, headers = read_head(sock)
  if not status then sock:close() return nil, headers end
  local len = tonumber(headers["content-length"])
  if not len then sock:close() return nil, "the response has no Content-Length" end
  local data = ""
  if len > 0 then
    data, err = sock:receive(len)
    if not data then sock:close() return nil, "reading the body: " .. tostring(err) end
  end
  if headers["connection"] and find(lower(headers["connection"]), "close", 1, true) then
    sock:close()
  else
    sock:setkeepalive(self.keepalive_timeout, self.pool_size)
  end
  return status, data, headers
end

-- A JSON call: the decoded 200 body, or nil, message, decoded error body.
local function call(self, path, args)
  if type(args) ~= "table" then return nil, "resty.corral: the request must be a table" end
  local body, err = self.json.encode(args)
  if not body then return nil, "resty.corral: cannot encode the request: " .. tostring(err) end
  local status, data, headers = self:request("POST", path, body)
  if not status then return nil, "resty.corral: " .. tostring(data) end
  local obj = self.json.decode(data)
  if status == 200 and type(obj) == "table" then return obj end
  local e = type(obj) == "table" and obj.error or nil
  local msg = "resty.corral: HTTP " .. status
  if type(e) == "table" then
    msg = msg .. " " .. tostring(e.code) .. ": " .. tostring(e.message)
  end
  if headers["retry-after"] then msg = msg .. " (retry after " .. headers["retry-after"] .. " s)" end
  return nil, msg, obj
end

--- Run code: `args` is the body of POST /v1/run ({code=, timeout=, memory_mb=, ...}).
function _M.run(self, args)
  return call(self, "/v1/run", args)
end

--- eval_in_sandbox's semantics: POST /v1/eval.
function _M.eval(self, args)
  return call(self, "/v1/eval", args)
end

--- GET /healthz: true, or nil and why.
function _M.healthy(self)
  local status, data = self:request("GET", "/healthz")
  if status == 200 then return true end
  return nil, status and ("HTTP " .. status .. ": " .. tostring(data)) or data
end

return _M
