-- Unix sockets, attacked under `default`, `warm` and `bwrap`: a run reaches no unix socket of the
-- host by path (a listener, a datagram socket, a real `corral serve`), whatever uid the controller
-- has; concurrent runs that share a network namespace neither see nor take each other's socket
-- names; and what programs build on socket pairs (multiprocessing.Pipe, asyncio) still works.
--
-- The host sockets live in SOCKET_DIR, a sticky world-writable directory outside /tmp, /var/tmp,
-- /dev/shm and /run (which each run replaces with its own), so that the run's uid can reach them
-- by path: the walls under test are corral's, not the directory's mode. As root the spec makes
-- it; an unprivileged user needs it made beforehand (spec/run.sh does, as root).
local corral = require "corral"
local core = require "corral.core"
local H = require "helper"

local SOCKET_DIR = "/var/lib/corral-spec"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local read = H.try_read

local function pystr(s) return string.format("%q", s) end

--- A fresh 0777 directory of this test under SOCKET_DIR.
local function scratch()
  if H.root and not core.exists(SOCKET_DIR) then
    assert(core.mkdir(SOCKET_DIR, tonumber("1777", 8)))
    assert(os.execute("chmod 1777 " .. q(SOCKET_DIR)))
  end
  assert(core.exists(SOCKET_DIR), SOCKET_DIR .. " is missing: make it as root, mode 1777")
  local d = assert(core.mkdtemp(SOCKET_DIR .. "/sock.XXXXXX"))
  assert(os.execute("chmod 0777 " .. q(d)))
  return d
end

-- A host listener: a stream, a datagram and a seqpacket socket at PATH, PATH.d and PATH.s (mode
-- 0666), each event written to PATH.log; prints its pid, then "ready" once both are bound.
local LISTENER = [[
import os, socket, sys, threading, time
print(os.getpid(), flush=True)
path = sys.argv[1]
log = open(path + ".log", "a", buffering=1)
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o666)
s.listen(16)
d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
d.bind(path + ".d")
os.chmod(path + ".d", 0o666)
sp = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sp.bind(path + ".s")
os.chmod(path + ".s", 0o666)
sp.listen(16)
def accept(s, what):
    while True:
        c, _ = s.accept()
        log.write("ACCEPTED %s\n" % what)
        c.close()
def receive():
    while True:
        log.write("RECEIVED %r\n" % d.recv(100))
threading.Thread(target=accept, args=(s, "stream"), daemon=True).start()
threading.Thread(target=accept, args=(sp, "seqpacket"), daemon=True).start()
threading.Thread(target=receive, daemon=True).start()
print("ready", flush=True)
time.sleep(120)
]]

local function start_listener(path)
  local script = path .. ".py"
  local f = assert(io.open(script, "w"))
  f:write(LISTENER)
  f:close()
  local h = io.popen("exec " .. H.python .. " -u " .. q(script) .. " " .. q(path), "r")
  local pid = tonumber(h:read("l"))
  assert(h:read("l") == "ready", "the listener did not start")
  return { pid = pid, h = h }
end

local function stop_listener(l)
  core.kill(l.pid, 9)
  l.h:close()
end

local ERRNO = "import errno\ndef en(e):\n    return errno.errorcode.get(getattr(e, 'errno', None), str(e))\n"

-- Every way a program could address the sockets at PATH: a stream or seqpacket connect, a
-- datagram sendto and connect, from a socket of its own and from each kind of socket pair.
local function reach_code(path)
  return ERRNO .. string.format([[
import socket
P = %s
def attempt(what, f):
    try:
        if f() == "peer":
            print("refused", what, "(it went to its own peer)")
        else:
            print("REACHED", what)
    except OSError as e:
        print("refused", what, en(e))
def stream():
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(1)
    c.connect(P)
def seqpacket():
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c.settimeout(1)
    c.connect(P + ".s")
def dgram():
    c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    c.sendto(b"dgram", P + ".d")
def dgram_connect():
    c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    c.connect(P + ".d")
    c.send(b"dgram-connect")
def pair(kind, how):
    def f():
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        a.settimeout(1)
        if how == "connect":
            a.connect(P + (".s" if kind == socket.SOCK_SEQPACKET else ""))
            return
        # a connected socket's datagrams go to its peer (seqpacket: the address is ignored)
        a.sendto(b"pair", P + ".d")
        b.setblocking(False)
        try:
            if b.recv(10) == b"pair":
                return "peer"
        except BlockingIOError:
            pass
    return f
def high_bits():
    # the family and type are ints to the kernel, 64-bit registers to seccomp
    import ctypes, platform
    if platform.machine() != "x86_64":
        raise OSError(0, "not x86_64")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(41), ctypes.c_long((1 << 32) | 1), ctypes.c_long(1), ctypes.c_long(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "socket")
    c = socket.socket(fileno=fd)
    c.settimeout(1)
    c.connect(P)
def high_bits_pair():
    import ctypes, platform
    if platform.machine() != "x86_64":
        raise OSError(0, "not x86_64")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    sv = (ctypes.c_int * 2)()
    if libc.syscall(ctypes.c_long(53), ctypes.c_long((1 << 32) | 1), ctypes.c_long((1 << 32) | 2),
                    ctypes.c_long(0), sv) < 0:
        raise OSError(ctypes.get_errno(), "socketpair")
    socket.socket(fileno=sv[0]).sendto(b"high", P + ".d")
attempt("stream", stream)
attempt("seqpacket", seqpacket)
attempt("high-bits", high_bits)
attempt("high-bits-pair", high_bits_pair)
attempt("dgram", dgram)
attempt("dgram-connect", dgram_connect)
# (SOCK_RAW is a datagram socket to the kernel's AF_UNIX)
for name, kind in (("stream", socket.SOCK_STREAM), ("seqpacket", socket.SOCK_SEQPACKET),
                   ("dgram", socket.SOCK_DGRAM), ("raw", socket.SOCK_RAW)):
    for how in ("connect", "sendto"):
        attempt("pair-%%s-%%s" %% (name, how), pair(kind, how))
]], pystr(path))
end

for _, pname in ipairs({ "default", "warm", "bwrap" }) do
  describe("unix sockets (" .. pname .. ")", function()
    teardown(function() assert(corral.close()) end)

    it("a host socket by path cannot be connected to nor sent to, nothing arrives", function()
      local d = scratch()
      local path = d .. "/host.sock"
      local l = start_listener(path)
      finally(function()
        stop_listener(l)
        os.execute("rm -rf " .. q(d))
      end)
      local res, err = corral.run_python(reach_code(path), { policy = pname, timeout = 5 })
      assert.is_truthy(res, err)
      assert.are.equal("exit", res.reason, res.stderr)
      assert.is_falsy(res.stdout:find("REACHED", 1, true), res.stdout)
      assert.are.equal(14, select(2, res.stdout:gsub("refused", "")), res.stdout)
      local log = read(path .. ".log") or ""
      assert.are.equal("", log, "the listener saw: " .. log)
      if pname ~= "bwrap" then
        -- (bwrap has no seccomp filter: its wall is a root of only what python needs)
        assert.is_truthy(H.has(res.limits, "unix-pairs-only"), table.concat(res.limits, " "))
      end
    end)

    it("a program cannot submit a run to a corral serve on a unix socket outside /tmp", function()
      local d = scratch()
      local sock, log = d .. "/serve.sock", d .. "/serve.log"
      os.execute("( exec " .. H.cli .. " serve --policy default --listen unix:" .. q(sock) .. " </dev/null >"
        .. q(log) .. " 2>&1 & echo $! > " .. q(d .. "/pid") .. " )")
      local pid
      finally(function()
        if pid then
          core.kill(pid, 15)
          if not H.eventually(function() return not core.kill(pid, 0) end, 5) then core.kill(pid, 9) end
        end
        os.execute("rm -rf " .. q(d))
      end)
      assert(H.eventually(function() return (read(d .. "/pid") or ""):match("%d+") ~= nil end, 5))
      pid = tonumber(read(d .. "/pid"):match("%d+"))
      assert(H.eventually(function() return (read(log) or ""):find("listening", 1, true) ~= nil end, 10), read(log))
      -- the socket's mode is 0660: as root runs have a uid of their own, which it alone would
      -- keep out; opened to everyone here, so that only corral's walls are tested
      assert(os.execute("chmod 0666 " .. q(sock)))
      local function requests()
        local f = io.popen("curl -s --unix-socket " .. q(sock) .. " http://corral/metrics")
        local text = f:read("a")
        f:close()
        local n, runs = 0, 0
        for name, v in text:gmatch("\n(corral_%S+) (%S+)") do
          if name:match("^corral_http_requests_total") then n = n + tonumber(v) end
          if name:match("^corral_runs_total") then runs = runs + tonumber(v) end
        end
        return n, runs
      end
      local before = requests()
      local code = ERRNO .. string.format([[
import json, socket
body = json.dumps({"code": "print('submitted by a run')"}).encode()
req = (b"POST /v1/run HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\n"
       b"Content-Length: %%d\r\nConnection: close\r\n\r\n" %% len(body)) + body
for what in ("socket", "pair"):
    try:
        if what == "socket":
            c = socket.socket(socket.AF_UNIX)
        else:
            c, _ = socket.socketpair()
        c.settimeout(3)
        c.connect(%s)
        c.sendall(req)
        print("RESPONSE", c.recv(200))
    except OSError as e:
        print("refused", what, en(e))
]], pystr(sock))
      local res, err = corral.run_python(code, { policy = pname, timeout = 8 })
      assert.is_truthy(res, err)
      assert.are.equal("exit", res.reason, res.stderr)
      assert.is_falsy(res.stdout:find("RESPONSE", 1, true), res.stdout)
      assert.are.equal(2, select(2, res.stdout:gsub("refused", "")), res.stdout)
      local after, runs = requests()
      assert.are.equal(1, after - before, "the server saw requests besides the test's own")
      assert.are.equal(0, runs)
    end)

    it("concurrent runs neither see nor take each other's socket names", function()
      local tag = "corral-spec-" .. core.getpid() .. "-" .. pname
      -- each binds the same abstract name (the one both want) and one of its own, then looks for
      -- the other's in /proc/net/unix until it has seen it or 3 s have passed
      local function code(mine, theirs)
        return ERRNO .. string.format([[
import socket, time
def bind(name):
    try:
        s, _ = socket.socketpair()
        s.bind("\0" + name)
        print("bound", name)
        return s
    except OSError as e:
        print("bind refused", en(e))
held = [bind(%s), bind(%s)]
t = time.monotonic() + 3
while time.monotonic() < t:
    if %s in open("/proc/net/unix").read():
        print("SAW the other's name")
        break
    time.sleep(0.05)
]], pystr(tag .. "-both"), pystr(tag .. "-" .. mine), pystr(tag .. "-" .. theirs))
      end
      local results, pending = {}, 2
      for i, c in ipairs({ code("a", "b"), code("b", "a") }) do
        corral.start(c, { policy = pname, timeout = 6 }, function(res, err)
          results[i] = res or { stdout = "", error = err, limits = {} }
          pending = pending - 1
        end)
      end
      while pending > 0 do corral.run_loop("once") end
      for i = 1, 2 do
        local r = results[i]
        assert.are.equal("exit", r.reason, tostring(r.error) .. (r.stderr or ""))
        assert.is_falsy(r.stdout:find("SAW", 1, true), r.stdout)
        assert.is_falsy(r.stdout:find("EADDRINUSE", 1, true), r.stdout)
        if H.has(r.limits, "shared-netns") or not H.has(r.limits, "no-network") then
          -- a namespace shared with other runs: no socket may have a name in it
          assert.are.equal(2, select(2, r.stdout:gsub("bind refused EPERM", "")), r.stdout)
        else
          -- a namespace of the run's own: its names are its own
          assert.are.equal(2, select(2, r.stdout:gsub("bound", "")), r.stdout)
        end
      end
    end)

    it("a socket pair gets no name from the kernel either (autobind, SO_PASSCRED)", function()
      -- a pair with SO_PASSCRED (or SO_PASSPIDFD) is given an abstract name of 5 hex digits at
      -- its first send or connect, which every run of a shared namespace reads in /proc/net/unix
      local r = assert(corral.run_python(ERRNO .. [[
import socket
def names():
    return {l.split()[-1] for l in open("/proc/net/unix").read().splitlines()[1:] if l.split()[-1].startswith("@")}
before = names()
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
for opt, name in ((socket.SO_PASSCRED, "PASSCRED"), (getattr(socket, "SO_PASSPIDFD", 76), "PASSPIDFD")):
    try:
        a.setsockopt(socket.SOL_SOCKET, opt, 1)
        print("set", name)
    except OSError as e:
        print("refused", name, en(e))
a.send(b"x")
try:
    a.connect("\0x")
except OSError as e:
    pass
print("new names", len(names() - before))
]], { policy = pname, timeout = 10 }))
      assert.are.equal("exit", r.reason, r.stderr)
      if H.has(r.limits, "shared-netns") then
        assert.is_truthy(r.stdout:find("refused PASSCRED EPERM", 1, true), r.stdout)
        assert.is_truthy(r.stdout:find("refused PASSPIDFD EPERM", 1, true), r.stdout)
      end
      if H.has(r.limits, "shared-netns") or not H.has(r.limits, "no-network") then
        assert.is_truthy(r.stdout:find("new names 0", 1, true), r.stdout)
      end
    end)

    it("multiprocessing.Pipe and asyncio still work", function()
      local res, err = corral.run_python([[
import asyncio, multiprocessing, socket
def child(conn):
    conn.send(conn.recv() + 1)
a, b = multiprocessing.Pipe()
p = multiprocessing.Process(target=child, args=(b,))
p.start()
a.send(41)
print("pipe", a.recv())
p.join()
async def main():
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_soon_threadsafe(fut.set_result, "woken")
    r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
    w.send(b"packet")
    return await fut, r.recv(10)
print("asyncio", asyncio.run(main()))
]], { policy = pname, timeout = 8 })
      assert.is_truthy(res, err)
      assert.are.equal("exit", res.reason, res.stderr)
      assert.are.equal(0, res.returncode, res.stderr)
      assert.matches("pipe 42", res.stdout)
      assert.matches("asyncio %('woken', b'packet'%)", res.stdout)
    end)
  end)
end

describe("unix sockets (warm, abstract names not scoped)", function()
  teardown(function() assert(corral.close()) end)

  -- Without Landlock's scope (a kernel without it, gVisor; here the policy's choice) the runs of a
  -- zygote may not share its network namespace: each gets one of its own.
  local unscoped = require("corral.policy").load("warm"):extend { name = "warm-unscoped", scope = false }

  it("concurrent runs get a network namespace each, and neither sees the other's names", function()
    local tag = "corral-spec-" .. core.getpid() .. "-unscoped"
    local function code(mine, theirs)
      return ERRNO .. string.format([[
import os, socket, time
print("netns", os.readlink("/proc/self/ns/net"), flush=True)
s, _ = socket.socketpair()
try:
    s.bind("\0" + %s)
    print("bound")
except OSError as e:
    print("bind refused", en(e))
t = time.monotonic() + 2
while time.monotonic() < t:
    if %s in open("/proc/net/unix").read():
        print("SAW the other's name")
        break
    time.sleep(0.05)
]], pystr(tag .. "-" .. mine), pystr(tag .. "-" .. theirs))
    end
    local results, pending = {}, 2
    for i, c in ipairs({ code("a", "b"), code("b", "a") }) do
      corral.start(c, { policy = unscoped, timeout = 6 }, function(res, err)
        results[i] = res or { stdout = "", error = err, limits = {} }
        pending = pending - 1
      end)
    end
    while pending > 0 do corral.run_loop("once") end
    for i = 1, 2 do
      local r = results[i]
      assert.are.equal("exit", r.reason, tostring(r.error) .. (r.stderr or ""))
      assert.is_truthy(r.stdout:find("bound\n", 1, true), r.stdout)
      assert.is_falsy(r.stdout:find("SAW", 1, true), r.stdout)
      assert.is_true(H.has(r.limits, "no-network"), table.concat(r.limits, " "))
      assert.is_false(H.has(r.limits, "shared-netns"), table.concat(r.limits, " "))
      assert.are.equal("EINVAL", r.refused["shared-netns"] and r.refused["shared-netns"].errno)
    end
    local a, b = results[1].stdout:match("netns (%S+)"), results[2].stdout:match("netns (%S+)")
    assert.is_truthy(a)
    assert.are_not.equal(a, b)
    assert.are_not.equal(core.readlink("/proc/self/ns/net"), a)
  end)
end)

describe("unix sockets", function()
  it("the spec's own listener is reachable from the host", function()
    -- the attacks above must not pass for a listener that nothing could reach
    local d = scratch()
    local path = d .. "/self.sock"
    local l = start_listener(path)
    finally(function()
      stop_listener(l)
      os.execute("rm -rf " .. q(d))
    end)
    local out = H.sh(H.python .. " -c " .. q(reach_code(path)))
    assert.matches("REACHED stream", out)
    assert.matches("REACHED seqpacket", out)
    assert.matches("REACHED dgram", out)
    assert.matches("REACHED high%-bits\n", out)
    assert.matches("REACHED high%-bits%-pair", out)
    assert.matches("REACHED pair%-raw%-sendto", out)
    assert(H.eventually(function()
      local log = read(path .. ".log") or ""
      return log:find("ACCEPTED stream", 1, true) and log:find("ACCEPTED seqpacket", 1, true)
        and log:find("RECEIVED b'dgram'", 1, true)
    end, 5), read(path .. ".log"))
  end)
end)
