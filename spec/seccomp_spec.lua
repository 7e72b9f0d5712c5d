-- corral-launch --seccomp: the program's seccomp filter, attacked with real system calls.
-- Every attack also runs without the filter, and must then get another answer: the test fails
-- if the filter does nothing.
local H = require "helper"
local report = require "corral.report"

local L = os.getenv("CORRAL_LAUNCH") or "./csrc/corral-launch"

-- A deny list like a policy's (30 names), also used by the cost measurement.
local FULL = {
  "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
  "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
  "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
  "delete_module", "reboot", "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at",
  "io_uring_setup", "io_uring_enter", "io_uring_register", "personality", "fsopen", "fsmount",
}

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function deny(names)
  local t = {}
  for _, n in ipairs(names) do t[#t + 1] = "--deny-syscall " .. n end
  return table.concat(t, " ")
end

-- Runs /usr/bin/python3 -I -c CODE ARGS... under the launcher with OPTS. Returns the program's
-- "r NAME VALUE" lines as a table, the parsed report, the launcher's exit status, the raw report
-- and the program's whole output.
local function run(opts, code, args)
  local out = H.sh("f=$(mktemp /tmp/corral-seccomp-report.XXXXXX); " .. L .. " --report-fd 3 " ..
    opts .. " -- " .. H.python .. " -I -c " .. q(code) .. " " .. (args or "") ..
    " 3>\"$f\"; echo \"<<exit $?>>\"; cat \"$f\"; rm -f \"$f\"")
  local prog, status, rep = out:match("^(.-)<<exit (%d+)>>\n?(.*)$")
  assert.is_truthy(prog, out)
  local r = {}
  for name, value in prog:gmatch("r (%S+) (%S+)") do r[name] = value end
  return r, report.parse(rep), tonumber(status), rep, prog
end

-- Each case runs in a forked child (an unfiltered unshare() changes the process), which passes
-- the errno back as its exit code. x86_64 system call numbers.
local ATTACK = [==[
import ctypes, errno, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NEWNS, NEWPID, NEWUSER, NEWNET, SIGCHLD = 0x20000, 0x20000000, 0x10000000, 0x40000000, 17

def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return r, (ctypes.get_errno() if r == -1 else 0)

def sub(fn):
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(fn() & 0xff)
        except BaseException:
            os._exit(255)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def reap(r):
    # clone() without a stack returns twice, like fork()
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)

def attach():
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    e = sc(101, 16, pid, 0, 0)[1]                   # PTRACE_ATTACH
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return e

def vm_readv():
    dst, src = ctypes.create_string_buffer(8), ctypes.create_string_buffer(b"corral!")
    local = (ctypes.c_void_p * 2)(ctypes.addressof(dst), 8)
    remote = (ctypes.c_void_p * 2)(ctypes.addressof(src), 8)
    return sc(310, os.getpid(), local, 1, remote, 1, 0)[1]

def pivot_root():
    sc(272, NEWUSER | NEWNS)                        # past the capability check when allowed
    return sc(155, b"/nonexistent-corral", b"/nonexistent-corral")[1]

def clone(flags):
    r, e = sc(56, flags | SIGCHLD, 0, 0, 0, 0)
    reap(r)
    return e

def clone_exit(sig):
    r, e = sc(56, sig, 0, 0, 0, 0)
    reap(r)
    return e

def clone3(flags):
    args = struct.pack("=11Q", flags, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0)
    r, e = sc(435, ctypes.create_string_buffer(args, len(args)), len(args))
    reap(r)
    return e

def perf_event_open():
    attr = bytearray(128)
    struct.pack_into("=IIQ", attr, 0, 1, 64, 1)           # PERF_TYPE_SOFTWARE, size 64, task clock
    struct.pack_into("=Q", attr, 40, (1 << 5) | (1 << 6))  # exclude_kernel, exclude_hv
    return sc(298, ctypes.create_string_buffer(bytes(attr), 128), 0, -1, -1, 0)[1]

def reboot():
    # in a PID namespace of our own user namespace (when allowed), CAP_SYS_BOOT passes and the
    # bad magic numbers give EINVAL; never valid magic
    sc(272, NEWUSER | NEWPID)
    return sub(lambda: sc(169, 0, 0, 0, None)[1])

cases = {
    "ptrace-traceme": lambda: sc(101, 0, 0, 0, 0)[1],
    "ptrace-attach": attach,
    "process_vm_readv": vm_readv,
    "mount": lambda: sc(165, b"none", b"/nonexistent-corral", b"tmpfs", 0, None)[1],
    "umount2": lambda: sc(166, b"/", 0x100)[1],
    "pivot_root": pivot_root,
    "unshare": lambda: sc(272, NEWUSER)[1],
    "setns": lambda: sc(308, os.open("/proc/self/ns/user", os.O_RDONLY), NEWUSER)[1],
    "clone-newuser": lambda: clone(NEWUSER),
    "clone-newnet": lambda: clone(NEWUSER | NEWNET),
    "clone3-newuser": lambda: clone3(NEWUSER),
    "keyctl": lambda: sc(250, 0, -2, 1)[1],         # KEYCTL_GET_KEYRING_ID, process keyring
    "add_key": lambda: sc(248, b"user", b"corral-test", b"x", 1, -2)[1],
    "bpf": lambda: sc(321, 0, None, 8)[1],
    "perf_event_open": perf_event_open,
    "userfaultfd": lambda: sc(323, 1 | os.O_CLOEXEC)[1],   # UFFD_USER_MODE_ONLY
    "kexec_load": lambda: sc(246, 0, 0, None, 0x7fff0000)[1],
    "init_module": lambda: sc(175, None, 0, b"")[1],
    "reboot": reboot,
    "swapon": lambda: sc(167, b"/nonexistent-corral", 0x40000000)[1],
    "open_by_handle_at": lambda: sc(304, -5, None, 0)[1],
    "io_uring_setup": lambda: sc(425, 1, ctypes.create_string_buffer(120))[1],
    "personality": lambda: sc(135, 0xffffffff)[1],
    # pid 1 (signal 0: the permission check alone), and the two ways to make the kernel send
    # SIGKILL to whoever: a child's exit signal (ours: the clone's parent dies of it), an I/O one
    "kill-pid1": lambda: sc(62, 1, 0)[1],
    "tgkill-pid1": lambda: sc(234, 1, 1, 0)[1],
    "pidfd_open-pid1": lambda: sc(434, 1, 0)[1],
    "clone-exit-sigkill": lambda: clone_exit(9),
    "setsig-sigkill": lambda: sc(72, os.pipe()[0], 10, 9)[1],     # F_SETSIG
}
for name in sys.argv[1:]:
    e = sub(cases[name])
    print("r", name, "ok" if e == 0 else errno.errorcode.get(e, "E%d" % e), flush=True)
]==]

-- case, what it attacks, the names to deny, the filter's answer
local attacks = {
  { "ptrace-traceme", "ptrace(PTRACE_TRACEME)", { "ptrace" } },
  { "ptrace-attach", "ptrace(PTRACE_ATTACH) of a child", { "ptrace" } },
  { "process_vm_readv", "process_vm_readv()", { "process_vm_readv" } },
  { "mount", "mount()", { "mount" } },
  { "umount2", "umount2()", { "umount2" } },
  { "pivot_root", "pivot_root() in a user namespace", { "pivot_root" } },
  { "unshare", "unshare(CLONE_NEWUSER)", { "unshare" } },
  { "setns", "setns()", { "setns" } },
  { "clone-newuser", "a raw clone(CLONE_NEWUSER) when unshare is denied", { "unshare" } },
  { "clone-newnet", "a raw clone(CLONE_NEWUSER|CLONE_NEWNET) when setns is denied", { "setns" } },
  { "clone3-newuser", "clone3(CLONE_NEWUSER) when unshare is denied", { "unshare" }, "ENOSYS" },
  { "keyctl", "keyctl()", { "keyctl" } },
  { "add_key", "add_key()", { "add_key" } },
  { "bpf", "bpf()", { "bpf" } },
  { "perf_event_open", "perf_event_open() of its own task", { "perf_event_open" } },
  { "userfaultfd", "userfaultfd(UFFD_USER_MODE_ONLY)", { "userfaultfd" } },
  { "kexec_load", "kexec_load()", { "kexec_load" } },
  { "init_module", "init_module()", { "init_module" } },
  { "reboot", "reboot() in a PID namespace", { "reboot" } },
  { "swapon", "swapon()", { "swapon" } },
  { "open_by_handle_at", "open_by_handle_at()", { "open_by_handle_at" } },
  { "io_uring_setup", "io_uring_setup()", { "io_uring_setup" } },
  { "personality", "personality()", { "personality" } },
  -- whatever the list: nothing reaches pid 1, a PID namespace's supervising init
  -- (as another user than root, the host's pid 1 refuses the call without the filter too)
  { "kill-pid1", "kill() of pid 1 with any list", {}, nil, "root" },
  { "tgkill-pid1", "tgkill() of pid 1 with any list", {}, nil, "root" },
  { "pidfd_open-pid1", "pidfd_open() of pid 1 with any list", {} },
  { "clone-exit-sigkill", "a clone() whose exit signal is SIGKILL with any list", {} },
  { "setsig-sigkill", "fcntl(F_SETSIG, SIGKILL) with any list", {} },
}

local SOCKETS = [==[
import socket
def try_(name, fn):
    try:
        s = fn()
        for x in (s if isinstance(s, tuple) else (s,)):
            x.close()
        print("r", name, "ok", flush=True)
    except OSError as e:
        print("r", name, e.errno == 1 and "EPERM" or "E%d" % e.errno, flush=True)
try_("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
try_("inet-udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
try_("inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
try_("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
try_("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
try_("unix-pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
]==]

local WORKS = [==[
import os, subprocess, threading
pid = os.fork()
if pid == 0:
    os._exit(7)
print("r fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
print("r subprocess", subprocess.run(["/bin/true"]).returncode, flush=True)
print("r shell", subprocess.run(["/bin/sh", "-c", "/bin/true | /bin/cat"]).returncode, flush=True)
box = []
t = threading.Thread(target=lambda: box.append(1))
t.start()
t.join()
print("r thread", len(box), flush=True)
]==]

-- getpid() through the i386 entry point: mov eax, 20; int 0x80; ret
local INT80 = [==[
import ctypes, mmap, os
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("r int80", "ok" if f() == os.getpid() else "bad", flush=True)
]==]

-- getpid() with the x32 bit (0x40000000) set
local X32 = [==[
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(0x40000000 | 39)
print("r x32", "ok" if r > 0 else "E%d" % ctypes.get_errno(), flush=True)
]==]

-- Loads allow-all filters (hand-made BPF: a test fixture) until the kernel's 32768 instructions
-- per process are nearly used up, then runs the launcher: its own filter no longer fits (ENOMEM).
local CROWD = [==[
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
def load(n):
    code = struct.pack("=HBBI", 0x20, 0, 0, 0) * (n - 1) + struct.pack("=HBBI", 0x06, 0, 0, 0x7fff0000)
    buf = ctypes.create_string_buffer(code, len(code))
    return libc.syscall(ctypes.c_long(317), 1, 0, ctypes.byref(Prog(n, ctypes.addressof(buf)))) == 0
assert libc.prctl(38, 1, 0, 0, 0) == 0
while load(4096):
    pass
n = 2048
while n >= 1:
    while load(n):
        pass
    n //= 2
os.execv(sys.argv[1], sys.argv[1:])
]==]

local function crowded(args)
  return H.sh("f=$(mktemp /tmp/corral-seccomp-report.XXXXXX); " .. H.python .. " -I -c " .. q(CROWD) ..
    " " .. L .. " " .. args .. " 3>\"$f\"; echo \"<<exit $?>>\"; cat \"$f\"; rm -f \"$f\"")
end

-- The filter cache (--seccomp-cache DIR): a private directory, as the host's lock directory is.
local core = require "corral.core"
local cache = assert(core.mkdtemp("/tmp/corral-sccache-XXXXXX"))

local function cache_files()
  local t = {}
  for _, name in ipairs(core.listdir(cache) or {}) do
    local st = core.lstat(cache .. "/" .. name)
    t[name] = st and st.ino
  end
  return t
end

local function only_file()
  local name, ino, n = nil, nil, 0
  for k, v in pairs(cache_files()) do name, ino, n = k, v, n + 1 end
  assert.are.equal(1, n, "one cache file")
  return name, ino
end

local function clear_cache()
  for name in pairs(cache_files()) do os.remove(cache .. "/" .. name) end
end

describe("corral-launch --seccomp", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)
  teardown(function() core.rmtree(cache) end)

  for _, a in ipairs(attacks) do
    local case, what, names, answer = a[1], a[2], a[3], a[4] or "EPERM"
    it("answers " .. what .. " with " .. answer, function()
      local free = run("", ATTACK, case)
      assert.is_truthy(free[case], "no result without the filter")
      if a[5] ~= "root" or H.root then
        assert.are_not.equal(answer, free[case], "the same call without the filter")
      end
      local got, rep, status = run("--seccomp auto " .. deny(names), ATTACK, case)
      assert.are.equal(answer, got[case])
      assert.are.equal(tostring(#names), rep.applied.seccomp)
      assert.are.equal(0, status)
      -- the same filter built and written to the cache, then read from it: the same answer
      clear_cache()
      for pass = 1, 2 do
        local cgot, crep, cstatus = run("--seccomp auto --seccomp-cache " .. cache .. " " .. deny(names), ATTACK, case)
        assert.are.equal(answer, cgot[case], "cache pass " .. pass)
        assert.are.same(rep.applied, crep.applied)
        assert.are.same(rep.refused, crep.refused)
        assert.are.equal(0, cstatus)
      end
    end)
  end

  it("loads a cached filter that answers every attack as the built one, and keeps the file", function()
    clear_cache()
    local cases = {}
    for _, a in ipairs(attacks) do cases[#cases + 1] = a[1] end
    local opts = "--pidns --seccomp require --deny-sockets " .. deny(FULL) .. " --deny-syscall no_such_call"
    local built, brep = run(opts, ATTACK, table.concat(cases, " "))
    local first, second
    for pass = 1, 2 do
      local got, rep, status = run(opts .. " --seccomp-cache " .. cache, ATTACK, table.concat(cases, " "))
      assert.are.same(built, got, "pass " .. pass)
      assert.are.same(brep.applied, rep.applied)
      assert.are.same(brep.refused, rep.refused)
      assert.are.equal("no_such_call", rep.refused["seccomp-unknown"].message)
      assert.are.equal(0, status)
      local _, ino = only_file()
      if pass == 1 then first = ino else second = ino end
    end
    -- a hit reads the file; a miss would have replaced it
    assert.are.equal(first, second)
    -- another deny list is another filter: another file
    run("--seccomp auto --seccomp-cache " .. cache .. " --deny-syscall ptrace", "pass")
    local n = 0
    for _ in pairs(cache_files()) do n = n + 1 end
    assert.are.equal(2, n)
  end)

  -- A damaged file: the filter is built again (never loaded from it, never left out) and the
  -- file replaced.
  local damage = {
    { "truncated", function(data) return data:sub(1, #data - 9) end },
    { "cut to its header", function(data) return data:sub(1, 20) end },
    { "empty", function() return "" end },
    { "one instruction bit flipped", function(data)
      local i = #data - 5
      return data:sub(1, i - 1) .. string.char(data:byte(i) ~ 0x10) .. data:sub(i + 1)
    end },
    { "one key byte changed", function(data)
      local i = 48 + 3
      return data:sub(1, i - 1) .. string.char(data:byte(i) ~ 1) .. data:sub(i + 1)
    end },
    { "grown by a byte", function(data) return data .. "x" end },
    { "garbage", function(data) return string.rep("\255", #data) end },
  }
  for _, d in ipairs(damage) do
    it("ignores a cache file that is " .. d[1] .. " and builds the filter", function()
      clear_cache()
      local opts = "--seccomp auto --seccomp-cache " .. cache .. " --deny-sockets --deny-syscall personality"
      run(opts, "pass")
      local name, ino = only_file()
      local path = cache .. "/" .. name
      local f = assert(io.open(path, "rb"))
      local data = f:read("a")
      f:close()
      f = assert(io.open(path, "wb"))
      f:write(d[2](data))
      f:close()
      local got, rep, status = run(opts, ATTACK, "personality")
      assert.are.equal("EPERM", got.personality)
      local sgot = run(opts, SOCKETS)
      assert.are.equal("EPERM", sgot.inet)
      assert.are.equal("1", rep.applied.seccomp)
      assert.is_truthy(rep.applied["deny-sockets"])
      assert.are.equal(0, status)
      -- replaced by a good one
      local name2, ino2 = only_file()
      assert.are.equal(name, name2)
      assert.are_not.equal(ino, ino2)
      f = assert(io.open(path, "rb"))
      assert.are.equal(#data, #f:read("a"))
      f:close()
    end)
  end

  it("neither reads nor writes a cache directory others may write", function()
    clear_cache()
    local opts = "--seccomp auto --seccomp-cache " .. cache .. " --deny-syscall personality"
    assert(core.chmod(cache, 511))  -- 0777
    local got, rep = run(opts, ATTACK, "personality")
    assert(core.chmod(cache, 448))
    assert.are.equal("EPERM", got.personality)
    assert.are.equal("1", rep.applied.seccomp)
    assert.are.same({}, cache_files())
  end)

  it("denies every attack with a policy's list of 30 names, in a PID namespace", function()
    local cases = {}
    for _, a in ipairs(attacks) do cases[#cases + 1] = a[1] end
    local got, rep, status = run("--pidns --seccomp require --deny-sockets " .. deny(FULL), ATTACK,
      table.concat(cases, " "))
    for _, a in ipairs(attacks) do
      assert.are.equal(a[4] or "EPERM", got[a[1]], a[1])
    end
    assert.are.equal("30", rep.applied.seccomp)
    assert.is_truthy(rep.applied["deny-sockets"])
    assert.is_nil(rep.refused["seccomp-unknown"])
    assert.are.equal(0, status)
  end)

  it("loads the filter in the init, ahead of the program, unless it denies a call the launcher makes", function()
    local WHO = [==[
import errno, os
def field(pid, name):
    for l in open("/proc/%s/status" % pid):
        if l.startswith(name + ":"):
            return l.split()[1]
print("r init", field(1, "Seccomp"))
print("r filters", field("self", "Seccomp_filters"))
try:
    os.kill(os.getpid(), 0)     # (pid 1 is refused whatever the list)
    print("r kill 0")
except OSError as e:
    print("r kill", errno.errorcode[e.errno])
]==]
    -- a policy's list: the init B loads it on itself (mode 2) and the program inherits that one
    -- filter, not a second
    local got, rep, status, _, prog = run("--pidns --seccomp require " .. deny(FULL), WHO)
    assert.are.same({ init = "2", filters = "1", kill = "0" }, got, prog)
    assert.are.equal("30", rep.applied.seccomp)
    assert.are.equal(0, status)
    -- kill() denied: the init still has to kill and reap, so the program loads the filter itself
    got, rep, status, _, prog = run("--pidns --seccomp require " .. deny({ "kill" }), WHO)
    assert.are.same({ init = "0", filters = "1", kill = "EPERM" }, got, prog)
    assert.are.equal("1", rep.applied.seccomp)
    assert.are.equal(0, status)
  end)

  it("keeps os.fork, subprocess and threads working under the full list", function()
    for _, opts in ipairs({ "--no-pidns", "--pidns" }) do
      local got, rep, status, _, prog = run(opts .. " --seccomp auto --deny-sockets " .. deny(FULL), WORKS)
      assert.are.same({ fork = "7", subprocess = "0", shell = "0", thread = "1" }, got, prog)
      assert.are.equal("30", rep.applied.seccomp)
      assert.are.equal(0, status)
    end
  end)

  it("refuses every socket family but AF_UNIX with --deny-sockets", function()
    local free = run("", SOCKETS)
    local got, rep = run("--seccomp auto --deny-sockets", SOCKETS)
    for _, fam in ipairs({ "inet", "inet-udp", "inet6", "netlink" }) do
      assert.are.equal("ok", free[fam], fam .. " without the filter")
      assert.are.equal("EPERM", got[fam], fam)
    end
    assert.are.equal("ok", got.unix)
    assert.are.equal("ok", got["unix-pair"])
    assert.is_truthy(rep.applied["deny-sockets"])
    assert.are.equal("0", rep.applied.seccomp)
    -- the filter is the last step: its lines come after the program child's others
    local order = rep.applied_order
    assert.are.same({ "empty-env", "seccomp", "deny-sockets" }, { table.unpack(order, #order - 2) })
  end)

  it("kills the process for a system call through int 0x80 (i386)", function()
    local free, _, free_status = run("", INT80)
    if free.int80 == nil and free_status == 128 + 11 then
      -- a kernel built without IA32 emulation (or booted with ia32_emulation=0) answers int 0x80
      -- with SIGSEGV before any filter could see it: nothing of i386 to attack here
      pending("this kernel has no i386 system call entry: int 0x80 is SIGSEGV without a filter")
      return
    end
    assert.are.equal("ok", free.int80)
    assert.are.equal(0, free_status)
    local got, rep, status = run("--seccomp auto", INT80)
    assert.is_nil(got.int80)
    assert.are.same({ kind = "signal", code = 31 }, rep.status)
    assert.are.equal(128 + 31, status)
  end)

  it("kills the process for a system call with the x32 bit", function()
    local free = run("", X32)
    assert.is_truthy(free.x32)
    local got, rep = run("--seccomp auto --deny-syscall ptrace", X32)
    assert.is_nil(got.x32)
    assert.are.same({ kind = "signal", code = 31 }, rep.status)
  end)

  it("lists names this architecture does not have on one refused line and runs", function()
    local got, rep, status = run("--seccomp require --deny-syscall socketcall --deny-syscall no_such_call " ..
      "--deny-syscall personality --deny-syscall personality", ATTACK, "personality")
    assert.are.same({ errno = "ENOSYS", message = "socketcall no_such_call" }, rep.refused["seccomp-unknown"])
    assert.are.equal("1", rep.applied.seccomp)
    assert.are.equal("EPERM", got.personality)
    assert.are.equal(0, status)
  end)

  it("keeps the line of unknown names within a report line", function()
    local names = {}
    for i = 1, 100 do names[i] = string.format("no_such_call_%02d_%s", i, string.rep("x", 40)) end
    names[#names + 1] = "zz"
    local _, rep, status, raw = run("--seccomp auto " .. deny(names), "pass")
    local line = raw:match("(refused seccomp%-unknown [^\n]*)")
    assert.is_truthy(line, raw)
    assert.is_true(#line < 1024)
    assert.is_truthy(line:find(" no_such_call_01_", 1, true))
    assert.is_truthy(line:find(" %.%.%.$"), line)
    assert.is_falsy(line:find(" zz", 1, true), line)
    assert.are.equal("0", rep.applied.seccomp)
    assert.are.equal(0, status)
  end)

  it("runs without the filter in auto mode when the kernel refuses it", function()
    local out = crowded("--report-fd 3 --seccomp auto --deny-syscall personality --deny-sockets -- " ..
      H.python .. " -I -c " .. q(SOCKETS))
    local prog, status, raw = out:match("^(.-)<<exit (%d+)>>\n?(.*)$")
    local rep = report.parse(raw)
    assert.are.equal("ENOMEM", rep.refused.seccomp and rep.refused.seccomp.errno, raw)
    assert.are.equal("ENOMEM", rep.refused["deny-sockets"].errno)
    assert.is_nil(rep.applied.seccomp)
    assert.is_truthy(prog:find("r inet ok", 1, true), prog)
    assert.are.equal("0", status)
  end)

  it("runs nothing in require mode when the kernel refuses the filter", function()
    local out = crowded("--report-fd 3 --seccomp require --deny-syscall personality -- " ..
      H.python .. " -I -c 'print(\"ran\")'")
    local prog, status, raw = out:match("^(.-)<<exit (%d+)>>\n?(.*)$")
    local rep = report.parse(raw)
    assert.are.same("seccomp", rep.fatal and rep.fatal.step, raw)
    assert.are.equal("ENOMEM", rep.fatal.errno)
    assert.is_nil(rep.status)
    assert.is_nil(rep.pid)
    assert.is_falsy(prog:find("ran", 1, true))
    assert.are.equal("125", status)
  end)

  it("probes for seccomp filters", function()
    assert.is_truthy(H.sh(L .. " --probe"):find("\nprobe seccomp yes", 1, true))
    assert.is_truthy(crowded("--probe"):find("\nprobe seccomp no ENOMEM ", 1, true))
  end)
end)
