-- Bad options raise an error that names the option, and start nothing.
local corral = require "corral"
local H = require "helper"

describe("option validation #fast", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  local cases = {
    { { timeout = -1 }, "timeout" },
    { { timeout = "5" }, "timeout" },
    { { timeout = 0 / 0 }, "timeout" },
    { { timeout = 1e9 }, "timeout" },
    { { cpu_seconds = 1.5 }, "cpu_seconds" },
    { { cpu_seconds = 0 }, "cpu_seconds" },
    { { memory_mb = 10 * 1024 * 1024 * 1024 }, "memory_mb" },
    { { memory_mb = -256 }, "memory_mb" },
    { { file_mb = -1 }, "file_mb" },
    { { processes = 0 }, "processes" },
    { { max_output = -5 }, "max_output" },
    { { max_output = math.huge }, "max_output" },
    { { require_network_isolation = "yes" }, "require_network_isolation" },
    { { policy = 5 }, "policy" },
    { { python = "" }, "python" },
    { { stdin = 42 }, "stdin" },
    { { env = { ["BAD=NAME"] = "x" } }, "env" },
    { { env = { OK = 5 } }, "env" },
    { { timout = 5 }, "timout" },
    { { [1] = 5 }, "option names must be strings" },
  }
  for _, case in ipairs(cases) do
    local opts, name = case[1], case[2]
    it("rejects " .. name .. " = " .. tostring(select(2, next(opts))), function()
      local ok, err = pcall(corral.run_python, "print(1)", opts)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(name, 1, true), tostring(err))
      assert.is_truthy(tostring(err):find("run_python", 1, true), tostring(err))
    end)
  end

  it("rejects code that is not a string", function()
    local ok, err = pcall(corral.run_python, nil)
    assert.is_false(ok)
    assert.is_truthy(err:find("code must be a string", 1, true))
  end)

  it("rejects an options value that is not a table", function()
    local ok, err = pcall(corral.run_python, "print(1)", "fast")
    assert.is_false(ok)
    assert.is_truthy(err:find("options must be a table", 1, true))
  end)

  it("names an unknown policy", function()
    local ok, err = pcall(corral.run_python, "print(1)", { policy = "no-such-policy" })
    assert.is_false(ok)
    assert.is_truthy(err:find("no-such-policy", 1, true), err)
  end)

  it("returns nil, message, code for an interpreter that does not exist", function()
    local res, err, code = corral.run_python("print(1)", { python = "/nonexistent/python3" })
    assert.is_nil(res)
    assert.are.equal("ENOENT", code)
    assert.is_truthy(err:find("/nonexistent/python3", 1, true))
  end)

  it("rejects bad jobs in run_many before starting any", function()
    local ok, err = pcall(corral.run_many, { "print(1)", { code = "print(2)", memory_mb = "lots" } })
    assert.is_false(ok)
    assert.is_truthy(err:find("job 2", 1, true) and err:find("memory_mb", 1, true), err)
  end)

  it("rejects bad eval_in_sandbox options by seed 003's names", function()
    local ok, err = pcall(corral.eval_in_sandbox, "print(1)", { io_max_kb = -1 })
    assert.is_false(ok)
    assert.is_truthy(err:find("io_max_kb", 1, true), err)
  end)
end)

describe("prepared runs", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  -- a policy that counts the calls of its prepare
  local function counting()
    local calls = 0
    local pol = corral.load_policy("default"):extend { name = "counting", prestart = 0 }
    local prepare = pol.prepare
    pol.prepare = function(self, ...) calls = calls + 1 return prepare(self, ...) end
    return pol, function() return calls end
  end

  it("checks and prepares once: start takes the plan as it is", function()
    local pol, calls = counting()
    local plan = assert(corral.prepare { policy = pol, memory_mb = 128, timeout = 2 })
    assert.are.equal(1, calls())
    assert.are.equal(128, plan.o.memory_mb)
    local res, done
    assert(corral.start("print(6 * 7)", plan, function(r) res, done = r, true end))
    while not done do corral.run_loop("once") end
    assert.are.equal("42\n", res.stdout)
    assert.are.equal(1, calls())
  end)

  it("raises for bad options at prepare, naming the option, and starts nothing", function()
    local ok, err = pcall(corral.prepare, { memory_mb = 1 })
    assert.is_false(ok)
    assert.is_truthy(err:find("memory_mb", 1, true), err)
    ok, err = pcall(corral.prepare_eval, { io_max_kb = -1 })
    assert.is_false(ok)
    assert.is_truthy(err:find("io_max_kb", 1, true), err)
  end)

  it("refuses a plan made for the other face", function()
    local plan = assert(corral.prepare {})
    local ok, err = pcall(corral.start_eval, "print(1)", plan, function() end)
    assert.is_false(ok)
    assert.is_truthy(err:find("prepared for run_python", 1, true), err)
  end)

  it("configures the process in one call and refuses an unknown setting", function()
    local was = corral.configure()
    assert.are.same({ prestart_after_pause = false, prestart_launches = true, share_network = true,
                      warm_interpreters = true }, was)
    local now = corral.configure { prestart_launches = false }
    assert.is_false(now.prestart_launches)
    corral.configure { prestart_launches = true }
    assert.has_error(function() corral.configure { prestart = false } end, "configure: setting 'prestart' is not known")
    assert.has_error(function() corral.configure { warm_interpreters = 1 } end)
  end)
end)
