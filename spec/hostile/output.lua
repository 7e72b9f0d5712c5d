--- Hostile cases: what a program prints (floods, one endless line, bytes that are not UTF-8,
-- closed streams). See spec/hostile_spec.lua for the fields.
local assert = require "luassert"

local REPLACEMENT = "\xEF\xBF\xBD"

return {
  {
    name = "a stdout flood is read, counted, capped and ended at the timeout",
    code = "import os\nb = b'o' * 65536\nwhile True: os.write(1, b)",
    opts = { timeout = 1, max_output = 1000 },
    expect = { reason = "timeout", timed_out = true, truncated = true },
    needs = { "output-cap" },
    check = function(r)
      assert.are.equal(string.rep("o", 1000), r.stdout)
      -- read on past the cap, not stopped at it (a reader that stops leaves the writer blocked
      -- on a full pipe: a cap and a pipe's 64 KiB); how much more depends on the machine's speed
      assert.is_true(r.stdout_bytes > 1000 * 1000, "only " .. r.stdout_bytes .. " bytes read")
    end,
  },
  {
    name = "a stderr flood is read, counted, capped and ended at the timeout",
    code = "import os\nb = b'e' * 65536\nwhile True: os.write(2, b)",
    opts = { timeout = 1, max_output = 1000 },
    expect = { reason = "timeout", timed_out = true, truncated = true },
    check = function(r)
      assert.are.equal(string.rep("e", 1000), r.stderr)
      assert.are.equal("", r.stdout)
      -- read on past the cap, not stopped at it (a reader that stops leaves the writer blocked
      -- on a full pipe: a cap and a pipe's 64 KiB); how much more depends on the machine's speed
      assert.is_true(r.stderr_bytes > 1000 * 1000, "only " .. r.stderr_bytes .. " bytes read")
    end,
  },
  {
    name = "four forked writers flooding both streams are capped",
    code = [[
import os
for i in range(4):
    if os.fork() == 0:
        b = (b"%d" % i) * 65536
        while True:
            os.write(1 + i % 2, b)
while True:
    os.write(1, b"p" * 65536)
]],
    opts = { timeout = 1, max_output = 5000 },
    expect = { reason = "timeout", timed_out = true, truncated = true },
    check = function(r)
      assert.are.equal(5000, #r.stdout)
      assert.are.equal(5000, #r.stderr)
    end,
  },
  {
    name = "one 5 MB line without a newline is truncated, and the run ends normally",
    code = "import sys\nsys.stdout.write('L' * (5 * 1000 * 1000))",
    opts = { timeout = 2, max_output = 1000 },
    expect = { reason = "exit", returncode = 0, truncated = true, timed_out = false },
    check = function(r)
      assert.are.equal(string.rep("L", 1000), r.stdout)
      assert.are.equal(5 * 1000 * 1000, r.stdout_bytes)
    end,
  },
  {
    name = "bytes that are not UTF-8 come back as U+FFFD on both streams",
    code = [[
import os
os.write(1, b"ok \xff\xfe end \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf")
os.write(2, b"err \x80\x81")
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0 },
    check = function(r)
      for _, s in ipairs({ r.stdout, r.stderr }) do
        assert.is_truthy(utf8.len(s), "not valid UTF-8: " .. s)
      end
      assert.is_truthy(r.stdout:find("^ok " .. REPLACEMENT .. REPLACEMENT .. " end "), r.stdout)
      assert.are.equal("err " .. REPLACEMENT .. REPLACEMENT, r.stderr)
    end,
  },
  {
    name = "a cut multi-byte character at the output cap stays valid UTF-8",
    code = "import sys\nsys.stdout.write('\\u20ac' * 1000)",
    opts = { timeout = 2, max_output = 1000 },
    expect = { reason = "exit", truncated = true },
    check = function(r)
      assert.is_truthy(utf8.len(r.stdout), "not valid UTF-8")
      assert.is_true(#r.stdout >= 999)
    end,
  },
  {
    name = "a program that closes stdout and stderr and hangs on is ended at the timeout",
    code = "import os, time\nprint('closing', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(60)",
    opts = { timeout = 1 },
    expect = { reason = "timeout", timed_out = true, stdout = "closing" },
  },
  {
    name = "an escapee that keeps printing after the program exits does not hold the result",
    code = [[
import os, time
if os.fork() == 0:
    os.setsid()
    while True:
        print("escapee", flush=True)
        time.sleep(0.01)
time.sleep(0.1)
print("main done", flush=True)
]],
    opts = { timeout = 3, max_output = 100000 },
    expect = { reason = "exit", returncode = 0, stdout = "main done", max_elapsed = 2 },
  },
}
