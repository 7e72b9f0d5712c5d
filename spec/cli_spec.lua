-- The corral command line, run as a real process from the source tree.
local cjson = require "cjson"
local core = require "corral.core"
local H = require "helper"

local function write_tmp(content)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(content)
  f:close()
  return path
end

local function corral(args, input)
  local cmd = H.cli .. " " .. args
  if input then cmd = cmd .. " < " .. input end
  return H.sh(cmd .. "; echo \"<$?>\"")
end

local function split_status(out)
  local body, status = out:match("^(.-)\n?<(%d+)>$")
  return body, tonumber(status)
end

describe("corral CLI", function()
  local files = {}
  local function tmp(content) local p = write_tmp(content) files[#files + 1] = p return p end
  after_each(function() for _, p in ipairs(files) do os.remove(p) end files = {} end)

  it("prints the output and exits with the program's code", function()
    local body, status = split_status(corral("run " .. tmp("print('hi'); import sys; sys.exit(3)")))
    assert.are.equal("hi", body)
    assert.are.equal(3, status)
  end)

  it("reads the program from stdin with -", function()
    local body, status = split_status(corral("run -", tmp("print(6 * 7)")))
    assert.are.equal("42", body)
    assert.are.equal(0, status)
  end)

  it("exits 124 on timeout", function()
    local _, status = split_status(corral("run --timeout 0.5 " .. tmp("import time; time.sleep(9)")))
    assert.are.equal(124, status)
  end)

  it("exits 128+N when a signal ends the program", function()
    local _, status = split_status(corral("run " .. tmp("import os; os.kill(os.getpid(), 9)")))
    assert.are.equal(137, status)
  end)

  it("exits 2 with a message naming a bad flag or value", function()
    local body, status = split_status(corral("run --timeout soon x.py"))
    assert.are.equal(2, status)
    assert.is_truthy(body:find("--timeout", 1, true), body)
    body, status = split_status(corral("run --memory -5 " .. tmp("print(1)")))
    assert.are.equal(2, status)
    assert.is_truthy(body:find("--memory", 1, true), body)
    body, status = split_status(corral("run --frobnicate " .. tmp("print(1)")))
    assert.are.equal(2, status)
    assert.is_truthy(body:find("--frobnicate", 1, true), body)
    body, status = split_status(corral("run"))
    assert.are.equal(2, status)
    assert.is_truthy(body:find("missing FILE", 1, true), body)
    body, status = split_status(corral("launch"))
    assert.are.equal(2, status)
    assert.is_truthy(body:find("launch", 1, true), body)
  end)

  it("names the flag of every bad value, never the library's option name", function()
    local prog = tmp("print(1)")
    local capped = tmp([[return require("corral.policy").load("default"):extend {
      name = "capped", maxima = { timeout = 2, memory_mb = 512 } }]])
    os.rename(capped, capped .. ".lua")
    files[#files + 1] = capped .. ".lua"
    local empty = tmp("")
    -- arguments, the flag the message must name, the library's name it must not use
    local cases = {
      { "run --timeout 0", "--timeout" },
      { "run --timeout soon", "--timeout" },
      { "run --cpu 0", "--cpu", "cpu_seconds" },
      { "run --cpu 1.5", "--cpu", "cpu_seconds" },
      { "run --memory 0", "--memory", "memory_mb" },
      { "run --file-size -1", "--file-size", "file_mb" },
      { "run --processes 0", "--processes" },
      { "run --open-files 1", "--open-files", "open_files" },
      { "run --max-output -1", "--max-output", "max_output" },
      { "run --policy no-such-policy", "--policy" },
      { "run --python ''", "--python" },
      { "run --stdin /nonexistent/in", "--stdin", "stdin_file" },
      { "run --policy " .. capped .. ".lua --timeout 1 --memory 1024", "--memory", "memory_mb" },
      { "run --timeout", "--timeout" },
      { "run --require-network-isolation=yes", "--require-network-isolation" },
      { "probe --policy no-such-policy", "--policy" },
      { "serve --listen nowhere", "--listen" },
      { "serve --concurrency 0", "--concurrency" },
      { "serve --queue -1", "--queue" },
      { "serve --max-body 0", "--max-body", "max_body_bytes" },
      { "serve --drain-seconds -1", "--drain-seconds", "drain_seconds" },
      { "serve --token-file " .. empty, "--token-file" },
      { "serve --token-file /nonexistent/token", "--token-file", "token_file" },
      { "serve --policy no-such-policy", "--policy" },
    }
    for _, c in ipairs(cases) do
      local args = c[1]:match("^run ") and (c[1] .. " " .. prog) or c[1]
      local body, status = split_status(H.sh("env -u CORRAL_TOKEN " .. H.cli .. " " .. args .. " </dev/null; echo \"<$?>\""))
      assert.are.equal(2, status, args .. " → " .. body)
      assert.is_truthy(body:find(c[2], 1, true), args .. " → " .. body)
      if c[3] then assert.is_nil(body:find(c[3], 1, true), args .. " → " .. body) end
    end
  end)

  it("says a file it cannot read once, with the reason", function()
    local dir = H.sh("mktemp -d /tmp/corral-cli-dir.XXXXXX")
    local cases = {
      { "run " .. dir, dir .. ": Is a directory" },
      { "run /nonexistent/prog.py", "/nonexistent/prog.py: No such file or directory" },
      { "run --stdin " .. dir .. " " .. tmp("print(1)"), dir .. ": Is a directory" },
      { "serve --token-file " .. dir, dir .. ": Is a directory" },
    }
    for _, c in ipairs(cases) do
      local body, status = split_status(corral(c[1]))
      assert.are.equal(2, status, body)
      assert.is_truthy(body:find("cannot read " .. (c[1]:match("%-%-%S+") or ""), 1, true), body)
      assert.is_truthy(body:find(c[2], 1, true), body)
      local path = c[2]:match("^(.-):")
      local _, n = body:gsub(path:gsub("%p", "%%%0"), "")
      assert.are.equal(1, n, body)
    end
    H.sh("rmdir " .. dir)
  end)

  it("answers a usage error under --json with a JSON error on stdout and exit 2", function()
    local prog = tmp("print(1)")
    -- arguments, the flag named (false: none)
    local cases = {
      { "run --json --memory 0 " .. prog, "--memory" },
      { "run --frobnicate --json " .. prog, "--frobnicate" },
      { "run --json --timeout soon " .. prog, "--timeout" },
      { "run --json", false },
      { "run --json /nonexistent/prog.py", false },
      { "run --json --stdin - -", "--stdin" },
      { "probe --json --policy no-such-policy", "--policy" },
      { "probe --json extra", false },
      { "policies --json extra", false },
    }
    for _, c in ipairs(cases) do
      local out, status = split_status(H.sh(H.cli .. " " .. c[1] .. " </dev/null 2>/dev/null; echo \"<$?>\""))
      assert.are.equal(2, status, c[1] .. " → " .. out)
      local ok, r = pcall(cjson.decode, out)
      assert.is_true(ok, c[1] .. " → " .. out)
      assert.are.same({ "error" }, (function() local k = {} for n in pairs(r) do k[#k + 1] = n end return k end)())
      assert.are.equal("usage", r.error.code, out)
      assert.is_string(r.error.message, out)
      assert.are.equal(c[2] or cjson.null, r.error.flag, out)
      -- and nothing on stderr
      local err = H.sh(H.cli .. " " .. c[1] .. " </dev/null 2>&1 >/dev/null")
      assert.are.equal("", err, c[1])
    end
  end)

  it("writes '/' in JSON as is, as the server does", function()
    local body, status = split_status(corral("run --json " .. tmp("print('a/b')")))
    assert.are.equal(0, status, body)
    assert.is_truthy(body:find('"stdout":"a/b\\n"', 1, true), body)
    assert.is_nil(body:find("\\/", 1, true), body)
    body = split_status(corral("policies --json"))
    assert.is_truthy(body:find('"path":"', 1, true), body)
    assert.is_nil(body:find("\\/", 1, true), body)
    -- a string that really holds a backslash before a slash keeps it
    body = split_status(corral("run --json " .. tmp("print('a\\\\/b')")))
    assert.are.equal("a\\/b\n", cjson.decode(body).stdout, body)
  end)

  it("exits 125 when the sandbox itself fails", function()
    local body, status = split_status(corral("run --python /nonexistent/python " .. tmp("print(1)")))
    assert.are.equal(125, status)
    assert.is_truthy(body:find("/nonexistent/python", 1, true), body)
  end)

  it("gives the program files and arguments, and writes what it collects under --out-dir only", function()
    local dir = H.sh("mktemp -d"):gsub("%s+$", "")
    local data = dir .. "/data.csv"
    local f = assert(io.open(data, "wb"))
    f:write("a,b\n")
    f:close()
    local prog = tmp([[
import os, sys
print(sys.argv[1:], open("in/d.csv").read().strip(), open("data.csv").read().strip())
os.makedirs("plots/sub")
open("plots/p.png", "w").write("p")
open("plots/sub/q.png", "w").write("q")
open("plots/esc.png", "w").write("e")
os.symlink("/etc/passwd", "plots/l.png")
]])
    -- a link planted in --out-dir is not followed: the file under it is not written
    local out = dir .. "/out"
    assert(core.mkdir(out, 448))
    assert(core.symlink(dir .. "/elsewhere", out .. "/plots"))
    local body, status = split_status(corral("run --file " .. data .. " --file " .. data .. "=in/d.csv --collect 'plots/**'"
      .. " --out-dir " .. out .. " " .. prog .. " -- x 'y z' 2>&1"))
    assert.are.equal(0, status, body)
    assert.matches("%['x', 'y z'%] a,b a,b", body)
    assert.matches("not written: plots/l.png: a link to /etc/passwd", body)
    assert.matches("not written: plots/p.png: .*plots is a link, not a directory", body)
    assert.is_nil(core.lstat(dir .. "/elsewhere"))
    os.remove(out .. "/plots")
    prog = tmp("import os\nos.makedirs('plots/sub')\nopen('plots/p.png', 'w').write('p')\nopen('plots/sub/q.png', 'w').write('q')\n")
    body, status = split_status(corral("run --collect 'plots/**' --out-dir " .. out .. "/new/dir " .. prog .. " 2>&1"))
    assert.are.equal(0, status, body)
    assert.are.equal("q", H.read(out .. "/new/dir/plots/sub/q.png"))
    assert.are.equal("p", H.read(out .. "/new/dir/plots/p.png"))
    -- a file there already is not replaced
    body = split_status(corral("run --collect 'plots/**' --out-dir " .. out .. "/new/dir " .. prog .. " 2>&1"))
    assert.matches("not written: plots/p.png: .*File exists", body)
    -- usage errors name the flag
    for _, c in ipairs({
      { "--collect '*.png' " .. prog, "%-%-collect needs %-%-out%-dir" },
      { "--out-dir " .. out .. " " .. prog, "%-%-out%-dir goes with %-%-collect" },
      { "--file " .. dir .. "/missing " .. prog, "cannot read %-%-file " },
      { "--file " .. data .. "=../x " .. prog, "%-%-file entry 1 %('%.%./x'%): the path has a '%.%.' segment" },
      { "--collect '/etc/*' --out-dir " .. out .. " " .. prog, "%-%-collect entry 1 %('/etc/%*'%) is absolute" },
      { prog .. " extra", "only one FILE may be given %(the program's arguments go after %-%-%)" },
    }) do
      body, status = split_status(corral("run " .. c[1] .. " 2>&1"))
      assert.are.equal(2, status, body)
      assert.matches(c[2], body)
    end
    H.sh("rm -rf " .. dir)
  end)

  it("prints exactly the result fields with --json", function()
    local body, status = split_status(corral("run --json --stdin " .. tmp("abc") .. " " ..
      tmp("import sys; print(sys.stdin.read()); sys.exit(7)")))
    assert.are.equal(7, status)
    local r = cjson.decode(body)
    local keys = {}
    for k in pairs(r) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({ "limits", "network_isolated", "ok", "reason", "refused", "returncode", "signal", "stderr",
                      "stdout", "timed_out", "truncated", "usage" }, keys)
    assert.are.equal("abc\n", r.stdout)
    assert.are.equal(7, r.returncode)
    assert.are.equal(cjson.null, r.signal)
    local ukeys = {}
    for k in pairs(r.usage) do ukeys[#ukeys + 1] = k end
    table.sort(ukeys)
    assert.are.same({ "cpu_sys_s", "cpu_total_s", "cpu_user_s", "max_rss_kb", "memory_peak_kb", "wall_s" }, ukeys)
  end)

  it("says in --json's refused why a protection is missing from limits", function()
    local pol = tmp([[
      return require("corral.policy").load("default"):extend {
        name = "holey", tmpfs = { ["/tmp"] = 16, ["/no-such-dir-for-corral"] = 1 } }]])
    os.rename(pol, pol .. ".lua")
    files[#files + 1] = pol .. ".lua"
    local body, status = split_status(corral("run --json --policy " .. pol .. ".lua " .. tmp("print(1)")))
    assert.are.equal(0, status, body)
    local r = cjson.decode(body)
    for _, l in ipairs(r.limits) do assert.are_not.equal("private-tmp", l) end
    assert.are.equal("ENOENT", r.refused["private-tmp"].errno, body)
  end)

  it("gives its one run a network namespace of its own: no holder for a single run", function()
    local body, status = split_status(corral("run --json " .. tmp("print(1)")))
    assert.are.equal(0, status)
    local r = cjson.decode(body)
    local has = {}
    for _, l in ipairs(r.limits) do has[l] = true end
    assert.is_true(r.network_isolated)
    assert.is_true(has["no-network"])
    assert.is_nil(has["shared-netns"])
  end)

  it("runs a warm policy in its warm interpreter, as the server does, and leaves nothing behind", function()
    -- what the program sees: a zygote run's /proc/self/exe is corral-zygote (a cold run's is the
    -- interpreter) and the policy's preloaded modules are already imported; its mounts name its
    -- run directory. `sh -c` says the CLI's pid, which its zygote's --parent-pid names.
    -- dead helpers of a zygote (its spawner), not reaped by it, would be left to pid 1
    local function zombies()
      -- (this pass's: spec/run.sh runs another as nobody meanwhile)
      local uid = core.geteuid()
      return tonumber((H.sh("ps -e -o uid=,stat=,comm= | awk '" .. (uid == 0 and "$1 != 65534" or ("$1 == " .. uid))
        .. " && $2 ~ /^Z/ && $3 ~ /corral-spawn/ { n++ } END { print n + 0 }'")))
    end
    local zombies_before = zombies()
    local out = H.sh("sh -c 'echo $$; exec " .. H.cli .. " run --json --policy warm " ..
      tmp("import os, sys\nprint(os.path.basename(os.readlink('/proc/self/exe')), 'json' in sys.modules)\n"
        .. "import re\nprint(re.search(r'corral-\\w{6}', open('/proc/self/mountinfo').read()).group(0))") .. "'; echo \"<$?>\"")
    local pid, rest = out:match("^(%d+)\n(.*)$")
    local body, status = split_status(rest)
    assert.are.equal(0, status, body)
    local r = cjson.decode(body)
    local exe, json_loaded, name = r.stdout:match("^(%S+) (%S+)\n(%S+)\n$")
    assert.are.equal("corral-zygote", exe, r.stdout)
    assert.are.equal("True", json_loaded)
    assert.is_true(r.network_isolated)
    assert.is_truthy(H.has(r.limits, "pid-namespace") and H.has(r.limits, "seccomp"), table.concat(r.limits, " "))
    -- once it has exited: no zygote of it, no run directory
    assert.are.same({}, H.pids_with("--parent-pid " .. pid .. " "))
    -- (its run directory's name, from the code's mount: the program sees neither at its host path)
    assert.matches("^corral%-%w+$", name)
    assert.is_false(core.exists("/dev/shm/" .. name) or core.exists("/tmp/" .. name), name)
    assert.is_true(zombies() <= zombies_before, "the zygote left its spawner unreaped")
  end)

  describe("stopped by SIGTERM, SIGINT or SIGHUP mid-run", function()
    -- The CLI as a child of this process (its signals at their defaults, as a shell's foreground
    -- job has them); its run's program sleeps. Returns what it left: its exit, its run
    -- directory, and whether anything of it still runs.
    local function stop_mid_run(policy, signum)
      local ended
      local cli = assert(core.spawn {
        file = "/usr/bin/lua5.4", args = { "bin/corral", "run", "--json", "--policy", policy, "--timeout", "30",
          tmp("import time\ntime.sleep(30)") },
        stdout_cap = 65536, stderr_cap = 65536, timeout = 60,
        on_exit = function(raw) ended = raw end,
      })
      local pid = cli:pid()
      local marker = "--parent-pid " .. pid .. " "
      -- whether p descends from the CLI (a run's init hides its arguments from the run, and so
      -- from ps: the program is found by its ancestry)
      local function of_cli(p)
        for _ = 1, 16 do
          if p == pid then return true end
          local stat = H.sh("cat /proc/" .. p .. "/stat 2>/dev/null")
          p = tonumber(stat:match("^%d+ %(.*%) %S (%d+)"))
          if not p or p <= 1 then return false end
        end
        return false
      end
      -- the program itself, and its run directory, which its mounts name (the program sees its
      -- code and work dir at paths of its own)
      local top
      assert.is_true(H.eventually(function()
        core.run("nowait")
        for _, p in ipairs(H.pids_with("python3 -I ")) do
          local args = H.sh("tr '\\0' ' ' < /proc/" .. p .. "/cmdline")
          local name = args:match("^/usr/bin/python3 %-I ") and of_cli(p)
            and H.sh("cat /proc/" .. p .. "/mountinfo 2>/dev/null"):match("/(corral%-%w%w%w%w%w%w)/code ")
          for _, base in ipairs(name and { "/dev/shm/", "/tmp/" } or {}) do
            if core.exists(base .. name) then top = base .. name end
          end
        end
        return top ~= nil
      end, 20), "the program did not start: " .. tostring(ended and ended.stderr))
      core.kill(pid, signum)
      assert.is_true(H.eventually(function() core.run("nowait") return ended ~= nil end, 20), "the CLI did not exit")
      -- what still runs of the program: a process whose mounts are the run's
      local programs, name = {}, top:match("[^/]+$")
      for _, p in ipairs(H.pids_with("python3 -I ")) do
        if H.sh("cat /proc/" .. p .. "/mountinfo 2>/dev/null"):find("/" .. name .. "/code ", 1, true) then
          programs[#programs + 1] = p
        end
      end
      return ended, top, H.pids_with(marker), programs
    end

    for _, policy in ipairs({ "default", "warm" }) do
      for _, sig in ipairs({ { 15, "SIGTERM" }, { 2, "SIGINT" }, { 1, "SIGHUP" } }) do
        it("under " .. policy .. ", " .. sig[2] .. " ends the run and leaves nothing behind", function()
          local raw, top, procs, programs = stop_mid_run(policy, sig[1])
          assert.are.same({ 128 + sig[1], 0 }, { raw.exit_status, raw.term_signal }, raw.stderr)
          assert.are.same({}, procs, "a launcher or zygote of the CLI outlived it")
          assert.are.same({}, programs, "the program outlived the CLI")
          assert.is_false(core.exists(top), "its run directory " .. top .. " outlived the CLI")
        end)
      end
    end
  end)

  it("adds an error object to --json when the sandbox fails", function()
    local body, status = split_status(corral("run --json --python /nonexistent/python " .. tmp("print(1)")))
    assert.are.equal(125, status)
    local r = cjson.decode(body)
    assert.is_false(r.ok)
    assert.are.equal("ENOENT", r.error.kind)
    assert.are.equal("sandbox_failed", r.error.code)
    assert.is_truthy(r.error.message:find("/nonexistent/python", 1, true))
  end)

  it("does not leak the caller's environment into the sandbox", function()
    local body = split_status(H.sh("CORRAL_TEST_SECRET=hunter2 " .. H.cli .. " run --json " ..
      tmp("import os; print(dict(os.environ))") .. "; echo \"<$?>\""))
    local r = cjson.decode(body)
    assert.is_nil(r.stdout:find("hunter2", 1, true))
    assert.is_truthy(r.stdout:find("PATH", 1, true))
  end)

  it("probes the host", function()
    local body, status = split_status(corral("probe --json"))
    assert.are.equal(0, status)
    local p = cjson.decode(body)
    assert.are.equal(core.geteuid(), p.euid)
    assert.is_boolean(p.network_isolation)
    assert.are.equal("default", p.policy.name)
    assert.is_truthy(H.has(p.policy.limits, "timeout"))
    local text = split_status(corral("probe"))
    assert.is_truthy(text:find("network isolation", 1, true))
  end)

  it("lists the policies", function()
    local body, status = split_status(corral("policies"))
    assert.are.equal(0, status)
    assert.is_truthy(body:find("default", 1, true))
    assert.is_truthy(body:find("bwrap", 1, true))
  end)

  it("shows help for each command", function()
    for _, c in ipairs({ "--help", "run --help", "probe --help", "policies --help" }) do
      local body, status = split_status(corral(c))
      assert.are.equal(0, status, c)
      assert.is_truthy(body:find("usage: corral", 1, true), c)
    end
  end)

  it("shows a command's own help for `help COMMAND`", function()
    local main = split_status(corral("help"))
    for _, c in ipairs({ "run", "probe", "policies", "serve" }) do
      local body, status = split_status(corral("help " .. c))
      assert.are.equal(0, status, c)
      assert.is_truthy(body:find("usage: corral " .. c, 1, true), body)
      assert.are.equal(split_status(corral(c .. " --help")), body)
      assert.are_not.equal(main, body)
    end
    local body, status = split_status(corral("help launch"))
    assert.are.equal(2, status, body)
    assert.is_truthy(body:find("unknown command 'launch'", 1, true), body)
  end)

  it("runs the examples from any directory", function()
    local tree = H.sh("pwd")
    local out, status = H.sh("cd / && lua5.4 " .. tree .. "/examples/embed.lua")
    assert.are.equal(0, status, out)
    assert.is_truthy(out:find("correct  PASS", 1, true), out)
    local body
    body, status = split_status(H.sh("cd / && " .. tree .. "/bin/corral run " .. tree .. "/examples/model_program.py; echo \"<$?>\""))
    assert.are.equal(0, status, body)
    assert.is_truthy(body:find("primes below", 1, true), body)
    body, status = split_status(H.sh("cd / && CORRAL_TENANT_TIER=free " .. tree .. "/bin/corral run --json --policy " .. tree ..
      "/examples/policies/tenant.lua " .. tmp("print('tenant')") .. "; echo \"<$?>\""))
    assert.are.equal(0, status, body)
    assert.are.equal("tenant\n", cjson.decode(body).stdout)
  end)

  it("runs a policy given by path", function()
    local body, status = split_status(H.sh("CORRAL_TENANT_TIER=free " .. H.cli ..
      " run --json --policy examples/policies/tenant.lua --timeout 100 " .. tmp("print('tenant')") .. "; echo \"<$?>\""))
    assert.are.equal(0, status, body)
    local r = cjson.decode(body)
    assert.are.equal("tenant\n", r.stdout)
  end)
end)
