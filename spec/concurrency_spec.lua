-- Many runs on one loop.
local corral = require "corral"
local core = require "corral.core"
local H = require "helper"

describe("concurrency", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("finishes 50 runs in parallel with no leaked fd, process or temp dir", function()
    local jobs = {}
    for i = 1, 50 do
      jobs[i] = { code = "import os, sys; print(" .. i .. " * 2); sys.exit(" .. (i % 3) .. ")" }
    end
    jobs[7] = { code = "import time; time.sleep(10)", timeout = 1 }
    -- a flood that ends by itself: truncated whatever the machine's speed (a 1 s timeout may come
    -- before 50 parallel interpreters have printed anything)
    jobs[13] = { code = "for _ in range(100): print('x' * 1000)", timeout = 20 }
    local results = corral.run_many(jobs, { concurrency = 50 })
    assert.are.equal(50, #results)
    for i, r in ipairs(results) do
      if i == 7 then assert.is_true(r.timed_out)
      elseif i == 13 then assert.is_true(r.truncated)
      else
        assert.are.equal(tostring(i * 2) .. "\n", r.stdout, "job " .. i)
        assert.are.equal(i % 3, r.returncode)
      end
    end
  end)

  it("gives concurrent runs distinct uids as root", function()
    if not H.root then pending("only as root") return end
    local jobs = {}
    for i = 1, 8 do jobs[i] = "import os, time; time.sleep(0.3); print(os.getuid())" end
    local seen = {}
    for _, r in ipairs(corral.run_many(jobs, { concurrency = 8 })) do
      assert.is_nil(seen[r.stdout], "uid used twice: " .. r.stdout)
      seen[r.stdout] = true
    end
  end)

  it("runs with start and the loop, calling back once per run", function()
    local got = {}
    for i = 1, 5 do
      assert(corral.start("print(" .. i .. ")", nil, function(r) got[#got + 1] = r.stdout end))
    end
    corral.run_loop()
    table.sort(got)
    assert.are.same({ "1\n", "2\n", "3\n", "4\n", "5\n" }, got)
  end)

  it("kills a run on request", function()
    local result
    local proc = assert(corral.start("import time; time.sleep(30)", { timeout = 20 }, function(r) result = r end))
    local t0 = core.hrtime()
    proc:kill()
    corral.run_loop()
    assert.is_truthy(result)
    assert.is_false(result.ok)
    assert.is_true(core.hrtime() - t0 < 2)
  end)
end)

describe("isolation between concurrent runs", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function() H.assert_clean(snap) end)

  it("keeps a run's code, files and scratch space from another run", function()
    local victim = [[
import os, time
SECRET = 'sk-live-123'
open('note.txt', 'w').write(SECRET)
open('/tmp/left-by-victim', 'w').write(SECRET)
open('/dev/shm/left-by-victim', 'w').write(SECRET)
time.sleep(1.5)
print(sorted(os.listdir('.')))
]]
    local attacker = [[
import glob, os, sys, time
time.sleep(0.5)
mine = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))   # this run's own directory is fair game
found = []
for pattern in ('/tmp/corral-*/code/*', '/tmp/corral-*/work/*', '/dev/shm/corral-*/code/*',
                '/dev/shm/corral-*/work/*', '/tmp/left-by-victim', '/tmp/*/work/note.txt',
                '/dev/shm/*/work/note.txt', '/dev/shm/*', '/var/tmp/*'):
    for path in glob.glob(pattern):
        if path.startswith(mine + '/'):
            continue
        try:
            if 'sk-live-123' in open(path).read():
                found.append(path)
        except OSError:
            pass
for d in glob.glob('/tmp/corral-*/work') + glob.glob('/dev/shm/corral-*/work'):
    if d.startswith(mine + '/'):
        continue
    try:
        open(d + '/planted', 'w').write('x')
        found.append('planted in ' + d)
    except OSError:
        pass
print('found', found)
]]
    local r = corral.run_many({ victim, attacker }, { concurrency = 2 })
    assert.are.equal("found []\n", r[2].stdout, r[2].stderr)
    assert.are.equal("['note.txt']\n", r[1].stdout, r[1].stderr)
    -- nothing the runs wrote is left on the host
    assert.is_false(core.exists("/tmp/left-by-victim"))
    assert.is_false(core.exists("/dev/shm/left-by-victim"))
  end)
end)
