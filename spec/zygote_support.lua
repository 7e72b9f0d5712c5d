--- Helpers for spec/zygote_spec.lua and bench/zygote.lua: a default run's launch plan, built as the
-- library builds it (the default policy's launch_args over a run directory of its own), run by
-- corral-launch through the host module, or by corral-zygote through spec/zygote_driver.py.
local core = require "corral.core"
local cjson = require "cjson"
local policy = require "corral.policy"
local options = require "corral.options"
local hostmod = require "corral.host"
local report = require "corral.report"

local M = {}

--- Every run directory M.plan made (their paths are in the command line of a run's processes).
M.run_dirs = {}

M.zygote = "./csrc/corral-zygote"
M.launcher = "./csrc/corral-launch"
M.python = "/usr/bin/python3"
M.driver = "spec/zygote_driver.py"
-- the default policy's environment: the locale Python starts in
M.zygote_args = { M.zygote, "--control-fd", "{ctl}", "--net", "new", "--userns", "auto",
  "--python", M.python, "--env", "LANG=C.UTF-8", "--env", "PATH=/usr/bin:/bin" }

--- A run directory and the default policy's launcher arguments for `code`: those of a cold run,
-- or with `warm`, of a run of the policy's zygote (the program runs its file itself, without the
-- prelude, in a zygote started with --flush-handlers).
-- @return plan `{args = {...}, run = run, close = function}`; close() removes the directory and
-- gives back the uid
function M.plan(code, opts, warm)
  local pol = policy.load((opts and opts.policy) or "default")
  local host = assert(hostmod.basics())
  local o = options.check("run_python", opts or {}, options.run_schema)
  o.policy = nil
  o = assert(pol:prepare(o, host))
  local run = { euid = host.euid, has_nul = code:find("\0", 1, true) ~= nil, zygote = warm or nil }
  if host.root and host.setuid and pol.uid_range then
    run.uid = assert(hostmod.take_uid(pol.uid_range[1], pol.uid_range[2]))
    run.gid = run.uid
  end
  local top = assert(core.mkdtemp(require("corral.host").run_dir_base() .. "/corral-XXXXXX"))
  run.top = top
  M.run_dirs[#M.run_dirs + 1] = top
  run.code_dir = top .. "/code"
  run.code_path = run.code_dir .. "/" .. (pol.code_name or "main.py")
  run.workdir = top .. "/work"
  assert(core.mkdir(run.code_dir, run.uid and 488 or 448))
  assert(core.write_file(run.code_path, code, run.uid and 288 or 256))
  assert(core.mkdir(run.workdir, 448))
  if run.uid then
    assert(core.chown(run.code_dir, -1, run.gid))
    assert(core.chown(run.code_path, -1, run.gid))
    assert(core.chmod(top, 457))
    assert(core.chown(run.workdir, run.uid, run.gid))
  end
  local plan = { args = pol:launch_args(o, run, host), run = run, opts = o }
  function plan.close()
    if run.top then
      assert(core.rmtree(run.top))
      assert(not core.exists(run.top), "run directory left: " .. run.top)
      run.top = nil
    end
    if run.uid then hostmod.release_uid(run.uid); run.uid = nil end
  end
  return plan
end

--- Run `args` with corral-launch, as the library does (stdin: `stdin` or EOF).
-- @return `{status = raw wait status, stdout, stderr, report}`
function M.launch(args, stdin)
  local res
  assert(core.spawn {
    file = M.launcher, args = args, stdin = stdin, report = true, timeout = 30,
    stdout_cap = 1 << 20, stderr_cap = 1 << 20,
    on_exit = function(r) res = r end,
  })
  while not res do core.run("once") end
  local status = res.term_signal ~= 0 and res.term_signal or (res.exit_status << 8)
  return { status = status, stdout = res.stdout, stderr = res.stderr, report = res.report }
end

local function tmpfile(text)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

--- Drive a zygote through `steps` (see spec/zygote_driver.py); `zargs` replaces M.zygote_args.
-- @return the events, and by kind: `ready` (fields), `runs` (id → event), `exit`, `times`,
-- `messages` (the unexpected ones)
function M.drive(steps, zargs)
  local script = tmpfile(cjson.encode { zygote = zargs or M.zygote_args, steps = steps })
  local p = io.popen(M.python .. " " .. M.driver .. " " .. script .. " 2>&1")
  local out = { events = {}, runs = {}, messages = {}, times = {} }
  for line in p:lines() do
    local ok, ev = pcall(cjson.decode, line)
    if not ok then ev = { event = "message", fields = { "driver: " .. line } } end
    for k, v in pairs(ev) do if v == cjson.null then ev[k] = nil end end
    if ev.event == "run" then
      for _, k in ipairs({ "stdout", "stderr", "report" }) do
        ev[k] = ev[k]:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
      end
    end
    out.events[#out.events + 1] = ev
    if ev.event == "ready" then out.ready = ev.fields
    elseif ev.event == "run" then out.runs[ev.id] = ev
    elseif ev.event == "exit" then out.exit = ev
    elseif ev.event == "times" then out.times[ev.name] = ev.times
    elseif ev.event == "message" then out.messages[#out.messages + 1] = table.concat(ev.fields, " | ")
    end
  end
  p:close()
  os.remove(script)
  return out
end

--- A run step for the driver.
function M.run_step(id, args, stdin)
  return { op = "run", id = tostring(id), args = args, stdin = stdin }
end

--- The set of `applied` names of a report (values dropped), as a sorted list.
function M.applied(text)
  local names = {}
  for name in pairs(report.parse(text).applied) do names[#names + 1] = name end
  table.sort(names)
  return names
end

--- The report without the lines that differ between two runs of the same plan (pid, usage).
function M.stable_report(text)
  local keep = {}
  for line in (text or ""):gmatch("[^\n]+") do
    if line:match("^observed ") then
      keep[#keep + 1] = line:match("^observed %a+")   -- the same observations, measured apart
    elseif not line:match("^usage ") and not line:match("^pid ") and not line:match("^total ") then
      keep[#keep + 1] = line
    end
  end
  return table.concat(keep, "\n")
end

return M
