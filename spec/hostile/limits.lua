--- Hostile cases: the rlimits and the size-bounded mounts, each attacked (CPU, memory, file size,
-- inodes, space, fds, processes, threads, stack). See spec/hostile_spec.lua for the fields.
local assert = require "luassert"

-- Memory the kernel holds for a run outside its processes' pages, each kind attacked under a
-- 64 MiB whole-run budget: the program takes 4 MiB at a time up to 256 MiB, printing
-- "held MIB" after each step, or "refused MIB ERRNO" when a bound stops it, then holds it for
-- 3 s. It must be ended with reason memory (the budget counted what was held) or refused at or
-- below the budget; either way memory_peak_kb must show what it held.
local HELD_BUDGET_MB = 64
local HELD_PRELUDE = [[
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
MB = 1 << 20
STEP = 4
def fail(what):
    e = ctypes.get_errno()
    raise OSError(e, what + ": " + os.strerror(e))
def hold(take, total=256):
    held = 0
    try:
        while held < total:
            take(held)
            held += STEP
            print("held", held, flush=True)
    except OSError as e:
        print("refused", held, e.errno, flush=True)
    time.sleep(3)
    print("survived", held, flush=True)
]]

-- `needs`: what counting that kind takes besides the budget (csrc/launch/held.c)
local function held_case(kind, code, opts, needs)
  local o = { memory_mb = HELD_BUDGET_MB, timeout = 8 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return {
    name = kind .. " counts against the whole-run memory budget, or is refused within it",
    code = HELD_PRELUDE .. code,
    opts = o,
    needs = { "budget-memory", table.unpack(needs or {}) },
    check = function(r)
      local held = tonumber(r.stdout:match(".*held (%d+)")) or 0
      local peak = r.usage.memory_peak_kb or 0
      if r.reason == "memory" then
        -- ended by the budget: it counted more than the budget
        assert.is_true(peak > HELD_BUDGET_MB * 1024, "peak " .. peak .. " KiB")
        assert.is_nil(r.stdout:find("survived", 1, true), r.stdout)
        return
      end
      local mb = tonumber(r.stdout:match("refused (%d+) %d+"))
      assert.is_truthy(mb, "neither ended by the budget nor refused (reason " .. tostring(r.reason)
        .. ", peak " .. peak .. " KiB): " .. r.stdout:sub(-200))
      assert.is_true(mb <= HELD_BUDGET_MB, "refused only at " .. mb .. " MiB")
      -- held for 3 s: every poll of those saw it
      assert.is_true(peak >= held * 1024, "held " .. held .. " MiB, peak " .. peak .. " KiB")
    end,
  }
end

local HELD = {
  held_case("detached SysV shared memory", [[
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
def take(i):
    sid = libc.shmget(0, STEP * MB, 0o1600)      # IPC_PRIVATE, IPC_CREAT | 0600
    if sid < 0:
        fail("shmget")
    a = libc.shmat(sid, None, 0)
    if a is None or a == ctypes.c_void_p(-1).value:
        fail("shmat")
    ctypes.memset(a, 1, STEP * MB)
    libc.shmdt(a)
hold(take)
]], nil, { "private-ipc" }),
  held_case("SysV message queues", [[
class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 8192)]
m = Msg(1, b"x" * 8192)
q = [-1, 0]         # the queue being filled, its bytes
def take(i):
    sent = 0
    while sent < STEP * MB:
        if q[0] < 0:
            q[0] = libc.msgget(0, 0o1600)
            if q[0] < 0:
                fail("msgget")
        if libc.msgsnd(q[0], ctypes.byref(m), 8192, 0o4000) != 0:     # IPC_NOWAIT
            if ctypes.get_errno() != errno.EAGAIN:
                fail("msgsnd")
            q[0] = -1       # full: the next queue
            continue
        sent += 8192
hold(take)
]], nil, { "private-ipc" }),
  held_case("SysV semaphore sets", [[
def take(i):
    for j in range(2):      # 32000 semaphores of 64 bytes each in the kernel: 2 MiB a set
        if libc.semget(0, 32000, 0o1600) < 0:
            fail("semget")
hold(take)
]], nil, { "private-ipc" }),
  held_case("POSIX message queues", [[
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_MSGQUEUE)
resource.setrlimit(resource.RLIMIT_MSGQUEUE, (hard, hard))
rt = ctypes.CDLL("librt.so.1", use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(Attr)]
n = [0]
def take(i):
    sent = 0
    while sent < STEP * MB:
        name = ("/q%d" % n[0]).encode()
        n[0] += 1
        a = Attr(0, 10, 8192, 0)
        d = rt.mq_open(name, os.O_CREAT | os.O_RDWR | os.O_NONBLOCK, 0o600, ctypes.byref(a))
        if d < 0:
            fail("mq_open")
        for j in range(10):
            if rt.mq_send(d, b"x" * 8192, 8192, 0) != 0:
                fail("mq_send")
            sent += 8192
hold(take)
]]),
  held_case("memfds no longer mapped", [[
import socket
keep, far = socket.socketpair()
def take(i):
    fd = os.memfd_create("held")
    os.write(fd, b"\1" * (STEP * MB))
    # more than open_files: the rest in flight, in a unix socket's queue
    try:
        socket.send_fds(keep, [b"x"], [fd])
        os.close(fd)
    except OSError:
        pass
hold(take)
]], { file_mb = 4 }, { "seccomp" }),
  held_case("unix socketpair buffers", [[
import socket, struct
# 16 children, each filling up to 28 socketpairs (both ways) and reporting the bytes it sent
r, w = os.pipe()
def child():
    pairs, sent = [], 0
    try:
        for i in range(28):
            a, b = socket.socketpair()
            pairs.append((a, b))
            for s in (a, b):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                s.setblocking(False)
                try:
                    while True:
                        sent += s.send(b"x" * 65536)
                except BlockingIOError:
                    pass
    finally:
        os.write(w, struct.pack("q", sent))
    time.sleep(10)
kids = []
def take(i):
    while sum(kids) < (i + STEP) * MB:
        if len(kids) == 16:
            raise OSError(errno.EAGAIN, "sixteen children already")
        if os.fork() == 0:
            try:
                child()
            finally:
                os._exit(0)
        kids.append(struct.unpack("q", os.read(r, 8))[0])
hold(take)
]]),
  held_case("tmpfs files in /tmp, /var/tmp, /dev/shm and the work dir", [[
dirs = ["/tmp", "/var/tmp", "/dev/shm", "."]
def take(i):
    while dirs:
        try:
            with open("%s/held%d" % (dirs[0], i), "wb") as f:
                f.write(b"\1" * (STEP * MB))
            return
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            os.unlink("%s/held%d" % (dirs[0], i))
            dirs.pop(0)
    raise OSError(errno.ENOSPC, "every tmpfs is full")
hold(take)
]], { file_mb = 4 }, { "private-tmp", "work-tmpfs" }),
}

local CASES = {
  {
    name = "a CPU loop ends with reason cpu (SIGXCPU)",
    code = "while True: pass",
    opts = { cpu_seconds = 1, timeout = 6 },   -- room for a loaded machine: the run ends at 1 s of CPU
    expect = { reason = "cpu", signal = 24, returncode = -24, timed_out = false, ok = false },
    needs = { "cpu" },
    check = function(r)
      -- under load getrusage() reports less than the kernel's RLIMIT_CPU clock (see below)
      assert.is_true(r.usage.cpu_user_s + r.usage.cpu_sys_s >= 0.7, "cpu " .. r.usage.cpu_user_s)
    end,
  },
  {
    name = "a CPU loop that ignores SIGXCPU is killed at the hard limit, reason cpu",
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass",
    opts = { cpu_seconds = 1, timeout = 8 },   -- 2 s of CPU: room for a loaded machine
    expect = { reason = "cpu", signal = 9, timed_out = false },
    needs = { "cpu" },
  },
  {
    name = "threads burning CPU on every core end with reason cpu",
    -- hashlib releases the GIL on large buffers: the threads really run in parallel
    code = [[
import hashlib, threading
buf = b"x" * (1 << 20)
def burn():
    while True:
        hashlib.sha256(buf).digest()
for _ in range(4):
    threading.Thread(target=burn, daemon=True).start()
threading.Event().wait()
]],
    -- (a wall timeout far past the CPU limit: on a machine busy with other work four threads
    -- may take several seconds to be given one second of CPU)
    opts = { cpu_seconds = 1, timeout = 20 },
    -- SIGXCPU from RLIMIT_CPU at 1 s, or the whole-run budget's SIGKILL at 1.3 s: with four
    -- threads on every core the two are 150 ms of wall time apart, and either may land first
    expect = { reason = "cpu", timed_out = false },
    check = function(r)
      assert.is_true(r.signal == 24 or r.signal == 9, "signal " .. tostring(r.signal))
    end,
    needs = { "cpu" },
  },
  {
    -- a refused request leaves nothing the sandbox can see, and holding little the program is
    -- not near its limit: its MemoryError is its own word, reason exit
    name = "one allocation past memory_mb fails with MemoryError, reason exit",
    code = "x = bytearray(512 * 1024 * 1024)\nprint('allocated')",
    opts = { memory_mb = 128, timeout = 2 },
    expect = { reason = "exit", ok = false, stdout_not = "allocated", stderr = "MemoryError" },
    needs = { "memory" },
  },
  {
    name = "a growing memory bomb ends with reason memory",
    code = "a = []\nwhile True: a.append(b'x' * 10**6)",
    opts = { memory_mb = 128, timeout = 2 },
    expect = { reason = "memory", ok = false },
    needs = { "memory" },
  },
  {
    name = "anonymous mmaps of 8 MiB until ENOMEM end with reason memory",
    code = "import mmap\nms = []\nwhile True: ms.append(mmap.mmap(-1, 8 << 20)); ms[-1][::4096] = b'x' * 2048",
    opts = { memory_mb = 128, timeout = 4 },
    expect = { reason = "memory", ok = false, stderr = "Cannot allocate memory" },
    needs = { "memory" },
  },
  {
    name = "an anonymous mmap of 1 GiB fails with ENOMEM, reason exit",
    code = "import mmap\nm = mmap.mmap(-1, 1 << 30)\nprint('mapped')",
    opts = { memory_mb = 128, timeout = 2 },
    expect = { reason = "exit", stdout_not = "mapped", stderr = "Cannot allocate memory" },
    needs = { "memory" },
  },
  {
    name = "a write past file_mb ends with reason file-size",
    code = "open('big', 'wb').write(b'x' * (3 * 1024 * 1024))",
    opts = { file_mb = 1, timeout = 2 },
    expect = { reason = "file-size", stderr = "File too large", ok = false },
    needs = { "file-size" },
  },
  {
    name = "a write past file_mb with SIGXFSZ at its default is killed by SIGXFSZ",
    code = "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_DFL)\nopen('big', 'wb').write(b'x' * (3 * 1024 * 1024))",
    opts = { file_mb = 1, timeout = 2 },
    expect = { reason = "file-size", signal = 25, returncode = -25 },
    needs = { "file-size" },
  },
  {
    name = "creating files until the inodes run out stops at each scratch mount's bound",
    code = [[
import os
for d, bound in (("/tmp", 16384), ("/var/tmp", 16384), ("/dev/shm", 65536), (".", 65536)):
    n = 0
    try:
        while True:
            os.close(os.open("%s/f%d" % (d, n), os.O_CREAT | os.O_WRONLY, 0o600))
            n += 1
    except OSError as e:
        print(d, "stopped", n, e.errno, "within" if n <= bound else "BEYOND", flush=True)
]],
    opts = { timeout = 10 },   -- about 1 s alone, 3 s among the other cases
    expect = { reason = "exit", returncode = 0, stdout = {
      "/tmp stopped %d+ 28 within", "/var/tmp stopped %d+ 28 within", "/dev/shm stopped %d+ 28 within",
      "%. stopped %d+ 28 within" } },
    needs = { "private-tmp", "work-tmpfs" },
  },
  {
    name = "filling /tmp and /dev/shm stops with ENOSPC at their size",
    code = [[
import os
for d, mb in (("/tmp", 16), ("/dev/shm", 64)):
    total = 0
    try:
        for i in range(10000):
            with open("%s/fill%d" % (d, i), "wb") as f:
                f.write(b"\0" * (1 << 20))
            total += 1
    except OSError as e:
        print(d, "stopped at", total, "MiB", e.errno, "within" if total <= mb else "BEYOND", flush=True)
]],
    opts = { timeout = 5, file_mb = 1 },
    expect = { reason = "exit", stdout = { "/tmp stopped at %d+ MiB 28 within", "/dev/shm stopped at %d+ MiB 28 within" } },
    needs = { "private-tmp" },
  },
  {
    name = "opening files, pipes and sockets stops at open_files with EMFILE",
    code = [[
import os, resource, socket
held = []
for kind in ("file", "pipe", "socket"):
    try:
        while True:
            if kind == "file":
                held.append(open("/dev/null"))
            elif kind == "pipe":
                held.extend(os.pipe())
            else:
                held.append(socket.socketpair())
    except OSError as e:
        print(kind, "stopped", e.errno, flush=True)
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], "highest", max(x if isinstance(x, int) else 0 for x in held))
]],
    opts = { open_files = 32, timeout = 2 },
    expect = { reason = "exit", stdout = { "file stopped 24", "pipe stopped 24", "socket stopped 24", "soft 32 highest" } },
    needs = { "open-files" },
    check = function(r)
      local n = tonumber(r.stdout:match("highest (%d+)"))
      assert.is_truthy(n, r.stdout)
      assert.is_true(n < 32, "fd " .. n .. " open")
    end,
  },
  {
    name = "a fork bomb is held to the process limit",
    code = [[
import os, time
n = 0
for i in range(10000):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    except OSError as e:
        print("fork refused", e.errno)
        break
print("forked", n)
]],
    opts = { processes = 16, timeout = 2 },
    expect = { reason = "exit", stdout = "fork refused 11" },
    needs = { "processes" },
    check = function(r)
      local n = tonumber(r.stdout:match("forked (%d+)"))
      assert.is_truthy(n, r.stdout)
      assert.is_true(n < 16, "forked " .. n)
    end,
  },
  {
    name = "an exponential fork bomb is ended at the timeout and nothing survives",
    code = [[
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
]],
    opts = { processes = 32, timeout = 1.5, cpu_seconds = 5 },
    expect = { reason = "timeout", timed_out = true },
    needs = { "processes" },
  },
  {
    name = "a thread bomb is held to the process limit",
    code = [[
import threading
ev = threading.Event()
n = 0
try:
    for i in range(10000):
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
except RuntimeError as e:
    print("refused:", e)
print("threads", n)
ev.set()
]],
    opts = { processes = 16, timeout = 2 },
    expect = { reason = "exit", stdout = "refused: can't start new thread" },
    needs = { "processes" },
    check = function(r)
      local n = tonumber(r.stdout:match("threads (%d+)"))
      assert.is_truthy(n, r.stdout)
      assert.is_true(n < 16, "threads " .. n)
    end,
  },
  {
    name = "a C stack overflow is reported as SIGSEGV",
    code = [[
import sys
sys.setrecursionlimit(10**8)
x = []
for _ in range(10**6):
    x = [x]
print("nested", flush=True)
repr(x)
]],
    -- it ends by itself in a second or two; a loaded machine may take several times that
    opts = { timeout = 30, memory_mb = 512 },
    expect = { reason = "signal", signal = 11, returncode = -11, stdout = "nested" },
  },
}
for _, c in ipairs(HELD) do CASES[#CASES + 1] = c end

-- Eight children allocating at once, released together, under a 256 MB budget: at the tick that
-- ends the run, its init stops every process and sums the proportional set sizes of all of them
-- (memory_peak_kb: what the run held, not what the program says); that must be over the budget
-- by at most a quarter of it (the supervisor polls sooner as memory climbs toward the limit).
-- Polling is no hard bound (a supervisor starved of CPU sees the run late): a loaded machine
-- allocates slower too, and the case holds there with room.
CASES[#CASES + 1] = {
  name = "eight children of 160 MB at once overshoot a 256 MB budget by at most a quarter",
  code = [[
import os, time
r, w = os.pipe()
for i in range(8):
    if os.fork() == 0:
        os.close(w)
        os.read(r, 1)
        block = bytearray(b"\x01") * (160 * 1024 * 1024)
        time.sleep(3)
        os._exit(0)
os.close(r)
time.sleep(0.2)
os.close(w)         # all eight at once
for i in range(8):
    os.wait()
print("survived")
]],
  opts = { memory_mb = 256, timeout = 10 },
  expect = { reason = "memory", stdout_not = "survived" },
  needs = { "budget-memory" },
  check = function(r)
    local peak = r.usage.memory_peak_kb
    assert.is_true(peak > 256 * 1024 and peak <= 320 * 1024, "peak " .. tostring(peak) .. " KiB")
  end,
}
return CASES
