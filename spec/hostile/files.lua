--- Hostile cases: files. Inherited fds, leaving files for the next run, the code dir, symlink
-- and hardlink tricks against the clean-up, reading host files and other runs' files, writing
-- into host directories. See spec/hostile_spec.lua for the fields.
local assert = require "luassert"
local S = require "hostile.support"

local ERRNO = "import errno\ndef en(e):\n    return errno.errorcode.get(e.errno, str(e.errno))\n"

local function sentinel_check(r, ctx)
  local ok, why = S.sentinel_intact(ctx)
  assert(ok, why)
end

local function remove_sentinel(ctx)
  if ctx.sentinel_dir then require("corral.core").rmtree(ctx.sentinel_dir) end
end

-- Plant links to the host sentinel in the work dir, in every shape the clean-up could follow.
local function plant(ctx)
  return string.format([[
import os, socket
D, F = %s, %s
os.symlink(D, "link-dir")
os.symlink(F, "link-file")
os.symlink(D + "/", "link-slash")
os.makedirs("a/b/c")
os.symlink(D, "a/b/c/deeper")
os.symlink("a/b/c/deeper", "a/relative")
os.symlink("loop1", "loop2")
os.symlink("loop2", "loop1")
os.mkdir("locked")
os.symlink(D, "locked/inside")
os.chmod("locked", 0)
os.chmod("a/b", 0)
os.mkfifo("fifo")
try:
    s = socket.socket(socket.AF_UNIX)   # refused by the seccomp filter (unix-pairs-only)
    s.bind("sock")
except OSError:
    pass
print("planted", flush=True)
]], S.pystr(ctx.sentinel_dir), S.pystr(ctx.sentinel))
end

return {
  {
    name = "no fd but 0, 1 and 2 is open in the program, 0 being /dev/null",
    code = [[
import os, stat
open_fds = []
for fd in range(0, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print("fds", open_fds)
print("stdin", os.readlink("/proc/self/fd/0"))
def pipe(fd):
    m = os.fstat(fd).st_mode
    return stat.S_ISFIFO(m) or stat.S_ISSOCK(m)
print("stdout", pipe(1), "stderr", pipe(2))
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", stdout = { "fds %[0, 1, 2%]\n", "stdin /dev/null", "stdout True stderr True" } },
    needs = { "closed-fds", "no-stdin" },
  },
  {
    name = "files, sockets and a daemon left for the next run are not seen by it",
    code = function(ctx) return "MARKER = " .. S.pystr(ctx.marker) .. "\n" .. [==[
import os, socket, time
places = ["/tmp", "/var/tmp", "/dev/shm", os.getcwd(), os.environ["HOME"]]
def litter():
    for d in places:
        for kind in ("file", "fifo", "sock", "dir"):
            p = os.path.join(d, "%s-left-%s" % (MARKER, kind))
            try:
                if kind == "file":
                    with open(p, "w") as f:
                        f.write("for the next run")
                    os.chmod(p, 0o666)
                elif kind == "fifo":
                    os.mkfifo(p, 0o666)
                elif kind == "sock":
                    socket.socket(socket.AF_UNIX).bind(p)
                else:
                    os.makedirs(p + "/deep/er", 0o777)
            except OSError:
                pass
litter()
if os.fork() == 0:
    os.setsid()
    while True:
        litter()
        time.sleep(0.05)
time.sleep(0.2)
print("littered", sorted(n for n in os.listdir("/tmp") if MARKER in n))
]==] end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "littered %[.*left%-file" },
    needs = { "private-tmp", "work-tmpfs" },
  },
  {
    name = "the code dir cannot be written, replaced or removed",
    code = ERRNO .. [[
import os, sys
code_dir = os.path.dirname(os.path.abspath(sys.argv[0]))   # the code's own directory
main = os.path.join(code_dir, "main.py")
for what, f in (("write", lambda: open(main, "a").write("x")),
                ("chmod", lambda: os.chmod(main, 0o777)),
                ("unlink", lambda: os.unlink(main)),
                ("rename", lambda: os.rename(main, main + ".old")),
                ("create", lambda: open(os.path.join(code_dir, "new.py"), "w")),
                ("chmod dir", lambda: os.chmod(code_dir, 0o777))):
    try:
        f()
        print("DONE", what)
    except OSError as e:
        print("refused", what, en(e))
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = { "refused write", "refused unlink", "refused create" }, stdout_not = "DONE" },
    -- the code dir is bound back read-only over the run's private /tmp (chmod is no write)
    needs = { "private-tmp" },
  },
  {
    name = "from a nested user namespace the private mounts cannot be removed or made writable",
    -- the mounts the launcher made are locked for a namespace the program makes: unmounting /tmp
    -- would bare the host's /tmp, remounting the code dir would make it writable
    code = [[
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def en():
    return errno.errorcode.get(ctypes.get_errno(), "?")
uid, gid = os.getuid(), os.getgid()
r = libc.unshare(0x10000000 | 0x00020000)       # CLONE_NEWUSER | CLONE_NEWNS
print("unshare", r, en() if r else "")
if r == 0:
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write("0 %d 1" % uid)
    open("/proc/self/gid_map", "w").write("0 %d 1" % gid)
code = os.path.dirname(os.path.abspath(sys.argv[0]))
for p in ("/tmp", "/dev/shm", "/var/tmp", os.getcwd(), code, "/proc"):
    r = libc.umount2(p.encode(), 2)                 # MNT_DETACH
    print("UNMOUNTED" if r == 0 else "kept", p, en() if r else "")
r = libc.mount(None, code.encode(), None, 32 | 4096, None)   # MS_REMOUNT | MS_BIND: read-write
print("REMOUNTED" if r == 0 else "still read-only", en() if r else "")
try:
    open(os.path.join(code, "planted.py"), "w")
    print("WROTE into the code dir")
except OSError as e:
    print("code dir", errno.errorcode.get(e.errno))
r = libc.mount(b"proc", b"/proc", b"proc", 0, None)
print("MOUNTED proc" if r == 0 else "no new proc", en() if r else "")
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = { "kept /tmp", "still read%-only", "code dir EROFS" },
               stdout_not = { "UNMOUNTED", "REMOUNTED", "WROTE", "MOUNTED proc" } },
    needs = { "private-tmp", "work-tmpfs" },
  },
  {
    name = "the clean-up does not follow links planted in the work dir",
    setup = S.make_sentinel,
    teardown = remove_sentinel,
    code = plant,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "planted" },
    check = sentinel_check,
  },
  {
    name = "the clean-up does not follow links planted in a work dir on the host",
    -- the host-work variant keeps the work dir on the host: the clean-up walks what was planted
    variant = "host-work",
    prologue = false,
    setup = S.make_sentinel,
    teardown = remove_sentinel,
    code = plant,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "planted" },
    check = sentinel_check,
  },
  {
    -- The run directory's parent (/dev/shm or /tmp) is sticky, but the run directory is the
    -- uid's that made it: the controller's, which a controller that is not root shares with the
    -- program. Its clean-up removes in, out, code/main.py, code and work by name below the path.
    name = "the clean-up does not follow a link put in place of the run directory",
    variant = "exposed",
    prologue = false,
    setup = function(ctx)
      local s = S.make_sentinel(ctx)
      local core = require "corral.core"
      for _, d in ipairs({ "/code", "/work" }) do assert(core.mkdir(s.sentinel_dir .. d, 493)) end
      for _, f in ipairs({ "/in", "/out", "/code/main.py" }) do assert(core.write_file(s.sentinel_dir .. f, "precious", 420)) end
      return s
    end,
    teardown = function(ctx)
      remove_sentinel(ctx)
      local core = require "corral.core"
      local base = require("corral.host").run_dir_base()
      for _, name in ipairs(core.listdir(base) or {}) do
        if name:find(ctx.marker, 1, true) then core.rmtree(base .. "/" .. name) end
      end
    end,
    code = function(ctx) return ERRNO .. string.format([[
import os
top = os.path.dirname(os.getcwd())
try:
    os.rename(top, top + "." + %s)
    os.symlink(%s, top)
    print("replaced")
except OSError as e:
    print("refused", en(e))
]], S.pystr(ctx.marker), S.pystr(ctx.sentinel_dir)) end,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0 },
    check = function(r, ctx)
      local core = require "corral.core"
      local gone = {}
      for _, f in ipairs({ "in", "out", "code/main.py", "code", "work", "keep" }) do
        if not core.lstat(ctx.sentinel_dir .. "/" .. f) then gone[#gone + 1] = f end
      end
      assert(#gone == 0, "the clean-up removed " .. table.concat(gone, ", ") .. " from a host directory")
      -- and the run directory, renamed away, went all the same
      local base = require("corral.host").run_dir_base()
      for _, name in ipairs(core.listdir(base) or {}) do
        assert(not name:find(ctx.marker, 1, true), "the run directory was left at " .. base .. "/" .. name)
      end
    end,
  },
  {
    name = "a hard link to a host file cannot be made from the work dir",
    setup = S.make_sentinel,
    teardown = remove_sentinel,
    code = function(ctx) return ERRNO .. string.format([[
import os
for where in ("hl", "/tmp/hl", "/dev/shm/hl"):
    try:
        os.link(%s, where)
        print("LINKED", where)
    except OSError as e:
        print("refused", where, en(e))
]], S.pystr(ctx.sentinel)) end,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "refused hl", stdout_not = "LINKED" },
    check = sentinel_check,
  },
  {
    name = "a hard link from a work dir on the host leaves the host file unharmed",
    -- As root the run's uid may not link a file it neither owns nor can write
    -- (fs.protected_hardlinks): EPERM. As nobody it owns the sentinel and the link is made; the
    -- clean-up must then remove the link only. Without Landlock, whose REFER right refuses the
    -- link with EXDEV before the clean-up is put to the test.
    variant = "host-work-open",
    prologue = false,
    setup = S.make_sentinel,
    teardown = remove_sentinel,
    code = function(ctx) return ERRNO .. string.format([[
import os
try:
    os.link(%s, "hl")
    print("linked")
except OSError as e:
    print("refused", en(e))
]], S.pystr(ctx.sentinel)) end,
    opts = { timeout = 2 },
    expect = function(ctx)
      return { reason = "exit", returncode = 0, stdout = ctx.root and "refused EPERM" or "linked" }
    end,
    check = sentinel_check,
  },
  {
    name = "the clean-up removes a deep, locked, oddly named tree from a work dir on the host",
    variant = "host-work",
    prologue = false,
    code = [[
import os, socket
base = os.getcwd()
p = base
for i in range(300):
    p = os.path.join(p, "d")
    os.mkdir(p)
open(os.path.join(p, "bottom"), "w").write("x")
for name in ("...", "new\nline", " ", "-rf", "\udcff\udcfe"):
    os.mkdir(os.path.join(base, name))
    open(os.path.join(base, name, "f"), "w").write("x")
os.mkfifo("fifo")
try:
    socket.socket(socket.AF_UNIX).bind("sock")
except OSError:
    pass
q = base
for i in range(300):
    q = os.path.join(q, "d")
for i in range(300):
    os.chmod(q, 0)
    q = os.path.dirname(q)
os.chmod(".", 0o500)
print("built", flush=True)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout = "built" },
  },
  {
    name = "host secrets stay unreadable: /etc/shadow, /root, the kernel's memory",
    code = ERRNO .. [[
import os
for p in ("/etc/shadow", "/etc/gshadow", "/root", "/root/.bash_history", "/proc/kcore", "/dev/mem", "/proc/1/environ"):
    try:
        if os.path.isdir(p):
            print("LISTED", p, os.listdir(p)[:5])
        else:
            print("READ", p, len(open(p, "rb").read(16)))
    except OSError as e:
        print("denied", p, en(e))
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = { "denied /etc/shadow", "denied /root " }, stdout_not = { "LISTED", "READ" } },
  },
  {
    name = "a run finds nothing of a concurrent run's files",
    companion = {
      code = [[
import os, time
SECRET = "sk-companion-secret"
for p in ("note.txt", "/tmp/note.txt", "/dev/shm/note.txt", "/var/tmp/note.txt"):
    open(p, "w").write(SECRET)
    os.chmod(p, 0o644)
time.sleep(1.2)
print("companion done")
]],
      opts = { timeout = 4 },
    },
    code = [[
import glob, os, sys, time
time.sleep(0.3)
mine = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))   # this run's own directory
found = []
for pattern in ("/tmp/corral-*/work/*", "/tmp/corral-*/code/*", "/dev/shm/corral-*/work/*",
                "/dev/shm/corral-*/code/*", "/tmp/*", "/dev/shm/*", "/var/tmp/*",
                "/proc/*/cwd/*", "/proc/*/root/tmp/*"):
    for path in glob.glob(pattern):
        if path.startswith(mine + "/"):
            continue
        try:
            if "sk-companion-secret" in open(path).read():
                found.append(path)
        except OSError:
            pass
print("found", found)
]],
    opts = { timeout = 3 },
    expect = { reason = "exit", stdout_exact = "found []\n" },
    check = function(r, ctx, o)
      assert.are.equal("companion done\n", o.companion.res and o.companion.res.stdout)
    end,
  },
  {
    name = "the controller's source tree is unreadable",
    code = function(ctx) return ERRNO .. string.format([[
import os
T = %s
for p in (T, T + "/lua/corral/init.lua", T + "/spec/hostile_spec.lua", T + "/csrc/corral-launch"):
    try:
        if os.path.isdir(p):
            print("LISTED", p, len(os.listdir(p)))
        else:
            print("READ", p, len(open(p, "rb").read()))
    except OSError as e:
        print("denied", p, en(e))
]], S.pystr(ctx.tree)) end,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "denied", stdout_not = { "LISTED", "READ" } },
    needs = { "filesystem" },
  },
  {
    name = "world-writable host directories cannot be written",
    code = function(ctx)
      local dirs = {}
      for i, d in ipairs(ctx.world_writable) do dirs[i] = S.pystr(d) end
      return ERRNO .. "MARKER = " .. S.pystr(ctx.marker) .. "\n" .. string.format([[
import os
for d in [%s]:
    for kind in ("file", "dir", "fifo"):
        p = os.path.join(d, MARKER + "-" + kind)
        try:
            if kind == "file":
                open(p, "w").write("left on the host")
            elif kind == "dir":
                os.mkdir(p)
            else:
                os.mkfifo(p)
            print("WROTE", p)
        except OSError as e:
            print("denied", p, en(e))
print("tried", %d, "dirs")
]], table.concat(dirs, ", "), #dirs)
    end,
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0, stdout = "tried", stdout_not = "WROTE" },
    needs = { "filesystem" },
  },
}
