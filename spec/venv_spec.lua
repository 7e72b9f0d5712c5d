-- A virtualenv's interpreter as a run's python: its pyvenv.cfg and site-packages are readable,
-- wherever the venv lives (a scratch path such as /tmp, which the run's own mount hides, is bound
-- back read-only), under each policy and through the CLI. The venvs are real (`python3 -m venv`,
-- Debian's python3-venv); the package is written into their site-packages, as pip would put it.
local corral = require "corral"
local H = require "helper"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A venv at `dir` with a package `corralvenvpkg` in its site-packages; nil when python3 -m venv
-- is not available here (the reason second).
local function make_venv(dir)
  local out, status = H.sh(H.python .. " -m venv --without-pip " .. q(dir))
  if status ~= 0 then return nil, out end
  local site = H.sh("ls -d " .. q(dir) .. "/lib/python3*/site-packages")
  assert(H.sh("mkdir -p " .. q(site .. "/corralvenvpkg") .. " && echo 'ANSWER = 42' > " ..
    q(site .. "/corralvenvpkg/__init__.py") .. " && chmod -R a+rX " .. q(dir) .. " && echo ok") == "ok")
  return dir .. "/bin/python"
end

local PROGRAM = "import sys, corralvenvpkg; print(sys.prefix, corralvenvpkg.ANSWER)"

describe("a virtualenv's python", function()
  local snap, made
  before_each(function() snap, made = H.snapshot(), {} end)
  after_each(function()
    for _, d in ipairs(made) do H.sh("rm -rf " .. q(d)) end
    H.assert_clean(snap)
  end)

  -- where a venv can be: under /tmp (a scratch path of every run), and as root under /opt
  local places = { { "/tmp", "a scratch path the run's own /tmp hides" } }
  if H.root then places[#places + 1] = { "/opt", "a directory of the host's own" } end

  for _, place in ipairs(places) do
    for _, policy in ipairs({ "default", "bwrap", "warm" }) do
      it("imports a package installed into a venv under " .. place[1] .. " (" .. place[2] .. "), policy "
        .. policy, function()
        local top = H.sh("mktemp -d " .. place[1] .. "/corral-venv-spec.XXXXXX")
        made[#made + 1] = top
        H.sh("chmod 0755 " .. q(top))
        local python, why = make_venv(top .. "/venv")
        if not python then pending("python3 -m venv is not available: " .. why) return end
        local r, err = corral.run_python(PROGRAM, { python = python, policy = policy, timeout = 20 })
        assert.is_truthy(r, err)
        assert.are.equal(top .. "/venv 42\n", r.stdout, r.stderr)
        assert.is_true(r.ok)
        -- the venv is read-only to the program
        r = assert(corral.run_python("open(" .. string.format("%q", top .. "/venv/pyvenv.cfg") .. ", 'a')",
          { python = python, policy = policy, timeout = 20 }))
        assert.is_false(r.ok)
        assert.is_truthy(r.stderr:find("Error", 1, true), r.stderr)
        corral.close()
      end)
    end
  end

  it("grants the venv alone: a .pth naming a directory elsewhere widens nothing and runs nothing", function()
    local top = H.sh("mktemp -d /tmp/corral-venv-spec.XXXXXX")
    made[#made + 1] = top
    H.sh("chmod 0755 " .. q(top))
    local python, why = make_venv(top .. "/venv")
    if not python then pending("python3 -m venv is not available: " .. why) return end
    -- a host directory beside the venv, with a secret at its top and a path deep inside it
    assert(H.sh("mkdir -p " .. q(top .. "/hostdir/sub/deep") .. " && echo s3cret > " .. q(top .. "/hostdir/secret") ..
      " && chmod -R a+rX " .. q(top .. "/hostdir") .. " && echo ok") == "ok")
    local site = H.sh("ls -d " .. q(top) .. "/venv/lib/python3*/site-packages")
    -- a .pth that adds the deep path, and one whose import line would run outside the sandbox
    local marker = top .. "/ran-outside"
    assert(H.sh("echo " .. q(top .. "/hostdir/sub/deep") .. " > " .. q(site .. "/wide.pth") ..
      " && echo " .. q("import os; open(" .. string.format("%q", marker) .. ", 'w')") .. " > " ..
      q(site .. "/run.pth") .. " && chmod a+r " .. q(site) .. "/*.pth && echo ok") == "ok")
    for _, policy in ipairs({ "default", "bwrap", "warm" }) do
      local r = assert(corral.run_python("print(open(" .. string.format("%q", top .. "/hostdir/secret") .. ").read())",
        { python = python, policy = policy, timeout = 20 }))
      assert.is_false(r.ok, policy .. ": " .. r.stdout)
      assert.is_nil(r.stdout:find("s3cret", 1, true), policy)
      corral.close()
      -- the controller asked the interpreter without its site module: no .pth line ran as it
      -- (a warm policy's interpreter starts, site and preloads included, as the controller: its
      -- venv is the operator's, as trusted as a policy)
      if policy ~= "warm" then
        assert.is_nil(io.open(marker, "r"), policy .. ": a .pth line ran in the controller's name")
      end
    end
  end)

  it("runs through the CLI's --python", function()
    local top = H.sh("mktemp -d /tmp/corral-venv-spec.XXXXXX")
    made[#made + 1] = top
    H.sh("chmod 0755 " .. q(top))
    local python, why = make_venv(top .. "/venv")
    if not python then pending("python3 -m venv is not available: " .. why) return end
    local prog = top .. "/prog.py"
    assert(H.sh("printf '%s\\n' " .. q(PROGRAM) .. " > " .. q(prog) .. " && chmod a+r " .. q(prog) .. " && echo ok") == "ok")
    local out, status = H.sh(H.cli .. " run --python " .. q(python) .. " " .. q(prog))
    assert.are.equal(top .. "/venv 42", out)
    assert.are.equal(0, status)
  end)
end)
