-- corral.schema is the one list of a run's options: every face reads it, README shows it.
local schema = require "corral.schema"
local options = require "corral.options"
local H = require "helper"

local function keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

describe("the option schema #fast", function()
  it("is the table README shows", function()
    local f = assert(io.open("README.md", "rb"))
    local readme = f:read("a")
    f:close()
    local table_text = readme:match("<!%-%- options table:[^\n]*%-%->\n(.-)<!%-%- end of options table %-%->")
    assert.is_string(table_text, "README has no options table between its markers")
    assert.are.equal(schema.markdown(), table_text, "README's option table is stale: paste `bin/corral options`")
  end)

  it("is what `corral options` prints", function()
    local out, status = H.sh(H.cli .. " options")
    assert.are.equal(0, status)
    assert.are.equal(schema.markdown(), out .. "\n")
  end)

  it("gives every entry a kind, a line of documentation, and a range to each number", function()
    local kinds = { number = true, integer = true, boolean = true, string = true, policy = true, env = true,
                    files = true, args = true, collect = true }
    for _, list in ipairs({ schema.run, schema.serve }) do
      local flags = {}
      for _, e in ipairs(list) do
        assert.is_true(kinds[e.kind] or false, e.name)
        assert.is_string(e.doc, e.name)
        assert.is_nil(e.doc:find("\n", 1, true), e.name)
        if e.flag then
          assert.is_nil(flags[e.flag], e.flag)
          flags[e.flag] = true
          assert.is_truthy(e.flag:match("^%-%-[a-z][a-z%-]*$"), e.flag)
          assert.are.equal(e.kind == "boolean", e.metavar == nil, e.name)
        end
      end
    end
    for _, e in ipairs(schema.run) do
      if e.kind == "number" or e.kind == "integer" then
        assert.is_number(e.min, e.name)
        assert.is_true(e.min <= e.default and e.default <= e.max, e.name)
      end
    end
  end)

  it("is where the validator, the policies and the server take their names from", function()
    assert.are.same(keys(schema.run_by_name), keys(options.run_schema))
    assert.are.same({ "cpu_max_time_sec", "io_max_kb", "mem_max_mb", "policy", "python", "stdin",
                      "timeout_max_time_sec" }, keys(options.eval_schema))
    local default = require("corral.policy").load("default")
    assert.are.same(schema.defaults(), default.defaults)
    local bwrap = require("corral.policy").load("bwrap")
    for k, v in pairs(schema.eval_defaults()) do assert.are.equal(v, bwrap.defaults[k], k) end
    assert.are.equal(131072, bwrap.defaults.max_output)
    local serve = require "corral.serve"
    assert.are.same({ "args", "code", "collect", "cpu_seconds", "file_mb", "files", "max_output", "memory_mb",
                      "open_files", "policy", "processes", "require_network_isolation", "stdin", "timeout" },
                    keys(serve.RUN_FIELDS))
    assert.are.same({ "code", "cpu_max_time_sec", "io_max_kb", "mem_max_mb", "stdin", "timeout_max_time_sec" },
                    keys(serve.EVAL_FIELDS))
  end)

  it("turns eval_in_sandbox's options into run options in the run's units", function()
    assert.are.same({ timeout = 10, cpu_seconds = 1, memory_mb = 100, max_output = 131072, policy = "bwrap" },
                    schema.eval_to_run({}))
    local ro = schema.eval_to_run({ io_max_kb = 2, mem_max_mb = 64, stdin = "x", python = "python3" })
    assert.are.equal(2048, ro.max_output)
    assert.are.equal(64, ro.memory_mb)
    assert.are.equal("x", ro.stdin)
    assert.are.equal("python3", ro.python)
  end)

  it("restates a library error in each face's words", function()
    local msg = "run_python: option 'memory_mb' must be at least 16, got 0"
    assert.are.same({ "--memory must be at least 16, got 0", "--memory" }, { schema.restate(msg, "flag") })
    assert.are.same({ "field 'memory_mb' must be at least 16, got 0", "memory_mb" }, { schema.restate(msg, "field") })
    assert.are.same({ "field 'mem_max_mb' (memory_mb) must be at least 16, got 0", "mem_max_mb" },
                    { schema.restate(msg, "eval") })
    assert.are.same({ "--max-body must be at least 1", "--max-body" },
                    { schema.restate("serve: option 'max_body_bytes' must be at least 1", "flag", schema.serve) })
    assert.are.same({ "--policy 'x' not found", "--policy" }, { schema.restate("policy 'x' not found", "flag") })
    assert.are.same({ "something else", nil }, { schema.restate("start: something else", "field") })
  end)
end)
