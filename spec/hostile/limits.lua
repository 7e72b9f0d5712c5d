--- Hostile cases: the rlimits and the size-bounded mounts, each attacked (CPU, memory, file size,
-- inodes, space, fds, processes, threads, stack). See spec/hostile_spec.lua for the fields.
local assert = require "luassert"

return {
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
    opts = { cpu_seconds = 1, timeout = 6 },
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
    opts = { timeout = 5, memory_mb = 512 },
    expect = { reason = "signal", signal = 11, returncode = -11, stdout = "nested" },
  },
}
