-- corral against bare Python, measured side by side in one run (make bench): every figure
-- corral's performance targets ask for, and its targets with PASS or MISS computed from this run.
--
-- 1. Latency of print('hello'): bare `python3 -I -c`, `unshare --net python3 -I -c`, corral's
--    `default`, `bwrap` and `warm` policies through the library (corral.run_python) and through
--    `corral run --json` (a new Lua process per run), and through `corral serve` end to end (one
--    server per policy on loopback TCP with a token, wrk with one keep-alive connection). Every
--    case is warmed up, then the cases run round-robin, so that machine drift hits all alike:
--    median, p99, and the ratio of the median to bare Python's of the same run. A heavy-import
--    program (json, decimal, … csv, and numpy when installed) bare, under `default` and `warm`.
--    A reference row, the floor of any warm run: Python itself, with warm's modules imported,
--    forking a child that runs print('hello') into a pipe and exits, timed inside that process
--    from the fork to the child's reaping (a python3 per round, two untimed forks first, then
--    three timed).
-- 2. Throughput: runs/s at concurrency 1, 2 and 8 through the library (each policy) and through
--    `corral serve` (wrk -c2, -c8), in interleaved chunks after a warm-up chunk, with the
--    controller's own CPU per run (the bench process's getrusage for the library; /proc/PID/stat of
--    the server process for serve; children's CPU is not the controller's).
-- 3. Controller RSS: the library controller (this process) and each server at idle; then a series
--    of --rss-runs runs through one library controller at concurrency 8 (default and warm mixed),
--    RSS after a full GC at the start, after a warm-up and at regular marks, and the spread.
--
-- The `warm` rows run when `corral.policies()` lists a `warm` policy that loads and runs
-- print('hello'); otherwise the bench says "warm: not available (<reason>)" and goes on. Every
-- run's result is checked (ok, stdout "hello\n"); a failed run is counted, never timed.
--
--   lua5.4 bench/bench.lua [N] [--runs N] [--throughput-runs N] [--serve-seconds S]
--                          [--rss-runs N] [--only SECTIONS] [--json FILE] [--doc FILE]
--
-- With --doc (make bench: docs/performance.md), everything printed on stdout is also written to
-- FILE after bench/performance-head.md, with the date and the machine: the figures in the docs
-- come from a run, never typed by hand.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local core = require "corral.core"
local corral = require "corral"
local has_cjson, cjson = pcall(require, "cjson")

local hrtime, fmt = core.hrtime, string.format

local USAGE = [[
usage: lua5.4 bench/bench.lua [N] [OPTIONS]
  N, --runs N            latency rounds: samples per case (default 100)
  --throughput-runs N    runs per policy and concurrency through the library (default 300)
  --serve-seconds S      wrk seconds per server: at concurrency 1 (latency) and again at 2 and
                         at 8 (throughput) (default 5)
  --rss-runs N           runs in the controller RSS series (default 2000; the target is 10000)
  --only LIST            sections to run, comma-separated: latency,serve,throughput,rss,
                         sessions (bare python3, a session cell through the library and
                         through corral serve, a warm session's open; latency includes it)
  --json FILE            also write every figure as JSON to FILE
  --doc FILE             also write the page docs/performance.md is (the method and this run's
                         output) to FILE
  -h, --help             this text
]]

local opt = { runs = 100, throughput_runs = 300, serve_seconds = 5, rss_runs = 2000,
              only = { latency = true, serve = true, throughput = true, rss = true, sessions = true } }
do
  local flags = { ["--runs"] = "runs", ["--throughput-runs"] = "throughput_runs",
                  ["--serve-seconds"] = "serve_seconds", ["--rss-runs"] = "rss_runs" }
  local i = 1
  while i <= #arg do
    local a = arg[i]
    if a == "-h" or a == "--help" then
      io.stdout:write(USAGE)
      os.exit(0)
    elseif flags[a] or a == "--json" or a == "--doc" or a == "--only" then
      local v = arg[i + 1]
      if not v then io.stderr:write("bench: ", a, " needs a value\n", USAGE) os.exit(2) end
      if a == "--json" or a == "--doc" then
        opt[a:sub(3)] = v
      elseif a == "--only" then
        opt.only = {}
        for s in v:gmatch("[^,]+") do
          if not ({ latency = 1, serve = 1, throughput = 1, rss = 1, sessions = 1 })[s] then
            io.stderr:write("bench: unknown section '", s, "'\n", USAGE) os.exit(2)
          end
          opt.only[s] = true
        end
        if opt.only.latency then opt.only.sessions = true end
      else
        local n = math.tointeger(tonumber(v))
        if not n or n < 1 then io.stderr:write("bench: ", a, " needs a whole number >= 1\n") os.exit(2) end
        opt[flags[a]] = n
      end
      i = i + 1
    elseif math.tointeger(tonumber(a)) and i == 1 then
      opt.runs = math.tointeger(tonumber(a))
    else
      io.stderr:write("bench: unexpected argument '", a, "'\n", USAGE)
      os.exit(2)
    end
    i = i + 1
  end
end

-- Helpers ---------------------------------------------------------------------------------------

-- every line said, for --doc
local said = {}
local function say(...)
  local line = fmt(...)
  said[#said + 1] = line
  io.stdout:write(line, "\n")
  io.stdout:flush()
end
local function progress(...) io.stderr:write("bench: ", fmt(...), "\n") io.stderr:flush() end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function which(name)
  local f = io.popen("command -v " .. sh_quote(name) .. " 2>/dev/null")
  local path = f:read("l")
  f:close()
  return path ~= "" and path or nil
end

local function sleep(seconds)
  local fired = false
  local t = core.timer(seconds, function() fired = true end)
  while not fired do core.run("once") end
  t:close()
end

-- the sorted copy's value at quantile p (nearest rank)
local function quantile(sorted, p)
  return sorted[math.max(1, math.ceil(#sorted * p))]
end

local function summary(samples)
  local s = {}
  for i, v in ipairs(samples) do s[i] = v end
  table.sort(s)
  if #s == 0 then return nil end
  return { n = #s, median = quantile(s, 0.5), p99 = quantile(s, 0.99) }
end

local function rss_kb(pid)
  local text = read_file("/proc/" .. (pid or "self") .. "/status")
  return tonumber(text and text:match("VmRSS:%s*(%d+)"))
end

local CLK_TCK
do
  local f = io.popen("getconf CLK_TCK 2>/dev/null")
  CLK_TCK = tonumber(f:read("l")) or 100
  f:close()
end

-- user+sys seconds of another process (not its children)
local function cpu_s(pid)
  local text = read_file("/proc/" .. pid .. "/stat")
  local rest = text and text:match("%) (.*)$")
  if not rest then return nil end
  local f = {}
  for w in rest:gmatch("%S+") do f[#f + 1] = w end
  -- fields from 3 (state) on: utime is field 14, stime 15
  return (tonumber(f[12]) + tonumber(f[13])) / CLK_TCK
end

local function self_cpu_s()
  local ru = core.rusage()
  return ru.user_s + ru.sys_s
end

local function settle()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function mb(kb) return kb and fmt("%.1f MB", kb / 1024) or "?" end

-- The children's environment: core.spawn gives an empty one unless told otherwise.
local ENV = {}
for _, k in ipairs { "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_RUNTIME_DIR", "CORRAL_POLICY_PATH",
                     "CORRAL_LAUNCH", "CORRAL_CPATH" } do
  local v = os.getenv(k)
  if v then ENV[#ENV + 1] = k .. "=" .. v end
end

-- Spawn a process (no shell), wait for it; its result table or nil, message.
local function spawn_wait(file, args)
  local res
  local p, err = core.spawn { file = file, args = args, env = ENV, on_exit = function(r) res = r end }
  if not p then return nil, err end
  while not res do core.run("once") end
  return res
end

local function exit_text(r)
  if r.term_signal and r.term_signal ~= 0 then return "signal " .. r.term_signal end
  return "exit " .. tostring(r.exit_status)
end

-- What is here ----------------------------------------------------------------------------------

local HELLO = "print('hello')"
local HEAVY_MODULES = "json, decimal, fractions, statistics, datetime, collections, re, email, csv"
local LUA = which(arg[-1] or "lua5.4") or arg[-1] or "lua5.4"
local WRK = which("wrk")
local NCPU = core.cpu_count()

local unshare
do
  local u = which("unshare")
  if u then
    for _, args in ipairs { { "--net" }, { "--user", "--map-root-user", "--net" } } do
      local a = { table.unpack(args) }
      a[#a + 1] = "true"
      local r = spawn_wait(u, a)
      if r and r.exit_status == 0 then
        unshare = { u, table.unpack(args) }
        break
      end
    end
  end
end

-- A policy is available when it is listed, loads, and runs print('hello').
local listed = {}
for _, p in ipairs(corral.policies()) do listed[#listed + 1] = p.name end
local function policy_status(name)
  local found = false
  for _, n in ipairs(listed) do found = found or n == name end
  if not found then
    return false, "no policy named '" .. name .. "' on the policy path; corral.policies(): " .. table.concat(listed, ", ")
  end
  local ok, err = pcall(corral.load_policy, name)
  if not ok then return false, "it does not load: " .. tostring(err) end
  local pok, r, rerr = pcall(corral.run_python, HELLO, { policy = name })
  if not pok or not r then return false, "a first run failed: " .. tostring(pok and rerr or r) end
  if not r.ok or r.stdout ~= "hello\n" then
    return false, "a first run gave reason " .. tostring(r.reason) .. ", stdout " .. fmt("%q", r.stdout)
      .. ", stderr " .. fmt("%q", r.stderr:sub(1, 200))
  end
  return true
end

local LIB_IDLE_RSS = rss_kb()     -- before any run through the library
local available, why_not = {}, {}
-- `default` without its launches started ahead (prestart = 0): what they save, side by side
local COLD = "default-cold"
local COLD_POLICY = require("corral.policy").load("default"):extend { name = COLD, prestart = 0 }
local function pol_of(name) return name == COLD and COLD_POLICY or name end

local POLICIES = {}               -- the policies measured, in order
for _, name in ipairs { "default", "bwrap", "warm" } do
  local ok, reason = policy_status(name)
  available[name], why_not[name] = ok, reason
  if ok then POLICIES[#POLICIES + 1] = name end
end
if not available.default then error("bench: the default policy does not work here: " .. why_not.default, 0) end

-- bare Python is the interpreter the sandbox runs (python3 on the policy's PATH), not whatever
-- python3 comes first on the caller's PATH (a pyenv shim, a virtualenv)
local PY
do
  local r = corral.run_python("import sys; print(sys.executable)")
  PY = r and r.ok and r.stdout:match("^(/%S+)\n$") or "/usr/bin/python3"
end
local function python_ok(code)
  local r = spawn_wait(PY, { "-I", "-c", code })
  return r and r.exit_status == 0
end
local have_numpy = python_ok("import numpy")
if have_numpy then HEAVY_MODULES = HEAVY_MODULES .. ", numpy" end
-- the warm policy whose interpreter has imported what the heavy program imports: with numpy,
-- warm-numpy (warm's modules and numpy), measured for hello too (what its bigger interpreter
-- costs every run)
local WARM_HEAVY = "warm"
if have_numpy and available.warm then
  local ok, reason = policy_status("warm-numpy")
  available["warm-numpy"], why_not["warm-numpy"] = ok, reason
  if ok then WARM_HEAVY = "warm-numpy" end
end
local HEAVY = "import " .. HEAVY_MODULES .. "\nprint('ok')"
-- a program that logs a lot: 100,000 lines (588,890 bytes) of print()
local PRINTS = "for i in range(100000):\n    print(i)"
local PRINTS_LAST = "99999\n"
-- the print-heavy rows run every PRINT_EVERY rounds: unbuffered, one takes seconds
local PRINT_EVERY = 10

local function python_version()
  local f = io.popen(sh_quote(PY) .. " -V 2>&1")
  local v = f:read("l")
  f:close()
  return v
end

local report = {
  machine = { cpus = NCPU, python = python_version(), python_path = PY, corral = corral._VERSION,
              kernel = (function() local f = io.popen("uname -r") local v = f:read("l") f:close() return v end)() },
  config = { runs = opt.runs, throughput_runs = opt.throughput_runs, serve_seconds = opt.serve_seconds,
             rss_runs = opt.rss_runs },
  policies = {}, heavy_modules = HEAVY_MODULES, numpy = have_numpy,
  latency = {}, throughput = {}, rss = {}, targets = {},
}
for _, name in ipairs { "default", "bwrap", "warm" } do
  report.policies[name] = { available = available[name], reason = why_not[name] }
end

say("corral bench — %s; %d CPUs; %s (%s); %s", report.machine.corral, NCPU, report.machine.python, PY,
  os.date("!%Y-%m-%d %H:%M UTC"))
for _, name in ipairs { "bwrap", "warm" } do
  if not available[name] then say("%s: not available (%s)", name, why_not[name]) end
end
say("heavy imports: %s%s", HEAVY_MODULES, have_numpy and "" or " (numpy is not installed: measured without it)")
if not unshare then say("unshare --net: not available here (that row is left out)") end

-- corral serve: one server per policy, loopback TCP with a token, driven by wrk ----------------

local tmpdir = assert(core.mkdtemp("/tmp/corral-bench-XXXXXX"))
-- a directory on a tmpfs for the files' floor (the run directories' base when that is /dev/shm)
local SHM_DIR = require("corral.host").run_dir_base() == "/dev/shm"
  and core.mkdtemp("/dev/shm/corral-bench-XXXXXX") or nil
local servers = {}
-- a session cell through each server (`sessions`): targets of wrk as the servers are
local cells = {}
local serve_reason
if not (opt.only.serve or opt.only.sessions) then
  serve_reason = "not selected (--only)"
elseif not WRK then
  serve_reason = "wrk not found (apt-get install wrk)"
elseif not has_cjson then
  serve_reason = "lua-cjson not installed"
end

-- wrk's script: POST the body, check every response, print the counts (and the latencies, in
-- microseconds, as value-count pairs) in done(). Runs under wrk's LuaJIT.
local WRK_SCRIPT = [==[
wrk.method = "POST"
wrk.body = @BODY@
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. @TOKEN@
local DUMP = @DUMP@
local threads = {}
function setup(thread) threads[#threads + 1] = thread end
function init() n, bad, first_bad = 0, 0, nil end
function response(status, headers, body)
  n = n + 1
  if status ~= 200 or not body:find('"ok":%s*true') or not body:find('"stdout":%s*"hello\\n"') then
    bad = bad + 1
    first_bad = first_bad or (status .. " " .. body:sub(1, 300):gsub("%c", " "))
  end
end
function done(summary, latency)
  local responses, nbad, first = 0, 0, nil
  for _, t in ipairs(threads) do
    responses = responses + t:get("n")
    nbad = nbad + t:get("bad")
    first = first or t:get("first_bad")
  end
  local e = summary.errors
  io.write(string.format("bench requests %d duration_us %d responses %d bad %d errors %d\n", summary.requests,
    summary.duration, responses, nbad, e.connect + e.read + e.write + e.status + e.timeout))
  if first then io.write("bench first_bad ", first, "\n") end
  if DUMP then
    for i = 1, #latency do
      local v, c = latency(i)
      io.write(string.format("bench lat %d %d\n", v, c))
    end
  end
end
]==]

local token
do
  local f = assert(io.open("/dev/urandom", "rb"))
  token = f:read(16):gsub(".", function(c) return fmt("%02x", c:byte()) end)
  f:close()
end
local token_file = tmpdir .. "/token"
assert(core.write_file(token_file, token .. "\n"))

local function wrk_script(pol, dump)
  local path = tmpdir .. "/wrk-" .. pol .. (dump and "-lat" or "") .. ".lua"
  local body = cjson.encode { code = HELLO, policy = pol }
  local text = WRK_SCRIPT:gsub("@(%u+)@", { BODY = fmt("%q", body), TOKEN = fmt("%q", token), DUMP = tostring(dump) })
  assert(core.write_file(path, text))
  return path
end

-- wrk's script that opens a session: one POST /v1/sessions, its id printed, then the thread stops.
local WRK_OPEN = [==[
wrk.method = "POST"
wrk.body = "{}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. @TOKEN@
local done_ = false
function response(status, headers, body)
  if not done_ then
    done_ = true
    io.write("bench status ", status, " id ", body:match('"id":%s*"([^"]+)"') or "-", "\n")
  end
  wrk.thread:stop()
end
]==]

local function stop_server(s)
  if s.exit then return end
  core.kill(s.pid, 15)                      -- SIGTERM: drain, then exit 0
  local deadline = hrtime() + 10
  while not s.exit and hrtime() < deadline do sleep(0.02) end
  if not s.exit then
    s.proc:kill()
    while not s.exit do core.run("once") end
  end
end

local function start_server(pol)
  local s = { policy = pol, log = tmpdir .. "/serve-" .. pol .. ".log" }
  local line = fmt("exec %s bin/corral serve --listen 127.0.0.1:0 --token-file %s --policy %s --concurrency 8 "
    .. "--drain-seconds 5 2>%s", sh_quote(LUA), sh_quote(token_file), sh_quote(pol), sh_quote(s.log))
  local proc, err = core.spawn { file = "/bin/sh", args = { "-c", line }, env = ENV,
                                 on_exit = function(r) s.exit = r end }
  if not proc then return nil, err end
  s.proc, s.pid = proc, proc:pid()
  local deadline = hrtime() + 15
  while not s.exit and hrtime() < deadline do
    s.addr = (read_file(s.log) or ""):match("listening address=(%S+)")
    if s.addr then break end
    sleep(0.02)
  end
  if not s.addr then
    stop_server(s)
    local log = (read_file(s.log) or ""):gsub("%s+$", ""):sub(-300)
    return nil, "the server did not start: " .. (s.exit and exit_text(s.exit) or "no 'listening' line in 15 s")
      .. (log ~= "" and ("; its log: " .. log) or "")
  end
  s.url = "http://" .. s.addr .. "/v1/run"
  s.script, s.script_lat = wrk_script(pol, false), wrk_script(pol, true)
  sleep(0.2)
  s.rss_idle = rss_kb(s.pid)
  s.lat = {}                                  -- seconds, one per request at concurrency 1
  s.tp = {}                                   -- conc → {requests, seconds, cpu_s}
  s.bad, s.requests = 0, 0
  return s
end

-- A session opened on server s, and a target of wrk (as a server is) whose requests are a cell
-- print('hello') in it: POST /v1/sessions/{id}/exec, {"code": ...} on a kept-alive connection.
-- @return the target, or nil, message
local function cell_target(s)
  local path = tmpdir .. "/wrk-open-" .. s.policy .. ".lua"
  assert(core.write_file(path, (WRK_OPEN:gsub("@TOKEN@", function() return fmt("%q", token) end))))
  local r, err = spawn_wait(WRK, { "-t1", "-c1", "-d5s", "--timeout", "10s", "-s", path,
    "http://" .. s.addr .. "/v1/sessions" })
  if not r then return nil, "wrk: " .. tostring(err) end
  local status, id = r.stdout:match("bench status (%d+) id (%S+)")
  if status ~= "201" or id == "-" then
    return nil, "POST /v1/sessions: " .. tostring(status) .. " " .. (r.stdout .. r.stderr):sub(1, 300)
  end
  local c = { policy = s.policy, pid = s.pid, url = "http://" .. s.addr .. "/v1/sessions/" .. id .. "/exec",
              lat = {}, tp = {}, bad = 0, requests = 0, session = id }
  local body = cjson.encode { code = HELLO }
  for _, dump in ipairs { false, true } do
    local file = tmpdir .. "/wrk-cell-" .. s.policy .. (dump and "-lat" or "") .. ".lua"
    local text = WRK_SCRIPT:gsub("@(%u+)@", { BODY = fmt("%q", body), TOKEN = fmt("%q", token), DUMP = tostring(dump) })
    assert(core.write_file(file, text))
    if dump then c.script_lat = file else c.script = file end
  end
  return c
end

-- Run wrk against server s for `seconds` with `conns` connections; adds to s's counters.
-- @return requests, seconds, controller cpu seconds; or nil, message
local function wrk_run(s, conns, seconds, lat_into)
  local cpu0 = cpu_s(s.pid)
  local r, err = spawn_wait(WRK, { "-t1", "-c" .. conns, "-d" .. seconds .. "s", "--timeout", "10s",
    "-s", lat_into and s.script_lat or s.script, s.url })
  local cpu1 = cpu_s(s.pid)
  if not r then return nil, "wrk: " .. tostring(err) end
  if r.exit_status ~= 0 then return nil, "wrk: " .. exit_text(r) .. " " .. r.stderr:sub(1, 300) end
  local out = r.stdout
  local req, dur, bad, errors = out:match("bench requests (%d+) duration_us (%d+) responses %d+ bad (%d+) errors (%d+)")
  if not req then return nil, "wrk printed no counts: " .. out:sub(1, 300) end
  req, dur, bad, errors = tonumber(req), tonumber(dur) / 1e6, tonumber(bad), tonumber(errors)
  s.requests = s.requests + req
  s.bad = s.bad + bad + errors
  s.first_bad = s.first_bad or out:match("bench first_bad ([^\n]*)")
  if errors > 0 and not s.first_bad then s.first_bad = errors .. " socket/status errors" end
  if lat_into then
    for v, c in out:gmatch("bench lat (%d+) (%d+)") do
      for _ = 1, tonumber(c) do lat_into[#lat_into + 1] = tonumber(v) / 1e6 end
    end
  end
  return req - bad, dur, (cpu1 and cpu0) and (cpu1 - cpu0) or 0
end

local function tp_add(s, conc, good, dur, cpu)
  local t = s.tp[conc] or { requests = 0, seconds = 0, cpu_s = 0 }
  s.tp[conc] = t
  t.requests, t.seconds, t.cpu_s = t.requests + good, t.seconds + dur, t.cpu_s + cpu
end

local main_ok, main_err = xpcall(function()

if not serve_reason then
  for _, pol in ipairs { "default", "warm" } do
    if available[pol] then
      local s, err = start_server(pol)
      if s then
        servers[#servers + 1] = s
      else
        say("corral serve --policy %s: not available (%s)", pol, err)
        why_not["serve_" .. pol] = err
      end
    end
  end
  for _, s in ipairs(servers) do
    progress("serve %s: listening on %s; warm-up (wrk -c8, 1 s)", s.policy, s.addr)
    if opt.only.serve then
      local ok, err = wrk_run(s, 8, 1)
      if not ok then error("serve " .. s.policy .. " warm-up: " .. err, 0) end
    end
    s.rss_warm = rss_kb(s.pid)
    if opt.only.sessions then
      local c, err = cell_target(s)
      if not c then error("serve " .. s.policy .. ": a session: " .. err, 0) end
      cells[#cells + 1] = c
    end
  end
end
-- what the latency rounds drive with wrk -c1: /v1/run of each server (serve), a cell (sessions)
local wrk_targets = {}
if opt.only.serve then for _, s in ipairs(servers) do wrk_targets[#wrk_targets + 1] = s end end
for _, c in ipairs(cells) do wrk_targets[#wrk_targets + 1] = c end

-- 1. Latency -------------------------------------------------------------------------------------

local function proc_case(argv, want)
  local file, args = argv[1], { table.unpack(argv, 2) }
  return function()
    local r, err = spawn_wait(file, args)
    if not r then return false, err end
    if r.exit_status ~= 0 then return false, exit_text(r) .. ": " .. r.stderr:sub(1, 200) end
    if not r.stdout:find(want, 1, true) then return false, "stdout " .. fmt("%q", r.stdout:sub(1, 200)) end
    return true
  end
end
local function lib_case(code, pol, want)
  return function()
    local r, err = corral.run_python(code, { policy = pol_of(pol) })
    if not r then return false, err end
    if not r.ok or r.stdout ~= want then
      return false, "reason " .. tostring(r.reason) .. ", stdout " .. fmt("%q", r.stdout:sub(1, 100))
        .. ", stderr " .. fmt("%q", r.stderr:sub(1, 200))
    end
    return true
  end
end

-- The floor: what a fork of a warmed python3 costs with nothing of corral's around it. The
-- samples are the process's own (fork to reaping), not the wall time of its start.
local FLOOR = [[
import gc, os, sys, time
for m in sys.argv[1].split(","):
    try:
        if m:
            __import__(m)
    except Exception:
        pass  # as the zygote: a module that does not import is left out
compile("def f(a, *b, **c):\n    return [x for x in b if x]\n", "<w>", "exec")
gc.collect()
gc.freeze()
src = sys.argv[2]
times = []
for i in range(5):
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        exec(compile(src, "main.py", "exec"), {"__name__": "__main__"})
        sys.stdout.flush()
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    dt = time.perf_counter() - t0
    out = os.read(r, 100)
    os.close(r)
    if out != b"hello\n":
        sys.exit("the child printed %r" % out)
    if i >= 2:
        times.append(dt)
print(" ".join("%.9f" % t for t in times))
]]
local FLOOR_MODS
do
  local ok, wp = pcall(function() return require("corral.policy").load("warm") end)
  FLOOR_MODS = ok and wp.warm and wp.warm.preload and table.concat(wp.warm.preload, ",")
end
-- A case whose python3 (run with `args`) times itself: it prints `n` samples in seconds.
local function self_timed(args, n)
  return function()
    local r, err = spawn_wait(PY, args)
    if not r then return false, err end
    if r.exit_status ~= 0 then return false, exit_text(r) .. ": " .. r.stderr:sub(1, 200) end
    local t = {}
    for v in r.stdout:gmatch("[%d.]+") do t[#t + 1] = tonumber(v) end
    if #t ~= n then return false, "stdout " .. fmt("%q", r.stdout:sub(1, 200)) end
    return true, nil, t
  end
end
local function floor_case() return self_timed({ "-I", "-c", FLOOR, FLOOR_MODS or "", HELLO }, 3) end

-- The files' floor: what the kernel takes for the files of the files_ rows with nothing of
-- corral's around them: one python3 makes 100 files of 10 KB in a directory of a tmpfs, reads
-- each back (open, fstat, read, close) and removes them, timed inside (its own loop's overhead
-- included); three rounds, the last two kept.
local FILES_FLOOR = [[
import os, sys, time
base = sys.argv[1]
data = b"x" * 10240
times = []
for i in range(3):
    d = os.path.join(base, "floor-%d-%d" % (os.getpid(), i))
    t0 = time.perf_counter()
    os.mkdir(d)
    names = [os.path.join(d, "f%03d.bin" % k) for k in range(100)]
    for n in names:
        f = os.open(n, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(f, data)
        os.close(f)
    for n in names:
        f = os.open(n, os.O_RDONLY)
        os.fstat(f)
        if len(os.read(f, 20480)) != 10240:
            sys.exit("short read")
        os.close(f)
    for n in names:
        os.unlink(n)
    os.rmdir(d)
    if i >= 1:
        times.append(time.perf_counter() - t0)
print(" ".join("%.9f" % t for t in times))
]]
local function files_floor_case() return self_timed({ "-I", "-c", FILES_FLOOR, SHM_DIR }, 2) end

local code_file = tmpdir .. "/hello.py"
assert(core.write_file(code_file, HELLO))
local CLI_OK = '"stdout":"hello\\n"'

-- { id, label, fn, group }: group "hello" (ratio to bare) or "heavy" (ratio to bare heavy)
local cases = {}
local function add(id, label, fn, group) cases[#cases + 1] = { id = id, label = label, fn = fn, group = group or "hello", t = {}, fails = 0 } end
-- the print-heavy program through the library, its whole output kept
local function prints_case(pol)
  return function()
    local r, err = corral.run_python(PRINTS, { policy = pol, max_output = 1000000 })
    if not r then return false, err end
    if not r.ok or r.truncated or r.stdout:sub(-#PRINTS_LAST) ~= PRINTS_LAST then
      return false, "reason " .. tostring(r.reason) .. ", truncated " .. tostring(r.truncated)
        .. ", stderr " .. fmt("%q", r.stderr:sub(1, 200))
    end
    return true
  end
end
-- a cell print('hello') in a session opened once per policy; and a session opened, its first
-- cell run (the time of both), closed (not timed)
local session = require "corral.session"
local open_sessions = {}
local function cell_case(pol)
  return function()
    local s = open_sessions[pol]
    if not s or not s:alive() then
      local err
      s, err = session.open { policy = pol_of(pol) }
      if not s then return false, err end
      open_sessions[pol] = s
    end
    local r, err = s:exec(HELLO)
    if not r then return false, err end
    if r.reason ~= "ok" or r.stdout ~= "hello\n" then return false, "reason " .. tostring(r.reason) .. " " .. r.stderr:sub(1, 200) end
    return true
  end
end
local function session_case(pol)
  return function()
    local t0 = hrtime()
    local s, err = session.open { policy = pol_of(pol) }
    if not s then return false, err end
    local r
    r, err = s:exec(HELLO)
    local dt = hrtime() - t0
    s:close()
    if not r then return false, err end
    if r.reason ~= "ok" or r.stdout ~= "hello\n" then return false, "reason " .. tostring(r.reason) .. " " .. r.stderr:sub(1, 200) end
    return true, nil, { dt }
  end
end

-- print('hello') given 100 files of 10 KB and handed back all of them (collect "**")
local FILES100 = {}
for i = 1, 100 do FILES100[i] = { path = fmt("in/f%03d.bin", i), content = ("x"):rep(10240) } end
-- print('hello') with `files` given and `collect`, expecting `want` files back. The two directions
-- apart too: the 100 files given and not collected; and 100 files of 10 KB that the program
-- writes, collected or not (new files: none is what the caller gave)
local WRITE100 = "for i in range(100):\n    open('f%03d.bin' % i, 'wb').write(b'x' * 10240)\nprint('hello')"
local function files_apart(pol, code, files, collect, want)
  return function()
    local r, err = corral.run_python(code, { policy = pol_of(pol), files = files, collect = collect })
    if not r then return false, err end
    if not r.ok or r.stdout ~= "hello\n" or #(r.files or {}) ~= want or r.files_truncated then
      return false, "reason " .. tostring(r.reason) .. ", files " .. tostring(r.files and #r.files)
        .. ", stderr " .. fmt("%q", r.stderr:sub(1, 200))
    end
    return true
  end
end
if opt.only.sessions then add("bare", "bare python3 -I -c", proc_case({ PY, "-I", "-c", HELLO }, "hello\n")) end
if opt.only.latency then
  add("floor", FLOOR_MODS and "floor: fork of a warmed python3 (no corral)"
    or "floor: fork of a python3 (no corral; no warm policy)", floor_case())
  if unshare then
    local argv = { table.unpack(unshare) }
    for _, a in ipairs { PY, "-I", "-c", HELLO } do argv[#argv + 1] = a end
    add("unshare", table.concat(unshare, " "):gsub("^.*/", "") .. " python3 -I -c", proc_case(argv, "hello\n"))
  end
  for _, pol in ipairs(POLICIES) do
    add("lib_" .. pol, "corral " .. pol .. " (library)", lib_case(HELLO, pol, "hello\n"))
    if pol == "default" then
      add("lib_" .. COLD, "corral default, prestart = 0 (library)", lib_case(HELLO, COLD, "hello\n"))
    end
  end
  if WARM_HEAVY ~= "warm" then
    add("lib_" .. WARM_HEAVY, "corral " .. WARM_HEAVY .. " (library)", lib_case(HELLO, WARM_HEAVY, "hello\n"))
  end
  if SHM_DIR then
    add("files_floor", "floor: the same 100 files made, read, removed (python3, tmpfs)", files_floor_case())
  end
  for _, pol in ipairs(POLICIES) do
    if pol ~= "bwrap" then
      add("files_" .. pol, "corral " .. pol .. ", 100 files of 10 KB in and out",
        files_apart(pol, HELLO, FILES100, { "**" }, 100))
      add("files0_" .. pol, "corral " .. pol .. ", files = {} (none)", files_apart(pol, HELLO, {}, nil, 0))
      add("filesin_" .. pol, "corral " .. pol .. ", the 100 files in only", files_apart(pol, HELLO, FILES100, nil, 0))
      add("write_" .. pol, "corral " .. pol .. ", the program writes 100 files", files_apart(pol, WRITE100, nil, nil, 0))
      add("out_" .. pol, "corral " .. pol .. ", ... and they are collected", files_apart(pol, WRITE100, nil, { "**" }, 100))
    end
  end
  for _, pol in ipairs(POLICIES) do
    add("cli_" .. pol, "corral run --json --policy " .. pol .. " (CLI)",
      proc_case({ LUA, "bin/corral", "run", "--json", "--policy", pol, code_file }, CLI_OK))
  end
  add("heavy_bare", "bare python3 -I", proc_case({ PY, "-I", "-c", HEAVY }, "ok\n"), "heavy")
  for _, pol in ipairs(POLICIES) do
    if pol ~= "bwrap" then add("heavy_" .. pol, "corral " .. pol .. " (library)", lib_case(HEAVY, pol, "ok\n"), "heavy") end
  end
  if WARM_HEAVY ~= "warm" then
    add("heavy_" .. WARM_HEAVY, "corral " .. WARM_HEAVY .. " (library)", lib_case(HEAVY, WARM_HEAVY, "ok\n"), "heavy")
  end
  add("print_bare", "bare python3 -I", proc_case({ PY, "-I", "-c", PRINTS }, PRINTS_LAST), "print")
  add("print_bare_u", "bare python3 -I -u", proc_case({ PY, "-I", "-u", "-c", PRINTS }, PRINTS_LAST), "print")
  for _, pol in ipairs(POLICIES) do
    if pol ~= "bwrap" then add("print_" .. pol, "corral " .. pol .. " (library)", prints_case(pol_of(pol)), "print") end
  end
  add("print_default_u", "corral default, python_args -I -u (library)",
    prints_case(require("corral.policy").load("default"):extend { python_args = { "-I", "-u" } }), "print")
end

if opt.only.sessions then
  for _, pol in ipairs(POLICIES) do
    if pol ~= "bwrap" then
      add("cell_" .. pol, "session cell, " .. pol .. " (library)", cell_case(pol))
    end
  end
  if available.warm then add("session_warm", "warm session: open and first cell (library)", session_case("warm")) end
end

local function timed(c)
  local t0 = hrtime()
  local ok, err, inner = c.fn()
  local dt = hrtime() - t0
  if ok then
    -- a case that times itself (the floor) gives its own samples
    for _, v in ipairs(inner or { dt }) do c.t[#c.t + 1] = v end
  else
    c.fails = c.fails + 1
    c.first_err = c.first_err or err
  end
end

-- serve at concurrency 1: one wrk step of 1 s per target at SERVE_STEPS rounds spread evenly
local SERVE_STEPS = #wrk_targets > 0 and opt.serve_seconds or 0
local rounds = #cases > 0 and opt.runs or SERVE_STEPS
local serve_at = {}
for i = 1, SERVE_STEPS do
  local r = math.max(1, (i * rounds) // SERVE_STEPS)
  serve_at[r] = (serve_at[r] or 0) + 1
end

if #cases > 0 or SERVE_STEPS > 0 then
  progress("latency: %d warm-up rounds, then %d rounds of %d cases%s", #cases > 0 and 3 or 0, rounds, #cases,
    SERVE_STEPS > 0 and fmt(" and %d steps of wrk -c1 1 s per server and cell", SERVE_STEPS) or "")
  for i = 1, 3 do for _, c in ipairs(cases) do if c.group ~= "print" or i == 1 then c.fn() end end end
  for _, s in ipairs(wrk_targets) do assert(wrk_run(s, 1, 1)) end
  local t_start = hrtime()
  for r = 1, rounds do
    for _, c in ipairs(cases) do
      if c.group ~= "print" or r % PRINT_EVERY == 0 then timed(c) end
    end
    for _ = 1, serve_at[r] or 0 do
      for k = 1, #wrk_targets do
        -- alternate which target goes first
        local s = wrk_targets[(r + k) % #wrk_targets + 1]
        local good, dur, cpu = wrk_run(s, 1, 1, s.lat)
        if not good then error("serve " .. s.policy .. (s.session and " cell" or "") .. ": " .. dur, 0) end
        tp_add(s, 1, good, dur, cpu)
      end
    end
    if r % 25 == 0 then progress("  round %d of %d (%.0f s)", r, rounds, hrtime() - t_start) end
  end
end

local stats = {}
for _, c in ipairs(cases) do stats[c.id] = summary(c.t) end
for _, s in ipairs(servers) do stats["serve_" .. s.policy] = opt.only.serve and summary(s.lat) or nil end
for _, c in ipairs(cells) do stats["serve_cell_" .. c.policy] = summary(c.lat) end
local bare = stats.bare and stats.bare.median
local heavy_bare = stats.heavy_bare and stats.heavy_bare.median

local function lat_row(id, label, st, base, fails, first_err, note)
  if not st then
    say("%-44s %s", label, fails and fails > 0 and fmt("every run failed (%d): %s", fails, tostring(first_err)) or "-")
    return
  end
  local ratio = base and st.median / base
  say("%-44s %5d %9.2f %9.2f %8s%s%s", label, st.n, st.median * 1000, st.p99 * 1000,
    ratio and fmt("%.2fx", ratio) or "-", note or "",
    (fails and fails > 0) and fmt("  (%d FAILED: %s)", fails, tostring(first_err)) or "")
  report.latency[id] = { label = label, n = st.n, median_ms = st.median * 1000, p99_ms = st.p99 * 1000,
                         ratio = ratio, failed = fails or 0, first_error = first_err }
end

if #cases > 0 or #wrk_targets > 0 then
  say("")
  say("latency of print('hello'): %d interleaved rounds after 3 warm-up rounds; ratio = median / bare median",
    #cases > 0 and rounds or 0)
  say("%-44s %5s %9s %9s %8s", "case", "n", "median ms", "p99 ms", "ratio")
  for _, c in ipairs(cases) do
    if c.group == "hello" then lat_row(c.id, c.label, stats[c.id], bare, c.fails, c.first_err) end
  end
  for _, s in ipairs(opt.only.serve and servers or {}) do
    lat_row("serve_" .. s.policy, "corral serve --policy " .. s.policy .. " (HTTP, wrk -c1)", stats["serve_" .. s.policy],
      bare, s.bad, s.first_bad)
  end
  for _, c in ipairs(cells) do
    lat_row("serve_cell_" .. c.policy, "session cell, " .. c.policy .. " (corral serve, wrk -c1)",
      stats["serve_cell_" .. c.policy], bare, c.bad, c.first_bad)
  end
  if serve_reason then say("%-44s not measured: %s", "corral serve", serve_reason) end
  if #cases > 0 then
    say("heavy imports (import %s); ratio = median / bare heavy median", HEAVY_MODULES)
    for _, c in ipairs(cases) do
      if c.group == "heavy" then
        local note
        local w = stats["heavy_" .. WARM_HEAVY]
        if c.id == "heavy_" .. WARM_HEAVY and stats.heavy_default and w then
          note = fmt("  (%s %.1fx faster than default)", WARM_HEAVY, stats.heavy_default.median / w.median)
        end
        lat_row(c.id, c.label, stats[c.id], heavy_bare, c.fails, c.first_err, note)
      end
    end
    say("print-heavy (100,000 lines of print(), every %d rounds); ratio = median / bare print-heavy median",
      PRINT_EVERY)
    for _, c in ipairs(cases) do
      if c.group == "print" then lat_row(c.id, c.label, stats[c.id], stats.print_bare and stats.print_bare.median,
        c.fails, c.first_err) end
    end
  end
end

-- 2. Throughput ----------------------------------------------------------------------------------

-- `total` runs of print('hello') through the library, `conc` at a time, run `i` under policy
-- `policy_of(i)`; `each()` is called after every loop turn. Returns failures and the first
-- failure's text.
local function pump(total, conc, policy_of, each)
  local started, done, fails, first = 0, 0, 0, nil
  local function next_run()
    if started >= total then return end
    started = started + 1
    local pol = policy_of(started)
    local p, err = corral.start(HELLO, { policy = pol_of(pol) }, function(r, e)
      done = done + 1
      if not r or not r.ok or r.stdout ~= "hello\n" then
        fails = fails + 1
        first = first or (tostring(pol) .. ": " .. (r and ("reason " .. tostring(r.reason) .. " " .. r.stderr:sub(1, 200))
          or tostring(e)))
      end
      next_run()
    end)
    if not p then
      done, fails = done + 1, fails + 1
      first = first or tostring(err)
      next_run()
    end
  end
  for _ = 1, conc do next_run() end
  while done < total do
    core.run("once")
    if each then each(done) end
  end
  return fails, first
end

-- `total` runs of print('hello') through the library at `conc`; wall seconds, controller CPU
-- seconds, failures and the first failure's text
local function lib_chunk(pol, conc, total)
  local cpu0, t0 = self_cpu_s(), hrtime()
  local fails, first = pump(total, conc, function() return pol end)
  return hrtime() - t0, self_cpu_s() - cpu0, fails, first
end

local CONCS = { 1, 2, 8 }
local tp_rows = {}
if opt.only.throughput then
  local ROUNDS = 3
  local configs = {}
  for _, pol in ipairs(POLICIES) do
    for _, conc in ipairs(CONCS) do
      configs[#configs + 1] = { pol = pol, conc = conc, chunk = math.max(conc * 4, -(-opt.throughput_runs // ROUNDS)),
                                runs = 0, wall = 0, cpu = 0, fails = 0 }
    end
    if pol == "default" then
      for _, conc in ipairs { 1, 2 } do
        configs[#configs + 1] = { pol = COLD, conc = conc, chunk = math.max(conc * 4, -(-opt.throughput_runs // ROUNDS)),
                                  runs = 0, wall = 0, cpu = 0, fails = 0 }
      end
    end
  end
  progress("throughput (library): warm-up, then %d interleaved rounds of %d configurations", ROUNDS, #configs)
  for _, c in ipairs(configs) do lib_chunk(c.pol, c.conc, c.conc * 3) end
  for _ = 1, ROUNDS do
    for _, c in ipairs(configs) do
      local wall, cpu, fails, first = lib_chunk(c.pol, c.conc, c.chunk)
      c.runs, c.wall, c.cpu = c.runs + c.chunk - fails, c.wall + wall, c.cpu + cpu
      c.fails, c.first = c.fails + fails, c.first or first
    end
  end
  for _, c in ipairs(configs) do
    tp_rows[#tp_rows + 1] = { path = "library", policy = c.pol, conc = c.conc, runs = c.runs, rate = c.runs / c.wall,
                              cpu_ms = c.cpu / (c.runs + c.fails) * 1000, failed = c.fails, first_error = c.first }
  end
end

if #servers > 0 and opt.only.serve then
  -- concurrency 1 came from the latency steps; 2 and 8 here, in interleaved steps of 2 s or less
  local steps = math.max(1, opt.serve_seconds // 2)
  local step_s = math.max(1, opt.serve_seconds // steps)
  progress("throughput (serve): %d interleaved rounds of wrk -c2 and -c8, %d s each, per server", steps, step_s)
  for _ = 1, steps do
    for _, conc in ipairs { 2, 8 } do
      for _, s in ipairs(servers) do
        local good, dur, cpu = wrk_run(s, conc, step_s)
        if not good then error("serve " .. s.policy .. ": " .. dur, 0) end
        tp_add(s, conc, good, dur, cpu)
      end
    end
  end
  for _, s in ipairs(servers) do
    s.rss_end = rss_kb(s.pid)
    for _, conc in ipairs(CONCS) do
      local t = s.tp[conc]
      if t and t.seconds > 0 then
        tp_rows[#tp_rows + 1] = { path = "serve", policy = s.policy, conc = conc, runs = t.requests,
                                  rate = t.requests / t.seconds, cpu_ms = t.cpu_s / math.max(1, t.requests) * 1000,
                                  failed = s.bad, first_error = s.first_bad }
      end
    end
  end
  for _, s in ipairs(servers) do stop_server(s) end
end

if #tp_rows > 0 then
  say("")
  say("throughput of print('hello'): runs/s; controller CPU = user+sys of the controller process per run")
  say("%-8s %-12s %5s %7s %9s %10s %12s", "path", "policy", "conc", "runs", "runs/s", "vs conc 1", "ctl CPU/run")
  local one = {}
  for _, r in ipairs(tp_rows) do
    local key = r.path .. ":" .. r.policy
    if r.conc == 1 then one[key] = r.rate end
    r.vs_1 = one[key] and r.rate / one[key]
    say("%-8s %-12s %5d %7d %9.1f %10s %9.2f ms%s", r.path, r.policy, r.conc, r.runs, r.rate,
      r.vs_1 and fmt("%.2fx", r.vs_1) or "-", r.cpu_ms,
      r.failed > 0 and fmt("  (%d FAILED: %s)", r.failed, tostring(r.first_error)) or "")
    report.throughput[#report.throughput + 1] = r
  end
  if #servers > 0 then
    say("serve: every response checked (HTTP 200, ok == true, stdout == \"hello\\n\"); %s",
      (function()
        local parts = {}
        for _, s in ipairs(servers) do parts[#parts + 1] = fmt("%s: %d requests, %d bad", s.policy, s.requests, s.bad) end
        return table.concat(parts, "; ")
      end)())
  end
end

-- 3. Controller RSS -------------------------------------------------------------------------------

say("")
say("controller RSS (VmRSS of the controller process; its children are not counted)")
say("  library controller (this process) at idle, before any run: %s", mb(LIB_IDLE_RSS))
report.rss.library_idle_kb = LIB_IDLE_RSS
report.rss.serve = {}
for _, s in ipairs(opt.only.serve and servers or {}) do
  say("  corral serve --policy %-8s %s at idle, %s after warm-up, %s after %d requests", s.policy, mb(s.rss_idle),
    mb(s.rss_warm), mb(s.rss_end), s.requests)
  report.rss.serve[s.policy] = { idle_kb = s.rss_idle, warm_kb = s.rss_warm, end_kb = s.rss_end, requests = s.requests }
end

if opt.only.rss then
  local RUNS, CONC = opt.rss_runs, 8
  local pols = { "default" }
  if available.warm then pols[2] = "warm" end
  local every = RUNS >= 5000 and 1000 or math.max(1, RUNS // 5)
  local warmup = math.max(1, math.min(200, RUNS // 5))
  progress("RSS series: %d warm-up runs, then %d runs at concurrency %d (%s)", warmup, RUNS, CONC, table.concat(pols, "+"))
  settle()
  local rss_start = rss_kb()
  local total = warmup + RUNS
  local marks, rss_warm, t0, cpu0 = {}, nil, nil, nil
  local next_mark = every
  local fails, first = pump(total, CONC, function(i) return pols[i % #pols + 1] end, function(done)
    if not rss_warm and done >= warmup then
      settle()
      rss_warm, t0, cpu0 = rss_kb(), hrtime(), self_cpu_s()
    end
    if rss_warm and done - warmup >= next_mark then
      settle()
      marks[#marks + 1] = { runs = next_mark, kb = rss_kb() }
      next_mark = next_mark + every
    end
  end)
  local wall, cpu = hrtime() - t0, self_cpu_s() - cpu0
  settle()
  local lo, hi, dev = rss_warm, rss_warm, 0
  for _, m in ipairs(marks) do
    lo, hi = math.min(lo, m.kb), math.max(hi, m.kb)
    dev = math.max(dev, math.abs(m.kb - rss_warm))
  end
  say("  series through the library, %d runs at concurrency %d, policy %s (after a full GC each):",
    RUNS, CONC, table.concat(pols, " and ", 1) .. (#pols > 1 and " alternating" or ""))
  local parts = { fmt("start %s", mb(rss_start)), fmt("after %d warm-up runs %s", warmup, mb(rss_warm)) }
  for _, m in ipairs(marks) do parts[#parts + 1] = fmt("+%d runs %s", m.runs, mb(m.kb)) end
  for i = 1, #parts, 6 do say("    %s", table.concat(parts, " | ", i, math.min(#parts, i + 5))) end
  say("    spread after warm-up: max-min %d KB, largest departure from the warm-up value %d KB; "
    .. "%.0f runs/s, controller CPU %.2f ms/run%s", hi - lo, dev, RUNS / wall, cpu / RUNS * 1000,
    fails > 0 and fmt("; %d FAILED: %s", fails, tostring(first)) or "")
  report.rss.series = { runs = RUNS, concurrency = CONC, policies = pols, start_kb = rss_start, warmup_runs = warmup,
                        warm_kb = rss_warm, marks = marks, spread_kb = hi - lo, max_departure_kb = dev,
                        rate = RUNS / wall, cpu_ms = cpu / RUNS * 1000, failed = fails, first_error = first }
end

-- 100 idle sessions in this controller: its RSS, and each session's own memory (the PSS of its
-- processes: the launcher or init and the kernel; a warm session's pages shared with its zygote
-- count in part)
local function pss_kb(pid)
  local t = read_file("/proc/" .. pid .. "/smaps_rollup")
  return t and tonumber(t:match("\nPss:%s+(%d+) kB")) or 0
end
local function tree_pss_kb(root)
  local kids = {}
  for _, name in ipairs(core.listdir("/proc") or {}) do
    local pid = tonumber(name)
    local st = pid and read_file("/proc/" .. pid .. "/stat")
    local ppid = st and tonumber(st:match("^%d+ %b() %S+ (%d+)"))
    if ppid then kids[ppid] = kids[ppid] or {} table.insert(kids[ppid], pid) end
  end
  local total, stack = 0, { root }
  while #stack > 0 do
    local pid = table.remove(stack)
    total = total + pss_kb(pid)
    for _, k in ipairs(kids[pid] or {}) do stack[#stack + 1] = k end
  end
  return total
end
local IDLE_SESSIONS = 100
if opt.only.rss then
  for _, s in pairs(open_sessions) do s:close() end
  local pol = available.warm and "warm" or "default"
  progress("idle sessions: %d %s sessions, one cell each", IDLE_SESSIONS, pol)
  settle()
  local before = rss_kb()
  local list, fails, first = {}, 0, nil
  for i = 1, IDLE_SESSIONS do
    local s, err = session.open { policy = pol }
    if s then list[#list + 1] = s else fails, first = fails + 1, first or err end
  end
  local pending = #list
  for _, s in ipairs(list) do
    local ok, err = s:exec_async("x = list(range(100))", {}, function(r)
      pending = pending - 1
      if r.reason ~= "ok" then fails, first = fails + 1, first or r.stderr end
    end)
    if not ok then pending, fails, first = pending - 1, fails + 1, first or err end
  end
  while pending > 0 do core.run("once") end
  settle()
  local after = rss_kb()
  local pss = {}
  for _, s in ipairs(list) do pss[#pss + 1] = tree_pss_kb(s.proc:pid()) / 1024 end
  local st = summary(pss)
  say("  %d idle %s sessions: controller RSS %s (%s before them, %+.1f MB); each session's PSS median %.1f MB, "
    .. "p99 %.1f MB%s", #list, pol, mb(after), mb(before), (after - before) / 1024, st and st.median or 0,
    st and st.p99 or 0, fails > 0 and fmt("; %d FAILED: %s", fails, tostring(first)) or "")
  report.rss.sessions = { n = #list, policy = pol, controller_kb = after, before_kb = before,
                          pss_median_mb = st and st.median, pss_p99_mb = st and st.p99, failed = fails }
  for _, s in ipairs(list) do s:close() end
end

-- 4. Targets --------------------------------------------------------------------------------------

local function tp(path, pol, conc)
  for _, r in ipairs(tp_rows) do
    if r.path == path and r.policy == pol and r.conc == conc then return r end
  end
end
local function failed_any(...)
  for _, id in ipairs { ... } do
    local l = report.latency[id]
    if l and l.failed > 0 then return true end
  end
  return false
end

say("")
say("targets, from this run's figures")
local function target(name, value, pass, note)
  local status = pass == nil and "n/a" or (pass and "PASS" or "MISS")
  say("  %-58s %-20s %-4s%s", name, value or "not measured", status, note and ("  " .. note) or "")
  report.targets[#report.targets + 1] = { target = name, value = value, status = status, note = note }
end
local warm_note = not available.warm and "warm not available (see above)" or nil

do
  local d, k = stats.lib_default, stats["lib_" .. COLD]
  local r = d and bare and d.median / bare
  target("default median <= 1.10x bare", r and fmt("%.2fx", r), r and r <= 1.10 and not failed_any("lib_default", "bare"),
    k and bare and fmt("with prestart = 0: %.2fx", k.median / bare) or nil)
end
do
  local ss = report.rss.sessions
  target("100 idle sessions: controller RSS < 30 MB", ss and mb(ss.controller_kb), ss and ss.controller_kb < 30 * 1024
    and ss.failed == 0, ss and fmt("each session's PSS: median %.1f MB", ss.pss_median_mb or 0) or nil)
end
do
  local c = stats.session_warm
  local r = c and bare and c.median / bare
  target("warm session creation (open and first cell) <= 0.2x bare", r and fmt("%.2fx (%.2f ms)", r, c.median * 1000),
    r and r <= 0.2 and not failed_any("session_warm", "bare"), warm_note)
  -- a cell's round trip through corral serve (HTTP on a kept-alive connection), the library's beside it
  local sid = stats.serve_cell_warm and "serve_cell_warm" or "serve_cell_default"
  local sc = stats[sid]
  local rs = sc and bare and sc.median / bare
  local cw = stats.cell_warm or stats.cell_default
  local lib = cw and bare and fmt("; library: %.3fx (%.2f ms)", cw.median / bare, cw.median * 1000) or ""
  target("session cell print('hello') <= 0.03x bare (corral serve)", rs and fmt("%.3fx (%.2f ms)", rs, sc.median * 1000),
    rs and rs <= 0.03 and not failed_any(sid, "bare"), sc and ("policy " .. sid:sub(12) .. lib) or serve_reason)
end
do
  -- A run with files takes a launch started ahead whose interpreter is up and waits for them (a
  -- run without files takes one that waits before the interpreter): the files' cost is against
  -- the same run given files = {}; against a run without `files` too.
  local f, k = stats.files_default, stats.files0_default
  local d = f and k and (f.median - k.median) * 1000
  -- apart: in (given, not collected) against files = {}; out (new files collected) against the
  -- same program not collecting
  local function ms(a, b) return stats[a] and stats[b] and fmt("%+.2f", (stats[a].median - stats[b].median) * 1000) end
  local apart = {}
  local plain = ms("files_default", "lib_default")
  if plain then apart[#apart + 1] = "default: " .. plain .. " ms against a run without files" end
  for _, pol in ipairs({ "default", "warm" }) do
    local i, o = ms("filesin_" .. pol, "files0_" .. pol), ms("out_" .. pol, "write_" .. pol)
    if i and o then apart[#apart + 1] = fmt("%s: in %s ms, out %s ms", pol, i, o) end
  end
  local warm = ms("files_warm", "files0_warm")
  if warm then table.insert(apart, 1, "warm: " .. warm .. " ms") end
  -- the kernel's own work for the same files, timed in one process (it runs in the run's
  -- critical path; only its overlap with something else could bring the cost below it)
  if stats.files_floor then
    table.insert(apart, 1, fmt("floor (the kernel's making, reading and removing of the files): %.2f ms",
      stats.files_floor.median * 1000))
  end
  target("100 files of 10 KB in and out add <= 2 ms (default)", d and fmt("%+.2f ms", d),
    d and d <= 2 and not failed_any("files_default", "files0_default"),
    #apart > 0 and table.concat(apart, "; ") or nil)
end
do
  local c1, c2 = tp("library", "default", 1), tp("library", "default", 2)
  local r = c1 and c2 and c2.rate / c1.rate
  -- with prestart, a run at concurrency 1 already overlaps the next one's launch
  local k1, k2 = tp("library", COLD, 1), tp("library", COLD, 2)
  local note = k1 and k2 and fmt("with prestart = 0: %.2fx (%.0f and %.0f runs/s)", k2.rate / k1.rate, k1.rate, k2.rate)
  target("throughput at conc 2 >= 1.7x conc 1 (library, default)", r and fmt("%.2fx", r), r and r >= 1.7 and c1.failed + c2.failed == 0, note)
  local s1, s2 = tp("serve", "default", 1), tp("serve", "default", 2)
  local rs = s1 and s2 and s2.rate / s1.rate
  if rs then target("throughput at conc 2 >= 1.7x conc 1 (serve, default)", fmt("%.2fx", rs), rs >= 1.7 and s1.failed == 0) end
end
do
  local w = stats.serve_warm
  local r = w and bare and w.median / bare
  local f = stats.floor and bare and stats.floor.median / bare
  target("warm median through corral serve <= 0.15x bare", r and fmt("%.2fx (%.2f ms)", r, w.median * 1000),
    r and r <= 0.15 and not failed_any("serve_warm", "bare"), warm_note or (not w and serve_reason)
      or (f and fmt("floor (a warmed python3's own fork, timed inside it): %.2fx", f)) or nil)
end
do
  local r = tp("serve", "warm", 8)
  target("warm >= 600 runs/s at conc 8 on 2 cores (serve)", r and fmt("%.0f runs/s", r.rate), r and r.rate >= 600 and r.failed == 0,
    warm_note or (not r and serve_reason) or (NCPU ~= 2 and fmt("this machine has %d CPUs", NCPU)) or nil)
  local l = tp("library", "warm", 8)
  if l then target("warm >= 600 runs/s at conc 8 on 2 cores (library)", fmt("%.0f runs/s", l.rate), l.rate >= 600 and l.failed == 0) end
end
do
  local d, w = stats.heavy_default, stats["heavy_" .. WARM_HEAVY]
  local r = d and w and d.median / w.median
  target("heavy imports: warm >= 10x faster than default", r and fmt("%.1fx", r),
    r and r >= 10 and not failed_any("heavy_default", "heavy_" .. WARM_HEAVY),
    warm_note or (WARM_HEAVY ~= "warm" and "policy " .. WARM_HEAVY .. ": warm's modules and numpy preloaded") or nil)
end
do
  local worst, who = nil, nil
  for _, s in ipairs(servers) do
    if s.rss_idle and (not worst or s.rss_idle > worst) then worst, who = s.rss_idle, s.policy end
  end
  if worst then
    target("controller RSS at idle < 15 MB (corral serve)", fmt("%s (%s)", mb(worst), who), worst < 15 * 1024)
  end
  target("controller RSS at idle < 15 MB (library controller)", mb(LIB_IDLE_RSS), LIB_IDLE_RSS and LIB_IDLE_RSS < 15 * 1024,
    "the bench process itself, before any run")
end
do
  local s = report.rss.series
  local note
  if s and s.runs < 10000 then note = fmt("%d runs, not 10,000: make bench-rss for the full series", s.runs) end
  target("controller RSS flat (+-2 MB) across 10,000 runs", s and fmt("%+d KB max", s.max_departure_kb),
    s and s.max_departure_kb <= 2048 and s.failed == 0, note)
end

end, debug.traceback)

-- Cleanup, JSON ------------------------------------------------------------------------------------

for _, s in ipairs(servers) do pcall(stop_server, s) end
core.rmtree(tmpdir)
if SHM_DIR then core.rmtree(SHM_DIR) end
if not main_ok then
  io.stderr:write("bench: ", tostring(main_err), "\n")
  os.exit(1, true)
end
if opt.doc then
  local head = read_file("bench/performance-head.md")
  if not head then
    io.stderr:write("bench: --doc needs bench/performance-head.md (run from the source tree)\n")
    os.exit(1, true)
  end
  local m = report.machine
  local args = {}
  for i = 1, #arg do args[i] = arg[i] end
  local f = assert(io.open(opt.doc, "w"))
  f:write(head, "\n## The last run\n\n",
    fmt("%s, %d CPUs, kernel %s, %s, as uid %d: `lua5.4 bench/bench.lua %s`\n\n", os.date("!%Y-%m-%d %H:%M UTC"),
      m.cpus, m.kernel, m.python, core.getuid(), table.concat(args, " ")),
    "```\n", table.concat(said, "\n"), "\n```\n")
  f:close()
  io.stdout:write("page written to ", opt.doc, "\n")
end
if opt.json then
  if not has_cjson then
    io.stderr:write("bench: --json needs lua-cjson\n")
    os.exit(1, true)
  end
  local f = assert(io.open(opt.json, "w"))
  f:write(cjson.encode(report), "\n")
  f:close()
  say("")
  say("figures written to %s", opt.json)
end
os.exit(0, true)
