-- `corral repl` at a real terminal: spec/repl_driver.py runs it on a pseudo-terminal and types
-- as a person would (Ctrl-C and Ctrl-D are the terminal's), and nothing outlives the command.
local cjson = require "cjson"
local H = require "helper"

-- Run the driver on `steps`; the transcript has "\n" line ends (the terminal shows "\r\n").
local function drive(args, steps)
  local argv = { "lua5.4", "bin/corral", "repl" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(cjson.encode({ argv = argv, cwd = ".", steps = steps }))
  f:close()
  local out = H.sh(H.python .. " spec/repl_driver.py " .. path)
  os.remove(path)
  local ok, res = pcall(cjson.decode, out)
  assert.is_true(ok, "the driver said: " .. out)
  res.output = res.output:gsub("\r\n", "\n")
  assert.is_true(res.ok, "did not happen: " .. cjson.encode(res.failed) .. "\nthe terminal showed:\n" .. res.output)
  return res
end

local function send(text) return { op = "send", text = text } end
local function expect(text) return { op = "expect", text = text, timeout = 60 } end
local WAIT = { op = "wait", timeout = 60 }

describe("corral repl", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  for _, pol in ipairs({ "default", "warm" }) do
    it("keeps state across lines, continues a def and shows a traceback (" .. pol .. ")", function()
      local res = drive({ "--policy", pol }, {
        expect(">>> "), send("x = 41\n"),
        expect(">>> "), send("x + 1\n"),
        expect("42\n>>> "), send("def f(a):\n"),
        expect("... "), send("    return a * 2\n"),
        expect("... "), send("\n"),
        expect(">>> "), send("f(x)\n"),
        expect("82\n>>> "), send("for i in range(2): i\n"),
        expect("... "), send("\n"),
        expect("0\n1\n>>> "), send("1 / 0\n"),
        expect("ZeroDivisionError: division by zero\n>>> "), send("print('still', x)\n"),
        expect("still 41\n>>> "), send("\4"),
        WAIT,
      })
      assert.are.equal(0, res.status)
      assert.matches('Traceback %(most recent call last%):\n  File "<cell %d+>", line 1, in <module>\n', res.output)
      assert.matches(">>> def f%(a%):\n%.%.%.     return a %* 2\n%.%.%. \n>>> ", res.output)
    end)
  end

  it("interrupts a running statement at Ctrl-C, keeping the session's state", function()
    local res = drive({}, {
      expect(">>> "), send("x = 7\n"),
      expect(">>> "), send("while True: pass\n"),
      expect("... "), send("\n"),
      expect("\n"),
      -- the statement spins in the sandbox: then the terminal's Ctrl-C
      { op = "busy", cpu = 0.5, timeout = 60 }, send("\3"),
      expect("KeyboardInterrupt\n>>> "), send("x * 6\n"),
      expect("42\n>>> "), send("\4"),
      WAIT,
    })
    assert.are.equal(0, res.status)
    assert.matches('File "<cell %d+>", line 1, in <module>\n.*KeyboardInterrupt\n>>> x %* 6\n42\n', res.output)
  end)

  it("drops the line at Ctrl-C at the prompt, and the statement begun", function()
    local res = drive({}, {
      expect(">>> "), send("if True:\n"),
      expect("... "), send("    y = 1\n"),
      expect("... "), send("\3"),
      expect("KeyboardInterrupt\n>>> "), send("'y' in dir()\n"),
      expect("False\n>>> "), send("\4"),
      WAIT,
    })
    assert.are.equal(0, res.status)
  end)

  for _, case in ipairs({ { "exit()", 0 }, { "exit(3)", 3 }, { "import sys; sys.exit(7)", 7 } }) do
    it("ends with the code of " .. case[1], function()
      local res = drive({}, { expect(">>> "), send(case[1] .. "\n"), WAIT })
      assert.are.equal(case[2], res.status)
    end)
  end

  it("interrupts a statement at its --timeout and goes on", function()
    local res = drive({ "--timeout", "1" }, {
      expect(">>> "), send("while True: pass\n"),
      expect("... "), send("\n"),
      expect("corral: interrupted at its timeout (1 s)\n>>> "), send("6 * 7\n"),
      expect("42\n>>> "), send("\4"),
      WAIT,
    })
    assert.are.equal(0, res.status)
    assert.matches("KeyboardInterrupt\n", res.output)
  end)

  it("names the flag of a bad option", function()
    local out, status = H.sh(H.cli .. " repl --memory 1; echo \"<$?>\""):match("^(.-)\n?<(%d+)>$")
    assert.are.equal("2", status)
    assert.matches("corral repl: %-%-memory must be at least 16, got 1\n", out)
    out = H.sh(H.cli .. " repl --lifetime 0; echo \"<$?>\"")
    assert.matches("%-%-lifetime must be in 1%.%..*<2>$", out)
    out = H.sh(H.cli .. " repl --stdin x; echo \"<$?>\"")
    assert.matches("unknown option %-%-stdin.*<2>$", out)
  end)
end)
