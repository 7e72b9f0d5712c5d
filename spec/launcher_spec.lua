-- corral-launch run by hand: usage, probe, exit-status mirroring, the report.
local H = require "helper"
local report = require "corral.report"

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

  it("probes the host", function()
    local out = launch("--probe")
    assert.are.equal(0, status(out))
    assert.is_truthy(out:find("probe euid %d+"))
    assert.is_truthy(out:find("probe network%-namespace %a+"))
  end)
end)
