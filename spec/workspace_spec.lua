-- A run's files: given before its first instruction (`files`), its arguments (`args`), and the
-- files it leaves handed back (`collect`) whatever ended it, within the policy's caps, without
-- following anything the program planted.
local corral = require "corral"
local policy = require "corral.policy"
local core = require "corral.core"
local H = require "helper"

local function run(code, opts)
  local res, err, ecode = corral.run_python(code, opts)
  assert.is_truthy(res, tostring(err) .. " " .. tostring(ecode))
  return res
end

local function by_path(files)
  local t = {}
  for _, f in ipairs(files or {}) do t[f.path] = f end
  return t
end

-- the default policy (PID namespace, the work dir a tmpfs), warm (the zygote forks the program),
-- and no PID namespace (the work dir on the host, the launcher a subreaper)
local function policies()
  return {
    { "default", "default" },
    { "warm", "warm" },
    { "no-pidns", policy.load("default"):extend { pid_namespace = false, separation = "auto" } },
  }
end

describe("workspace", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() assert(corral.close()) H.assert_clean(snap) end)

  describe("bad options are refused before anything runs, naming the entry", function()
    local cases = {
      { { { path = "/etc/x", content = "" } }, "entry 1 %('/etc/x'%): the path is absolute" },
      { { { path = "a/../b", content = "" } }, "entry 1 %('a/%.%./b'%): the path has a '%.%.' segment" },
      { { { path = "./a", content = "" } }, "has a '%.' segment" },
      { { { path = "a//b", content = "" } }, "has an empty segment" },
      { { { path = "a/", content = "" } }, "has an empty segment" },
      { { { path = "", content = "" } }, "entry 1 %(''%): the path is empty" },
      { { { path = "a\0b", content = "" } }, "holds a NUL byte" },
      { { { path = "a", content = "1" }, { path = "a", content = "2" } }, "entry 2 %('a'%): the path is given twice %(entry 1%)" },
      { { { path = "a", content = "1" }, { path = "a/b", content = "2" } }, "entry 2 %('a/b'%): the path goes through the file of entry 1" },
      { { { path = "x/y/z", content = "1" }, { path = "x/y", content = "2" } }, "entry 1 %('x/y/z'%): the path goes through the file of entry 2" },
      { { { path = "a", content = 5 } }, "content must be a string" },
      { { { path = "a", content = "", mode = 4095 } }, "mode must be 0 to 0777" },
      { { { path = "a", content = "", mode = 1.5 } }, "mode must be a whole number" },
      { { { path = "a", content = "", mode = 1e300 } }, "mode must be 0 to 0777 %(511%), got 1e%+300" },
      { { { path = "a", content = "", mode = 2^63 } }, "mode must be 0 to 0777 %(511%), got 9%.2233720368548e%+18" },
      { { { path = "a", content = "", owner = 0 } }, "unknown field 'owner'" },
      { { x = 1 }, "must be a list" },
      { "a.txt", "must be a list" },
      { { ("a"):rep(300) and { path = ("a"):rep(300), content = "" } }, "a name longer than 255 bytes" },
    }
    for i, c in ipairs(cases) do
      it("files #" .. i, function()
        local ok, err = pcall(corral.run_python, "print(1)", { files = c[1] })
        assert.is_false(ok)
        assert.matches("option 'files'", err)
        assert.matches(c[2], err)
      end)
    end

    it("args and collect", function()
      for _, c in ipairs({
        { { args = { 1 } }, "option 'args' entry 1 must be a string" },
        { { args = { "a\0" } }, "option 'args' entry 1 holds a NUL byte" },
        { { args = "x" }, "option 'args' must be a list" },
        { { collect = { "/etc/*" } }, "option 'collect' entry 1 %('/etc/%*'%) is absolute" },
        { { collect = { "../*" } }, "option 'collect' entry 1 %('%.%./%*'%) has a '%.%.' segment" },
        { { collect = {} }, "option 'collect' is an empty list" },
        { { collect = { "**/**/**/x" } }, "more than two %*%*" },
        { { collect = "*.png" }, "option 'collect' must be true or a list" },
      }) do
        local ok, err = pcall(corral.run_python, "print(1)", c[1])
        assert.is_false(ok)
        assert.matches(c[2], err)
      end
      local args = {}
      for i = 1, 300 do args[i] = "x" end
      local ok, err = pcall(corral.run_python, "print(1)", { args = args })
      assert.is_false(ok)
      assert.matches("option 'args' has 300 entries, more than 256", err)
    end)

    it("more bytes than the policy allows", function()
      local small = policy.load("default"):extend { name = "small-in", max_files_in_mb = 1 }
      local ok, err = pcall(corral.run_python, "print(1)",
        { policy = small, files = { { path = "big", content = ("x"):rep(1048577) } } })
      assert.is_false(ok)
      assert.matches("option 'files' holds 1048577 bytes, over the maximum of 1048576 that policy 'small%-in' allows", err)
    end)

    it("no code and no file of files named by args[1]", function()
      local ok, err = pcall(corral.run_python, nil, { files = { { path = "a.py", content = "" } }, args = { "b.py" } })
      assert.is_false(ok)
      assert.matches("code must be a string, or nil with args%[1%] naming a file of `files`", err)
    end)
  end)

  for _, p in ipairs(policies()) do
    local name, pol = p[1], p[2]

    it("files are there before the first instruction, with their modes, as the program's (" .. name .. ")", function()
      local r = run([[
import os, stat, sys
for p in ("data/in.csv", "tool.sh", "empty"):
    st = os.stat(p)
    print(p, oct(stat.S_IMODE(st.st_mode)), st.st_size, st.st_uid == os.getuid(), st.st_gid == os.getgid())
print(open("data/in.csv", "rb").read())
print(sys.argv[1:])
]], { policy = pol, args = { "one", "two words", "" },
      files = { { path = "data/in.csv", content = "a,b\n1,\0\255\n" }, { path = "tool.sh", content = "#!/bin/sh\n", mode = 493 },
                { path = "empty", content = "", mode = 0 } } })
      assert.are.equal(0, r.returncode, r.stderr)
      assert.are.equal("data/in.csv 0o644 9 True True\ntool.sh 0o755 10 True True\nempty 0o0 0 True True\n"
        .. "b'a,b\\n1,\\x00\\xff\\n'\n['one', 'two words', '']\n", r.stdout)
    end)

    it("args[1] names the file of files that runs (" .. name .. ")", function()
      local r = run(nil, { policy = pol, args = { "pkg/main.py", "x" },
        files = { { path = "pkg/main.py", content = "import sys, helper\nprint(sys.argv, helper.V)\n" },
                  { path = "pkg/helper.py", content = "V = 42\n" } } })
      -- -I: the script's directory is not on sys.path, as `python3 -I pkg/main.py` has it
      assert.matches("ModuleNotFoundError: No module named 'helper'", r.stderr)
      r = run(nil, { policy = pol, args = { "main.py", "x" },
        files = { { path = "main.py", content = "import sys\nprint(sys.argv)\nraise SystemExit(3)\n" } } })
      assert.are.equal("['main.py', 'x']\n", r.stdout)
      assert.are.equal(3, r.returncode)
    end)

    it("collects by glob, links as links, never a fifo or what a link names (" .. name .. ")", function()
      local r = run([[
import os
os.makedirs("out/deep/er")
open("out/a.png", "wb").write(b"\x89PNG")
open("out/deep/er/b.txt", "w").write("b" * 10)
open("skip.txt", "w").write("no")
os.symlink("/etc/shadow", "out/shadow.png")
os.symlink("/etc", "out/etc")
os.mkfifo("out/fifo.png")
os.link("out/a.png", "out/hard.png")
]], { policy = pol, collect = { "out/*.png", "out/**/*.txt", "out/etc/*" } })
      assert.are.equal(0, r.returncode, r.stderr)
      local f = by_path(r.files)
      assert.are.same({ "out/a.png", "out/deep/er/b.txt", "out/hard.png", "out/shadow.png" },
        (function() local t = {} for _, e in ipairs(r.files) do t[#t + 1] = e.path end return t end)())
      assert.are.equal("\137PNG", f["out/a.png"].content)
      assert.are.equal("file", f["out/a.png"].type)
      assert.is_false(f["out/a.png"].truncated)
      assert.are.equal("\137PNG", f["out/hard.png"].content)
      assert.are.equal(("b"):rep(10), f["out/deep/er/b.txt"].content)
      assert.are.equal("link", f["out/shadow.png"].type)
      assert.are.equal("/etc/shadow", f["out/shadow.png"].target)
      assert.is_nil(f["out/shadow.png"].content)
      assert.is_nil(r.files_truncated)
    end)

    it("a collected file that holds what it was given comes back as the very string; a changed one as it is (" .. name .. ")", function()
      local files = {
        { path = "same.txt", content = "same" }, { path = "d/big.bin", content = ("z"):rep(100000) },
        { path = "samesize.txt", content = "abcd" }, { path = "grown.txt", content = "g" },
        { path = "moved.txt", content = "m" }, { path = "chmod.txt", content = "c", mode = 384 },
        { path = "empty", content = "" },
      }
      local r = run([[
import os
open("samesize.txt", "r+").write("ABCD")
open("grown.txt", "a").write("+")
os.rename("moved.txt", "moved2.txt")
open("moved.txt", "w").write("M")
os.chmod("chmod.txt", 0o640)
]], { policy = pol, files = files, collect = { "**" } })
      assert.are.equal(0, r.returncode, r.stderr)
      local f = by_path(r.files)
      local want = { ["same.txt"] = "same", ["d/big.bin"] = files[2].content, ["samesize.txt"] = "ABCD",
                     ["grown.txt"] = "g+", ["moved.txt"] = "M", ["moved2.txt"] = "m", ["chmod.txt"] = "c", empty = "" }
      local n = 0
      for path, content in pairs(want) do
        n = n + 1
        assert.are.equal(content, f[path].content, path)
        assert.are.equal(#content, f[path].size, path)
        assert.is_false(f[path].truncated, path)
      end
      assert.are.equal(n, #r.files)
      assert.are.equal(416, f["chmod.txt"].mode)
      assert.is_true(rawequal(files[1].content, f["same.txt"].content))
      assert.is_true(rawequal(files[2].content, f["d/big.bin"].content))
      assert.is_nil(r.files_truncated)
    end)

    it("collect = true: what the run made or changed, not what it was given (" .. name .. ")", function()
      local r = run([[
open("changed.txt", "a").write("+")
open("new.txt", "w").write("n")
import os
os.rename("moved.txt", "moved2.txt")
]], { policy = pol, collect = true, files = { { path = "same.txt", content = "s" }, { path = "changed.txt", content = "c" },
                                             { path = "moved.txt", content = "m" } } })
      assert.are.equal(0, r.returncode, r.stderr)
      local f = by_path(r.files)
      assert.is_nil(f["same.txt"])
      assert.are.equal("c+", f["changed.txt"].content)
      assert.are.equal("n", f["new.txt"].content)
      assert.are.equal("m", f["moved2.txt"].content)
    end)

    it("collect = true: a given file moved with its directory, or swapped with another's, is sent back (" .. name .. ")", function()
      -- renaming a directory changes the ctime of neither the files in it nor their inodes
      local files = { { path = "d/x", content = "PPPP" }, { path = "e/x", content = "QQQQ" },
                      { path = "m/y", content = "moved" } }
      local r = run([[
import os
os.rename("d", "t"); os.rename("e", "d"); os.rename("t", "e")
os.rename("m", "n")
print(open("d/x").read(), open("e/x").read(), open("n/y").read())
]], { policy = pol, collect = true, files = files })
      assert.are.equal("QQQQ PPPP moved\n", r.stdout, r.stderr)
      local f = by_path(r.files)
      -- each of d/x and e/x holds the other's bytes: changed; n/y is a file the run made
      assert.is_truthy(f["d/x"], "d/x holds QQQQ, not what it was given, and is not sent back")
      assert.are.equal("QQQQ", f["d/x"].content)
      assert.is_truthy(f["e/x"], "e/x holds PPPP, not what it was given, and is not sent back")
      assert.are.equal("PPPP", f["e/x"].content)
      assert.is_truthy(f["n/y"], "n/y, made by the run's rename of m, is not sent back")
      assert.are.equal("moved", f["n/y"].content)
    end)

    it("collects after a timeout, a memory kill and a background writer (" .. name .. ")", function()
      local r = run("open('before.txt', 'w').write('x')\nwhile True:\n    pass\n",
        { policy = pol, timeout = 1, collect = { "*.txt" } })
      assert.are.equal("timeout", r.reason)
      assert.are.equal("x", by_path(r.files)["before.txt"].content)
      r = run("open('before.txt', 'w').write('y')\nb = []\nwhile True:\n    b.append(bytearray(1 << 20))\n",
        { policy = pol, memory_mb = 64, collect = { "*.txt" } })
      assert.are.equal("memory", r.reason)
      assert.are.equal("y", by_path(r.files)["before.txt"].content)
      -- a child that keeps the file growing: killed with the run, before the file is read
      r = run([[
import os, time
if os.fork() == 0:
    with open("grow.txt", "a") as f:
        while True:
            f.write("g" * 1000); f.flush()
time.sleep(0.3)
]], { policy = pol, collect = { "grow.txt" }, file_mb = 64 })
      local g = by_path(r.files)["grow.txt"]
      assert.is_truthy(g, r.stderr)
      -- (read once the writer is dead: its size is final, and what is kept is all of it up to the cap)
      assert.are.equal(math.min(g.size, 8 * 1048576), #g.content)
      assert.are.equal(g.size > 8 * 1048576, g.truncated)
      assert.are.equal(("g"):rep(#g.content), g.content)
    end)
  end

  it("files have their exact modes in a work dir with a default ACL (no-pidns)", function()
    -- the run directory under a directory with a default ACL (user rwx, group and other r-x),
    -- which its work dir inherits and which would take the umask's place: the modes are set
    -- with fchmod, not given to openat
    local base = assert(core.mkdtemp("/tmp/corral-acl-XXXXXX"))
    assert(core.chmod(base, 493))   -- 0755: the run's uid passes
    local _, st = H.sh(H.python .. [[ -c "import os, struct
acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', t, p, 0xffffffff) for t, p in ((1, 7), (4, 5), (0x20, 5)))
os.setxattr(']] .. base .. [[', 'system.posix_acl_default', acl)"]])
    assert.are.equal(0, st)
    local r = run([[
import os, stat
print([oct(stat.S_IMODE(os.stat(p).st_mode)) for p in ("d", "d/x", "d/e/y")])
]], { policy = policy.load("default"):extend { name = "acl", pid_namespace = false, separation = "auto", tmp_dir = base },
      files = { { path = "d/x", content = "x", mode = 511 }, { path = "d/e/y", content = "", mode = 0 } } })
    assert(core.rmtree(base))
    assert.are.equal(0, r.returncode, r.stderr)
    assert.are.equal("['0o755', '0o777', '0o0']\n", r.stdout)
  end)

  it("the records of a run are the supervisor's alone, even to a program with no mount namespace and no Landlock (no-pidns, filesystem off)", function()
    -- What gVisor or a container without user namespaces gives a controller that is not root:
    -- the run directory (its records in and out) is on the host, beside the work dir, and the
    -- program has the controller's uid. (As root the program has a run uid, and the files the
    -- controller made are not its own.)
    local ws = require "corral.workspace"
    local files = { { path = "data.txt", content = "ORIGINAL" } }
    local r = run([[
import os
top = os.path.dirname(os.getcwd())
def rec(path, data):
    return b"\x00".join([b"f", path, b"%d" % len(data), b"644", b"%d" % len(data), data])
try:
    with open(top + "/out.new", "wb") as f:
        f.write(rec(b"../../outside", b"x") + b"".join(rec(b"n%d" % i, b"n") for i in range(500))
                + b"\x00".join([b"end", b"1", b"", b""]))
    os.rename(top + "/out.new", top + "/out")
except OSError as e:
    print("out:", e)
try:
    os.chmod(top + "/in", 0o600)
    data = open(top + "/in", "rb").read()
    with open(top + "/in", "r+b") as f:
        f.seek(data.index(b"ORIGINAL"))
        f.write(b"CHANGED!")
except (OSError, ValueError) as e:
    print("in:", e)
open("data.txt", "w").write("CHANGED!")
]], { policy = policy.load("default"):extend { name = "exposed", pid_namespace = false, filesystem = "off",
  separation = "auto" },
      files = files, collect = { "*" } })
    assert.are.equal(0, r.returncode, r.stderr)
    for _, e in ipairs(r.files) do assert.is_nil(ws.path_problem(e.path), e.path) end
    assert.is_true(#r.files <= 100, #r.files .. " entries")
    local f = by_path(r.files)
    assert.is_truthy(f["data.txt"], r.stdout)
    assert.are.equal("CHANGED!", f["data.txt"].content)
  end)

  -- the default policy's program starts while its files are made (--files-wait-fd); a warm
  -- one's after: either way the code does not run
  for _, name in ipairs({ "default", "warm" }) do
    it("files that do not fit in the work dir end the run before its code, naming the file (" .. name .. ")", function()
      local files = {}
      for i = 1, 1000 do files[i] = { path = "d" .. i .. "/f", content = "x" } end
      local res, err, code = corral.run_python("print('ran')",
        { policy = policy.load(name):extend { name = "small", work_mb = 1 }, files = files })
      assert.is_nil(res)
      assert.are.equal("ENOSPC", code)
      assert.matches("files%-in: d%d+/f: the program's files do not fit in the work dir", err)
    end)
  end

  describe("caps", function()
    local capped = policy.load("default"):extend { name = "capped", max_files_out = 5, max_file_out_mb = 0.001,
                                                   max_files_out_mb = 0.003 }

    it("a file over the per-file cap comes back truncated, the list cut at the total", function()
      local r = run([[
for i in range(4):
    open("f%d" % i, "wb").write(bytes([65 + i]) * 2000)
]], { policy = capped, collect = { "*" } })
      assert.are.equal(4, #r.files)
      local kept = 0
      for _, f in ipairs(r.files) do
        assert.are.equal(2000, f.size)
        assert.is_true(f.truncated)
        assert.is_true(#f.content <= 1048)
        kept = kept + #f.content
      end
      assert.are.equal(math.floor(0.003 * 1048576), kept)
      assert.are.same({ "bytes" }, r.files_truncated)
    end)

    it("a given file left as it was counts against the caps as one sent back", function()
      local small = { { path = "f0", content = ("@"):rep(500) } }
      local r = run("pass", { policy = capped, files = small, collect = { "*" } })
      assert.is_true(rawequal(small[1].content, r.files[1].content))
      assert.is_nil(r.files_truncated)
      -- over the per-file cap: its first bytes, as for a file the run made, until the total
      local files = {}
      for i = 1, 4 do files[i] = { path = "f" .. i, content = string.char(64 + i):rep(2000) } end
      r = run("pass", { policy = capped, files = files, collect = { "*" } })
      assert.are.equal(4, #r.files)
      local kept = 0
      for i, f in ipairs(r.files) do
        assert.are.equal(2000, f.size)
        assert.is_true(f.truncated)
        assert.are.equal(files[i].content:sub(1, #f.content), f.content)
        assert.is_true(#f.content <= 1048)
        kept = kept + #f.content
      end
      assert.are.equal(math.floor(0.003 * 1048576), kept)
      assert.are.same({ "bytes" }, r.files_truncated)
    end)

    it("more files than the cap: the list stops, and says so", function()
      local r = run("for i in range(50):\n    open('f%d' % i, 'w').write('x')\n", { policy = capped, collect = { "*" } })
      assert.are.equal(5, #r.files)
      assert.are.same({ "files" }, r.files_truncated)
    end)

    it("as many tiny files as the work dir holds, a huge file, a deep tree", function()
      local r = run([[
import os
n = 0
try:
    while True:
        open("t%d" % n, "w").close()
        n += 1
except OSError as e:
    print("stopped", e.errno != 0, n > 1000)
]], { collect = { "*" }, timeout = 30 })
      assert.are.equal("stopped True True\n", r.stdout)
      assert.are.equal(100, #r.files)
      assert.are.same({ "files" }, r.files_truncated)
      r = run("open('huge', 'wb').write(b'h' * (60 << 20))\n", { collect = { "huge" }, file_mb = 61, memory_mb = 512 })
      assert.are.equal(0, r.returncode, r.stderr)
      local h = r.files[1]
      assert.are.equal(60 * 1048576, h.size)
      assert.are.equal(8 * 1048576, #h.content)
      assert.is_true(h.truncated)
      r = run([[
import os
p = "."
for i in range(100):
    p = os.path.join(p, "d")
os.makedirs(p)
open(os.path.join(p, "leaf"), "w").write("l")
open(os.path.join("d/d/d", "near"), "w").write("n")
]], { collect = true })
      assert.are.equal(0, r.returncode, r.stderr)
      assert.are.equal("n", by_path(r.files)["d/d/d/near"].content)
      assert.are.same({ "depth" }, r.files_truncated)
    end)

    it("globs that try every split of a deep tree: the walk stops at its cap, not at the timeout", function()
      -- 64 globs of two ** each, never matching, against 20000 names 60 directories down: each
      -- name costs every glob thousands of splits, billions of steps in all (the work dir on
      -- the host: no tmpfs to run out of inodes)
      local nopidns = policy.load("default"):extend { pid_namespace = false, separation = "auto" }
      local globs = {}
      for i = 1, 64 do globs[i] = "**/**/z" .. i end
      local r = run([[
import os
p = "/".join(["d"] * 60)
os.makedirs(p)
for i in range(20000):
    open(os.path.join(p, "f%d" % i), "w").close()
]], { policy = nopidns, collect = globs, timeout = 20, cpu_seconds = 10 })
      assert.are.equal(0, r.returncode, r.stderr)
      assert.are.equal("exit", r.reason)
      assert.are.same({ "scan" }, r.files_truncated)
    end)
  end)

  it("a name that is not UTF-8 comes back as its bytes, and in JSON as base64 beside a readable one", function()
    local r = run("open(b'caf\\xe9.txt', 'w').write('c')\n", { collect = { "*.txt" } })
    assert.are.equal("caf\233.txt", r.files[1].path)
    local obj = require("corral.result").object(r, nil, nil, {})
    assert.are.equal("caf\239\191\189.txt", obj.files[1].path)
    assert.are.equal(core.b64encode("caf\233.txt"), obj.files[1].path_b64)
    assert.are.equal(core.b64encode("c"), obj.files[1].content)
  end)

  it("a run without files or collect has no files field", function()
    local r = run("print(1)\n", {})
    assert.is_nil(r.files)
    assert.is_nil(r.files_truncated)
  end)
end)
