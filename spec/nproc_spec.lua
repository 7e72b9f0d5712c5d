-- --processes N is what the program may hold: N processes, itself included, whatever processes
-- of the run's own (the launcher, the init, a wrapper's) share its RLIMIT_NPROC count.
local corral = require "corral"
local H = require "helper"

-- forks children that wait on a pipe until a fork fails; prints how many it holds
local FORKS = [[
import os
r, w = os.pipe()
n = 0
while n < 64:
    try:
        pid = os.fork()
    except OSError as e:
        print(n, e.errno)
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
]]

describe("--processes", function()
  local snap
  before_each(function() snap = H.snapshot() end)
  after_each(function()
    corral.close(10)
    H.assert_clean(snap)
  end)

  for _, policy in ipairs({ "default", "warm", "bwrap" }) do
    for _, n in ipairs({ 1, 2, 5 }) do
      it("lets the program hold exactly " .. n .. " processes under " .. policy, function()
        local r, err = corral.run_python(FORKS, { policy = policy, processes = n, timeout = 20 })
        assert.is_table(r, tostring(err))
        assert.are.equal(0, r.returncode, r.stderr)
        -- EAGAIN (11) after N - 1 children
        assert.are.equal((n - 1) .. " 11\n", r.stdout)
      end)
    end
  end
end)
