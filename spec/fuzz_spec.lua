-- The fuzz harnesses' committed inputs, replayed: fuzz/corpus/T (seeds) and fuzz/regress/T
-- (inputs that once crashed a parser) go once each through the harness fuzz/T.c, built with
-- gcc's AddressSanitizer and UBSan and fuzz/replay.c instead of libFuzzer (`make replay-build`,
-- into a temp dir: the tree may be read-only). A violated invariant aborts, a sanitizer report
-- exits non-zero. The fuzzing itself is `make fuzz` (clang, libFuzzer).
local H = require "helper"

local TARGETS = { "plan", "utf8", "lua", "records" }

local function quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- Regular files of a directory, sorted (none when it does not exist).
local function files(dir)
  local out = {}
  local f = io.popen("find " .. quote(dir) .. " -maxdepth 1 -type f ! -name '.*' 2>/dev/null | LC_ALL=C sort")
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  return out
end

describe("fuzz regression replay", function()
  local dir

  lazy_setup(function()
    dir = H.sh("mktemp -d /tmp/corral-fuzz-replay.XXXXXX")
    -- a make started by `make test` must not take its jobserver or flags
    local out, status = H.sh("env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s --no-print-directory replay-build REPLAY_DIR="
      .. quote(dir))
    assert(status == 0, "make replay-build failed:\n" .. out)
  end)

  lazy_teardown(function()
    if dir and dir:match("^/tmp/corral%-fuzz%-replay%.") then H.sh("rm -rf " .. quote(dir)) end
  end)

  for _, target in ipairs(TARGETS) do
    local inputs = {}
    for _, kind in ipairs({ "corpus", "regress" }) do
      for _, path in ipairs(files("fuzz/" .. kind .. "/" .. target)) do inputs[#inputs + 1] = path end
    end

    it("has seeds for the " .. target .. " harness", function()
      assert.is_true(#files("fuzz/corpus/" .. target) > 0)
    end)

    for _, path in ipairs(inputs) do
      it("replays " .. path .. " with no violated invariant or sanitizer report", function()
        local out, status = H.sh(dir .. "/" .. target .. " " .. quote(path))
        assert.equal(0, status, out)
      end)
    end
  end
end)
