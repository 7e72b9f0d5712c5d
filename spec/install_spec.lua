-- Installing: `make install DESTDIR=...` and `luarocks make --tree ...` give a corral that runs
-- code from outside the source tree.
local H = require "helper"

describe("install", function()
  it("says which Debian packages it installs and lets apt's progress through", function()
    -- a stand-in apt-get and dpkg-query on PATH: every package is missing, and apt-get says what
    -- it was asked and prints a progress line, as the real one does
    local bin = H.sh("mktemp -d /tmp/corral-fakeapt.XXXXXX")
    local function script(name, body)
      local f = assert(io.open(bin .. "/" .. name, "w"))
      f:write("#!/bin/sh\n" .. body .. "\n")
      f:close()
      H.sh("chmod 755 " .. bin .. "/" .. name)
    end
    script("dpkg-query", "exit 1")
    script("apt-get", 'echo "fake apt-get $*"; echo "Setting up fake-package (1.0) ..."')
    local out, status = H.sh("PATH=" .. bin .. ":$PATH make --no-print-directory deps-run")
    H.sh("rm -rf " .. bin)
    if H.root then
      assert.are.equal(0, status, out)
      assert.is_truthy(out:find("installing Debian packages for deps-run", 1, true), out)
      assert.is_truthy(out:find("fake apt-get -q update", 1, true), out)
      assert.is_truthy(out:find("fake apt%-get %-q %-y %-o Dpkg::Progress%-Fancy=0 install .*lua5%.4"), out)
      assert.is_truthy(out:find("Setting up fake-package (1.0) ...", 1, true), out)
    else
      assert.are_not.equal(0, status, out)
      assert.is_truthy(out:find("apt%-get install %-y .*lua5%.4"), out)
    end
  end)

  it("installs with luarocks make into a tree and runs from outside the source tree", function()
    local tree = H.sh("mktemp -d /tmp/corral-rocks.XXXXXX")
    local out, status = H.sh("luarocks --lua-version 5.4 make --tree " .. tree ..
      " rockspec/corral-dev-1.rockspec LUA_INCDIR=/usr/include/lua5.4 > " .. tree .. ".log 2>&1; echo $?; tail -5 " .. tree .. ".log")
    assert.are.equal("0", out:match("^(%d+)"), out)
    local code = H.sh("cd / && echo 'print(6*7)' | env -i PATH=/usr/bin:/bin " .. tree .. "/bin/corral run --json -")
    assert.is_truthy(code:find('"stdout":"42\\n"', 1, true), code)
    local lib = H.sh("cd / && env -i PATH=/usr/bin:/bin LUA_PATH='" .. tree .. "/share/lua/5.4/?.lua;" .. tree ..
      "/share/lua/5.4/?/init.lua;;' LUA_CPATH='" .. tree .. "/lib/lua/5.4/?.so;;' lua5.4 -e " ..
      "'local r = require(\"corral\").run_python(\"print(1+1)\"); io.write(r.stdout)'")
    assert.are.equal("2", lib)
    H.sh("rm -rf " .. tree .. " " .. tree .. ".log")
    assert.is_truthy(status)
  end)

  it("installs with make install DESTDIR and PREFIX", function()
    local dest = H.sh("mktemp -d /tmp/corral-dest.XXXXXX")
    local out = H.sh("make -s install DESTDIR=" .. dest .. " PREFIX=/opt/corral >/dev/null 2>&1; echo $?")
    assert.are.equal("0", out)
    for _, f in ipairs({ "/opt/corral/bin/corral", "/opt/corral/libexec/corral/corral-launch",
                         "/opt/corral/lib/lua/5.4/corral/core.so", "/opt/corral/share/lua/5.4/corral/init.lua",
                         "/opt/corral/share/corral/policies/default.lua" }) do
      assert.are.equal("yes", H.sh("test -e " .. dest .. f .. " && echo yes"), f)
    end
    H.sh("rm -rf " .. dest)
  end)

  it("installs with make install PREFIX alone and runs from anywhere without LUA_PATH", function()
    local prefix = H.sh("mktemp -d /tmp/corral-prefix.XXXXXX")
    local out = H.sh("make -s install PREFIX=" .. prefix .. " >/dev/null 2>&1; echo $?")
    assert.are.equal("0", out)
    H.sh("chmod -R a+rX " .. prefix)
    local got = H.sh("cd / && echo 'print(6*7)' | env -i PATH=/usr/bin:/bin " .. prefix ..
      "/bin/corral run --json - 2>&1")
    H.sh("rm -rf " .. prefix)
    assert.is_truthy(got:find('"stdout":"42\\n"', 1, true), got)
  end)
end)
