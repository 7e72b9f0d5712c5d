-- Attacks on sessions: the cell's program runs in the kernel's interpreter, so it can read the
-- request's token, write the answer framing on the kernel's own fds, replace the kernel's
-- functions and read its requests. Whatever it writes, the host stays bounded and answers, and
-- only its own session is confused; the HTTP caller reaches a session by its exact id only.
local corral = require "corral"
local session = require "corral.session"
local core = require "corral.core"
local cjson = require "cjson"
local H = require "helper"

-- forge(obj, length=None): the end of the running request, as the kernel writes it, with `obj`
-- (a dict, or raw bytes) as its answer and `length` (bytes) as its LENGTH.
local FORGE = [[
import sys, os, json, base64, threading, time
def _kernel():
    f = sys._getframe()
    while f.f_code.co_name != '_corral_kernel':
        f = f.f_back
    return f.f_locals
def forge(obj, length=None):
    K = _kernel()
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    mark = b"\0" + K['token'].encode() + b"\0"
    K['write_all'](K['err_fd'], mark)
    ln = str(len(data)).encode() if length is None else length
    K['write_all'](K['out_fd'], mark + ln + b"\n" + data)
]]

describe("a session under attack from its own program", function()
  local snap
  local sessions = {}
  before_each(function() snap = H.snapshot() sessions = {} end)
  after_each(function()
    for _, s in ipairs(sessions) do s:close() end
    assert(corral.close())
    H.assert_clean(snap)
  end)
  local function new(opts)
    local s = assert(session.open(opts or {}))
    sessions[#sessions + 1] = s
    local r = assert(s:exec(FORGE))
    assert.are.equal("ok", r.reason, r.stderr)
    return s
  end

  it("loses only itself to an answer LENGTH that is not a whole number of bytes", function()
    for _, len in ipairs({ "13.5", "-5", "0x10", "1e3", " 7", "99999999999999999999" }) do
      local s = new()
      local ok, r = pcall(s.exec, s, "forge({'status': 'ok'}, b'" .. len .. "')\nimport time\ntime.sleep(60)",
        { timeout = 5 })
      assert.is_true(ok, len .. ": " .. tostring(r))
      assert.are.equal("lost", r.reason, len)
      assert.is_false(s:alive())
    end
  end)

  it("bounds a forged answer's fields and gives each its type", function()
    local s = new()
    local r = assert(s:exec("forge({'status': 'ok', 'value': 'v' * 1000000, 'value_truncated': 'no',"
      .. " 'execution_count': 'z', 'cpu_s': [1], 'memory_kb': {}, 'images': [{}, 7, None],"
      .. " 'error': {'type': ['t'], 'message': 'm' * 1000000, 'traceback': 5}})"))
    assert.are.equal("ok", r.reason)
    assert.are.equal(("v"):rep(10000), r.value)
    assert.is_true(r.value_truncated)
    assert.is_nil(r.execution_count)
    assert.is_nil(r.usage.cpu_s)
    assert.is_nil(r.usage.memory_kb)
    assert.are.same({}, r.images)
    assert.is_nil(r.error.type)
    assert.is_nil(r.error.traceback)
    assert.is_true(#r.error.message <= s.max_output)
    -- a value that is not a string is none; bytes that are not UTF-8 are repaired
    r = assert(s:exec("forge({'status': 'exit', 'value': {'a': [1]}, 'exit_code': 'x'})"))
    assert.are.equal("exit", r.reason)
    assert.is_nil(r.value)
    assert.is_nil(r.returncode)
  end)

  it("ends the session's processes at an exit it answers, whoever wrote the answer", function()
    local s = new()
    local r = assert(s:exec("forge({'status': 'exit', 'exit_code': 4})\nimport time\ntime.sleep(300)"))
    assert.are.equal("exit", r.reason)
    assert.are.equal(4, r.returncode)
    assert.is_false(s:alive())
    -- not at its idle timeout: now
    assert.is_true(H.eventually(function() core.run("nowait") return s.proc == nil end, 20))
  end)

  it("refuses an answer of millions of small values before it is decoded", function()
    local s = new { memory_mb = 512 }
    local before = collectgarbage("count")
    local r = assert(s:exec("forge(b'{\"status\": \"ok\", \"x\": [' + b'{},' * 4000000 + b'{}]}')\n"
      .. "import time\ntime.sleep(60)", { timeout = 60 }))
    assert.are.equal("lost", r.reason)
    assert.is_false(s:alive())
    -- the frame's bytes, not the 4 million tables it describes
    assert.is_true(collectgarbage("count") - before < 64 * 1024)
  end)

  it("refuses a collection of millions of tiny records before a table is made for each", function()
    -- the records are one base64 string of the answer (one value to values_at_most): each
    -- record of 10 bytes would be a table of its own before workspace.bound keeps out_files
    local s = new { memory_mb = 512 }
    local r = assert(s:exec([[
_dumps = json.dumps
def evil(obj, *a, **k):
    if 'files' in obj:
        obj['files'] = base64.b64encode(b"f\0a\0" b"0\0" b"0\0" b"0\0" * 500000 + b"end\0" b"1\0" b"\0").decode()
    return _dumps(obj, *a, **k)
json.dumps = evil]]))
    assert.are.equal("ok", r.reason, r.stderr)
    collectgarbage("collect")
    local before = collectgarbage("count")
    collectgarbage("stop")
    local ok, r2 = pcall(s.exec, s, "x = 1", { collect = true, timeout = 60 })
    local grown = collectgarbage("count") - before
    collectgarbage("restart")
    assert.is_true(ok, tostring(r2))
    assert.is_true(r2.files == nil or #r2.files <= s.caps.out_files)
    -- what the host allocated for that answer (GC stopped: all of it): its 6.7 MB frame in a
    -- few copies, not 500,000 tables
    assert.is_true(grown < 64 * 1024, string.format("%.0f MB allocated for a 6.7 MB answer", grown / 1024))
  end)

  it("keeps a replaced kernel's file answers within the caller's caps", function()
    local s = new()
    local r = assert(s:exec([[
_dumps = json.dumps
def evil(obj, *a, **k):
    if 'content_b64' in obj:
        obj['content_b64'] = base64.b64encode(b'x' * 100000).decode()
        obj['size'], obj['truncated'], obj['mode'] = 'big', False, 'rw'
    if 'entries' in obj:
        e = {'path_b64': base64.b64encode(b'e').decode(), 'type': 'file', 'size': 1}
        obj['entries'] = [e] * 5000 + [{'path_b64': 7, 'type': [], 'size': 'no'}]
        obj['truncated'] = False
    if 'complete' in obj:
        obj['complete'] = 'maybe'
    return _dumps(obj, *a, **k)
json.dumps = evil
open('f.txt', 'w').write('abc')]]))
    assert.are.equal("ok", r.reason, r.stderr)
    local f = assert(s:get("f.txt", 1000))
    assert.are.equal(("x"):rep(1000), f.content)
    assert.is_true(f.truncated)
    assert.is_nil(f.mode)
    local l = assert(s:list(5))
    assert.are.equal(5, #l.entries)
    assert.is_true(l.truncated)
    local c = assert(s:complete("1"))
    assert.is_nil(c.complete)
  end)

  it("answers for later requests written by a thread that steals each token confuse only its session", function()
    local other = new()
    local s = new()
    assert(s:exec([[
def thief():
    K = None
    seen = set()
    while True:
        f = sys._current_frames().get(threading.main_thread().ident)
        while f is not None and f.f_code.co_name != '_corral_kernel':
            f = f.f_back
        t = f and f.f_locals.get('token')
        if t and t not in seen:
            seen.add(t)
            forge({'status': 'ok', 'value': 'forged', 'execution_count': 999})
        time.sleep(0.001)
threading.Thread(target=thief, daemon=True).start()]]))
    for i = 1, 5 do
      local r = s:exec("'real'", { timeout = 10 })
      if r then assert.is_true(r.value == nil or #r.value <= 10000) end
      local o = assert(other:exec("x = " .. i .. "\nx * 2"))
      assert.are.equal(tostring(i * 2), o.value)
      assert.are.equal("ok", o.reason)
      assert.are.equal("", o.stdout)
    end
  end)

  it("loses only itself when its program eats the host's requests", function()
    local other = new()
    local s = new { grace = 0.5 }
    assert(s:exec([[
fd = _kernel()['req_fd']
def eat():
    while True:
        os.read(fd, 65536)
threading.Thread(target=eat, daemon=True).start()]]))
    local r = assert(s:exec("1", { timeout = 2 }))
    assert.is_true(r.reason == "lost" or r.reason == "ok", r.reason)
    assert.are.equal("2", assert(other:exec("1 + 1")).value)
  end)

  it("keeps each stream to max_output whatever writes to the kernel's fds, between cells too", function()
    local s = new { max_output = 1000 }
    assert(s:exec([[
K = _kernel()
def flood():
    while True:
        try:
            os.write(K['out_fd'], b'o' * 65536)
            os.write(K['err_fd'], b'e' * 65536)
        except OSError:
            time.sleep(0.01)
threading.Thread(target=flood, daemon=True).start()]]))
    for _ = 1, 3 do
      local r = assert(s:exec("time.sleep(0.2)\n1"))
      assert.is_true(#r.stdout <= 1000 and #r.stderr <= 1000)
      assert.is_true(r.truncated)
    end
  end)

  it("keeps at most MAX_SPARES kernels ahead, whatever options each session asks for", function()
    local me = core.getpid()
    for i = 1, session.MAX_SPARES + 3 do
      local s = assert(session.open { idle_timeout = 100 + i })
      s:close()
    end
    -- (the closed sessions' launchers end a moment after close(), on a busy machine later)
    local n
    H.eventually(function()
      n = 0
      for _, pid in ipairs(H.pids_with("--parent-pid " .. me .. " ")) do
        local cmd = H.try_read("/proc/" .. pid .. "/cmdline") or ""
        if not cmd:find("\0--prestart\0", 1, true) then n = n + 1 end
      end
      return n <= session.MAX_SPARES
    end, 10)
    assert.is_true(n <= session.MAX_SPARES, n .. " kernels kept ahead")
  end)
end)

describe("sessions of corral serve under attack", function()
  local snap, dir, srv
  local n = 0
  local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
  -- One request with curl: status, body, decoded JSON (or nil).
  local function http(method, path, body)
    n = n + 1
    local out, inp = dir .. "/out" .. n, dir .. "/in" .. n
    local cmd = "curl -s --path-as-is -X " .. method .. " -o " .. q(out) .. " -w '%{http_code}'"
    if body then
      local f = assert(io.open(inp, "wb"))
      f:write(body)
      f:close()
      cmd = cmd .. " --data-binary @" .. q(inp)
    end
    local status = tonumber((H.sh(cmd .. " --unix-socket " .. q(dir .. "/s.sock") .. " " .. q("http://corral" .. path))))
    local text = H.try_read(out) or ""
    local ok, obj = pcall(cjson.decode, text)
    return status, text, ok and obj or nil
  end
  local function open_session()
    local status, text, obj = http("POST", "/v1/sessions", "{}")
    assert.are.equal(201, status, text)
    status, text = http("POST", "/v1/sessions/" .. obj.id .. "/exec", cjson.encode { code = FORGE })
    assert.are.equal(200, status, text)
    return obj.id
  end
  before_each(function()
    snap = H.snapshot()
    dir = core.mkdtemp("/tmp/corral-attack.XXXXXX")
    core.chmod(dir, 493)
    srv = tonumber((H.sh(H.cli .. " serve --listen unix:" .. q(dir .. "/s.sock") .. " </dev/null >"
      .. q(dir .. "/log") .. " 2>&1 & echo $!")))
    assert.is_true(H.eventually(function()
      return (H.try_read(dir .. "/log") or ""):find("listening", 1, true) ~= nil
    end, 20), H.try_read(dir .. "/log"))
  end)
  after_each(function()
    core.kill(srv, 15)
    H.eventually(function() return not core.kill(srv, 0) end, 10)
    core.rmtree(dir)
    assert.is_true(H.eventually(function() return #H.stray_processes() == 0 end, 5), "stray processes")
    H.assert_clean(snap)
  end)

  it("answers within its caps whatever the kernel answers, and reaches a session by its id only", function()
    local a, b = open_session(), open_session()
    local exec = "/v1/sessions/" .. a .. "/exec"
    local status, text, r = http("POST", exec, cjson.encode { code = [[
_dumps = json.dumps
def evil(obj, *a, **k):
    if 'content_b64' in obj:
        obj['content_b64'] = base64.b64encode(b'x' * (17 << 20)).decode()
        obj['size'], obj['truncated'] = 1, False
    if 'entries' in obj:
        obj['entries'] = [{'path_b64': 'ZQ==', 'type': 'file', 'size': 1}] * 5000
    return _dumps(obj, *a, **k)
json.dumps = evil
open('f.txt', 'w').write('abc')
forge({'status': 'ok', 'value': 'v' * 100000, 'execution_count': 'z', 'cpu_s': 'q'})]] })
    assert.are.equal(200, status, text)
    assert.are.equal(10000, #r.value)
    assert.is_true(r.value_truncated)
    assert.are.equal(cjson.null, r.execution_count)
    status, text, r = http("GET", "/v1/sessions/" .. a .. "/files/f.txt")
    assert.are.equal(413, status, #text)
    assert.are.equal("file_too_large", r.error.code)
    status, text, r = http("GET", "/v1/sessions/" .. a .. "/files")
    assert.are.equal(200, status, #text)
    assert.are.equal(1000, #r.entries)
    assert.is_true(r.truncated)
    -- another session's files are not this one's; ids are looked up exactly
    assert.are.equal(201, (http("PUT", "/v1/sessions/" .. b .. "/files/mine.txt", "b's")))
    assert.are.equal(404, (http("GET", "/v1/sessions/" .. a .. "/files/mine.txt")))
    for _, bad in ipairs({ a .. "/../" .. b .. "/exec", a:upper() .. "/exec", a .. "%00/exec", "%2e%2e/exec",
                           b:sub(1, 31) .. "/exec", b .. "0/exec", "/" .. b .. "/exec", "*/exec" }) do
      status, text = http("POST", "/v1/sessions/" .. bad, '{"code": "1"}')
      assert.are.equal(404, status, bad .. ": " .. text)
    end
    -- a forged exit ends the session and its processes now
    status, text, r = http("POST", "/v1/sessions/" .. b .. "/exec",
      cjson.encode { code = "forge({'status': 'exit', 'exit_code': 5})\ntime.sleep(300)" })
    assert.are.equal(200, status, text)
    assert.are.equal("exit", r.reason)
    assert.is_true(H.eventually(function()
      local _, _, h = http("GET", "/healthz")
      return h and h.sessions == 1
    end, 20))
    status = http("GET", "/v1/sessions/" .. b .. "/files/mine.txt")
    assert.are.equal(410, status)
  end)
end)
