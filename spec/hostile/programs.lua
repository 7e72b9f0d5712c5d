--- Hostile cases: how a program ends and what it is made of. Exit codes, crashes, broken and huge
-- sources, stdin, a program faking its reason. See spec/hostile_spec.lua for the fields.
local assert = require "luassert"

local cases = {}

for _, n in ipairs({ 0, 1, 3, 255 }) do
  cases[#cases + 1] = {
    name = "os._exit(" .. n .. ") is returncode " .. n,
    code = "import os\nprint('exiting', flush=True)\nos._exit(" .. n .. ")",
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = n, ok = (n == 0), signal = false, stdout_exact = "exiting\n" },
  }
end

local more = {
  {
    name = "a segfault (ctypes.string_at(0)) is SIGSEGV, reason signal",
    code = "import ctypes\nprint('before', flush=True)\nctypes.string_at(0)",
    opts = { timeout = 2 },
    expect = { reason = "signal", signal = 11, returncode = -11, stdout = "before" },
  },
  {
    name = "os.abort() is SIGABRT, reason signal, and dumps no core",
    code = "import os\nos.abort()",
    opts = { timeout = 2 },
    expect = { reason = "signal", signal = 6, returncode = -6 },
    needs = { "no-core" },
    check = function()
      local core = require "corral.core"
      for _, name in ipairs(core.listdir(".") or {}) do
        assert.is_falsy(name:match("^core"), "a core file in the tree: " .. name)
      end
    end,
  },
  {
    name = "a syntax error is Python's own error, returncode 1",
    code = "print('never'\nx = = 1\n",
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 1, stdout = "^$", stderr = "SyntaxError" },
  },
  {
    name = "NUL bytes in the code are Python's own error, and nothing before them runs",
    code = "print('before the NUL')\n\0\nprint('after')\n",
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 1, stdout = "^$", stderr = "null bytes" },
  },
  {
    name = "1 MB of source (80000 statements) runs",
    code = function()
      local t = {}
      for i = 0, 79999 do t[#t + 1] = string.format("v%d = %d * 2\n", i, i) end
      t[#t + 1] = "print(v79999)\n"
      return table.concat(t)
    end,
    opts = { timeout = 15 },
    expect = { reason = "exit", returncode = 0, stdout_exact = "159998\n" },
    check = function(r) assert.is_true(r.usage.wall_s > 0) end,
  },
  {
    name = "10 MB of source (one string literal) runs",
    code = function() return "s = '" .. string.rep("a", 10 * 1000 * 1000) .. "'\nprint(len(s))\n" end,
    opts = { timeout = 3 },
    expect = { reason = "exit", returncode = 0, stdout_exact = "10000000\n" },
  },
  {
    name = "10 MB of source that does not fit the memory limit fails cleanly, reason memory",
    code = function() return "x = [" .. string.rep("1,", 5 * 1000 * 1000) .. "]\nprint(len(x))\n" end,
    opts = { timeout = 3, memory_mb = 128 },
    expect = { reason = "memory", ok = false, stdout = "^$" },
  },
  {
    name = "with no stdin, a read gets EOF at once",
    code = "import sys\nprint(repr(sys.stdin.buffer.read()))",
    opts = { timeout = 2 },
    expect = { reason = "exit", stdout_exact = "b''\n", max_elapsed = 1 },
    needs = { "no-stdin" },
  },
  {
    name = "stdin given is read back exactly, NUL and invalid UTF-8 included",
    code = [[
import sys, zlib
data = sys.stdin.buffer.read()
print(len(data), zlib.crc32(data), data[:8].hex(), data[-8:].hex())
]],
    opts = function()
      local t = {}
      for i = 0, 299999 do t[#t + 1] = string.char((i * 7 + 3) % 256) end
      return { timeout = 2, stdin = "\0\xff\xfe" .. table.concat(t) .. "\0end" }
    end,
    expect = { reason = "exit", returncode = 0 },
    check = function(r)
      local n, _, head, tail = r.stdout:match("^(%d+) (%d+) (%x+) (%x+)\n$")
      assert.are.equal(300007, tonumber(n), r.stdout)
      assert.are.equal("00fffe030a11181f", head)
      assert.are.equal(string.format("%02x%02x%02x%02x", (299996 * 7 + 3) % 256, (299997 * 7 + 3) % 256,
        (299998 * 7 + 3) % 256, (299999 * 7 + 3) % 256) .. "00656e64", tail)
    end,
  },
  {
    name = "a program that sends itself SIGXCPU is not reported as out of CPU",
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)",
    opts = { timeout = 2, cpu_seconds = 2 },
    expect = { reason = "signal", signal = 24 },
  },
}
for _, c in ipairs(more) do cases[#cases + 1] = c end
return cases
