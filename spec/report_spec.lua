-- The launcher's report as the controller reads it (lua/corral/report.lua): each record at the
-- start of a line, every malformed line skipped, nothing raised.
local report = require "corral.report"

describe("report.parse #fast", function()
  it("reads a whole report", function()
    local r = report.parse("corral-launch 1\napplied session\napplied cpu 3\napplied filesystem 7\n"
      .. "refused seccomp ENOSYS no filter here\npid 2\nstatus exit 3\nusage 10 20 30\ntotal 40 50\n"
      .. "observed tasks 8\nobserved vm 131072\nobserved file 1048576\nobserved tasks 9\nobserved x 1\n"
      .. "observed vm -1\nobserved file 99999999999999999999999\n")
    assert.equal(1, r.version)
    assert.same({ session = true, cpu = "3", filesystem = "7" }, r.applied)
    assert.same({ "session", "cpu", "filesystem" }, r.applied_order)
    assert.same({ seccomp = { errno = "ENOSYS", message = "no filter here" } }, r.refused)
    assert.equal(2, r.pid)
    assert.same({ kind = "exit", code = 3 }, r.status)
    assert.same({ user_us = 10, sys_us = 20, maxrss_kb = 30 }, r.usage)
    assert.same({ cpu_us = 40, peak_kb = 50 }, r.total)
    -- the first of each known name; unknown names and bad numbers are skipped
    assert.same({ tasks = 8, vm = 131072, file = 1048576 }, r.observed)
  end)

  it("takes a record only at the start of a line", function()
    local r = report.parse("xapplied a\n applied b\n!applied c\nstatus exit 1 applied d\napplied e")
    assert.same({ e = true }, r.applied)
    assert.is_nil(r.status)  -- "exit 1 applied d" is not "exit N"
  end)

  it("skips an applied line whose value holds a space, or that has no name", function()
    local r = report.parse("applied a x y\napplied b  x\napplied c x\napplied \napplied\napplied d \n\n\napplied e.1")
    assert.same({ c = "x", d = true, e = ".1" }, r.applied)
    assert.same({ "c", "d", "e" }, r.applied_order)
  end)

  it("keeps the first order of a name applied twice, and its last value", function()
    local r = report.parse("applied a 1\napplied b\napplied a 2")
    assert.same({ a = "2", b = true }, r.applied)
    assert.same({ "a", "b" }, r.applied_order)
  end)

  it("reads a long line in linear time", function()
    local t0 = os.clock()
    local r = report.parse("applied x " .. string.rep("a ", 200000) .. "\napplied y")
    assert.same({ y = true }, r.applied)
    assert.is_true(os.clock() - t0 < 0.5, "took " .. (os.clock() - t0) .. " s")
  end)

  it("gives an empty report for what is not text", function()
    assert.same({ applied = {}, applied_order = {}, refused = {}, observed = {} }, report.parse(nil))
    assert.same({ applied = {}, applied_order = {}, refused = {}, observed = {} }, report.parse(""))
  end)
end)
