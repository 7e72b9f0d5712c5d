-- Policies: loading by name, path and table; maxima that clamp or refuse; the shipped examples.
local corral = require "corral"
local policy = require "corral.policy"
local core = require "corral.core"
local H = require "helper"

describe("policies", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("loads the shipped policies by name", function()
    assert.are.equal("default", policy.load("default").name)
    assert.are.equal("bwrap", policy.load("bwrap").name)
    local names = {}
    for _, p in ipairs(corral.policies()) do names[#names + 1] = p.name end
    assert.is_true(H.has(names, "default") and H.has(names, "bwrap"))
  end)

  it("refuses a request over a maximum, naming the option", function()
    local strict = policy.load("default"):extend { name = "strict", maxima = { timeout = 2 } }
    local ok, err = pcall(corral.run_python, "print(1)", { policy = strict, timeout = 10 })
    assert.is_false(ok)
    assert.is_truthy(err:find("'timeout'", 1, true), err)
    assert.is_truthy(err:find("strict", 1, true), err)
  end)

  it("clamps a request over a maximum and says so", function()
    local p = policy.load("default"):extend { name = "clamp", maxima = { memory_mb = 64 }, clamp = true }
    -- 200 MB held in 1 MB steps: runs at 512 MiB, reaches the limit at 64
    local r = assert(corral.run_python("a = [b'x' * 10**6 for _ in range(200)]", { policy = p, memory_mb = 512 }))
    assert.are.same({ "memory_mb" }, r.clamped)
    assert.are.equal("memory", r.reason)
  end)

  it("loads the tenant example by path and clamps to its tier", function()
    local p = policy.load("examples/policies/tenant.lua")
    local r = assert(corral.run_python("import time; time.sleep(30)", { policy = p, timeout = 60 }))
    assert.is_true(r.timed_out)
    assert.is_true(r.usage.wall_s < 6, "the free tier's 5 s maximum was not applied")
    assert.is_truthy(H.has(r.clamped, "timeout"))
  end)

  it("lets runs read, not write, the datasets example's directory, and nothing else on the host", function()
    local dir = assert(core.mkdtemp("/tmp/corral-ds-XXXXXX"))
    local other = assert(core.mkdtemp("/tmp/corral-ds-XXXXXX"))
    assert(core.chmod(dir, 493)) -- 0755: the run uid may read it by its permissions
    assert(core.chmod(other, 493))
    assert(core.write_file(dir .. "/table.csv", "a,b\n1,2\n", 420))
    assert(core.write_file(other .. "/secret.csv", "s\n", 420))
    -- the example reads CORRAL_DATASETS when it is loaded: load it through a wrapper that sets it
    local wrapper = os.tmpname() .. ".lua"
    local f = assert(io.open(wrapper, "w"))
    f:write(string.format([[
local getenv = os.getenv
os.getenv = function(k) if k == "CORRAL_DATASETS" then return %q end return getenv(k) end
local p = dofile("examples/policies/datasets.lua")
os.getenv = getenv
return p
]], dir))
    f:close()
    -- no private /tmp: the directories stay in sight, and Landlock alone decides
    local ds = policy.load(wrapper):extend { tmpfs = {} }
    local plain = policy.load("default"):extend { tmpfs = {} }
    os.remove(wrapper)
    local code = string.format([[
for path in (%q, %q):
    try:
        print("read", open(path).read().splitlines()[0])
    except OSError as e:
        print("denied", e.errno)
try:
    open(%q, "w")
    print("WROTE")
except OSError as e:
    print("no write", e.errno)
]], dir .. "/table.csv", other .. "/secret.csv", dir .. "/new.csv")
    local r = assert(corral.run_python(code, { policy = ds }))
    assert.are.equal("read a,b\ndenied 13\nno write 13\n", r.stdout, r.stderr)
    assert.is_true(H.has(r.limits, "filesystem"))
    local d = assert(corral.run_python(code, { policy = plain }))
    assert.are.equal("denied 13\ndenied 13\nno write 13\n", d.stdout, d.stderr)
    assert.is_false(core.exists(dir .. "/new.csv"))
    assert(core.rmtree(dir))
    assert(core.rmtree(other))
  end)

  it("polls the budgets where the policy's cgroup cannot be used, and refuses to run when it requires one", function()
    local auto = policy.load("default"):extend { budgets = "auto", cgroup = "/nonexistent/corral" }
    local r = assert(corral.run_python("print(1)", { policy = auto }))
    assert.are.equal("1\n", r.stdout)
    assert.is_true(H.has(r.limits, "budget-poll"), table.concat(r.limits, " "))
    assert.is_false(H.has(r.limits, "cgroup"))
    assert.are.equal("ENOENT", r.refused.cgroup.errno)
    local strict = policy.load("default"):extend { budgets = "cgroup", cgroup = "/nonexistent/corral" }
    local res, err, code = corral.run_python("print(1)", { policy = strict })
    assert.is_nil(res)
    assert.are.equal("ENOENT", code)
    assert.is_truthy(err:find("cgroup", 1, true), err)
    -- a policy that names no directory cannot require one
    assert.has_error(function() policy.load(policy.load("default"):extend { budgets = "cgroup" }) end)
  end)

  it("checks the per-run quota fields", function()
    local function bad(spec, want)
      local ok, err = pcall(policy.load, policy.load("default"):extend(spec))
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(want, 1, true), tostring(err))
    end
    bad({ user_quotas = { ["../x"] = 1 } }, "field 'user_quotas' keys must be names")
    bad({ user_quotas = { inotify_instances = -1 } }, "field 'user_quotas' values")
    bad({ user_quotas = { inotify_instances = 1.5 } }, "field 'user_quotas' values")
    bad({ pending_signals = "many" }, "field 'pending_signals'")
    bad({ message_queue_bytes = -1 }, "field 'message_queue_bytes'")
    bad({ deny_pipe_growth = "yes" }, "field 'deny_pipe_growth'")
    -- (its own network namespace: no shared one's holder is started for launch_args)
    local p = policy.load(policy.load("default"):extend { user_quotas = { inotify_instances = 2 },
                                                         pending_signals = false, network = "new" })
    local args = table.concat(p:launch_args(p:prepare({}, require("corral.host").probe()),
      { workdir = "/w", code_dir = "/c", top = "/t" }, {}), " ")
    assert.is_truthy(args:find("--user-max inotify_instances=2", 1, true), args)
    assert.is_falsy(args:find("sigpending", 1, true), args)
    assert.is_truthy(args:find("--deny-pipe-growth", 1, true), args)
    -- false turns them off
    p = policy.load(p:extend { user_quotas = false, deny_pipe_growth = false })
    args = table.concat(p:launch_args(p:prepare({}, require("corral.host").probe()),
      { workdir = "/w", code_dir = "/c", top = "/t" }, {}), " ")
    assert.is_falsy(args:find("--user-max", 1, true), args)
    assert.is_falsy(args:find("--deny-pipe-growth", 1, true), args)
  end)

  it("checks the network and seccomp_cache fields", function()
    assert.has_error(function() policy.load(policy.load("default"):extend { network = "everywhere" }) end)
    assert.has_error(function() policy.load(policy.load("default"):extend { seccomp_cache = "yes" }) end)
    for _, net in ipairs({ "new", "shared", "host" }) do
      assert.are.equal(net, policy.load(policy.load("default"):extend { network = net }).network)
    end
  end)

  -- network = "shared" needs the walls between concurrent runs; without them a run gets a
  -- namespace of its own, still isolated
  local walls = {
    { "seccomp off", { seccomp = "off" } },
    { "deny_sockets never", { deny_sockets = "never" } },
    { "Landlock off", { filesystem = "off", separation = "auto" } },
    { "no scope", { scope = false } },
  }
  for _, w in ipairs(walls) do
    it("gives each run its own network namespace under network = \"shared\" with " .. w[1], function()
      local spec = { name = "unwalled", network = "shared" }
      for k, v in pairs(w[2]) do spec[k] = v end
      local p = policy.load("default"):extend(spec)
      assert.is_false(p:shares_network())
      local r = assert(corral.run_python("print(1)", { policy = p }))
      assert.is_true(r.network_isolated)
      assert.is_true(H.has(r.limits, "no-network"))
      assert.is_false(H.has(r.limits, "shared-netns"))
    end)
  end

  it("raises naming a policy file that does not return a table", function()
    local base = os.tmpname()
    local path = base .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write("return 42\n")
    f:close()
    local ok, err = pcall(policy.load, path)
    os.remove(path)
    os.remove(base)
    assert.is_false(ok)
    assert.is_truthy(err:find("must return a table", 1, true), err)
  end)

  it("cleans up and reports an error when a policy's result() raises", function()
    local p = policy.load("default"):extend { name = "broken" }
    function p:result() error("bug in the operator's policy") end
    local res, err, code = corral.run_python("print(1)", { policy = p })
    assert.is_nil(res)
    assert.are.equal("EPOLICY", code)
    assert.is_truthy(err:find("bug in the operator's policy", 1, true), err)
  end)

  it("falls back to a subreaper when the policy asks for no pid namespace, still leaving nothing", function()
    local p = policy.load("default"):extend { name = "nopidns", pid_namespace = false, separation = "auto" }
    local code = [[
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
print("done")
]]
    local r = assert(corral.run_python(code, { policy = p, timeout = 3 }))
    assert.are.equal("done\n", r.stdout)
    assert.is_true(H.has(r.limits, "subreaper"))
    assert.is_false(H.has(r.limits, "pid-namespace"))
    assert.is_true(r.usage.wall_s < 2)
    assert.are.same({}, H.stray_processes())
  end)

  it("walls every run off from the controller and other runs, or runs nothing (separation)", function()
    -- default: Landlock with the PID namespace here, and a uid per run as root
    local r = assert(corral.run_python("print(1)"))
    assert.is_true(H.has(r.limits, "separated"), table.concat(r.limits, " "))
    -- neither a user namespace (so no PID namespace without root) nor Landlock: as root the run
    -- still has a uid of its own; otherwise it would have the controller's, and nothing runs
    local exposed = policy.load("default"):extend { name = "exposed", user_namespace = "never", filesystem = "off" }
    local code = "import os; print(os.getuid())"
    local e, err, ecode = corral.run_python(code, { policy = exposed })
    if H.root then
      assert(e, err)
      assert.is_true(H.has(e.limits, "separated"), table.concat(e.limits, " "))
      assert.are_not.equal("0\n", e.stdout)
    else
      assert.is_nil(e)
      assert.are.equal("ENOTSUP", ecode)
      for _, part in ipairs({ "policy 'exposed'", "separation", "controller's uid", "as root", "Landlock",
                              "Nothing ran", 'separation = "auto"' }) do
        assert.is_truthy(err:find(part, 1, true), err)
      end
      -- "auto" runs it, and says so
      local auto = exposed:extend { name = "exposed-auto", separation = "auto" }
      local a = assert(corral.run_python(code, { policy = auto }))
      assert.are.equal(core.getuid() .. "\n", a.stdout)
      assert.is_false(H.has(a.limits, "separated"))
      assert.are.equal("EOPNOTSUPP", a.refused.separation.errno)
    end
    -- corral serve probes it first: a policy whose every run would fail does not serve
    if not H.root then
      local dir = assert(core.mkdtemp("/tmp/corral-sep-XXXXXX"))
      assert(core.write_file(dir .. "/p.lua", 'return require("corral.policy").load("default"):extend { '
        .. 'name = "exposed", user_namespace = "never", filesystem = "off" }\n'))
      local out, status = H.sh("timeout 60 " .. H.cli .. " serve --listen unix:" .. dir .. "/s.sock --policy "
        .. dir .. "/p.lua")
      assert(core.rmtree(dir))
      assert.is_truthy(out:find("corral serve: refusing to start: ENOTSUP: policy 'exposed' walls each run off", 1, true), out)
      assert.are.equal(1, status, out)
      assert.is_falsy(out:find("listening", 1, true), out)
    end
  end)
end)

describe("separation across the controller's runs", function()
  it("by Landlock's signal scope without a PID namespace leaves the controller's processes out of reach", function()
    -- Without a PID namespace the controller's pid is a pid the program can name: the signal
    -- scope stops kill(), but prlimit() and setpriority() on a process of the same uid are no
    -- signal. Each call sets what is already there, so this process is left as it was. Either the
    -- run is not called separated, or neither call reaches. (As root each run has a uid of its own.)
    local pol = policy.load("default"):extend { name = "scoped-only", pid_namespace = false }
    local code = ([[
import os, resource
reached = []
try:
    resource.prlimit(CTL, resource.RLIMIT_NOFILE, resource.prlimit(CTL, resource.RLIMIT_NOFILE))
    reached.append('prlimit')
except OSError:
    pass
try:
    os.setpriority(os.PRIO_PROCESS, CTL, os.getpriority(os.PRIO_PROCESS, CTL))
    reached.append('setpriority')
except OSError:
    pass
print(' '.join(reached) or 'denied')
]]):gsub("CTL", tostring(core.getpid()))
    local r, err, ecode = corral.run_python(code, { policy = pol })
    if not r then
      assert.are.equal("ENOTSUP", ecode, err)
      return
    end
    if H.has(r.limits, "separated") then
      assert.are.equal("denied\n", r.stdout, r.stderr)
    end
  end)
end)
