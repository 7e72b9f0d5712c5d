-- corral.core's HTTP server, core.signal and core.timer, tested with real clients: curl, and a
-- raw Python client for byte-exact cases. Clients run as background processes (core.spawn) so
-- that the loop keeps serving while they run.
local core = require "corral.core"
local H = require "helper"

local CURL = "/usr/bin/curl"

-- Run the loop until pred() holds; fails after `seconds`.
local function wait(pred, seconds, what)
  local expired = false
  local t = core.timer(seconds or 15, function() expired = true end)
  while not pred() and not expired do core.run("once") end
  t:close()
  core.run("nowait")
  assert(pred(), "timed out waiting for " .. (what or "a condition"))
end

-- Run a client process to its end while the loop serves; returns its result.
local function client(file, args, timeout)
  local res
  assert(core.spawn { file = file, args = args, stdout_cap = 4 << 20, stderr_cap = 1 << 20,
                      timeout = timeout or 20, on_exit = function(r) res = r end })
  wait(function() return res end, (timeout or 20) + 5, file)
  return res
end

local function curl(args, timeout)
  local a = { "-q", "-sS" }
  for _, v in ipairs(args) do a[#a + 1] = v end
  return client(CURL, a, timeout)
end

-- The raw client: CODE runs after this prelude with ADDR, conn(), Reader and out.
local PRELUDE = [[
import socket, sys, time
ADDR = sys.argv[1]
out = sys.stdout
def conn(addr=ADDR):
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(addr[5:])
    else:
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host.strip("[]"), int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(10)
    return s
class Reader:
    def __init__(self, s):
        self.s, self.buf = s, b""
    def fill(self):
        try:
            d = self.s.recv(65536)
        except ConnectionResetError:
            return False
        self.buf += d
        return len(d) > 0
    def response(self):
        "one response: (status, headers dict, body); None at EOF"
        while b"\r\n\r\n" not in self.buf:
            if not self.fill():
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split(" ")[1])
        hdrs = {}
        for l in lines[1:]:
            k, v = l.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
        if status == 100:
            return self.response()
        n = int(hdrs.get("content-length", "0"))
        while len(self.buf) < n:
            if not self.fill():
                break
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, hdrs, body.decode()
    def eof(self):
        "True when the server closes (nothing more arrives)"
        while self.fill():
            pass
        return self.buf == b""
def show(r):
    if r is None:
        print("EOF")
    else:
        print(r[0], r[1].get("connection"), r[2])
]]

local function raw(addr, code, timeout)
  return client(H.python, { "-c", PRELUDE .. code, addr }, timeout)
end

-- Lines of a client's stdout.
local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

local function rss_kb()
  local f = assert(io.open("/proc/self/statm"))
  local _, res = f:read("n", "n")
  f:close()
  return res * 4
end

-- A server answering `path` with a small body; `opts` overrides.
local function serve(opts)
  opts = opts or {}
  opts.listen = opts.listen or "127.0.0.1:0"
  opts.on_request = opts.on_request or function(req, res)
    res:send(200, { ["Content-Type"] = "text/plain" }, req.method .. " " .. req.path)
  end
  return assert(core.http_listen(opts))
end

local function close(srv)
  srv:close()
  core.run("nowait")
end

describe("corral.core http", function()
  local snap, dir
  before_each(function()
    snap = H.snapshot()
    dir = core.mkdtemp("/tmp/corral-http-XXXXXX")
  end)
  after_each(function()
    core.run("nowait")
    assert(core.rmtree(dir))
    H.assert_clean(snap)
  end)

  describe("listening", function()
    it("serves a unix socket with mode 0660 and a request table", function()
      local path = dir .. "/s.sock"
      local seen
      local srv = serve { listen = "unix:" .. path, on_request = function(req, res)
        seen = req
        res:send(201, { ["X-Test"] = "yes", ["Content-Type"] = "text/plain" }, "made\n")
      end }
      assert.are.equal("unix:" .. path, srv:address())
      local st = assert(core.lstat(path))
      assert.are.equal("socket", st.type)
      assert.are.equal(tonumber("660", 8), st.mode & tonumber("777", 8))
      local r = curl { "-i", "--unix-socket", path, "-H", "X-Dup: a", "-H", "X-Dup: b",
                       "-H", "Mixed-Case: V ", "http://local/p/q?x=1&y=2" }
      assert.are.equal(0, r.exit_status, r.stderr)
      assert.matches("^HTTP/1.1 201 Created\r\n", r.stdout)
      assert.matches("\r\nX%-Test: yes\r\n", r.stdout)
      assert.matches("\r\nContent%-Length: 5\r\n", r.stdout)
      assert.matches("\r\nDate: %a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT\r\n", r.stdout)
      assert.matches("\r\nConnection: keep%-alive\r\n", r.stdout)
      assert.matches("\r\n\r\nmade\n$", r.stdout)
      assert.are.equal("GET", seen.method)
      assert.are.equal("/p/q?x=1&y=2", seen.target)
      assert.are.equal("/p/q", seen.path)
      assert.are.equal("x=1&y=2", seen.query)
      assert.are.equal("1.1", seen.version)
      assert.are.equal("unix", seen.peer)
      assert.are.equal("", seen.body)
      assert.is_true(seen.keep_alive)
      assert.are.equal("a, b", seen.headers["x-dup"])
      assert.are.equal("V", seen.headers["mixed-case"])
      assert.are.equal("local", seen.headers.host)
      close(srv)
      assert.is_false(core.exists(path))
    end)

    it("replaces a stale socket file nobody listens on", function()
      local path = dir .. "/stale.sock"
      local r = client(H.python, { "-c", "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])", path })
      assert.are.equal(0, r.exit_status, r.stderr)
      assert.are.equal("socket", core.lstat(path).type)
      local srv = serve { listen = "unix:" .. path }
      r = curl { "--unix-socket", path, "http://x/ok" }
      assert.are.equal("GET /ok", r.stdout)
      close(srv)
    end)

    it("refuses a socket something listens on, and a path that is not a socket", function()
      local path = dir .. "/live.sock"
      local srv = serve { listen = "unix:" .. path }
      local s2, err, code = core.http_listen { listen = "unix:" .. path, on_request = print }
      assert.is_nil(s2)
      assert.are.equal("EADDRINUSE", code)
      assert.matches("^EADDRINUSE: .*live%.sock", err)
      close(srv)
      assert(core.write_file(dir .. "/file", "x"))
      s2, err, code = core.http_listen { listen = "unix:" .. dir .. "/file", on_request = print }
      assert.is_nil(s2)
      assert.are.equal("ENOTSOCK", code)
      assert.matches("^ENOTSOCK: .*not a socket.*/file", err)
      local f = assert(io.open(dir .. "/file"))
      assert.are.equal("x", f:read("a"))
      f:close()
    end)

    it("listens on 127.0.0.1:0 and reports the real port", function()
      local seen
      local srv = serve { on_request = function(req, res) seen = req.peer res:send(204, {}) end }
      local port = srv:address():match("^127%.0%.0%.1:(%d+)$")
      assert.is_truthy(port)
      assert.is_true(tonumber(port) > 0)
      local r = curl { "-w", "%{http_code}", "http://" .. srv:address() .. "/" }
      assert.are.equal("204", r.stdout)
      assert.matches("^127%.0%.0%.1:%d+$", seen)
      close(srv)
    end)

    it("raises for bad options", function()
      local ok = function() end
      assert.has_error(function() core.http_listen { on_request = ok } end)
      assert.has_error(function() core.http_listen { listen = "127.0.0.1:0" } end)
      assert.has_error(function() core.http_listen { listen = "localhost:80", on_request = ok } end)
      assert.has_error(function() core.http_listen { listen = "127.0.0.1:0", on_request = ok, colour = 1 } end,
        "bad argument #1 to 'http_listen' (unknown option 'colour')")
      assert.has_error(function() core.http_listen { listen = "127.0.0.1:0", on_request = ok, max_body_bytes = -1 } end)
      local s, _, code = core.http_listen { listen = "unix:" .. dir .. "/" .. string.rep("x", 120), on_request = ok }
      assert.is_nil(s)
      assert.are.equal("ENAMETOOLONG", code)
    end)
  end)

  describe("keep-alive", function()
    it("reuses one connection for two HTTP/1.1 requests", function()
      local peers = {}
      local srv = serve { on_request = function(req, res)
        peers[#peers + 1] = req.peer
        res:send(200, nil, "ok")
      end }
      local r = curl { "-v", "http://" .. srv:address() .. "/1", "http://" .. srv:address() .. "/2" }
      assert.are.equal("okok", r.stdout)
      assert.matches("Re%-using existing connection", r.stderr)
      assert.are.equal(2, #peers)
      assert.are.equal(peers[1], peers[2])
      close(srv)
    end)

    it("closes after an HTTP/1.0 response", function()
      local peers = {}
      local srv = serve { on_request = function(req, res)
        peers[#peers + 1] = req.peer
        assert.are.equal("1.0", req.version)
        assert.is_false(req.keep_alive)
        res:send(200, nil, "ok")
      end }
      local r = curl { "-v", "--http1.0", "http://" .. srv:address() .. "/1", "http://" .. srv:address() .. "/2" }
      assert.are.equal("okok", r.stdout)
      assert.matches("< Connection: close", r.stderr)
      assert.is_nil(r.stderr:find("Re-using", 1, true))
      assert.are_not.equal(peers[1], peers[2])
      close(srv)
    end)

    it("closes after answering a request with Connection: close", function()
      local srv = serve()
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
s.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
show(rd.response()); print(rd.eof())
]])
      assert.are.same({ "200 close GET /a", "True" }, lines(r.stdout))
      close(srv)
    end)

    it("serves 1000 sequential keep-alive requests without growing fds or memory", function()
      local n, peers = 0, {}
      local srv = serve { on_request = function(req, res)
        n = n + 1
        peers[req.peer] = true
        res:send(200, { ["Content-Type"] = "application/json" }, '{"ok":true}')
      end }
      local url = "http://" .. srv:address() .. "/x[1-1000]"
      local r = curl { "-o", "/dev/null", url } -- warm-up
      assert.are.equal(0, r.exit_status, r.stderr)
      collectgarbage()
      collectgarbage()
      local fds, rss = #core.fds(), rss_kb()
      r = curl { "-o", "/dev/null", url }
      assert.are.equal(0, r.exit_status, r.stderr)
      collectgarbage()
      collectgarbage()
      assert.are.equal(2000, n)
      local conns = 0
      for _ in pairs(peers) do conns = conns + 1 end
      assert.are.equal(2, conns) -- one per curl
      assert.are.equal(fds, #core.fds())
      assert.is_true(rss_kb() - rss < 1024, "RSS grew by " .. (rss_kb() - rss) .. " KiB")
      close(srv)
    end)
  end)

  describe("request bodies", function()
    it("answers Expect: 100-continue before reading the body", function()
      local got
      local srv = serve { on_request = function(req, res) got = req.body res:send(200, nil, tostring(#req.body)) end }
      local f = dir .. "/body"
      assert(core.write_file(f, string.rep("b", 5000)))
      local r = curl { "-v", "-H", "Expect: 100-continue", "--data-binary", "@" .. f, "http://" .. srv:address() .. "/up" }
      assert.matches("< HTTP/1.1 100 Continue", r.stderr)
      assert.are.equal("5000", r.stdout)
      assert.are.equal(string.rep("b", 5000), got)
      close(srv)
    end)

    it("refuses a Content-Length over the cap with 413 even when asked to continue", function()
      local called = false
      local srv = serve { max_body_bytes = 1000, on_request = function() called = true end }
      local f = dir .. "/body"
      assert(core.write_file(f, string.rep("b", 5000)))
      local r = curl { "-v", "-H", "Expect: 100-continue", "-w", "%{http_code}", "--data-binary", "@" .. f,
                       "http://" .. srv:address() .. "/up" }
      assert.is_nil(r.stderr:find("100 Continue", 1, true))
      assert.matches('{"error":{"code":"body_too_large","message":"[^"]*1000 bytes"}}413$', r.stdout)
      assert.is_false(called)
      close(srv)
    end)

    it("refuses a Content-Length over the cap at once, without reading the body", function()
      local srv = serve { max_body_bytes = 1000 }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
t = time.time()
s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
st, h, body = rd.response()
print(st, h["connection"], h["content-type"], time.time() - t < 2)
print(body)
print(rd.eof())
]])
      local l = lines(r.stdout)
      assert.are.equal("413 close application/json True", l[1])
      assert.are.equal('{"error":{"code":"body_too_large","message":"the request body is over 1000 bytes"}}', l[2])
      assert.are.equal("True", l[3])
      close(srv)
    end)

    it("decodes a chunked upload", function()
      local got
      local srv = serve { on_request = function(req, res) got = req.body res:send(200, nil, "ok") end }
      local f = dir .. "/body"
      local data = string.rep("0123456789", 7000)
      assert(core.write_file(f, data))
      local r = curl { "-v", "-H", "Transfer-Encoding: chunked", "--data-binary", "@" .. f, "http://" .. srv:address() .. "/" }
      assert.matches("> Transfer%-Encoding: chunked", r.stderr)
      assert.are.equal("ok", r.stdout)
      assert.are.equal(data, got)
      close(srv)
    end)

    it("refuses a chunked body that grows over the cap with 413 and closes", function()
      local called = false
      local srv = serve { max_body_bytes = 1000, on_request = function() called = true end }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
for i in range(5):
    s.sendall(b"12c\r\n" + b"x" * 300 + b"\r\n")
show(rd.response()); print(rd.eof())
]])
      local l = lines(r.stdout)
      assert.matches('^413 close {"error":{"code":"body_too_large"', l[1])
      assert.are.equal("True", l[2])
      assert.is_false(called)
      close(srv)
    end)

    it("times out a body that stops with 408", function()
      local srv = serve { body_timeout = 0.5 }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
t = time.time()
show(rd.response()); print(rd.eof(), round(time.time() - t, 1))
]])
      local l = lines(r.stdout)
      assert.matches('^408 close {"error":{"code":"request_timeout","message":"the request body', l[1])
      local secs = tonumber(l[2]:match("True (%S+)"))
      assert.is_true(secs >= 0.4 and secs < 1.5, l[2])
      close(srv)
    end)
  end)

  describe("request heads", function()
    it("times out a head that never completes with 408", function()
      local srv = serve { header_timeout = 0.5 }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
t = time.time()
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
time.sleep(0.2)
s.sendall(b"X-Slow: 1\r\n")
show(rd.response()); print(rd.eof(), round(time.time() - t, 1))
]])
      local l = lines(r.stdout)
      assert.matches('^408 close {"error":{"code":"request_timeout","message":"the request head', l[1])
      local secs = tonumber(l[2]:match("True (%S+)"))
      assert.is_true(secs >= 0.4 and secs < 1.5, l[2])
      close(srv)
    end)

    it("refuses a head over max_header_bytes with 431", function()
      local srv = serve { max_header_bytes = 1024 }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n")
show(rd.response()); print(rd.eof())
s = conn(); rd = Reader(s)
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 900 + b"\r\n\r\n")
show(rd.response())
]])
      local l = lines(r.stdout)
      assert.are.equal('431 close {"error":{"code":"header_too_large","message":"the request head is over 1024 bytes"}}', l[1])
      assert.are.equal("True", l[2])
      assert.are.equal("200 keep-alive GET /", l[3])
      close(srv)
    end)

    it("accepts a request sent byte by byte", function()
      local got
      local srv = serve { on_request = function(req, res) got = req res:send(200, nil, req.body) end }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
for b in b"POST /slow?q HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nContent-Length: 5\r\n\r\nhello":
    s.sendall(bytes([b])); time.sleep(0.003)
show(rd.response())
]])
      assert.are.equal("200 keep-alive hello", r.stdout:gsub("\n$", ""))
      assert.are.equal("/slow", got.path)
      assert.are.equal("q", got.query)
      assert.are.equal("", got.headers["x-empty"])
      assert.are.equal("x", got.headers.host)
      close(srv)
    end)

    local bad = {
      { "an invalid method", "BREW / HTTP/1.1\r\n\r\n", 400, "HPE_INVALID_METHOD" },
      { "a malformed request line", "GET /a b HTTP/1.1\r\n\r\n", 400, "HPE_INVALID_CONSTANT" },
      { "a control character in the target", "GET /a\tb HTTP/1.1\r\n\r\n", 400, "HPE_INVALID_URL" },
      { "a space in a header name", "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "HPE_INVALID_HEADER_TOKEN" },
      { "two Content-Lengths", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400, "HPE_" },
      { "an unsupported transfer-coding", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
        "HPE_INVALID_TRANSFER_ENCODING" },
      { "gzip before chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400,
        "HPE_INVALID_TRANSFER_ENCODING" },
      { "an upgrade", "GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 400, "upgrades" },
      { "CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", 400, "CONNECT" },
      { "HTTP/2.0", "GET / HTTP/2.0\r\n\r\n", 505, "HTTP/2.0" },
      -- framing errors, each with a request behind it that must not be answered
      { "chunk data not followed by CRLF", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        .. "5\r\nhelloXY0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", 400, "HPE_STRICT: chunk data" },
      { "a chunk size line ending in a bare CR", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        .. "5\rXhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", 400, "HPE_LF_EXPECTED" },
      { "a bad chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        .. "zz\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", 400, "HPE_INVALID_CHUNK_SIZE" },
      { "a chunked body ending in a bare CR", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        .. "5\r\nhello\r\n0\r\n\rXGET /smuggled HTTP/1.1\r\n\r\n", 400, "HPE_LF_EXPECTED" },
      { "Content-Length with Transfer-Encoding", "POST / HTTP/1.1\r\nContent-Length: 3\r\n"
        .. "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", 400, "HPE_" },
      { "a head ending in a bare CR", "GET / HTTP/1.1\r\nHost: x\r\n\rGET /smuggled HTTP/1.1\r\n\r\n", 400,
        "HPE_LF_EXPECTED" },
      { "a bad request line", "GET / HTTP/1.1 x\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", 400, "HPE_" },
    }
    for _, case in ipairs(bad) do
      it("refuses " .. case[1] .. " with " .. case[3], function()
        local called = false
        local srv = serve { on_request = function() called = true end }
        local hex = case[2]:gsub(".", function(ch) return string.format("%02x", ch:byte()) end)
        local r = raw(srv:address(), "s = conn(); rd = Reader(s)\ns.sendall(bytes.fromhex('" .. hex
          .. "'))\nshow(rd.response()); print(rd.eof())\n")
        local l = lines(r.stdout)
        assert.matches("^" .. case[3] .. ' close {"error":{"code":"bad_request","message":"[^"]*'
          .. case[4]:gsub("%p", "%%%0"), l[1])
        assert.are.equal("True", l[2])
        assert.is_false(called)
        close(srv)
      end)
    end
  end)

  describe("chunked framing", function()
    it("accepts chunk extensions and trailers, then the next request", function()
      local got
      local srv = serve { on_request = function(req, res) got = got or req.body res:send(200, nil, req.method .. " " .. req.path) end }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
s.sendall(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 ; x=y\r\nhello\r\nA\r\n0123456789\r\n"
          b"0\r\nX-Trailer: 1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
show(rd.response()); show(rd.response())
]])
      local l = lines(r.stdout)
      assert.are.equal("200 keep-alive POST /a", l[1])
      assert.are.equal("200 keep-alive GET /b", l[2])
      assert.are.equal("hello0123456789", got)
      close(srv)
    end)
  end)

  describe("pipelining", function()
    it("answers requests sent in one write one at a time, in order", function()
      local pending, most, order = 0, 0, {}
      local srv = serve { on_request = function(req, res)
        pending = pending + 1
        most = math.max(most, pending)
        order[#order + 1] = req.path
        core.timer(0.05, function()
          pending = pending - 1
          res:send(200, nil, req.path .. ":" .. req.body)
        end)
      end }
      local r = raw(srv:address(), [[
s = conn(); rd = Reader(s)
s.sendall(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
          b"POST /3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n"
          b"GET /4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n")
for i in range(5):
    show(rd.response())
]])
      assert.are.same({ "200 keep-alive /1:", "200 keep-alive /2:abc", "200 keep-alive /3:de",
                        "200 close /4:", "EOF" }, lines(r.stdout))
      assert.are.equal(1, most)
      assert.are.same({ "/1", "/2", "/3", "/4" }, order)
      close(srv)
    end)
  end)

  describe("responses", function()
    it("answers 500 when on_request raises, and keeps serving", function()
      local errs = {}
      local srv = serve {
        on_request = function(req, res)
          if req.path == "/boom" then error("kaboom") end
          res:send(200, nil, "fine")
        end,
        on_error = function(msg) errs[#errs + 1] = msg end,
      }
      local base = "http://" .. srv:address()
      local r = curl { "-v", "-w", " %{http_code}\n", base .. "/boom", base .. "/ok" }
      assert.are.same({ '{"error":{"code":"internal_error","message":"the request handler failed"}} 500', "fine 200" },
        lines(r.stdout))
      assert.matches("Re%-using existing connection", r.stderr)
      assert.are.equal(1, #errs)
      assert.matches("kaboom", errs[1])
      assert.matches("traceback", errs[1])
      close(srv)
    end)

    it("sends a HEAD response without its body", function()
      local srv = serve { on_request = function(_, res) res:send(200, nil, "twelve bytes") end }
      local r = curl { "-i", "-I", "http://" .. srv:address() .. "/" }
      assert.matches("Content%-Length: 12\r\n", r.stdout)
      assert.matches("\r\n\r\n$", r.stdout)
      close(srv)
    end)

    it("refuses a second send and bad headers", function()
      local errors = {}
      local srv = serve { on_request = function(_, res)
        for _, h in ipairs { { ["Content-Length"] = "1" }, { ["Bad Name"] = "x" }, { X = "a\r\nInjected: 1" },
                             { X = {} }, { [1] = "x" } } do
          local ok, err = pcall(res.send, res, 200, h, "x")
          errors[#errors + 1] = not ok and err
        end
        assert(pcall(res.send, res, 99) == false)
        assert(res:send(200, { ["X-N"] = 7 }, "x"))
        local ok, err = pcall(res.send, res, 200, nil, "again")
        errors[#errors + 1] = not ok and err
      end }
      local r = curl { "-i", "http://" .. srv:address() .. "/" }
      assert.matches("\r\nX%-N: 7\r\n", r.stdout)
      assert.are.equal(6, #errors)
      for _, e in ipairs(errors) do assert.is_string(e) end
      assert.matches("set by the server", errors[1])
      assert.matches("already sent", errors[6])
      close(srv)
    end)
  end)

  describe("clients that go away", function()
    it("calls on_close when the client disconnects before the response", function()
      local saved, closed_calls, srv
      srv = serve { on_request = function(_, res)
        saved = res
        closed_calls = 0
        res:on_close(function() closed_calls = closed_calls + 1 end)
        assert.is_false(res:closed())
      end }
      local r = raw(srv:address(), [[
s = conn()
s.sendall(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
time.sleep(0.3)
s.close()
print("closed")
]])
      assert.are.equal("closed\n", r.stdout)
      wait(function() return closed_calls == 1 end, 5, "on_close")
      assert.is_true(saved:closed())
      local ok, err, code = saved:send(200, nil, "late")
      assert.is_false(ok)
      assert.are.equal("ECONNRESET", code)
      assert.matches("^ECONNRESET: ", err)
      assert.has_error(function() saved:send(200) end)
      local again = 0
      saved:on_close(function() again = again + 1 end) -- already closed: called at once
      assert.are.equal(1, again)
      assert.are.equal(1, closed_calls)
      assert.are.equal(0, srv:connections())
      close(srv)
    end)

    it("answers 503 over max_connections", function()
      local srv = serve { max_connections = 1 }
      local r = raw(srv:address(), [[
a = conn()
time.sleep(0.2)
b = conn(); rd = Reader(b)
show(rd.response()); print(rd.eof())
ra = Reader(a)
a.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
show(ra.response())
]])
      assert.are.same({ '503 close {"error":{"code":"overloaded","message":"too many connections (1)"}}',
                        "True", "200 keep-alive GET /a" }, lines(r.stdout))
      close(srv)
    end)

    it("does not buffer responses for a client that stops reading", function()
      local n = 0
      local srv = serve { send_timeout = 1, on_request = function(_, res)
        n = n + 1
        res:send(200, nil, string.rep("z", 8 << 20))
      end }
      -- 200 pipelined requests, never read: the server may only work on one at a time
      local r = raw(srv:address(), [[
s = conn()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.settimeout(0.5)
try:
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
except socket.timeout:
    pass
time.sleep(2)
print("done")
]])
      assert.are.equal("done\n", r.stdout)
      -- the kernel's socket buffers hold part of the first response: at most 2 are handled
      assert.is_true(n <= 2, n .. " requests handled")
      wait(function() return srv:connections() == 0 end, 5, "the send timeout")
      close(srv)
    end)
  end)

  describe("shutting down", function()
    it("drains: idle connections close, the current request finishes, no new connection", function()
      local srv
      srv = serve { on_request = function(req, res)
        if req.path == "/slow" then
          srv:stop_accepting()
          core.timer(0.2, function() res:send(200, nil, "slow") end)
        else
          res:send(200, nil, "fast")
        end
      end }
      local r = raw(srv:address(), [[
idle = conn(); ri = Reader(idle)
idle.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
show(ri.response())
busy = conn(); rb = Reader(busy)
busy.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
print(ri.eof())
show(rb.response()); print(rb.eof())
try:
    conn(); print("connected")
except ConnectionRefusedError:
    print("refused")
]])
      assert.are.same({ "200 keep-alive fast", "True", "200 close slow", "True", "refused" }, lines(r.stdout))
      wait(function() return srv:connections() == 0 end, 5, "drained")
      close(srv)
    end)

    it("close() fires on_close for pending requests and leaves no fd", function()
      local path = dir .. "/c.sock"
      local fired, srv = 0, nil
      srv = serve { listen = "unix:" .. path, on_request = function(_, res)
        res:on_close(function() fired = fired + 1 end)
        core.timer(0.1, function() srv:close() end)
      end }
      local r = raw("unix:" .. path, [[
s = conn(); rd = Reader(s)
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
show(rd.response())
]])
      assert.are.equal("EOF\n", r.stdout)
      assert.are.equal(1, fired)
      assert.are.equal(0, srv:connections())
      assert.is_false(core.exists(path))
      srv:close() -- twice is fine
      core.run("nowait")
    end)
  end)
end)

describe("corral.core signal and timer", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function()
    core.run("nowait")
    H.assert_clean(snap)
  end)

  it("delivers SIGUSR1 sent to ourselves", function()
    local got = {}
    local w = assert(core.signal(10, function(signum) got[#got + 1] = signum end))
    assert(core.kill(core.getpid(), 10))
    wait(function() return #got == 1 end, 5, "the signal")
    assert.are.same({ 10 }, got)
    assert.is_true(w:active())
    w:close()
    w:close()
    assert.is_false(w:active())
  end)

  it("fires a timer once, and not after close", function()
    local fired, never = 0, 0
    local t0 = core.hrtime()
    local t = core.timer(0.1, function() fired = fired + 1 end)
    local t2 = core.timer(0.05, function() never = never + 1 end)
    t2:close()
    wait(function() return fired == 1 end, 5, "the timer")
    assert.is_true(core.hrtime() - t0 >= 0.09)
    assert.is_false(t:active())
    t:close()
    core.run("nowait")
    assert.are.equal(0, never)
    assert.are.equal(1, fired)
  end)

  it("re-raises an error of a timer's function from core.run", function()
    core.timer(0, function() error("from the timer") end)
    assert.has_error(function() core.run("default") end)
  end)
end)
