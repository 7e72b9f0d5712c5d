--- Hostile cases: the network. TCP, UDP and DNS out; unix sockets to host listeners, by path and
-- by abstract name. Each listener is a host process the test starts; it greets whoever connects,
-- so a program that reaches it prints the greeting. See spec/hostile_spec.lua for the fields.
local assert = require "luassert"
local S = require "hostile.support"

local ERRNO = "import errno\ndef en(e):\n    return errno.errorcode.get(getattr(e, 'errno', None), str(e))\n"

-- A listener greeting each connection with "hello-from-host"; prints its pid, then what to
-- connect to. HOSTILE_LISTEN: "tcp", "abstract:NAME" or "path:PATH".
local LISTENER = [[
import os, socket, threading, time
print(os.getpid(), flush=True)
how = os.environ["HOSTILE_LISTEN"]
if how == "tcp":
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = s.getsockname()[1]
elif how.startswith("abstract:"):
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0" + how[9:])
    addr = how[9:]
else:
    s = socket.socket(socket.AF_UNIX)
    s.bind(how[5:])
    os.chmod(how[5:], 0o777)
    addr = how[5:]
s.listen(16)
print(addr, flush=True)
def serve():
    while True:
        c, _ = s.accept()
        c.sendall(b"hello-from-host")
        c.close()
threading.Thread(target=serve, daemon=True).start()
time.sleep(60)
]]

local function listener(how)
  return function(ctx)
    if how == "path" then
      local path = S.host_scratch() .. "/" .. ctx.token .. ".sock"
      local pid = S.start_helper(LISTENER, { HOSTILE_LISTEN = "path:" .. path })
      return { listener_pid = pid, helper_pids = { pid }, address = path }
    end
    local pid, addr = S.start_helper(LISTENER, { HOSTILE_LISTEN = how == "tcp" and "tcp" or ("abstract:" .. ctx.token) })
    return { listener_pid = pid, helper_pids = { pid }, address = addr }
  end
end

local function stop_listener(ctx)
  S.stop_helper(ctx.listener_pid)
  if ctx.address and ctx.address:sub(1, 1) == "/" then os.remove(ctx.address) end
end

local function tcp_connect(ctx)
  return ERRNO .. string.format([[
import socket
try:
    c = socket.create_connection(("127.0.0.1", %d), timeout=1)
    print("CONNECTED", c.recv(100))
except OSError as e:
    print("refused", en(e))
]], tonumber(ctx.address))
end

local function unix_connect(address)
  return function(ctx)
    local addr = address == "abstract" and ("'\\0' + " .. S.pystr(ctx.address)) or S.pystr(ctx.address)
    return ERRNO .. string.format([[
import socket
try:
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(1)
    c.connect(%s)
    print("CONNECTED", c.recv(100))
except OSError as e:
    print("refused", en(e))
]], addr)
  end
end

return {
  {
    name = "a TCP connection to a port the host listens on fails",
    setup = listener("tcp"),
    teardown = stop_listener,
    code = tcp_connect,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "refused", stdout_not = "CONNECTED" },
    needs = { "no-network" },
    check = function(r) assert(r.network_isolated) end,
  },
  {
    name = "TCP to the internet fails",
    -- the network namespace alone: Landlock's TCP wall would answer EACCES before it
    variant = "netns-only",
    code = ERRNO .. [[
import socket
for host, port in (("1.1.1.1", 443), ("8.8.8.8", 53), ("2606:4700:4700::1111", 443)):
    try:
        socket.create_connection((host, port), timeout=0.5)
        print("CONNECTED", host)
    except OSError as e:
        print("refused", host, en(e))
]],
    opts = { timeout = 3 },
    -- under `warm` the namespace is always the zygote's, shared by its runs: the seccomp socket
    -- filter comes with it
    expect = function()
      return { reason = "exit", returncode = 0, stdout_not = "CONNECTED",
               stdout = "refused 1%.1%.1%.1 " .. (S.base == "warm" and "EPERM" or "ENETUNREACH") }
    end,
    needs = { "no-network" },
  },
  {
    name = "a UDP packet to 8.8.8.8:53 cannot be sent",
    code = ERRNO .. [[
import socket
query = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(query, ("8.8.8.8", 53))
    s.settimeout(0.5)
    print("SENT", s.recvfrom(512))
except OSError as e:
    print("refused", en(e))
]],
    opts = { timeout = 3 },
    -- ENETUNREACH in a network namespace of the run's own; EPERM from the seccomp filter in the
    -- controller's shared one (no inet socket at all)
    expect = { reason = "exit", returncode = 0, stdout = "refused E[NP][ER][TR]", stdout_not = "SENT" },
    needs = { "no-network" },
  },
  {
    name = "a DNS look-up of a public name fails",
    code = [[
import socket
try:
    print("RESOLVED", socket.getaddrinfo("example.com", 443))
except socket.gaierror as e:
    print("no resolution:", e)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "no resolution", stdout_not = "RESOLVED" },
    needs = { "no-network" },
  },
  {
    name = "an abstract unix socket the host listens on cannot be reached",
    setup = listener("abstract"),
    teardown = stop_listener,
    code = unix_connect("abstract"),
    opts = { timeout = 3 },
    -- the seccomp filter refuses the socket (a unix socket but a connected pair); behind it, the
    -- network namespace (ECONNREFUSED: the name is not in it)
    expect = { reason = "exit", returncode = 0, stdout = "refused EPERM", stdout_not = "CONNECTED" },
    needs = { "no-network", "unix-pairs-only" },
  },
  {
    name = "the only network interface is a loopback that is down, with no route",
    variant = "netns-only",
    code = [[
import socket
# /proc/net is the reader's network namespace's (no socket needed, unlike if_nameindex)
dev = open("/proc/net/dev").read().splitlines()[2:]
print("interfaces", [l.split(":")[0].strip() for l in dev])
print("routes", open("/proc/net/route").read().splitlines()[1:])
try:
    s = socket.socket()
except OSError as e:
    print("no inet socket", e.errno)
    raise SystemExit(0)
s.bind(("127.0.0.1", 0))
s.listen()
try:
    socket.create_connection(s.getsockname(), timeout=1)
    print("CONNECTED to itself")
except OSError as e:
    print("own listener unreachable", e.errno)
]],
    opts = { timeout = 2 },
    -- under `warm` (the zygote's namespace, shared): no inet socket at all, as in TCP above
    expect = function()
      return { reason = "exit", returncode = 0, stdout_not = "CONNECTED",
               stdout = { "interfaces %['lo'%]", "routes %[%]\n",
                          S.base == "warm" and "no inet socket 1" or "own listener unreachable 101" } }
    end,
    needs = { "no-network" },
  },
  {
    name = "a unix socket the host listens on by path cannot be reached",
    -- the socket is in a world-writable host dir (/run/lock here): the network namespace does
    -- not cover path sockets, and Landlock does not control connect(). The seccomp filter
    -- refuses every unix socket but a connected pair (a socket anywhere else, under /srv or
    -- $HOME: spec/unix_sockets_spec.lua); behind it, the run's private /run hides the host's
    -- sockets there (the D-Bus and container-runtime ones are in /run too)
    setup = listener("path"),
    teardown = stop_listener,
    code = unix_connect("path"),
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "refused EPERM", stdout_not = "CONNECTED" },
    needs = { "private-tmp", "unix-pairs-only" },
  },
  {
    name = "with the host network, TCP to a host port is refused by Landlock",
    variant = "host-net",
    setup = listener("tcp"),
    teardown = stop_listener,
    code = tcp_connect,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "refused", stdout_not = "CONNECTED" },
    needs = { "landlock-net" },
  },
  {
    name = "with the host network, binding a TCP port is refused by Landlock",
    variant = "host-net",
    code = ERRNO .. [[
import socket
try:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    print("LISTENING", s.getsockname()[1])
except OSError as e:
    print("refused", en(e))
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "refused", stdout_not = "LISTENING" },
    needs = { "landlock-net" },
  },
  {
    name = "with the host network, an abstract unix socket of the host cannot be reached",
    -- Landlock's abstract unix socket scoping (ABI 6); named "landlock-net" here: rename the need
    -- if the Landlock work lists it under another name
    variant = "host-net",
    setup = listener("abstract"),
    teardown = stop_listener,
    code = unix_connect("abstract"),
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "refused", stdout_not = "CONNECTED" },
    needs = { "landlock-net" },
  },
  {
    -- under `warm`, concurrent runs share their zygote's network namespace: they still must not
    -- meet there (a loopback that is down; Landlock scopes abstract sockets to their run)
    name = "a concurrent run's abstract unix socket and loopback ports cannot be reached",
    companion = {
      code = function(ctx) return string.format([[
import socket, time
a = None
try:
    a = socket.socket(socket.AF_UNIX)
    a.bind("\0" + %s)
    a.listen(4)
    a.settimeout(2.5)
except OSError as e:
    print("abstract", e.errno)      # the seccomp filter: no unix socket but a pair
u = None
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 47123))
    u.settimeout(0.1)
except OSError as e:
    print("udp", e.errno)
try:
    if a:
        c, _ = a.accept()
        print("ACCEPTED")
    else:
        time.sleep(2.5)
except OSError:
    pass
try:
    if u:
        print("RECEIVED", u.recv(100))
except OSError:
    pass
print("companion done")
]], S.pystr(ctx.marker .. "-peer")) end,
      opts = { timeout = 5 },
    },
    code = function(ctx) return ERRNO .. string.format([[
import socket, time
time.sleep(0.5)
try:
    c = socket.socket(socket.AF_UNIX)
    c.connect("\0" + %s)
    print("CONNECTED abstract")
except OSError as e:
    print("abstract refused", en(e))
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("127.0.0.1", 47123))
    print("SENT udp")
except OSError as e:
    print("udp refused", en(e))
try:
    socket.create_connection(("127.0.0.1", 47123), timeout=0.5)
    print("CONNECTED tcp")
except OSError as e:
    print("tcp refused", en(e))
]], S.pystr(ctx.marker .. "-peer")) end,
    opts = { timeout = 4 },
    expect = { reason = "exit", returncode = 0, stdout = { "abstract refused", "udp refused", "tcp refused" },
               stdout_not = { "CONNECTED", "SENT" } },
    needs = { "no-network" },
    check = function(_, _, o)
      local c = o.companion.res
      assert.is_truthy(c, "the companion did not run")
      assert.matches("companion done", c.stdout)
      assert.is_falsy(c.stdout:find("ACCEPTED", 1, true) or c.stdout:find("RECEIVED", 1, true), c.stdout)
    end,
  },
}
