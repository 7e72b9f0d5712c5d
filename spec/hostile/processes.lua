--- Hostile cases: escapees, signals (to itself, its supervisor, its controller, other runs, host
-- processes), ptrace, privilege and rlimit raising. See spec/hostile_spec.lua for the fields.
local assert = require "luassert"
local S = require "hostile.support"

local function M(ctx) return "MARKER = " .. S.pystr(ctx.marker) .. "\n" end

-- errno names for the programs' reports
local ERRNO = "import errno\ndef en(e):\n    return errno.errorcode.get(e.errno, str(e.errno))\n"

return {
  {
    name = "a setsid grandchild holding the output pipe does not delay the result",
    code = [[
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("escapee alive", flush=True)
        time.sleep(60)
    os._exit(0)
time.sleep(0.2)
print("parent done", flush=True)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = { "parent done", "escapee alive" }, max_elapsed = 1.5 },
    needs = { "pid-namespace" },
  },
  {
    name = "a double-forked daemon with closed stdio and listening sockets dies with the run",
    code = function(ctx) return M(ctx) .. [[
import os, socket, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.chdir("/")
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            a = socket.socket(socket.AF_UNIX)
            a.bind("\0" + MARKER + "-abstract")
            a.listen()
            p = socket.socket(socket.AF_UNIX)
            p.bind("/tmp/" + MARKER + "-daemon.sock")
            p.listen()
        except OSError:
            pass    # the seccomp filter: no unix socket but a pair
        while True:
            for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ["HOME"]):
                try:
                    open(os.path.join(d, MARKER + "-daemon"), "w").write(str(time.time()))
                except OSError:
                    pass
            time.sleep(0.05)
    os._exit(0)
os.wait()
time.sleep(0.3)
print("daemon started", flush=True)
]] end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "daemon started", max_elapsed = 2 },
    needs = { "pid-namespace" },
  },
  {
    name = "an escapee that execs another program under a new name dies with the run",
    code = function(ctx) return M(ctx) .. [[
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep-" + MARKER, "60"])
    os._exit(0)
time.sleep(0.3)
print("done", flush=True)
]] end,
    opts = { timeout = 3 },
    expect = { reason = "exit", stdout = "done", max_elapsed = 2 },
  },
  {
    name = "a setsid escapee that outlives the timeout is killed with the run",
    code = [[
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
time.sleep(60)
]],
    opts = { timeout = 1 },
    expect = { reason = "timeout", timed_out = true, ok = false },
  },
  {
    name = "a program whose whole tree ignores SIGTERM is killed at the timeout",
    code = [[
import os, signal, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
for i in range(3):
    if os.fork() == 0:
        if i == 2:
            os.setsid()
        while True:
            time.sleep(1)
print("ignoring", flush=True)
while True:
    time.sleep(1)
]],
    opts = { timeout = 1 },
    expect = { reason = "timeout", timed_out = true, stdout = "ignoring" },
  },
  {
    name = "a program that stops itself with SIGSTOP is killed at the timeout",
    code = "import os, signal\nprint('stopping', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\nprint('resumed')",
    opts = { timeout = 1 },
    expect = { reason = "timeout", timed_out = true, stdout = "stopping", stdout_not = "resumed" },
  },
  {
    name = "killing its own process group is reported as SIGKILL, reason signal",
    code = [[
import os, signal, time
if os.fork() == 0:
    time.sleep(60)
print("killing my group", flush=True)
os.killpg(0, signal.SIGKILL)
time.sleep(60)
]],
    opts = { timeout = 3 },
    expect = { reason = "signal", signal = 9, returncode = -9, timed_out = false, stdout = "killing my group", max_elapsed = 2 },
  },
  {
    name = "signals to the supervising init are without effect",
    code = ERRNO .. [[
import os, signal, time
print("ppid", os.getppid())
for s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    try:
        os.kill(os.getppid(), s)
        print("sent", s.name)
    except OSError as e:
        print("refused", s.name, en(e))
time.sleep(0.3)
print("still here", flush=True)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = { "ppid 1\n", "still here" } },
    needs = { "pid-namespace" },
  },
  {
    -- The init blocks every signal it can, and the filter refuses F_SETSIG of the two it cannot:
    -- sigfillset leaves out the C library's own real-time signals (glibc 32 and 33, musl 32 to
    -- 34), whose default ends a process. Linux drops them at an init without a handler; gVisor
    -- delivers them.
    name = "I/O signals the program points at its supervising init are without effect",
    code = [[
import fcntl, os, time
def blocked(sig):
    try:
        for line in open("/proc/1/status"):
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16) >> (sig - 1) & 1 == 1
    except OSError:
        pass
    return None
for sig in (32, 33, 34):
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, fcntl.F_SETOWN, 1)
        fcntl.fcntl(r, 10, sig)         # F_SETSIG
    except OSError:
        print("refused", sig, flush=True)
        continue
    fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
    os.write(w, b"x")
    time.sleep(0.05)
    b = blocked(sig)
    print("sent", sig, {True: "blocked", False: "UNBLOCKED", None: "to an init whose mask is not shown"}[b], flush=True)
time.sleep(0.3)
print("still here", flush=True)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "still here", stdout_not = "UNBLOCKED" },
    needs = { "pid-namespace" },
  },
  {
    -- The init takes a stop signal whose si_pid is 0 as one from outside its namespace; a
    -- program may send a signal with a siginfo of its own (SI_QUEUE), si_pid 0 included, and
    -- the filter refuses pid 1 to rt_sigqueueinfo but not pidfd_send_signal through an fd of
    -- /proc/1. Without Landlock's signal scope (ABI 6: Linux 6.12) only the uid stands in the
    -- way, and a controller that is not root shares its uid with the program.
    name = "a stop signal forged with si_pid 0 does not end its own supervision",
    variant = "no-landlock",
    code = ERRNO .. [[
import ctypes, os, struct, time
libc = ctypes.CDLL(None, use_errno=True)
info = struct.pack("iiiiiI", 15, 0, -1, 0, 0, 0)       # SIGTERM, SI_QUEUE, si_pid 0, si_uid 0
buf = ctypes.create_string_buffer(info + bytes(128 - len(info)), 128)
fd = os.open("/proc/1", os.O_RDONLY | os.O_DIRECTORY)
r = libc.syscall(ctypes.c_long(424), ctypes.c_long(fd), ctypes.c_long(15), buf, ctypes.c_long(0))
print("pidfd_send_signal", "sent" if r == 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
time.sleep(0.5)
print("still here", flush=True)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "still here" },
    needs = { "pid-namespace" },
  },
  {
    name = "kill(-1) and a sweep of every pid reach nothing outside the run",
    controller = "child",
    setup = function() return S.victim() end,
    teardown = function(ctx) S.stop_helper(ctx.victim_pid) end,
    companion = { code = "import time\ntime.sleep(1.2)\nprint('victim survived')", opts = { timeout = 4 } },
    code = function(ctx) return ERRNO .. string.format([[
import os, signal
for name, pid in (("controller", %d), ("host victim", %d), ("other run", %d)):
    for s in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, s)
            print("SENT", name, s.name)
        except OSError as e:
            print("refused", name, s.name, en(e))
try:
    os.kill(-1, signal.SIGKILL)
except OSError as e:
    print("kill(-1):", en(e))
n = 0
for pid in range(2, 32768):
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except OSError:
            pass
print("signalled", n, "pids")
print("still here")
]], ctx.controller_pid, ctx.victim_pid, ctx.companion_pid or 0) end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = { "still here", "signalled 0 pids" }, stdout_not = "SENT" },
    needs = { "pid-namespace" },
    check = function(r, ctx, o)
      assert.is_true(S.alive(ctx.victim_pid), "the host victim was killed")
      assert.are.equal("victim survived\n", o.companion.res and o.companion.res.stdout)
    end,
  },
  {
    name = "signals and /proc reads aimed at the controller find nothing",
    controller = "child",
    code = function(ctx) return ERRNO .. string.format([[
import os, signal
CTRL = %d
for s in (signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP):
    try:
        os.kill(CTRL, s)
        print("SENT", s.name)
    except OSError as e:
        print("refused", s.name, en(e))
for entry in ("environ", "cmdline", "status", "maps", "mem", "fd", "cwd", "root"):
    p = "/proc/%%d/%%s" %% (CTRL, entry)
    try:
        if os.path.isdir(p):
            print("LISTED", entry, os.listdir(p))
        else:
            print("READ", entry, open(p, "rb").read(200))
    except OSError as e:
        print("denied", entry, en(e))
]], ctx.controller_pid) end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = { "refused SIGTERM ESRCH", "denied environ ENOENT" },
               stdout_not = { "SENT", "READ", "LISTED" } },
    needs = { "pid-namespace", "private-proc" },
    check = function(r, ctx)
      assert.is_falsy(r.stdout:find(ctx.secret, 1, true), "the controller's secret leaked")
    end,
  },
  {
    name = "without a pid namespace, signals to the controller and to host processes are refused",
    -- As root the run's uid differs from every host process: EPERM. As nobody the run shares the
    -- controller's uid, and only Landlock's signal scoping can refuse: without it the controller
    -- and the host victim die.
    variant = "no-pidns",
    prologue = false,    -- without a pid namespace there is no mount namespace: no private /tmp
    controller = "child",
    setup = function() return S.victim() end,
    teardown = function(ctx) S.stop_helper(ctx.victim_pid) end,
    code = function(ctx) return ERRNO .. string.format([[
import os, signal
for name, pid, s in (("host victim", %d, signal.SIGKILL), ("controller", %d, signal.SIGTERM)):
    try:
        os.kill(pid, s)
        print("SENT", name)
    except OSError as e:
        print("refused", name, en(e))
]], ctx.victim_pid, ctx.controller_pid) end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = { "refused host victim", "refused controller" }, stdout_not = "SENT" },
    needs = { "scoped-signals" },
    check = function(r, ctx)
      assert.is_true(S.alive(ctx.victim_pid), "the host victim was killed")
    end,
  },
  {
    name = "without a pid namespace, the program cannot kill its launcher and leave an escapee",
    -- In the subreaper fallback the launcher is the program's parent. As root it runs under
    -- another uid than the program: EPERM. As nobody they share the uid (the user namespace made
    -- for the network namespace does not stop signals): the launcher dies before its sweep, the
    -- host's group kill misses the setsid()ed escapee, and it outlives the run. Only Landlock's
    -- signal scoping refuses the kill.
    variant = "no-pidns",
    prologue = false,
    code = function(ctx) return ERRNO .. M(ctx) .. [[
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep-" + MARKER, "30"])
    os._exit(0)
time.sleep(0.3)
try:
    os.kill(os.getppid(), signal.SIGKILL)
    print("KILLED the launcher", flush=True)
    time.sleep(1)
except OSError as e:
    print("refused launcher", en(e), flush=True)
]] end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "refused launcher", stdout_not = "KILLED" },
    needs = { "scoped-signals" },
  },
  {
    name = "PTRACE_TRACEME under seccomp is refused",
    code = [[
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("traceme", libc.ptrace(0, 0, None, None), ctypes.get_errno())
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "traceme %-1 1\n" },
    needs = { "seccomp" },
  },
  {
    -- without the filter the supervisor becomes the tracer: every signal the program gets stops
    -- it and reaches the supervisor's waitpid, which must let it go on, not take it for the end
    name = "PTRACE_TRACEME without seccomp: the program goes on after a signal",
    variant = "no-seccomp",
    code = [[
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
print("traceme", libc.ptrace(0, 0, None, None), flush=True)
signal.signal(signal.SIGUSR1, lambda *a: print("got SIGUSR1", flush=True))
os.kill(os.getpid(), signal.SIGUSR1)
print("after the signal", flush=True)
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = { "traceme 0", "got SIGUSR1", "after the signal" } },
  },
  {
    name = "PTRACE_ATTACH to its supervisor fails and its memory cannot be read",
    code = ERRNO .. [[
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, os.getppid(), None, None)
print("attach", r, errno.errorcode.get(ctypes.get_errno()))
r = libc.ptrace(0x4206, os.getppid(), None, 0)
print("seize", r, errno.errorcode.get(ctypes.get_errno()))
for entry in ("mem", "environ", "fd"):
    try:
        p = "/proc/%d/%s" % (os.getppid(), entry)
        print("READ", entry, os.listdir(p) if entry == "fd" else open(p, "rb").read(64))
    except OSError as e:
        print("denied", entry, en(e))
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = { "attach %-1 EPERM", "seize %-1 EPERM", "denied mem", "denied environ", "denied fd" },
               stdout_not = "READ" },
  },
  {
    name = "raising any rlimit above its hard limit is refused",
    code = [[
import resource
for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE"):
    r = getattr(resource, name)
    soft, hard = resource.getrlimit(r)
    try:
        resource.setrlimit(r, (hard + 1000, hard + 1000))
        print("RAISED", name)
    except (ValueError, OSError) as e:
        print("refused", name, type(e).__name__)
    try:
        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("RAISED", name, "to infinity")
    except (ValueError, OSError) as e:
        pass
    print(name, resource.getrlimit(r) == (soft, hard))
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout_not = { "RAISED", "False" },
               stdout = { "refused RLIMIT_CPU", "refused RLIMIT_AS", "refused RLIMIT_FSIZE", "refused RLIMIT_NOFILE",
                          "refused RLIMIT_NPROC", "refused RLIMIT_CORE" } },
    needs = { "cpu", "memory", "file-size", "open-files", "processes", "no-core" },
  },
  {
    name = "taking uid 0 or another group is refused, and no capability is held",
    code = ERRNO .. [[
import os
for what, f in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                ("setgroups", lambda: os.setgroups([0])), ("setresuid", lambda: os.setresuid(0, 0, 0))):
    try:
        f()
        print("GAINED", what)
    except OSError as e:
        print("refused", what, en(e))
status = open("/proc/self/status").read()
for line in status.splitlines():
    if line.startswith(("CapEff", "CapPrm", "NoNewPrivs")):
        print(line.replace("\t", " "))
print("uid", os.getuid(), os.geteuid())
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", stdout = { "CapEff: 0000000000000000", "CapPrm: 0000000000000000", "NoNewPrivs: 1" },
               stdout_not = { "GAINED", "uid 0 " } },
    -- /proc/self/status: Landlock grants /proc only when it is the run's own
    needs = { "no-new-privs", "private-proc" },
  },
  {
    name = "an army of unreaped zombies does not disturb the end of the run",
    code = [[
import os, time
for i in range(20):
    if os.fork() == 0:
        os._exit(i)
time.sleep(0.2)
print("zombies made", flush=True)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "zombies made", max_elapsed = 2 },
  },
  {
    name = "an escapee holding unread stdin and the pipes does not delay the result",
    code = [[
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
print("left stdin unread", flush=True)
]],
    opts = { timeout = 3, stdin = string.rep("s", 2 * 1024 * 1024) },
    expect = { reason = "exit", returncode = 0, stdout = "left stdin unread", max_elapsed = 2 },
  },
}
