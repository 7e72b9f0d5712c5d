--- Hostile cases for protections being built elsewhere (whole-run budgets, seccomp) and for kernel
-- state a run can leave behind outside the filesystem (IPC objects, keys). Each names what it
-- needs; the runner asserts it is applied, so these fail until that work is merged.
-- See spec/hostile_spec.lua for the fields.
local S = require "hostile.support"

-- Provisional names of the whole-run budgets in result.limits: rename here when the budget work
-- settles on its names.
local MEMORY_BUDGET, CPU_BUDGET = "budget-memory", "budget-cpu"

local ERRNO = "import errno\ndef en(n):\n    return errno.errorcode.get(n, str(n))\n"

-- The IPC key and names the inspector looks for (support.lua: crc32 of the marker).
local function ipc_names(ctx)
  return "import zlib\nMARKER = " .. S.pystr(ctx.marker) .. "\nKEY = zlib.crc32(MARKER.encode()) & 0x7fffffff\n"
end

return {
  {
    name = "8 children of 100 MB each exceed a 256 MB whole-run budget, reason memory",
    code = [[
import os, time
kids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        block = bytearray(b"\x01") * (100 * 1024 * 1024)
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
bad = 0
for pid in kids:
    _, status = os.waitpid(pid, 0)
    bad += status != 0
print("children failed:", bad, flush=True)
]],
    opts = { memory_mb = 256, timeout = 4 },
    expect = { reason = "memory", ok = false },
    needs = { MEMORY_BUDGET },
  },
  {
    name = "a fork chain each burning 0.7 s of CPU exceeds a 1 s whole-run budget, reason cpu",
    code = [[
import os, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
for link in range(3):
    burn(0.7)
    print("link", link, "done", flush=True)
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        os._exit(0)
]],
    opts = { cpu_seconds = 1, timeout = 5 },
    expect = { reason = "cpu", ok = false },
    needs = { CPU_BUDGET },
  },
  {
    name = "a new user namespace cannot be made inside the sandbox",
    code = ERRNO .. [[
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
r = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
print("unshare", r, en(ctypes.get_errno()) if r else "")
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "unshare %-1 E" },
    needs = { "seccomp" },
  },
  {
    name = "io_uring cannot be set up inside the sandbox",
    code = ERRNO .. [[
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 4, params)
print("io_uring_setup", r, en(ctypes.get_errno()) if r < 0 else "")
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "io_uring_setup %-1 E" },
    needs = { "seccomp" },
  },
  {
    name = "a key left in the user keyring is not seen by the next run under the same uid",
    -- As root runs reuse uids and have no user namespace: the uid's user keyring is the kernel's
    -- and outlives the run (the inspector, under the same uid, finds the key). As nobody each
    -- run has a user namespace of its own, with its own keyrings. seccomp should refuse add_key /
    -- keyctl / request_key outright.
    code = function(ctx) return ERRNO .. "MARKER = " .. S.pystr(ctx.marker) .. "\n" .. [[
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
KEY_SPEC_USER_KEYRING = -4
r = libc.syscall(248, b"user", MARKER.encode(), b"left for the next run", 21, ctypes.c_long(KEY_SPEC_USER_KEYRING))
print("add_key", "refused " + en(ctypes.get_errno()) if r < 0 else "ADDED")
]] end,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "add_key refused" },
    needs = { "seccomp" },
  },
  {
    name = "SysV IPC objects and POSIX message queues do not outlive the run",
    code = function(ctx) return ipc_names(ctx) .. [[
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
IPC_CREAT = 0o1000
print("shmget", libc.shmget(KEY, 1 << 20, IPC_CREAT | 0o666) >= 0)
print("semget", libc.semget(KEY, 1, IPC_CREAT | 0o666) >= 0)
print("msgget", libc.msgget(KEY, IPC_CREAT | 0o666) >= 0)
q = rt.mq_open(("/" + MARKER).encode(), os.O_CREAT | os.O_RDWR, 0o666, None)
print("mq_open", q >= 0)
]] end,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0 },
    -- the inspector removes what it finds; this removes it from the host side too, should the
    -- inspector not have run
    teardown = function(ctx)
      local key = "zlib.crc32(" .. S.pystr(ctx.marker) .. ".encode()) & 0x7fffffff"
      os.execute(S.PY .. " -c \"import ctypes, zlib\nlibc = ctypes.CDLL(None)\nrt = ctypes.CDLL('librt.so.1')\nk = " .. key
        .. "\nfor i in (libc.shmget(k, 0, 0),): i >= 0 and libc.shmctl(i, 0, None)\n"
        .. "for i in (libc.semget(k, 0, 0),): i >= 0 and libc.semctl(i, 0, 0)\n"
        .. "for i in (libc.msgget(k, 0),): i >= 0 and libc.msgctl(i, 0, None)\n"
        .. "rt.mq_unlink(b'/' + " .. S.pystr(ctx.marker) .. ".encode())\"")
    end,
  },
}
