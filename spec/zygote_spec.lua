-- corral-zygote: a warm interpreter that forks one confined run per request. Real processes only:
-- spec/zygote_driver.py speaks the control protocol (a SOCK_SEQPACKET socketpair, SCM_RIGHTS),
-- and every program is also run by corral-launch on the same plan (the default policy's, built
-- as the library builds it), whose stdout, stderr, exit status and report must be the same.
local H = require "helper"
local Z = require "zygote_support"
local core = require "corral.core"
local report = require "corral.report"

local function hex(n)
  local f = assert(io.open("/dev/urandom", "rb"))
  local b = f:read(n)
  f:close()
  return (b:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- Every process of a zygote's tree shows the zygote's command line, marker included (the runs are
-- forks of it, their program's forks too): what is left of a zygote is found by it.
local MARKER = "zyg" .. hex(6)
local ZARGS = {}
for i, a in ipairs(Z.zygote_args) do ZARGS[i] = a end
ZARGS[#ZARGS + 1] = "--env"
ZARGS[#ZARGS + 1] = "SPEC_MARKER=" .. MARKER

-- The zygote's command line, with options added or (an option it has) replaced.
local function zargs(...)
  local t = {}
  for i, a in ipairs(ZARGS) do t[i] = a end
  local extra = { ... }
  for i = 1, #extra, 2 do
    local at
    for j = 2, #t - 1 do if t[j] == extra[i] and extra[i] ~= "--env" then at = j end end
    if at then t[at + 1] = extra[i + 1] else t[#t + 1] = extra[i]; t[#t + 1] = extra[i + 1] end
  end
  return t
end

-- Text that differs between two runs of the same program anyhow: object addresses.
local function stable(s)
  return (s:gsub("0x%x+", "0x?"))
end

local function int(x) return x and math.tointeger(x) end

-- A plan's launcher arguments with more options before its "--" (the program's command line).
local function with_options(args, ...)
  local out, more = {}, { ... }
  for _, a in ipairs(args) do
    if a == "--" then for _, m in ipairs(more) do out[#out + 1] = m end end
    out[#out + 1] = a
  end
  return out
end

-- A raw wait status, as text: "exit N" or "signal N".
local function how(status)
  status = int(status)
  if not status then return "none" end
  if status & 0x7f == 0 then return "exit " .. (status >> 8) end
  return "signal " .. (status & 0x7f)
end

-- Live processes (zombies aside: a container's pid 1 may never reap an orphan) of this spec's
-- zygotes and runs: MARKER in their command line (the zygote's processes, A and B of each run),
-- or a run directory made here (C shows the run's python3 command line, and its forks too).
local function marked()
  local f = io.popen("ps -e -o pid=,stat=,args=")
  local pids = {}
  for line in f:lines() do
    local pid, stat, args = line:match("^%s*(%d+)%s+(%S+)%s+(.*)$")
    local ours = pid and args:find(MARKER, 1, true)
    for _, dir in ipairs(Z.run_dirs) do ours = ours or (pid and args:find(dir .. "/", 1, true)) end
    if ours and not stat:match("^Z") and not args:match("^ps ") then
      pids[#pids + 1] = pid
    end
  end
  f:close()
  return pids
end

local function leftovers() return #marked() end

local function assert_no_leftovers()
  assert.is_true(H.eventually(function() return leftovers() == 0 end, 10),
    "processes of the zygote left: " .. table.concat(marked(), " "))
end

-- ---- programs compared with corral-launch ----

local PROGRAMS = {
  { "hello", "print('hello')" },
  { "the interpreter's state", [[
import sys, os, io, locale, signal, resource, __main__
print(sys.flags)
print(sys.path)
print(sys.executable, sys._base_executable, sys.prefix, sys.exec_prefix, sys.base_prefix, sys.platlibdir)
print(sys.argv, sys.orig_argv)
print(os.environ, os.environb)
print(os.getcwd(), __file__, __name__, __cached__, type(__loader__).__name__, __spec__, __package__)
print(sorted(os.listdir('/proc/self/fd')))
for s in (sys.stdin, sys.stdout, sys.stderr):
    b = s.buffer
    print(s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.write_through, type(b).__name__,
          s.seekable(), getattr(b, 'raw', b).name)
print(sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__)
print(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors(), locale.getpreferredencoding(False),
      locale.setlocale(locale.LC_CTYPE))
print([signal.getsignal(s) for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM,
                                      signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1)])
print(signal.pthread_sigmask(signal.SIG_BLOCK, []))
# the pid: 2 after B for corral-launch's program; 3 for a warm one (the zygote's vfork, which
# orphans it to B, took 2)
print(os.getuid(), os.getgid(), os.getgroups(), os.getpid() in (2, 3), os.getppid(), os.getpgrp() == os.getsid(0))
print(sys.path_importer_cache.get(__file__, 'absent'))
# (not RLIMIT_NPROC: its value counts the run's own processes of the program's uid, which differ
# by path; what the program may hold is the same, spec/nproc_spec.lua)
print([resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE,
                                       resource.RLIMIT_CORE, resource.RLIMIT_NOFILE)])
status = open('/proc/self/status').read()
print([l for l in status.split('\n') if l.split(':')[0] in ('NoNewPrivs', 'Seccomp', 'Seccomp_filters', 'Threads',
      'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'Uid', 'Gid', 'Groups')])
print(open('/proc/self/cmdline', 'rb').read(), open('/proc/self/environ', 'rb').read(),
      open('/proc/self/comm').read(), os.stat('/proc/self').st_uid)
import ctypes
print('dumpable', ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))
print(sys.getrecursionlimit(), sys.getswitchinterval(), sys.get_int_max_str_digits())
import time
print(time.tzname, time.timezone)
print(os.path.exists('/tmp'), os.listdir(os.environ['HOME']), os.access('/usr/lib/python3.11', os.R_OK))
]] },
  { "an uncaught exception", [[
def inner(x):
    return {}[x]
def outer():
    inner('missing')
print('before', flush=True)
outer()
]] },
  { "sys.exit(3)", "import sys\nprint('out')\nsys.exit(3)" },
  { "sys.exit('msg')", "import sys\nsys.exit('a message')" },
  { "raise SystemExit(256)", "raise SystemExit(256)" },
  { "sys.exit() with atexit", [[
import atexit, sys, __main__
atexit.register(lambda: print('atexit sees __file__:', hasattr(__main__, '__file__')))
sys.exit()
]] },
  { "os._exit(4)", "import os, atexit\natexit.register(print, 'not printed')\nprint('x', end='')\nos._exit(4)" },
  { "KeyboardInterrupt", "raise KeyboardInterrupt" },
  { "a syntax error", "print('never'\nx = = 1\n" },
  { "an atexit function", [[
import atexit, __main__
atexit.register(lambda: print('atexit ran, __file__ visible:', hasattr(__main__, '__file__')))
def bad():
    raise ValueError('in atexit')
atexit.register(bad)
print('main done')
]] },
  { "a non-daemon thread", [[
import threading, time
def work():
    time.sleep(0.2)
    print('thread done', flush=True)
threading.Thread(target=work).start()
print('main done', flush=True)
]] },
  { "a daemon thread", [[
import threading, time
def work():
    while True:
        time.sleep(0.01)
threading.Thread(target=work, daemon=True).start()
print('main done')
]] },
  { "__del__ at exit", [[
class A:
    def __del__(self):
        print('A.__del__ at exit')
a = A()
print('main done')
]] },
  { "__del__ of a class with empty __slots__", [[
class A:
    __slots__ = ()
    def __del__(self):
        print('A.__del__ at exit')
a = A()
]] },
  { "buffered output the program froze", [[
import gc, os
f = os.fdopen(1, 'w', closefd=False)
f.write('written at finalization\n')
gc.freeze()
]] },
  { "buffered output frozen after gc.unfreeze()", [[
import gc, os
gc.unfreeze()
f = os.fdopen(1, 'w', closefd=False)
f.write('written at finalization\n')
gc.freeze()
]] },
  { "a suspended generator's finally", [[
def gen():
    try:
        yield 1
    finally:
        print('generator finally')
g = gen()
next(g)
]] },
  { "a coroutine never awaited", [[
async def coro():
    pass
c = coro()
]] },
  { "a weakref callback", [[
import weakref
class A:
    pass
a = A()
r = weakref.ref(a, lambda ref: print('weakref callback'))
]] },
  { "buffered output never flushed", [[
import os
f = os.fdopen(1, 'w', closefd=False)
f.write('written at finalization\n')
]] },
  { "a failing flush at exit", [[
import io, os, sys
sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(os.dup(1), 'w')))
print('buffered')
os.close(sys.stdout.fileno())
]] },
  { "stdin", "import sys\nprint(repr(sys.stdin.read()))\nprint(repr(input() if False else ''))", "line one\nline two\n" },
  { "input() at EOF", "input('prompt: ')" },
  { "code with a NUL byte", "print('before')\n# \0\nprint('after')" },
  { "non-UTF-8 output", "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\n')\nprint('\\udcff')" },
  { "a subprocess of sys.executable", [[
import subprocess, sys
r = subprocess.run([sys.executable, '-I', '-c', 'import sys; print(sys.flags.isolated, sys.argv)'],
                   capture_output=True, text=True)
print(r.returncode, r.stdout.strip())
]] },
  { "seccomp and Landlock in force", [[
import os, ctypes
try:
    os.unshare(os.CLONE_NEWUSER) if hasattr(os, 'unshare') else None
    print('unshare allowed')
except OSError as e:
    print('unshare', e.errno)
try:
    open('/etc/passwd').read()
    print('read /etc/passwd')
except OSError as e:
    print('/etc/passwd', e.errno)
try:
    open('/root/x', 'w')
except OSError as e:
    print('/root/x', e.errno)
]] },
}

-- Without a PID namespace (a policy with pid_namespace = false): A is a subreaper.
local no_pidns_policy = require("corral.policy").load("default"):extend { name = "no-pidns", pid_namespace = false, separation = "auto" }

-- One zygote runs all of PROGRAMS, then corral-launch runs each on the same plan.
local compared
local function compare_all()
  if compared then return compared end
  local jobs, steps = {}, { { op = "ready" } }
  for _, p in ipairs(PROGRAMS) do
    jobs[#jobs + 1] = { p[1], Z.plan(p[2]), p[3] }
  end
  for i, j in ipairs(jobs) do
    steps[#steps + 1] = Z.run_step(i, j[2].args, j[3])
    steps[#steps + 1] = { op = "wait", ids = { tostring(i) } }
  end
  steps[#steps + 1] = { op = "close" }
  local out = Z.drive(steps, zargs())
  compared = { out = out, pairs = {} }
  for i, j in ipairs(jobs) do
    compared.pairs[j[1]] = { zygote = out.runs[tostring(i)], launch = Z.launch(j[2].args, j[3]) }
    j[2].close()
  end
  return compared
end

local COMPARED = {}
for _, p in ipairs(PROGRAMS) do
  COMPARED[#COMPARED + 1] = p[1]
end

-- After each test: no process of the zygote's (found by MARKER: other users of this machine run
-- their own sandboxes, which a machine-wide scan would count), no new fd in this process.
local function fds()
  local set = {}
  for _, fd in ipairs(core.fds()) do set[fd] = true end
  return set
end

describe("corral-zygote", function()
  local before
  before_each(function() before = fds() end)
  after_each(function()
    assert_no_leftovers()
    require("corral.host").release_idle_uids()      -- kept between runs (corral.close())
    local new = {}
    for fd in pairs(fds()) do
      if not before[fd] then new[#new + 1] = fd .. " -> " .. tostring(core.readlink("/proc/self/fd/" .. fd)) end
    end
    assert.are.equal("", table.concat(new, ", "), "fds leaked in the host")
  end)

  it("documents its options with --help", function()
    local out, status = H.sh(Z.zygote .. " --help")
    assert.are.equal(0, status)
    for _, opt in ipairs({ "--control-fd", "--net", "--userns", "--python", "--preload", "--command",
      "--flush-handlers", "--env" }) do
      assert.is_truthy(out:find(opt, 1, true), opt)
    end
  end)

  it("exits 2 naming what is wrong on its command line", function()
    local out, status = H.sh(Z.zygote .. " --net sideways --control-fd 0")
    assert.are.equal(2, status)
    assert.is_truthy(out:find("sideways", 1, true), out)
    out, status = H.sh(Z.zygote .. " --flush-handlers=yes --control-fd 0")
    assert.are.equal(2, status)
    assert.is_truthy(out:find("--flush-handlers takes no value", 1, true), out)
    out, status = H.sh(Z.zygote .. " --control-fd 0 </dev/null")
    assert.are.equal(2, status)
    assert.is_truthy(out:find("SOCK_SEQPACKET", 1, true), out)
    -- a host waiting for ready is told on the control socket
    local d = Z.drive({ { op = "ready" }, { op = "close" } }, zargs("--userns", "sometimes"))
    assert.are.equal("failed", d.ready[1])
    assert.is_truthy(d.ready[2]:find("sometimes", 1, true), d.ready[2])
    assert.are.equal(2, int(d.exit.status))
  end)

  it("says ready with what it set up and the modules it could not preload", function()
    local out = Z.drive({ { op = "ready" }, { op = "close" } }, zargs("--preload", "json,no_such_module,random"))
    assert.are.equal("ready", out.ready[1])
    local lines = table.concat(out.ready, "\n")
    assert.is_truthy(lines:find("preload-failed no_such_module ModuleNotFoundError: No module named 'no_such_module'", 1, true), lines)
    assert.is_falsy(lines:find("preload-failed json", 1, true), lines)
    -- the same lines a launcher writes for its namespaces
    local l = Z.launch({ "--report-fd", "3", "--net", "new", "--userns", "auto", "--", "/bin/true" })
    for _, name in ipairs({ "user-namespace", "no-network" }) do
      assert.are.equal(report.parse(l.report).applied[name] ~= nil,
        lines:find("applied " .. name, 1, true) ~= nil, name)
    end
    assert.are.equal(0, int(out.exit.status))
  end)

  it("fails with a message when --net require cannot be met, or starts", function()
    local out = Z.drive({ { op = "ready" }, { op = "close" } }, zargs("--net", "require"))
    if out.ready[1] == "failed" then
      assert.is_truthy(out.ready[2]:find("^fatal no%-network"), out.ready[2])
      assert.are.equal(1, int(out.exit.status))
    else
      assert.are.equal("ready", out.ready[1])
      assert.is_truthy(table.concat(out.ready, "\n"):find("applied no-network", 1, true))
    end
  end)

  describe("runs a program exactly as corral-launch does:", function()
    for _, name in ipairs(COMPARED) do
      it(name, function()
        local c = compare_all()
        local pair = c.pairs[name]
        local z, l = pair.zygote, pair.launch
        assert.is_truthy(z, "no result for " .. name)
        assert.is_nil(z.error)
        assert.are.equal(how(l.status), how(z.status))
        assert.are.equal(stable(l.stdout), stable(z.stdout))
        assert.are.equal(stable(l.stderr), stable(z.stderr))
        assert.are.same(Z.applied(l.report), Z.applied(z.report))
        assert.are.equal(Z.stable_report(l.report), Z.stable_report(z.report))
        assert.are.same({}, c.out.messages)
      end)
    end
  end)

  it("refuses a run without a PID namespace: its program is forked into the run's", function()
    local p = Z.plan("print('ran')", { policy = no_pidns_policy })
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "wait" }, { op = "close" } }, zargs())
    p.close()
    local r = out.runs["1"]
    assert.are.equal("", r.stdout)
    assert.is_truthy(r.stderr:find("^corral%-zygote: .*%-%-pidns"), r.stderr)
    assert.are.equal(2, int(r.status) >> 8)
    assert.are.equal(0, int(out.exit.status))
  end)

  it("gives every run fresh state: module attributes, random numbers", function()
    local code = [[
import json, random, sys
print(hasattr(json, 'mark'), random.random(), 'json' in sys.modules)
json.mark = 1
]]
    local p1, p2 = Z.plan(code), Z.plan(code)
    local out = Z.drive({
      { op = "ready" },
      Z.run_step(1, p1.args), { op = "wait" },
      Z.run_step(2, p2.args), { op = "wait" },
      { op = "close" },
    }, zargs("--preload", "json,random"))
    p1.close()
    p2.close()
    local a = { out.runs["1"].stdout:match("^(%S+) (%S+) (%S+)") }
    local b = { out.runs["2"].stdout:match("^(%S+) (%S+) (%S+)") }
    assert.are.equal("False", a[1])
    assert.are.equal("False", b[1])
    assert.are_not.equal(a[2], b[2])
    -- preloaded: already imported before the program's own import
    assert.are.equal("True", a[3])
  end)

  it("reseeds numpy.random's global generator in every run (python3-numpy)", function()
    local code = "import sys\nprint('numpy' in sys.modules)\nimport numpy\nprint(numpy.random.randint(1 << 62))"
    -- the program's own forks are not reseeded, as python3's are not
    local forks = "import os, numpy\nnumpy.random.seed(7)\npid = os.fork()\nv = numpy.random.randint(1 << 62)\n"
      .. "if pid == 0:\n    print(v, flush=True)\n    os._exit(0)\nos.waitpid(pid, 0)\nprint(v)"
    local p1, p2, p3 = Z.plan(code), Z.plan(code), Z.plan(forks)
    local out = Z.drive({
      { op = "ready" },
      Z.run_step(1, p1.args), { op = "wait" },
      Z.run_step(2, p2.args), { op = "wait" },
      Z.run_step(3, p3.args), { op = "wait" },
      { op = "close" },
    }, zargs("--preload", "numpy"))
    p1.close()
    p2.close()
    p3.close()
    assert.is_falsy(table.concat(out.ready, "\n"):find("preload-failed", 1, true), table.concat(out.ready, "\n"))
    local c, p = out.runs["3"].stdout:match("^(%d+)\n(%d+)\n$")
    assert.is_truthy(c, out.runs["3"].stdout .. out.runs["3"].stderr)
    assert.are.equal(c, p)
    local a = { out.runs["1"].stdout:match("^(%S+)\n(%d+)\n$") }
    local b = { out.runs["2"].stdout:match("^(%S+)\n(%d+)\n$") }
    assert.are.equal("True", a[1], out.runs["1"].stdout .. out.runs["1"].stderr)
    assert.are.equal("True", b[1], out.runs["2"].stdout .. out.runs["2"].stderr)
    assert.are_not.equal(a[2], b[2])
  end)

  it("gives the program a working rseq: sched_getcpu() follows the CPU it is moved to", function()
    local code = "import ctypes, os\nlibc = ctypes.CDLL(None)\ncpus = sorted(os.sched_getaffinity(0))\nbad = []\n"
      .. "for i in range(100):\n    c = cpus[i % len(cpus)]\n    os.sched_setaffinity(0, {c})\n"
      .. "    if libc.sched_getcpu() != c:\n        bad.append(c)\nprint(len(cpus), bad[:5])"
    local p = Z.plan(code)
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "wait" }, { op = "close" } }, zargs())
    p.close()
    assert.is_truthy(out.runs["1"].stdout:match("^%d+ %[%]\n$"), out.runs["1"].stdout .. out.runs["1"].stderr)
  end)

  it("lets a program's thread call pthread_exit with no fd left to load libgcc_s", function()
    -- glibc unwinds an exiting thread with libgcc_s, which it dlopens at the first pthread_exit of
    -- the process and aborts the whole process if it cannot; CPython calls pthread_exit for a
    -- daemon thread that wakes during finalization. ctypes releases the GIL around the call.
    local code = [[
import ctypes, os, threading
libc = ctypes.CDLL(None)
status = os.open("/proc/self/status", os.O_RDONLY)
def threads():
    return int(os.pread(status, 4096, 0).split(b"\nThreads:")[1].split()[0])
go = threading.Lock()
go.acquire()
def leave():
    go.acquire()
    libc.pthread_exit(None)
threading.Thread(target=leave, daemon=True).start()
fds = []
while True:
    try:
        fds.append(os.dup(status))
    except OSError:
        break
go.release()
while threads() > 1:
    pass
for fd in fds:
    os.close(fd)
print("left", len(fds) > 0)
]]
    local p = Z.plan(code)
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "wait" }, { op = "close" } }, zargs())
    p.close()
    local r = out.runs["1"]
    assert.are.equal("left True\n", r.stdout, r.stderr)
  end)

  it("has the preloaded modules in sys.modules before the program starts", function()
    local p = Z.plan("import sys\nprint('json' in sys.modules, 'decimal' in sys.modules)")
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "wait" }, { op = "close" } },
      zargs("--preload", "json"))
    p.close()
    assert.are.equal("True False\n", out.runs["1"].stdout)
  end)

  it("with --flush-handlers, its programs flush their output on SIGXCPU and the flush signal", function()
    -- the plan of a warm run: the program runs its file itself, without the prelude
    local function code(sig)
      return "import os, signal, sys\nprint(sys._getframe().f_back, signal.getsignal(signal.SIGXCPU),\n"
        .. "      signal.getsignal(63))\nos.kill(os.getpid(), " .. sig .. ")\nprint('not reached')\n"
    end
    local p1, p2, p3 = Z.plan(code(63), nil, true), Z.plan(code("signal.SIGXCPU"), nil, true),
      Z.plan("import signal\nprint([signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGXCPU, 63)])\n",
        nil, true)
    local with = zargs()
    with[#with + 1] = "--flush-handlers"
    local out = Z.drive({
      { op = "ready" },
      Z.run_step(1, p1.args), { op = "wait" },
      Z.run_step(2, p2.args), { op = "wait" },
      { op = "close" },
    }, with)
    local plain = Z.drive({ { op = "ready" }, Z.run_step(3, p3.args), { op = "wait" }, { op = "close" } }, zargs())
    p1.close()
    p2.close()
    p3.close()
    local handlers = "None <built-in function _corral_flush> <built-in function _corral_flush>\n"
    -- the flush signal: flushed, then killed as the stop would have; SIGXCPU: flushed, then its
    -- own death
    assert.are.equal(handlers, out.runs["1"].stdout, out.runs["1"].stderr)
    assert.are.equal("signal 9", how(out.runs["1"].status))
    assert.are.equal(handlers, out.runs["2"].stdout, out.runs["2"].stderr)
    assert.are.equal("signal 24", how(out.runs["2"].status))
    assert.are.equal(0, int(out.exit.status))
    -- without the option: python3's own dispositions
    assert.are.equal("[True, True]\n", plain.runs["3"].stdout, plain.runs["3"].stderr)
  end)

  it("keeps a seccomp filter per distinct deny list", function()
    local code = "import os\ntry:\n    os.getcwd()\n    print('allowed')\nexcept OSError as e:\n    print('denied', e.errno)"
    local p = Z.plan(code)
    local denied = {}
    for _, a in ipairs(p.args) do
      denied[#denied + 1] = a
      if a == "--seccomp" then denied[#denied + 1] = "auto"; denied[#denied + 1] = "--deny-syscall"; denied[#denied + 1] = "getcwd" end
    end
    -- "--seccomp auto" appears once: drop the original "auto" after the inserted one
    for i = 1, #denied do
      if denied[i] == "getcwd" and denied[i + 1] == "auto" then table.remove(denied, i + 1) break end
    end
    local out = Z.drive({
      { op = "ready" },
      Z.run_step(1, p.args), { op = "wait" },
      Z.run_step(2, denied), { op = "wait" },
      Z.run_step(3, p.args), { op = "wait" },
      Z.run_step(4, denied), { op = "wait" },
      { op = "close" },
    }, zargs())
    p.close()
    assert.are.equal("allowed\n", out.runs["1"].stdout)
    assert.are.equal("denied 1\n", out.runs["2"].stdout)
    assert.are.equal("allowed\n", out.runs["3"].stdout)
    assert.are.equal("denied 1\n", out.runs["4"].stdout)
  end)

  it("serves many requests at once", function()
    local steps, plans = { { op = "ready" } }, {}
    for i = 1, 24 do
      plans[i] = Z.plan("import time\ntime.sleep(0.1)\nprint(" .. i .. ")")
      steps[#steps + 1] = Z.run_step(i, plans[i].args)
    end
    steps[#steps + 1] = { op = "wait", timeout = 60 }
    steps[#steps + 1] = { op = "close" }
    local out = Z.drive(steps, zargs())
    for i = 1, 24 do
      plans[i].close()
      local r = out.runs[tostring(i)]
      assert.are.equal("exit 0", how(r.status), r.stderr)
      assert.are.equal(i .. "\n", r.stdout)
      assert.is_truthy(report.parse(r.report).applied["pid-namespace"] or not H.root)
    end
    assert.are.same({}, out.messages)
  end)

  it("reports the signal of a run whose A was killed, and kills its tree", function()
    local p = Z.plan("import os, time\nos.fork()\nprint('started', flush=True)\ntime.sleep(30)")
    local t0 = core.hrtime()
    local out = Z.drive({
      { op = "ready" },
      Z.run_step(1, p.args), { op = "kill", id = "1", sig = 9, delay = 0.3 },
      Z.run_step(2, p.args), { op = "kill", id = "2", sig = 15, delay = 0.3 },
      { op = "wait" },
      { op = "close" },
    }, zargs())
    p.close()
    assert.are.equal("signal 9", how(out.runs["1"].status))
    -- SIGTERM: A ends the run as a launcher does, and mirrors its SIGKILL
    assert.are.equal("signal 9", how(out.runs["2"].status))
    assert.is_truthy(report.parse(out.runs["2"].report).status)
    assert.is_true(core.hrtime() - t0 < 15)
  end)

  it("contains a setsid escapee as the launcher does", function()
    local code = ([[
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['%s', '60'])
    os._exit(0)
time.sleep(0.2)
print('parent done')
]]):format(MARKER)
    local p = Z.plan(code)
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "wait", timeout = 10 }, { op = "close" } }, zargs())
    local l = Z.launch(p.args)
    p.close()
    assert.are.equal(how(l.status), how(out.runs["1"].status))
    assert.are.equal(l.stdout, out.runs["1"].stdout)
    assert.is_true(out.runs["1"].wall < 3, "the escapee held the run")
  end)

  it("contains a fork bomb as the launcher does", function()
    local code = ([[
import os, time
n = 0
try:
    while n < 2000:
        if os.fork() == 0:
            os.execv('/bin/sleep', ['%s', '60'])
        n += 1
except OSError as e:
    print('fork refused', e.errno)
time.sleep(0.2)
]]):format(MARKER)
    local p = Z.plan(code, { processes = 16 })
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "wait", timeout = 20 }, { op = "close" } }, zargs())
    local l = Z.launch(p.args)
    p.close()
    assert.are.equal(how(l.status), how(out.runs["1"].status))
    assert.are.equal(l.stdout, out.runs["1"].stdout)
    assert.is_truthy(out.runs["1"].stdout:find("fork refused 11", 1, true), out.runs["1"].stdout)
  end)

  it("refuses what only a launcher could run, with a usage error on the run's stderr", function()
    local p = Z.plan("print('x')")
    local function edit(f)
      local a = {}
      for i, v in ipairs(p.args) do a[i] = v end
      f(a)
      return a
    end
    local function find(a, v) for i, x in ipairs(a) do if x == v then return i end end end
    local cases = {
      { "--net", edit(function(a) table.remove(a, find(a, "--net")); table.remove(a, find(a, "new")) end) },
      { "-S", edit(function(a) table.insert(a, find(a, "-I") + 1, "-S") end) },
      { "LANG", edit(function(a) a[find(a, "LANG=C.UTF-8")] = "LANG=C" end) },
      { "PROGRAM", edit(function(a) a[find(a, "--") + 1] = "/usr/bin/python3.11" end) },
      { "--probe", { "--probe" } },
      { "--frob", { "--frob", "--", "/bin/true" } },
    }
    local steps = { { op = "ready" } }
    for i, c in ipairs(cases) do steps[#steps + 1] = Z.run_step(i, c[2]) end
    steps[#steps + 1] = { op = "wait" }
    steps[#steps + 1] = { op = "close" }
    local out = Z.drive(steps, zargs())
    p.close()
    for i, c in ipairs(cases) do
      local r = out.runs[tostring(i)]
      assert.are.equal("exit 2", how(r.status), c[1])
      assert.is_truthy(r.stderr:match("^corral%-zygote: [^\n]+\n$"), r.stderr)
      assert.is_truthy(r.stderr:find(c[1], 1, true), c[1] .. ": " .. r.stderr)
      assert.are.equal("", r.stdout)
    end
  end)

  it("answers a bad request with an error and serves the next one", function()
    local p = Z.plan("print('still serving')")
    local out = Z.drive({
      { op = "ready" },
      { op = "raw", fields = { "run", "7", "--", "/bin/true" }, nfds = 0 },
      { op = "raw", fields = { "run", "8", "--", "/bin/true" }, nfds = 3 },
      { op = "raw", fields = { "run", "9", "--", "/bin/true" }, nfds = 5 },
      { op = "raw", fields = { "run", "x1", "--", "/bin/true" }, nfds = 4 },
      { op = "raw", fields = { "launch", "10" }, nfds = 4 },
      { op = "raw", fields = { "run", "11", "garbage" }, nfds = 4, terminate = false },
      { op = "raw", fields = {}, nfds = 0, terminate = false },
      Z.run_step(12, p.args), { op = "wait" },
      { op = "close" },
    }, zargs())
    p.close()
    local errors = {}
    for _, m in ipairs(out.messages) do
      local id, msg = m:match("^error | (%d+) | (.*)$")
      assert.is_truthy(id, m)
      errors[#errors + 1] = id .. " " .. msg
    end
    local all = table.concat(errors, "\n")
    assert.are.equal(7, #errors, all)
    assert.is_truthy(all:find("7 bad run request: it must carry exactly 4 fds", 1, true), all)
    assert.is_truthy(all:find("8 bad run request: it must carry exactly 4 fds", 1, true), all)
    assert.is_truthy(all:find("9 bad run request", 1, true), all)
    assert.is_truthy(all:find("0 bad run request: the ID is not a decimal number", 1, true), all)
    assert.is_truthy(all:find("10 unknown request", 1, true) or all:find("0 unknown request", 1, true), all)
    assert.is_truthy(all:find("not a sequence of NUL-terminated strings", 1, true), all)
    assert.are.equal("still serving\n", out.runs["12"].stdout)
    assert.are.equal(0, int(out.exit.status))
  end)

  it("exits when the control socket reaches EOF, ending the runs still going", function()
    local p = Z.plan("import time\nprint('up', flush=True)\ntime.sleep(30)")
    local t0 = core.hrtime()
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "sleep", s = 0.5 }, { op = "close" },
      { op = "wait", timeout = 3, eof = true } }, zargs())
    p.close()
    assert.are.equal(0, int(out.exit.status))
    assert.is_true(core.hrtime() - t0 < 8)
    -- the run was ended (its output pipes reached EOF), and nothing was said after EOF
    assert.are.equal("up\n", out.runs["1"].stdout)
    assert.is_truthy(out.runs["1"].pid)
    assert.is_nil(out.runs["1"].status)
  end)

  it("exits once its runs are done when its spawner is gone, so that the host starts another", function()
    local p1 = Z.plan("print('one')")
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p1.args), { op = "wait" }, { op = "kill_spawner" },
      { op = "await_exit", timeout = 5 } }, zargs())
    p1.close()
    assert.are.equal("one\n", out.runs["1"].stdout)
    -- its host ends the runs it sent meanwhile with a launch error when the socket reaches EOF,
    -- and starts another zygote for the next ones
    assert.is_truthy(out.exit, "the zygote did not exit")
    assert.are.equal(0, int(out.exit.status))
  end)

  it("runs a program as the child of its run's own init, corral-init; a run with a cgroup by its spawner", function()
    -- (and the init's command line: its name, none of the plan's options, which name the host)
    local code = "import os\nc = open('/proc/1/cmdline', 'rb').read()\n" ..
      "print(os.getpid(), os.getppid(), open('/proc/1/comm').read().strip(), c.split(b'\\0')[0].decode(), c.count(b'--'))"
    local p1, p2 = Z.plan(code), Z.plan(code)
    -- a run cgroup (here one that cannot be used: refused, and the budgets polled) goes by S
    local args = with_options(p2.args, "--cgroup", "/nonexistent/corral-spec")
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p1.args), { op = "wait" },
      Z.run_step(2, args), { op = "wait" }, { op = "close" } }, zargs())
    p1.close()
    p2.close()
    -- direct: the zygote cloned the init into the run's namespaces, which forked the program
    -- (pid 2) from the zygote's memory and became corral-init
    assert.are.equal("2 1 corral-init corral-init 0\n", out.runs["1"].stdout, out.runs["1"].stderr)
    assert.are.equal("exit 0", how(out.runs["1"].status))
    assert.is_truthy(out.runs["1"].report:find("applied pid-namespace", 1, true))
    -- its pid message carried the init's pidfd, and `ended` came before `exit`, with its status
    assert.are.equal(out.runs["1"].pid, out.runs["1"].pidfd_pid)
    assert.are.equal(0, out.runs["1"].ended)
    -- by S, A and B: the program is pid 3 (the helper that forked it took 2), under B, a copy of S
    assert.are.equal("3 1 corral-spawner corral-zygote 0\n", out.runs["2"].stdout, out.runs["2"].stderr)
    assert.is_truthy(out.runs["2"].report:find("refused cgroup", 1, true), out.runs["2"].report)
    -- neither a pidfd nor `ended`: the run ends at A's reaping
    assert.is_nil(out.runs["2"].pidfd_pid)
    assert.is_nil(out.runs["2"].ended)
  end)

  it("tells a direct run's end before its init is reaped, with the program's exit code or signal", function()
    local p1 = Z.plan("import sys\nsys.exit(7)")
    local p2 = Z.plan("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p1.args), Z.run_step(2, p2.args), { op = "wait" },
      { op = "close" } }, zargs())
    p1.close()
    p2.close()
    assert.are.same({}, out.messages)  -- `ended` after `exit` is one
    assert.are.equal("exit 7", how(out.runs["1"].status), out.runs["1"].stderr)
    assert.are.equal(out.runs["1"].status, out.runs["1"].ended)
    assert.are.equal("signal 15", how(out.runs["2"].status), out.runs["2"].stderr)
    assert.are.equal(out.runs["2"].status, out.runs["2"].ended)
  end)

  it("runs by its spawner when corral-init cannot be executed, and says nothing of it to the run", function()
    local dir = H.sh("mktemp -d /tmp/corral-zinit.XXXXXX")
    finally(function() os.execute("rm -rf '" .. dir .. "'") end)
    -- the zygote next to a corral-init that is not executable: P's execve fails (EACCES)
    assert(os.execute("cp '" .. Z.zygote .. "' '" .. dir .. "/corral-zygote' && cp '" ..
      Z.zygote:gsub("corral%-zygote$", "corral-init") .. "' '" .. dir .. "/corral-init' && chmod 0644 '" ..
      dir .. "/corral-init' && chmod a+rx '" .. dir .. "' '" .. dir .. "/corral-zygote'"))
    local zz = zargs()
    zz[1] = dir .. "/corral-zygote"
    local code = "import os\nprint(os.getpid(), open('/proc/1/comm').read().strip())"
    local p1, p2 = Z.plan(code), Z.plan(code)
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p1.args), { op = "wait" },
      Z.run_step(2, p2.args), { op = "wait" }, { op = "close" } }, zz)
    p1.close()
    p2.close()
    for _, id in ipairs({ "1", "2" }) do
      assert.are.equal("3 corral-spawner\n", out.runs[id].stdout, out.runs[id].stderr)
      assert.are.equal("exit 0", how(out.runs[id].status))
    end
  end)

  it("runs by its spawner a run whose arguments an execve would refuse, and the next one directly", function()
    -- one argument over the kernel's limit for one (128 KiB): corral-init's execve says E2BIG
    local code = "import os\nprint(os.getpid(), len(os.environ.get('BIG', '')))"
    local p1, p2 = Z.plan(code), Z.plan(code)
    local args = with_options(p1.args, "--env", "BIG=" .. ("x"):rep(200000))
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, args), { op = "wait" },
      Z.run_step(2, p2.args), { op = "wait" }, { op = "close" } }, zargs())
    p1.close()
    p2.close()
    assert.are.equal("3 200000\n", out.runs["1"].stdout, out.runs["1"].stderr)
    assert.are.equal("2 0\n", out.runs["2"].stdout, out.runs["2"].stderr)
  end)

  it("gives a run with --userns always a user namespace of its own where the zygote has none", function()
    if core.getuid() ~= 0 then pending("as root only: without root the zygote has one") return end
    local p = Z.plan("print(open('/proc/self/uid_map').read().split())")
    local args, skip = {}, false
    for i, a in ipairs(p.args) do
      if p.args[i - 1] == "--net" then a = "host" elseif p.args[i - 1] == "--userns" then a = "always" end
      if a == "--net-join" or a:match("^%-%-deny%-sockets") then skip = a == "--net-join"
      elseif skip then skip = false
      else args[#args + 1] = a end
    end
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, args), { op = "wait" }, { op = "close" } },
      zargs("--net", "host", "--userns", "always"))
    p.close()
    local r = out.runs["1"]
    assert.are.equal("exit 0", how(r.status), r.stderr)
    assert.is_truthy(r.report:find("applied user-namespace", 1, true), r.report)
    assert.are_not.equal("['0', '0', '4294967295']\n", r.stdout)
  end)

  it("starts each run from a spawner that maps nothing of libpython", function()
    local p1, p2 = Z.plan("print('one')"), Z.plan("print('two')")
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p1.args), { op = "wait" }, { op = "maps" },
      Z.run_step(2, p2.args), { op = "wait" }, { op = "close" } }, zargs())
    p1.close()
    p2.close()
    local maps, refused = {}, nil
    for _, ev in ipairs(out.events) do
      if ev.event == "maps" then maps[ev.who], refused = ev.maps, refused or ev.error end
    end
    if refused and core.getuid() ~= 0 then
      pending("the zygote's maps are root's to read (it is not dumpable): " .. refused)
      return
    end
    assert.is_truthy(maps.zygote and maps.spawner, "no maps of the zygote or of its spawner")
    assert.is_truthy(maps.zygote:find("libpython", 1, true), "the zygote maps no libpython: nothing to drop")
    assert.is_falsy(maps.spawner:find("libpython", 1, true), maps.spawner)
    -- and it still starts runs, before and after
    assert.are.equal("one\n", out.runs["1"].stdout)
    assert.are.equal("two\n", out.runs["2"].stdout)
  end)

  it("ends its runs and exits on SIGTERM", function()
    local p = Z.plan("import time\nprint('up', flush=True)\ntime.sleep(30)")
    local t0 = core.hrtime()
    local out = Z.drive({ { op = "ready" }, Z.run_step(1, p.args), { op = "sleep", s = 0.5 },
      { op = "signal", sig = 15 }, { op = "wait", timeout = 3, eof = true } }, zargs())
    p.close()
    assert.are.equal(0, int(out.exit.status))
    assert.is_true(core.hrtime() - t0 < 8)
    assert.are.equal("up\n", out.runs["1"].stdout)
  end)

  it("leaves nothing of a request in the memory the next run is forked from", function()
    local secret = hex(16)
    local p1 = Z.plan("print('one')")
    -- after padding: beyond the end of the next request, which does not overwrite it
    local args = with_options(p1.args, "--env", "PAD=" .. ("x"):rep(4000),
      "--env", "ZYGOTE_SECRET=" .. secret)
    -- the second run scans its own memory for the first one's secret: its first half, followed
    -- by bytes of the secret's SHA-256 (so that the whole secret is nowhere in its own memory)
    local digest = H.sh("printf %s " .. secret .. " | sha256sum"):match("^(%x+)")
    local p2 = Z.plan(([[
import hashlib
half, digest = %q.encode(), %q
found = []
with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
    for line in maps:
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        if not f[1].startswith('rw') or hi - lo > 1 << 28:
            continue
        try:
            mem.seek(lo)
            data = mem.read(hi - lo)
        except OSError:
            continue
        i = data.find(half)
        while i >= 0:
            if hashlib.sha256(data[i:i + 32]).hexdigest() == digest:
                found.append(f[-1] if len(f) > 5 else 'anonymous')
            i = data.find(half, i + 1)
print('found in', found)
]]):format(secret:sub(1, 16), digest))
    local out = Z.drive({
      { op = "ready" },
      Z.run_step(1, args), { op = "wait" },
      Z.run_step(2, p2.args), { op = "wait" },
      { op = "close" },
    }, zargs())
    p1.close()
    p2.close()
    assert.are.equal("one\n", out.runs["1"].stdout)
    assert.are.equal("found in []\n", out.runs["2"].stdout, out.runs["2"].stderr)
  end)

  it("dies with its parent, and its runs with it", function()
    local p = Z.plan("import time\ntime.sleep(30)")
    local script = os.tmpname()
    local cjson = require "cjson"
    local f = assert(io.open(script, "w"))
    f:write(cjson.encode { zygote = zargs(), steps = { { op = "ready" }, Z.run_step(1, p.args), { op = "sleep", s = 0.3 }, { op = "hang" } } })
    f:close()
    -- timeout(1): a driver that never says "hang" ends, so that this read ends too
    local pipe = io.popen("exec timeout 60 " .. Z.python .. " " .. Z.driver .. " " .. script)
    local driver, zygote
    for line in pipe:lines() do
      local ok, ev = pcall(cjson.decode, line)
      if ok and ev.event == "hang" then driver, zygote = int(ev.driver), int(ev.zygote) break end
    end
    assert.is_truthy(driver)
    assert.is_true(leftovers() > 1)
    core.kill(driver, 9)
    pipe:close()
    os.remove(script)
    p.close()
    assert.is_true(H.eventually(function() return leftovers() == 0 end, 10))
    local st = io.open("/proc/" .. zygote .. "/status")
    local state = st and st:read("a"):match("State:%s+(%a)")
    if st then st:close() end
    assert.is_true(state == nil or state == "Z", "the zygote is alive")
  end)
end)
