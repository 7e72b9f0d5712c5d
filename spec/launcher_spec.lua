-- corral-launch run by hand: usage, probe, exit-status mirroring, the report.
local H = require "helper"
local report = require "corral.report"
local core = require "corral.core"

local L = "./csrc/corral-launch"

local function launch(args)
  return H.sh(L .. " " .. args .. "; echo \"<$?>\"")
end
local function status(out) return tonumber(out:match("<(%d+)>$")) end

describe("corral-launch", function()
  it("documents its options with --help", function()
    local out = launch("--help")
    assert.are.equal(0, status(out))
    for _, opt in ipairs({ "--report-fd", "--pidns", "--net", "--uid", "--rlimit", "--env", "--chdir", "--probe" }) do
      assert.is_truthy(out:find(opt, 1, true), opt)
    end
  end)

  local bad = {
    { "--frob -- /bin/true", "--frob" },
    { "--rlimit cpu -- /bin/true", "cpu" },
    { "--rlimit bogus=1 -- /bin/true", "bogus" },
    { "--rlimit cpu=abc -- /bin/true", "abc" },
    { "--net sideways -- /bin/true", "sideways" },
    { "--report-fd", "--report-fd" },
    { "--", "PROGRAM" },
    { "--net-join 123 -- /bin/true", "--net new|require" },
    { "--net new --net-join 0 -- /bin/true", "out of range" },
    { "--seccomp-cache /tmp -- /bin/true", "--seccomp auto|require" },
    { "--seccomp auto --seccomp-cache tmp -- /bin/true", "absolute" },
    { "--hold-net --pidns", "--hold-net takes only" },
    { "--hold-net -- /bin/true", "--hold-net takes only" },
    { "--probe --hold-net", "--probe" },
    { "--held -- /bin/true", "--held goes with --hold-net" },
    { "--prestart --pidns -- /bin/true", "--prestart needs --pidns and --report-fd" },
    { "--prestart --report-fd 3 -- /bin/true", "--prestart needs --pidns and --report-fd" },
    -- a name of /proc/sys/user/max_*, never a path
    { "--user-max ../../kernel/x=1 -- /bin/true", "not a name of [a-z_]" },
    { "--user-max inotify_instances -- /bin/true", "is not NAME=VALUE" },
    { "--user-max inotify_instances=2147483648 -- /bin/true", "out of range" },
    { "--deny-pipe-growth -- /bin/true", "--seccomp auto|require" },
    { "--rlimit msgqueue=x -- /bin/true", "x" },
    { "--work-at /home/w -- /bin/true", "--work-at needs --work-tmpfs" },
    { "--work-tmpfs 1024 --chdir /tmp --work-at home -- /bin/true", "not an absolute path" },
    { "--work-tmpfs 1024 --chdir /tmp --work-at /home/../etc -- /bin/true", "'..' segment" },
    { "--work-tmpfs 1024 --chdir /tmp --work-at /home/w/ -- /bin/true", "empty" },
    { "--relay -- /bin/true", "--relay takes --status-fd N" },
    { "--relay --status-fd 4 --pidns -- /bin/true", "--relay takes --status-fd N" },
    { "--relay --status-fd 4 -- /bin/true", "--status-fd 4 is not an open file descriptor" },
    { "--status-fd 2 -- /bin/true", "out of range" },
    { "--report-fd 3 --status-fd 3 -- /bin/true 3>/dev/null", "--status-fd 3 is the report fd" },
    { "--code-at /run/code -- /bin/true", "--code-at needs --ro-bind" },
    { "--files-wait-fd 4 -- /bin/true", "--files-wait-fd 4 needs --files-in" },
    { "--files-wait-fd 2 --files-in /x --chdir /tmp -- /bin/true", "out of range" },
    { "--report-fd 3 --files-wait-fd 3 --files-in /x --chdir /tmp -- /bin/true 3>/dev/null", "is not the report fd" },
    { "--status-fd 5 --files-wait-fd 4 --files-in /x --chdir /tmp -- /bin/true", "goes without --status-fd" },
    { "--unlink-files -- /bin/true", "--unlink-files needs --files-in or --collect-to" },
    { "--ro-bind /usr --code-at run/corral -- /bin/true", "not an absolute path" },
    { "--ro-bind /usr --code-at /run/./corral -- /bin/true", "'.'" },
    { "--ro-bind /usr --work-tmpfs 1024 --chdir /tmp --work-at /home/s --code-at /home/s/c -- /bin/true", "overlap" },
  }
  for _, c in ipairs(bad) do
    it("exits 2 naming what is wrong in '" .. c[1] .. "'", function()
      local out = launch(c[1])
      assert.are.equal(2, status(out))
      assert.is_truthy(out:find(c[2], 1, true), out)
    end)
  end

  it("exits with the program's code and mirrors a signal", function()
    assert.are.equal(7, status(launch("--pidns -- /bin/sh -c 'exit 7'")))
    assert.are.equal(128 + 11, status(launch("--pidns -- /bin/sh -c 'kill -SEGV $$'")))
    assert.are.equal(128 + 11, status(launch("--no-pidns -- /bin/sh -c 'kill -SEGV $$'")))
  end)

  -- a wrapper (bwrap) reports its program's death by signal N as exit 128+N: the relay inside it
  -- says on --status-fd how the program ended
  describe("with --status-fd, a wrapper running --relay", function()
    local dir, wrapper
    setup(function()
      dir = H.sh("mktemp -d /tmp/corral-relay.XXXXXX"):gsub("%s+$", "")
      wrapper = dir .. "/wrapper.sh"
      local f = assert(io.open(wrapper, "w"))
      -- the relay, then exit as it did: 128+N for its program's signal N
      f:write('relay=$1; shift; "$relay" --relay --status-fd 4 -- "$@"; exit $?\n')
      f:close()
      H.sh("chmod -R a+rX " .. dir)
    end)
    teardown(function() H.sh("rm -rf " .. dir) end)
    local relay = H.sh("readlink -f " .. L):gsub("%s+$", "")
    local function wrapped(ns, prog)
      local out = launch("--report-fd 3 --status-fd 4 " .. ns .. " -- /bin/sh " .. wrapper .. " " .. relay
        .. " /bin/sh -c '" .. prog .. "' 3>&1")
      return report.parse(out), out
    end

    for _, ns in ipairs({ "--pidns", "--no-pidns" }) do
      it("reports the program's signal, not the wrapper's 128+N (" .. ns .. ")", function()
        local rep, out = wrapped(ns, "kill -SEGV $$")
        assert.are.same({ kind = "signal", code = 11 }, rep.status, out)
        assert.are.equal(128 + 11, status(out))
        rep, out = wrapped(ns, "kill -KILL $$")
        assert.are.same({ kind = "signal", code = 9 }, rep.status, out)
      end)

      it("reports an exit 139 as exit 139 (" .. ns .. ")", function()
        local rep, out = wrapped(ns, "exit 139")
        assert.are.same({ kind = "exit", code = 139 }, rep.status, out)
      end)

      it("keeps the status fd from the relay's program (" .. ns .. ")", function()
        local rep, out = wrapped(ns, "[ -e /proc/self/fd/4 ] && echo open || echo closed")
        assert.is_truthy(out:find("closed\n", 1, true), out)
        assert.are.same({ kind = "exit", code = 0 }, rep.status, out)
      end)
    end
  end)

  it("gives the program every signal at its default and none blocked, whatever it was started with", function()
    -- ignored signals pass execve: the shell leaves HUP, USR1 and PIPE ignored for the launcher
    for _, ns in ipairs({ "--pidns", "--no-pidns" }) do
      local out = H.sh("trap '' HUP USR1 PIPE; " .. L .. " " .. ns ..
        " -- /bin/grep -E '^Sig(Ign|Blk):' /proc/self/status")
      assert.are.equal("SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000", out, ns)
      -- (the same shell's own child does inherit them: the check can see an ignored signal)
      assert.is_falsy(H.sh("trap '' HUP USR1 PIPE; /bin/grep -E '^SigIgn:' /proc/self/status")
        :find("0000000000000000", 1, true))
    end
  end)

  it("exits 127 with a fatal report line for a missing program", function()
    local out = launch("--report-fd 3 -- /nonexistent/prog 3>&1")
    assert.are.equal(127, status(out))
    local rep = report.parse(out)
    assert.are.equal("ENOENT", rep.fatal.errno)
  end)

  it("reports what it applied, the status and the usage", function()
    local out = launch("--report-fd 3 --pidns --net new --rlimit cpu=2 --rlimit nofile=32 --env A=b " ..
      "--chdir /tmp -- /usr/bin/python3 -I -c 'import os; print(os.environ[\"A\"], os.getcwd())' 3>/tmp/corral-launch-report.$$; cat /tmp/corral-launch-report.$$; rm -f /tmp/corral-launch-report.$$")
    local rep = report.parse(out)
    assert.are.equal(1, rep.version)
    assert.are.equal("2", rep.applied.cpu)
    assert.are.equal("32", rep.applied["open-files"])
    assert.is_truthy(rep.applied["pid-namespace"])
    assert.is_truthy(rep.applied["empty-env"])
    assert.are.same({ kind = "exit", code = 0 }, rep.status)
    assert.is_truthy(rep.usage and rep.usage.user_us + rep.usage.sys_us > 0)
    assert.is_truthy(out:find("b /tmp", 1, true))
  end)

  describe("the files of --files-wait-fd", function()
    -- records of --files-in (csrc/launch/workspace.c): PATH \0 MODE \0 SIZE \0 and the bytes
    local function records(list)
      local t = {}
      for _, f in ipairs(list) do t[#t + 1] = f[1] .. "\0" .. f[2] .. "\0" .. #f[3] .. "\0" .. f[3] end
      return table.concat(t)
    end
    -- the program reads fd 5 to its end (not there: the files came first), then says what is in
    -- its work dir
    local PROG = "/bin/sh -c '(cat <&5) >/dev/null 2>&1; echo ran && cat in/a in/b'"
    local function files_run(recs, ns, extra, prog)
      local top = H.sh("mktemp -d /tmp/corral-fw-XXXXXX"):gsub("%s+$", "")
      local f = assert(io.open(top .. "/in", "wb"))
      f:write(recs)
      f:close()
      assert(os.execute("mkdir " .. top .. "/work"))
      local out = launch("--report-fd 3 " .. ns .. " --work-tmpfs 1048576 --chdir " .. top .. "/work --files-in " .. top ..
        "/in --files-wait-fd 5 " .. (extra or "") .. " -- " .. (prog or PROG) .. " 3>&1")
      H.sh("rm -rf " .. top)
      return out, report.parse(out)
    end

    for _, ns in ipairs({ "--pidns", "--no-pidns" }) do
      it("are no longer named in the run directory when the program starts, with --unlink-files (" .. ns .. ")", function()
        local out, rep = files_run(records({ { "in/a", "644", "A\n" } }), ns, "--unlink-files",
          "/bin/sh -c '(cat <&5) >/dev/null 2>&1; cat in/a; ls ..'")
        assert.are.equal(0, status(out), out)
        assert.is_truthy(out:find("A\nwork\n", 1, true), out)
        assert.are.equal("1", rep.applied["files-in"], out)
      end)
    end

    for _, ns in ipairs({ "--pidns", "--no-pidns" }) do
      it("are there when the program has read the fd to its end (" .. ns .. ")", function()
        local out, rep = files_run(records({ { "in/a", "644", "A\n" }, { "in/b", "600", "B\n" } }), ns)
        assert.are.equal(0, status(out), out)
        assert.is_truthy(out:find("ran\nA\nB\n", 1, true), out)
        assert.are.equal("2", rep.applied["files-in"], out)
      end)
    end

    it("are said made by one byte before EOF, which an init killed while it makes them never writes", function()
      -- with a PID namespace the init writes "y" and closes the pipe; without one the files are
      -- made first and the program has no fd 5
      local got = "/bin/sh -c 'x=$(cat <&5 2>/dev/null); echo \"go=$x\"; cat in/a'"
      local out = files_run(records({ { "in/a", "644", "A\n" } }), "--pidns", nil, got)
      assert.are.equal(0, status(out), out)
      assert.is_truthy(out:find("go=y\nA\n", 1, true), out)
      out = files_run(records({ { "in/a", "644", "A\n" } }), "--no-pidns", nil, got)
      assert.is_truthy(out:find("go=\nA\n", 1, true), out)
      -- the prelude runs the code on that byte alone: EOF without it (the pipe closed by an init
      -- that was killed, whose namespace's end is on its way) ends the program before its code
      local dir = assert(core.mkdtemp("/tmp/corral-go-XXXXXX"))
      assert(core.write_file(dir .. "/main.py", "print('the code ran')\n"))
      local src = dir .. "/prelude.py"
      assert(core.write_file(src, require("corral.prelude").waiting_source))
      local function prelude_with(bytes)
        return H.sh("cd " .. dir .. " && printf '" .. bytes .. "' | " .. H.python
          .. " -I -c \"$(cat prelude.py)\" main.py 4<&0 </dev/null; echo \"<$?>\"")
      end
      local eof, go, more = prelude_with(""), prelude_with("y"), prelude_with("yy")
      assert(core.rmtree(dir))
      assert.are.equal("<125>", eof)
      assert.are.equal("the code ran\n<0>", go)
      assert.are.equal("<125>", more)
    end)

    it("that cannot be made end the run before the program reads EOF there", function()
      -- the second record is not one (a mode that is not octal): the program was started, and is
      -- killed while it waits
      local out, rep = files_run(records({ { "in/a", "644", "A\n" } }) .. "in/b\0" .. "999\0" .. "1\0B", "--pidns")
      assert.are.equal(125, status(out), out)
      -- (the program's own steps before its execve report empty-env: it was started)
      assert.is_truthy(rep.applied["empty-env"], out)
      assert.is_falsy(out:find("ran", 1, true), out)
      assert.are.equal("files-in", rep.fatal and rep.fatal.step, out)
      assert.is_truthy(rep.fatal.message:find("in/b", 1, true), out)
      assert.is_nil(rep.pid)
      assert.is_nil(rep.status)
    end)
  end)

  describe("the work dir at --work-at", function()
    local PROG = "import os; print(os.getcwd(), os.environ['HOME'], os.environ['X'], os.environ['Y'], os.listdir('/home'))"
    local function work_run(dir, mounts)
      local out = launch("--report-fd 3 " .. mounts .. " --work-tmpfs 1048576 --chdir " .. dir ..
        " --work-at /home/sandbox --env HOME=/home/sandbox --env X=/home/sandbox/sub --env Y=/home/sandboxes" ..
        " -- " .. H.python .. " -I -c \"" .. PROG .. "\" 3>&1")
      return out, report.parse(out)
    end

    it("is a tmpfs at PATH inside a --tmpfs of the run, the program's cwd", function()
      local dir = H.sh("mktemp -d /tmp/corral-wa-XXXXXX"):gsub("%s+$", "")
      local out, rep = work_run(dir, "--pidns --tmpfs /home=1048576")
      assert.are.equal(0, status(out), out)
      assert.is_truthy(out:find("/home/sandbox /home/sandbox /home/sandbox/sub /home/sandboxes ['sandbox']", 1, true), out)
      assert.is_truthy(rep.applied["work-tmpfs"], out)
      assert.is_nil(rep.refused["work-at"])
      os.remove(dir)
    end)

    -- where it cannot be placed, the work dir stays on --chdir and the environment names it there
    for _, c in ipairs({
      { "--pidns --tmpfs /var/tmp=1048576", "in no --tmpfs the run mounted", true },
      { "--no-pidns", "needs --pidns", false },
    }) do
      it("stays on --chdir, named in the environment, with " .. c[1], function()
        local dir = H.sh("mktemp -d /tmp/corral-wa-XXXXXX"):gsub("%s+$", "")
        local host_had = H.sh("test -e /home/sandbox && echo yes") ~= ""
        local out, rep = work_run(dir, c[1])
        assert.are.equal(0, status(out), out)
        -- (a value that only starts like PATH is left as it is)
        assert.is_truthy(out:find(dir .. " " .. dir .. " " .. dir .. "/sub /home/sandboxes ", 1, true), out)
        assert.is_truthy(rep.refused["work-at"], out)
        assert.is_truthy(rep.refused["work-at"].message:find(c[2], 1, true), out)
        assert.are.equal(c[3], rep.applied["work-tmpfs"] ~= nil, out)
        -- nothing was made on the host's filesystem
        if not host_had then assert.are.equal("", H.sh("test -e /home/sandbox && echo yes")) end
        H.sh("rm -rf " .. dir)
      end)
    end
  end)

  describe("the code dir at --code-at", function()
    -- the code prints where it is, its arguments, and what the host path's parent holds
    local CODE = [[
import os, sys
try:
    open(__file__, "a").write("x")
    w = "written"
except OSError as e:
    w = os.strerror(e.errno)
print(__file__, sys.argv[1:], os.listdir("/tmp"), w)
]]
    local function code_run(mounts)
      local top = H.sh("mktemp -d /tmp/corral-ca-XXXXXX"):gsub("%s+$", "")
      assert(os.execute("mkdir " .. top .. "/code"))
      local f = assert(io.open(top .. "/code/main.py", "w"))
      f:write(CODE)
      f:close()
      H.sh("chmod -R a+rX " .. top)
      local out = launch("--report-fd 3 " .. mounts:gsub("CODE", top .. "/code") ..
        " --code-at /run/code -- " .. H.python ..
        " -I /run/code/main.py /run/code /run/code/x /run/codes 3>&1")
      H.sh("rm -rf " .. top)
      return out, report.parse(out), top
    end

    it("is the code dir bound read-only at PATH, and its own path is not there", function()
      local out, rep = code_run("--pidns --tmpfs /tmp=1048576 --tmpfs /run=1048576 --ro-bind CODE")
      assert.are.equal(0, status(out), out)
      assert.is_truthy(out:find("/run/code/main.py ['/run/code', '/run/code/x', '/run/codes'] [] " ..
        "Read-only file system\n", 1, true), out)
      assert.is_truthy(rep.applied["code-at"], out)
      assert.is_nil(rep.refused["code-at"])
    end)

    -- where it cannot be placed, the code stays at its own path and the arguments name it there
    for _, c in ipairs({
      { "--pidns --tmpfs /tmp=1048576 --ro-bind CODE", "in no --tmpfs the run mounted" },
      { "--no-pidns --tmpfs /tmp=1048576 --ro-bind CODE", "needs --pidns" },
    }) do
      it("stays at its own path, named in the arguments, with " .. c[1], function()
        local host_had = H.sh("test -e /run/code && echo yes") ~= ""
        local out, rep, top = code_run(c[1])
        local code = top .. "/code"
        assert.are.equal(0, status(out), out)
        -- (an argument that only starts like PATH is left as it is)
        assert.is_truthy(out:find(code .. "/main.py ['" .. code .. "', '" .. code .. "/x', '/run/codes'] ", 1, true), out)
        assert.is_truthy(rep.refused["code-at"], out)
        assert.is_truthy(rep.refused["code-at"].message:find(c[2], 1, true), out)
        assert.is_nil(rep.applied["code-at"])
        -- nothing was made on the host's filesystem
        if not host_had then assert.are.equal("", H.sh("test -e /run/code && echo yes")) end
      end)
    end
  end)

  describe("a shared network namespace (--hold-net, --net-join)", function()
    -- A holder and the launchers that join it must have the same parent: this shell.
    local SHARED = "--report-fd 3 --net new --pidns --landlock auto --fs-ro /usr --fs-ro /lib " ..
      "--fs-ro /lib64 --fs-ro /etc --fs-ro /proc --scope --seccomp auto --deny-sockets-without-netns"
    local PROG = [[import os, socket
print("netns", os.readlink("/proc/self/ns/net"))
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    print("inet ok")
except OSError as e:
    print("inet", e.errno)
print("ifaces", open("/proc/net/dev").read().count(":"))
]]
    local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

    -- Starts a holder in the background of a shell, runs `body` (with $H its pid) and stops it.
    local function with_holder(body)
      return H.sh("f=$(mktemp /tmp/corral-hold.XXXXXX); " .. L .. " --hold-net >$f 2>&1 & H=$!; " ..
        "i=0; while [ $i -lt 100 ] && ! grep -q ready $f; do sleep 0.02; i=$((i+1)); done; " ..
        "echo \"holder $(cat $f) $(readlink /proc/$H/ns/net)\"; " .. body .. "; kill $H; wait $H; echo \"<holder $?>\"; rm -f $f")
    end

    it("keeps an empty network namespace that a run joins, without its inet sockets", function()
      local out = with_holder(L .. " " .. SHARED .. " --net-join $H -- " .. H.python .. " -I -c " .. q(PROG) .. " 3>&1")
      local held = out:match("holder ready (net:%[%d+%])")
      assert.is_truthy(held, out)
      local rep = report.parse(out)
      assert.is_truthy(rep.applied["no-network"], out)
      assert.is_truthy(rep.applied["shared-netns"], out)
      assert.is_truthy(rep.applied["deny-sockets"], out)
      assert.is_truthy(rep.applied["scoped-abstract-unix"], out)
      assert.are.equal(held, out:match("netns (net:%[%d+%])"))
      assert.is_truthy(out:find("inet 1\n", 1, true), out)            -- EPERM
      assert.is_truthy(out:find("ifaces 1\n", 1, true), out)          -- lo alone
      -- SIGTERM ends the holder
      assert.is_truthy(out:find("<holder 143>", 1, true), out)
    end)

    it("makes a namespace of the run's own when the pid is not its parent's holder", function()
      -- pid 1 is no child of this shell, and this shell is no holder
      for _, pid in ipairs({ "1", "$$" }) do
        local out = H.sh(L .. " " .. SHARED .. " --net-join " .. pid .. " -- " .. H.python .. " -I -c " .. q(PROG) .. " 3>&1")
        local rep = report.parse(out)
        assert.are.equal("ESRCH", rep.refused["shared-netns"] and rep.refused["shared-netns"].errno, out)
        assert.is_truthy(rep.applied["no-network"])
        assert.is_nil(rep.applied["shared-netns"])
        assert.are_not.equal(H.sh("readlink /proc/self/ns/net"), out:match("netns (net:%[%d+%])"))
      end
    end)

    it("does not join without the socket filter and the scope, and runs in its own namespace", function()
      local out = with_holder(L .. " --report-fd 3 --net new --pidns --net-join $H -- " .. H.python ..
        " -I -c " .. q(PROG) .. " 3>&1")
      local rep = report.parse(out)
      assert.are.equal("EINVAL", rep.refused["shared-netns"] and rep.refused["shared-netns"].errno, out)
      assert.is_truthy(rep.applied["no-network"])
      assert.are_not.equal(out:match("holder ready (net:%[%d+%])"), out:match("netns (net:%[%d+%])"))
      assert.is_truthy(out:find("inet ok", 1, true), out)
    end)

    it("exits at EOF on a pipe on its stdin", function()
      local out = H.sh("(sleep 0.3) | " .. L .. " --hold-net; echo \"<$?>\"")
      assert.are.equal("ready\n<0>", out)
    end)
  end)

  it("probes the host", function()
    local out = launch("--probe")
    assert.are.equal(0, status(out))
    assert.is_truthy(out:find("probe euid %d+"))
    assert.is_truthy(out:find("probe network%-namespace %a+"))
  end)
end)
