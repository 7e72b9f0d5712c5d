-- Landlock in corral-launch (--landlock, --fs-ro, --fs-rw, --deny-tcp, --scope), each protection
-- attacked by a real Python program, with the same attack run without it to show it can succeed.
-- The kernel's degradations (no Landlock, an older ABI, restrict_self refused) are played with a
-- seccomp filter (spec/fake_landlock.py) on this kernel, which has them all.
local H = require "helper"
local core = require "corral.core"
local host = require "corral.host"
local report = require "corral.report"

local L = "./csrc/corral-launch"
local FAKE = H.python .. " spec/fake_landlock.py "

-- What Python 3.11 (Debian 12) needs: --fs-ro /usr alone starts it and runs the standard library.
-- /lib, /lib64 and /bin are symlinks into /usr (merged /usr) and a rule follows them; nothing in
-- /etc is needed (without /etc/ld.so.cache the loader searches its default directories,
-- /etc/localtime points into /usr/share/zoneinfo, a failed getpwuid is ignored); os.urandom and
-- random use getrandom(2), not /dev/urandom. /dev/null read-write is for subprocess.DEVNULL and
-- the like, not for start-up.
local PY_FS = "--fs-ro /usr --fs-rw /dev/null"

-- Prepended to every program: t(name, f) prints "name ok" or "name ERRNO-NAME".
local PRELUDE = [[
import errno, os, socket, subprocess, sys
D = sys.argv[1] if len(sys.argv) > 1 else ""
def t(name, f):
    try:
        f()
        print(name, "ok", flush=True)
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno), flush=True)
]]

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local read_file = H.try_read

--- Runs `code` (after PRELUDE) under the launcher with `opts` and the program arguments `...`.
-- `prefix` (optional) goes before the launcher (the fake-Landlock wrapper).
-- @return {rep = parsed report, text = the report, out = program output, t = name → result,
-- status = launcher exit code}
local function launch(dir, opts, code, prefix, ...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = q(tostring(a)) end
  local rep_path = dir .. "/report"
  local out = H.sh((prefix or "") .. L .. " --report-fd 3 " .. opts .. " -- " .. H.python .. " -I -c " ..
    q(PRELUDE .. code) .. " " .. table.concat(args, " ") .. " 3>" .. rep_path .. "; echo \"<$?>\"")
  local status = tonumber(out:match("<(%d+)>$"))
  out = out:gsub("\n?<%d+>$", "")
  local text = read_file(rep_path) or ""
  os.remove(rep_path)
  local r = { rep = report.parse(text), text = text, out = out, t = {}, status = status }
  for line in out:gmatch("[^\n]+") do
    local name, res = line:match("^([%w%-]+) (%w+)$")
    if name then r.t[name] = res end
  end
  return r
end

local function refused_lines(text, name)
  local lines = {}
  for line in text:gmatch("[^\n]+") do
    if line:find("^refused " .. name:gsub("%-", "%%-") .. " ") then lines[#lines + 1] = line end
  end
  return lines
end

--- A process outside the run: a TCP listener on 127.0.0.1 and an abstract unix socket listener,
-- both with a backlog (connect() completes without accept). Returns the handle, port, pid, name.
local LISTENER = [[
import os, socket, time
t = socket.socket(); t.bind(("127.0.0.1", 0)); t.listen(16)
name = "corral-landlock-spec-%d" % os.getpid()
u = socket.socket(socket.AF_UNIX); u.bind("\0" + name); u.listen(16)
print(t.getsockname()[1], os.getpid(), name, flush=True)
time.sleep(60)
]]
local function start_listener()
  local f = assert(io.popen("exec " .. H.python .. " -I -c " .. q(LISTENER), "r"))
  local port, pid, name = f:read("l"):match("^(%d+) (%d+) (%S+)$")
  return f, tonumber(port), tonumber(pid), name
end
local function stop_listener(f, pid)
  core.kill(pid, 9)
  f:close()
end
local function state(pid) return H.sh("ps -o stat= -p " .. pid) end   -- "" when gone

describe("corral-launch --landlock", function()
  local snap, dir
  before_each(function()
    snap = H.snapshot()
    dir = core.mkdtemp("/tmp/corral-ll-XXXXXX")
    for _, d in ipairs({ "ro", "rw", "rw2", "out" }) do assert(core.mkdir(dir .. "/" .. d, 493)) end
    assert(core.write_file(dir .. "/ro/f", "listed\n", 420))
    assert(core.write_file(dir .. "/rw/g", "mine\n", 420))
    assert(core.write_file(dir .. "/out/h", "host file\n", 420))
    H.sh("cp /bin/true " .. dir .. "/out/true && cp /bin/true " .. dir .. "/ro/true")
  end)
  after_each(function()
    assert(core.rmtree(dir))
    H.assert_clean(snap)
  end)

  local function fs() return PY_FS .. " --fs-ro " .. dir .. "/ro --fs-rw " .. dir .. "/rw --fs-rw " .. dir .. "/rw2" end

  for _, ns in ipairs({ "--no-pidns", "--pidns" }) do
    it("runs Python under --landlock require with " .. ns .. " and reports the ABI", function()
      local abi = tonumber(H.sh(L .. " --probe"):match("probe landlock yes abi (%d+)"))
      assert.is_truthy(abi and abi >= 1, "no Landlock on this host")
      local r = launch(dir, ns .. " --landlock require " .. fs(), [[
import json, decimal, sqlite3, hashlib, tempfile, time, random
print(json.dumps([str(decimal.Decimal(1) / 7)[:5], time.gmtime(0).tm_year, len(os.urandom(4))]))
t("devnull", lambda: subprocess.run(["/bin/true"], stdout=subprocess.DEVNULL, check=True))
]])
      assert.are.equal(0, r.status, r.out .. r.text)
      assert.is_truthy(r.out:find('["0.142", 1970, 4]', 1, true), r.out)
      assert.are.equal("ok", r.t.devnull)
      assert.are.equal(tostring(math.min(abi, 7)), r.rep.applied.filesystem)
      assert.is_nil(next(r.rep.refused), r.text)
      assert.is_nil(r.rep.applied["landlock-net"])
    end)
  end

  it("denies reading /etc/shadow and host files outside the lists, but not the listed ones", function()
    local code = [[
t("shadow", lambda: open("/etc/shadow").read())
t("host", lambda: open(D + "/out/h").read())
t("rootdir", lambda: os.listdir("/"))
t("listed", lambda: open(D + "/ro/f").read())
t("listeddir", lambda: os.listdir(D + "/ro"))
t("usr", lambda: open("/usr/lib/os-release").read())
]]
    local r = launch(dir, "--landlock auto " .. fs(), code, nil, dir)
    assert.are.equal("0", tostring(r.status), r.out)
    assert.are.same({ shadow = "EACCES", host = "EACCES", rootdir = "EACCES", listed = "ok", listeddir = "ok", usr = "ok" }, r.t)
    local without = launch(dir, "", code, nil, dir)
    -- the same attack without Landlock: only the file permissions stand (nobody cannot read shadow)
    assert.are.same({ shadow = H.root and "ok" or "EACCES", host = "ok", rootdir = "ok", listed = "ok", listeddir = "ok", usr = "ok" }, without.t)
  end)

  it("denies writing in an --fs-ro directory and allows it in an --fs-rw one", function()
    local code = [[
t("ro-create", lambda: open(D + "/ro/new", "w"))
t("ro-append", lambda: open(D + "/ro/f", "a").write("x"))
t("ro-truncate", lambda: os.truncate(D + "/ro/f", 0))
t("ro-unlink", lambda: os.unlink(D + "/ro/f"))
t("ro-mkdir", lambda: os.mkdir(D + "/ro/d"))
t("ro-fifo", lambda: os.mkfifo(D + "/ro/p"))
t("tmp-create", lambda: open(D + "/out/new", "w"))
t("rw-create", lambda: open(D + "/rw/new", "w").write("written"))
t("rw-truncate", lambda: os.truncate(D + "/rw/g", 1))
t("rw-mkdir", lambda: os.mkdir(D + "/rw/d"))
t("rw-unlink", lambda: (open(D + "/rw2/x", "w").close(), os.unlink(D + "/rw2/x")))
]]
    local r = launch(dir, "--landlock require " .. fs(), code, nil, dir)
    assert.are.same({
      ["ro-create"] = "EACCES", ["ro-append"] = "EACCES", ["ro-truncate"] = "EACCES", ["ro-unlink"] = "EACCES",
      ["ro-mkdir"] = "EACCES", ["ro-fifo"] = "EACCES", ["tmp-create"] = "EACCES",
      ["rw-create"] = "ok", ["rw-truncate"] = "ok", ["rw-mkdir"] = "ok", ["rw-unlink"] = "ok",
    }, r.t)
    assert.are.equal("listed\n", read_file(dir .. "/ro/f"))
    assert.is_false(core.exists(dir .. "/ro/new") or core.exists(dir .. "/out/new"))
    assert.are.equal("written", read_file(dir .. "/rw/new"))
    -- without Landlock the same writes in ro/ succeed
    local without = launch(dir, "", code, nil, dir)
    assert.are.equal("ok", without.t["ro-create"])
    assert.are.equal("ok", without.t["ro-truncate"])
    assert.is_true(core.exists(dir .. "/ro/new"))
  end)

  it("denies executing a binary outside the lists", function()
    local code = [[
t("out", lambda: subprocess.run([D + "/out/true"], check=True))
t("listed", lambda: subprocess.run([D + "/ro/true"], check=True))
t("usr", lambda: subprocess.run(["/bin/sh", "-c", "exit 0"], check=True))
t("execv", lambda: os.execv(D + "/out/true", ["true"]))
]]
    local r = launch(dir, "--landlock require " .. fs(), code, nil, dir)
    assert.are.same({ out = "EACCES", listed = "ok", usr = "ok", execv = "EACCES" }, r.t)
    local without = launch(dir, "", code, nil, dir)
    assert.are.equal("ok", without.t.out)
    assert.are.equal(0, without.status)   -- execv replaced Python with true
  end)

  it("refuses link, rename and symlink tricks across directories (REFER)", function()
    local code = [[
t("link-ro-to-rw", lambda: os.link(D + "/ro/f", D + "/rw/f"))
t("rename-ro-to-rw", lambda: os.rename(D + "/ro/f", D + "/rw/f"))
t("rename-rw-to-ro", lambda: os.rename(D + "/rw/g", D + "/ro/g"))
t("rename-rw-to-out", lambda: os.rename(D + "/rw/g", D + "/out/g"))
t("rename-dir-out", lambda: os.rename(D + "/rw", D + "/out/rw"))
t("symlink", lambda: os.symlink(D + "/out/h", D + "/rw/ln"))
t("via-symlink", lambda: open(D + "/rw/ln").read())
t("rename-rw-to-rw2", lambda: os.rename(D + "/rw/g", D + "/rw2/g"))
t("link-rw2-to-rw", lambda: os.link(D + "/rw2/g", D + "/rw/g2"))
]]
    local r = launch(dir, "--landlock require " .. fs(), code, nil, dir)
    assert.are.same({
      ["link-ro-to-rw"] = "EXDEV", ["rename-ro-to-rw"] = "EACCES", ["rename-rw-to-ro"] = "EACCES",
      ["rename-rw-to-out"] = "EACCES", ["rename-dir-out"] = "EACCES", symlink = "ok", ["via-symlink"] = "EACCES",
      ["rename-rw-to-rw2"] = "ok", ["link-rw2-to-rw"] = "ok",
    }, r.t)
    assert.are.equal("listed\n", read_file(dir .. "/ro/f"))
    assert.are.equal("mine\n", read_file(dir .. "/rw/g2"))
    -- without Landlock the hard link of the read-only file into rw/ works
    local without = launch(dir, "", [[t("link-ro-to-rw", lambda: os.link(D + "/ro/f", D + "/rw/f"))]], nil, dir)
    assert.are.equal("ok", without.t["link-ro-to-rw"])
  end)

  it("denies TCP connect and bind with --deny-tcp, on the host's network", function()
    local f, port, pid = start_listener()
    local code = [[
port = int(sys.argv[2])
t("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=5).close())
t("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
t("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(("127.0.0.1", port)))
]]
    local ok, err = pcall(function()
      local r = launch(dir, "--net host --landlock require --deny-tcp " .. fs(), code, nil, dir, port)
      assert.are.same({ connect = "EACCES", bind = "EACCES", udp = "ok" }, r.t)
      assert.is_true(r.rep.applied["landlock-net"])
      local without = launch(dir, "--net host --landlock require " .. fs(), code, nil, dir, port)
      assert.are.same({ connect = "ok", bind = "ok", udp = "ok" }, without.t)
      assert.is_nil(without.rep.applied["landlock-net"])
    end)
    stop_listener(f, pid)
    assert(ok, err)
  end)

  it("keeps --scope runs from abstract unix sockets and signals outside the run", function()
    local f, _, pid, name = start_listener()
    local code = [[
import signal
pid, name = int(sys.argv[2]), sys.argv[3]
t("unix", lambda: socket.socket(socket.AF_UNIX).connect("\0" + name))
t("kill0", lambda: os.kill(pid, 0))
t("kill-parent", lambda: os.kill(os.getppid(), 0))
c = os.fork()
if c == 0:
    signal.pause()
    os._exit(0)
t("kill-own-child", lambda: os.kill(c, signal.SIGTERM))
print("child", "signal%d" % os.WTERMSIG(os.waitpid(c, 0)[1]))
t("kill", lambda: os.kill(pid, signal.SIGTERM))
]]
    local ok, err = pcall(function()
      local r = launch(dir, "--no-pidns --landlock require --scope " .. fs(), code, nil, dir, pid, name)
      assert.are.same({ unix = "EPERM", kill0 = "EPERM", ["kill-parent"] = "EPERM", ["kill-own-child"] = "ok",
        child = "signal15", kill = "EPERM" }, r.t)
      assert.is_true(r.rep.applied["scoped-signals"])
      assert.is_true(r.rep.applied["scoped-abstract-unix"])
      assert.is_truthy(state(pid):find("^S"), "the listener was signalled")
      -- without --scope the same program reaches the socket and kills the listener
      local without = launch(dir, "--no-pidns --landlock require " .. fs(), code, nil, dir, pid, name)
      assert.are.same({ unix = "ok", kill0 = "ok", ["kill-parent"] = "ok", ["kill-own-child"] = "ok",
        child = "signal15", kill = "ok" }, without.t)
      assert.is_true(H.eventually(function() return state(pid):find("^Z") ~= nil or state(pid) == "" end))
    end)
    stop_listener(f, pid)
    assert(ok, err)
  end)

  for _, mode in ipairs({ "auto", "require" }) do
    it("reports a missing --fs-ro path under --landlock " .. mode .. " and runs", function()
      local missing = dir .. "/nonexistent"
      local r = launch(dir, "--landlock " .. mode .. " " .. fs() .. " --fs-ro " .. missing, [[
t("listed", lambda: open(D + "/ro/f").read())
t("host", lambda: open(D + "/out/h").read())
]], nil, dir)
      assert.are.equal(0, r.status, r.text)
      assert.are.same({ "refused fs-path ENOENT " .. missing .. ": does not exist; nothing is granted there" },
        refused_lines(r.text, "fs-path"))
      assert.are.same({ listed = "ok", host = "EACCES" }, r.t)
      assert.is_truthy(r.rep.applied.filesystem)
    end)
  end

  it("prints the ABI in the probe", function()
    local abi = H.sh(L .. " --probe"):match("probe landlock ([^\n]*)")
    assert.is_truthy(abi and abi:match("^yes abi %d+$"), abi)
    assert.are.equal("probe landlock yes abi 3", H.sh(FAKE .. "abi=3 " .. L .. " --probe"):match("probe landlock [^\n]*"))
    assert.is_truthy(H.sh(FAKE .. "ENOSYS " .. L .. " --probe"):find("probe landlock no ENOSYS this kernel has no Landlock", 1, true))
  end)

  it("opens the listed paths before it takes --uid, and confines the uid", function()
    if not H.root then pending("--uid needs root") return end
    local uid = assert(host.take_uid(60000, 60999))
    local ok, err = pcall(function()
      -- dir/priv is root's alone: the run uid could not open dir/priv/ro, the launcher can
      assert(core.chmod(dir, 493))
      assert(core.mkdir(dir .. "/priv", 448))
      assert(core.mkdir(dir .. "/priv/ro", 493))
      local r = launch(dir, "--uid " .. uid .. " --gid " .. uid .. " --landlock require " .. fs() ..
        " --fs-ro " .. dir .. "/priv/ro", [[
print("uid", os.getuid())
t("host", lambda: open(D + "/out/h").read())
t("usr", lambda: open("/usr/lib/os-release").read())
]], nil, dir)
      assert.are.equal(0, r.status, r.text)
      assert.are.same({}, refused_lines(r.text, "fs-path"))
      assert.are.equal(tostring(uid), r.rep.applied.uid)
      assert.are.same({ uid = tostring(uid), host = "EACCES", usr = "ok" }, r.t)
      -- the run uid itself may read the host file: only Landlock stopped it
      local without = launch(dir, "--uid " .. uid .. " --gid " .. uid, [[t("host", lambda: open(D + "/out/h").read())]], nil, dir)
      assert.are.equal("ok", without.t.host)
    end)
    host.release_uid(uid)
    assert(ok, err)
  end)

  it("denies everything, PROGRAM included, when no path is listed; --fs-rw / opens it all", function()
    local r = launch(dir, "--landlock require --deny-tcp", [[print("ran")]])
    assert.are.equal(126, r.status)
    assert.are.equal("exec EACCES", r.rep.fatal.step .. " " .. r.rep.fatal.errno)
    assert.is_truthy(r.rep.fatal.message:find("--fs-ro/--fs-rw", 1, true), r.rep.fatal.message)
    assert.are.equal("", r.out)
    local open = launch(dir, "--landlock require --deny-tcp --fs-rw /", [[t("host", lambda: open(D + "/out/h").read())]], nil, dir)
    assert.are.same({ host = "ok" }, open.t)
    assert.is_true(open.rep.applied["landlock-net"])
  end)

  -- An older kernel is asked only for the rights its ABI knows (a real one rejects the others
  -- with EINVAL); what they leave out is allowed, as `applied filesystem N` says.
  for _, c in ipairs({
    { abi = 1, truncate = "ok", rename = "EXDEV" },     -- REFER unknown: denied implicitly
    { abi = 2, truncate = "ok", rename = "ok" },        -- TRUNCATE unknown: not controlled
    { abi = 3, truncate = "EACCES", rename = "ok" },
  }) do
    it("handles the filesystem rights of ABI " .. c.abi .. " only", function()
      local r = launch(dir, "--landlock require " .. fs(), [[
t("truncate", lambda: os.truncate(D + "/ro/f", 1))
t("rename", lambda: os.rename(D + "/rw/g", D + "/rw2/g"))
]], FAKE .. "abi=" .. c.abi .. " ", dir)
      assert.are.equal(tostring(c.abi), r.rep.applied.filesystem, r.text)
      assert.are.same({ truncate = c.truncate, rename = c.rename }, r.t)
    end)
  end

  -- The kernel's degradations, played by spec/fake_landlock.py.
  local degraded = {
    { "ENOSYS", "auto", "--deny-tcp --scope", refused = { filesystem = "ENOSYS", ["landlock-net"] = "ENOSYS",
      ["scoped-signals"] = "ENOSYS", ["scoped-abstract-unix"] = "ENOSYS" }, host = "ok" },
    { "EOPNOTSUPP", "auto", "", refused = { filesystem = "EOPNOTSUPP" }, host = "ok", message = "lsm=" },
    { "ENOSYS", "require", "", fatal = "filesystem ENOSYS" },
    { "EOPNOTSUPP", "require", "--deny-tcp", fatal = "filesystem EOPNOTSUPP" },
    { "abi=3", "auto", "--deny-tcp --scope", applied = "3", host = "EACCES", refused = { ["landlock-net"] = "EOPNOTSUPP",
      ["scoped-signals"] = "EOPNOTSUPP", ["scoped-abstract-unix"] = "EOPNOTSUPP" }, message = "Landlock ABI 3 < 4: TCP" },
    { "abi=3", "require", "--deny-tcp", fatal = "landlock-net EOPNOTSUPP" },
    { "abi=5", "require", "--deny-tcp --scope", fatal = "landlock-scope EOPNOTSUPP" },
    { "abi=5", "require", "--deny-tcp", applied = "5", host = "EACCES", refused = {} },
    { "restrict=EPERM", "auto", "--scope", refused = { filesystem = "EPERM", ["scoped-signals"] = "EPERM",
      ["scoped-abstract-unix"] = "EPERM" }, host = "ok" },
    { "restrict=EPERM", "require", "", fatal = "filesystem EPERM" },
    { "abi=3,restrict=EPERM", "auto", "--deny-tcp", refused = { filesystem = "EPERM", ["landlock-net"] = "EOPNOTSUPP" },
      host = "ok" },
  }
  for _, c in ipairs(degraded) do
    local fake, mode, extra = c[1], c[2], c[3]
    it("with a kernel that says " .. fake .. ", --landlock " .. mode .. " " .. extra .. " " ..
       (c.fatal and "runs nothing" or "reports what is missing and runs"), function()
      local r = launch(dir, "--landlock " .. mode .. " " .. extra .. " " .. fs(),
        [[t("host", lambda: open(D + "/out/h").read())]], FAKE .. fake .. " ", dir)
      if c.fatal then
        assert.are.equal(125, r.status, r.text)
        assert.are.equal(c.fatal, r.rep.fatal.step .. " " .. r.rep.fatal.errno)
        assert.are.equal("", r.out)
        assert.is_nil(r.rep.pid)
        return
      end
      assert.are.equal(0, r.status, r.text)
      assert.are.equal(c.host, r.t.host)
      assert.are.equal(c.applied, r.rep.applied.filesystem)
      local refused = {}
      for name, v in pairs(r.rep.refused) do
        refused[name] = v.errno
        assert.are.equal(1, #refused_lines(r.text, name), r.text)
      end
      assert.are.same(c.refused, refused)
      if c.message then assert.is_truthy(r.text:find(c.message, 1, true), r.text) end
      if c.applied and extra:find("--deny-tcp", 1, true) then
        assert.are.equal(tonumber(c.applied) >= 4 or nil, r.rep.applied["landlock-net"])
      end
    end)
  end

  -- --separate: the program is walled off from the controller and other runs by a uid of its own,
  -- or by Landlock's filesystem rules with a PID namespace (the signal scope alone leaves
  -- prlimit() and setpriority() on a process of the same uid). Without --uid the program has the
  -- launcher's uid (the controller's): each case reads a file of that uid outside the lists, and
  -- signals the launcher's parent (not there at all within a PID namespace).
  local uid = tonumber((H.sh("id -u"):match("%d+")))
  local separate = {
    { "", "--pidns --landlock require", "require", applied = true, host = "EACCES", signal = "ESRCH" },
    { "", "--no-pidns --landlock require --scope", "require", fatal = true },
    { "", "--no-pidns --landlock require --scope", "auto", refused = true, host = "EACCES", signal = "EPERM" },
    { "ENOSYS", "--pidns --landlock auto", "require", fatal = true },
    { "ENOSYS", "--pidns --landlock auto", "auto", refused = true, host = "ok", signal = "ESRCH" },
    { "", "--no-pidns --landlock require --scope", "off", host = "EACCES", signal = "EPERM" },
  }
  if uid == 0 then
    -- a uid of its own: the controller's files and processes are another user's
    separate[#separate + 1] = { "ENOSYS", "--no-pidns --landlock auto --uid 60123 --gid 60123", "require",
      applied = true, host = "EACCES", signal = "EPERM", hostmode = 384 }
  end
  for _, c in ipairs(separate) do
    local fake, extra, mode = c[1], c[2], c[3]
    it("--separate " .. mode .. " with " .. (fake ~= "" and fake or "this kernel") .. " " .. extra .. ": "
       .. (c.fatal and "runs nothing" or c.refused and "says the run is not walled off, and runs"
           or c.applied and "the run is walled off" or "says nothing"), function()
      if c.hostmode then assert(core.chmod(dir .. "/out/h", c.hostmode)) end
      local r = launch(dir, extra .. (mode ~= "off" and " --separate " .. mode or "") .. " " .. fs(),
        [[
t("host", lambda: open(D + "/out/h").read())
t("signal", lambda: os.kill(int(sys.argv[2]), 0))
]], fake ~= "" and (FAKE .. fake .. " ") or nil, dir, core.getpid())
      if c.fatal then
        assert.are.equal(125, r.status, r.text)
        assert.are.equal("separation EOPNOTSUPP", r.rep.fatal.step .. " " .. r.rep.fatal.errno)
        assert.is_truthy(r.rep.fatal.message:find("controller's uid", 1, true), r.text)
        assert.are.equal("", r.out)
        assert.is_nil(r.rep.pid)
        return
      end
      assert.are.equal(0, r.status, r.text)
      assert.are.same({ host = c.host, signal = c.signal }, r.t)
      assert.are.equal(c.applied, r.rep.applied.separation, r.text)
      assert.are.equal(c.refused and "EOPNOTSUPP" or nil, r.rep.refused.separation and r.rep.refused.separation.errno,
        r.text)
    end)
  end
end)
