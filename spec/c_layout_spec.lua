-- The C tree's layout: no import circle among the files of csrc/launch, csrc/zygote and
-- csrc/core (a file uses another when it calls what that one defines: spec/c_circles.py reads it
-- off the objects' symbols), and the zygote protocol's words are csrc/zygote/protocol.h's, in the
-- test peers that speak it and in docs/internals.md.
local H = require "helper"

local function cflags(pkgs)
  local out = H.sh("pkg-config --cflags " .. pkgs .. " 2>/dev/null || true")
  return (out:gsub("%-I", "-isystem "):gsub("\n", " "))
end

local read = H.read

local function protocol_words()
  local words = {}
  for name, word in read("csrc/zygote/protocol.h"):gmatch('#define (ZP_%u+)%s+"(%l+)"') do
    words[word] = name
  end
  return words
end

describe("the C tree", function()
  for _, case in ipairs({
    { dir = "csrc/launch", pkgs = "libseccomp" },
    { dir = "csrc/zygote", pkgs = "python-3.11-embed libseccomp" },
    { dir = "csrc/core", pkgs = "lua5.4 libuv" },
  }) do
    it("has no import circle among the files of " .. case.dir, function()
      local out = H.sh("/usr/bin/python3 spec/c_circles.py " .. case.dir .. " " .. cflags(case.pkgs))
      assert.is_truthy(out:find("circles: none", 1, true), out)
    end)
  end

  it("names the zygote protocol's words once, in protocol.h, and its test peers use only those", function()
    local words = protocol_words()
    local n = 0
    for _ in pairs(words) do n = n + 1 end
    assert.are.equal(9, n)
    -- the peers' messages: b"WORD\0..." sent, and the kinds the driver reads
    for _, file in ipairs({ "spec/zygote_peer.py", "spec/zygote_driver.py" }) do
      local src = read(file)
      for word in src:gmatch('b"(%l+)\\0') do
        assert.is_truthy(words[word], file .. " speaks '" .. word .. "', not a word of protocol.h")
      end
    end
    for word in read("spec/zygote_driver.py"):match('kind in %(([^)]*)%)'):gmatch('"(%l+)"') do
      assert.is_truthy(words[word], "zygote_driver.py reads '" .. word .. "', not a word of protocol.h")
    end
    -- the C ends spell none of them as a literal where they send or compare one
    for _, file in ipairs({ "csrc/zygote/main.c", "csrc/zygote/request.c", "csrc/zygote/program.c",
      "csrc/core/zygote.c" }) do
      local src = read(file)
      for word in pairs(words) do
        for _, pat in ipairs({ 'strcmp%([^,]+, "' .. word .. '"%)', 'send3%(z, "' .. word .. '"',
          'answer%(sock, "' .. word .. '"', '%] = "' .. word .. '";', '{ "' .. word .. '", ' .. '[%a]+ }' }) do
          assert.is_falsy(src:find(pat), file .. " spells '" .. word .. "' instead of " .. words[word])
        end
      end
    end
  end)

  it("describes each protocol word in docs/internals.md", function()
    local doc = read("docs/internals.md")
    local section = doc:match("\n### Protocol\n(.-)\n### ")
    assert.is_truthy(section, "no Protocol section")
    for word in pairs(protocol_words()) do
      assert.is_truthy(section:find("`" .. word .. "\\0", 1, true), "the Protocol section has no `" .. word .. "\\0")
    end
  end)
end)
