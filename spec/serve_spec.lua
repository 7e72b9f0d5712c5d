-- corral serve: the HTTP controller, run as a real process (`lua5.4 bin/corral serve`) and
-- spoken to with curl, over a unix socket and over loopback TCP.
local cjson = require "cjson"
local core = require "corral.core"
local H = require "helper"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function write(path, content)
  local f = assert(io.open(path, "wb"))
  f:write(content)
  f:close()
end

local read = H.try_read

local function alive(pid)
  -- a zombie (our server's wrapper is gone, and pid 1 of a container may not reap) is dead
  local stat = read("/proc/" .. pid .. "/stat")
  return stat ~= nil and not stat:match("^%d+ %b() Z")
end

local dir          -- this test's scratch dir: socket, logs, request bodies
local servers = {} -- servers started by this test: killed in after_each

--- Start `corral serve` with `args` in the background; returns a server handle
-- {pid, sock, log, status_file}. Waits until it logs that it listens (or has exited).
local function start_server(args, env)
  local n = #servers + 1
  local s = { sock = dir .. "/s" .. n .. ".sock", log = dir .. "/server" .. n .. ".log",
              status_file = dir .. "/server" .. n .. ".status", pid_file = dir .. "/server" .. n .. ".pid" }
  local listen = args:find("--listen", 1, true) and "" or ("--listen unix:" .. s.sock .. " ")
  -- a subshell starts the server, records its pid, waits and records its exit status
  os.execute("( " .. (env or "") .. " " .. H.cli .. " serve " .. listen .. args .. " </dev/null >" .. q(s.log) .. " 2>&1 & "
    .. "echo $! > " .. q(s.pid_file) .. "; wait $!; echo $? > " .. q(s.status_file) .. " ) >/dev/null 2>&1 &")
  assert(H.eventually(function() return (read(s.pid_file) or ""):match("%d+") ~= nil end, 5), "no pid")
  s.pid = tonumber(read(s.pid_file):match("%d+"))
  servers[n] = s
  H.eventually(function()
    return (read(s.log) or ""):find("listening", 1, true) ~= nil or read(s.status_file) ~= nil
  end, 10)
  return s
end

--- The exit status of a server, waiting up to `seconds` for it.
local function exit_status(s, seconds)
  H.eventually(function() return (read(s.status_file) or ""):match("%d+") ~= nil end, seconds or 5)
  local st = read(s.status_file)
  return st and tonumber(st:match("%d+"))
end

local function stop_server(s)
  -- SIGTERM: a server stops as in production (and lets go of the launches it started ahead);
  -- SIGKILL for one that does not within 5 s
  if alive(s.pid) then core.kill(s.pid, 15) end
  if not H.eventually(function() return not alive(s.pid) end, 5) then core.kill(s.pid, 9) end
  H.eventually(function() return not alive(s.pid) end, 5)
  -- and its wrapper has written the status: nothing writes into the scratch dir any more
  exit_status(s, 5)
end

local bodies = 0
--- One HTTP request with curl. `target` is a server (unix socket) or a "http://HOST:PORT" base.
-- @return status (number; 0 when curl could not connect), headers (lower-case names), body,
-- decoded JSON body (or nil), curl's exit code
local function http(target, method, path, body, extra)
  bodies = bodies + 1
  local out, hdr, inp = dir .. "/out" .. bodies, dir .. "/hdr" .. bodies, dir .. "/in" .. bodies
  local cmd = { "curl -s -X", method, "-o", q(out), "-D", q(hdr), "-w '%{http_code}'", extra or "" }
  if body then
    write(inp, body)
    cmd[#cmd + 1] = "--data-binary @" .. q(inp) .. " -H 'Content-Type: application/json'"
  end
  if type(target) == "table" then
    cmd[#cmd + 1] = "--unix-socket " .. q(target.sock) .. " " .. q("http://corral" .. path)
  else
    cmd[#cmd + 1] = q(target .. path)
  end
  local f = io.popen(table.concat(cmd, " ") .. "; echo \" $?\"")
  local text = f:read("a")
  f:close()
  local code, rc = text:match("(%d+) (%d+)%s*$")
  local headers = {}
  for line in (read(hdr) or ""):gmatch("[^\r\n]+") do
    local k, v = line:match("^([^:]+):%s*(.*)$")
    if k then headers[k:lower()] = v end
  end
  local b = read(out) or ""
  local ok, decoded = pcall(cjson.decode, b)
  return tonumber(code) or 0, headers, b, ok and decoded or nil, tonumber(rc)
end

local function json(t) return cjson.encode(t) end

local function keys(t)
  local k = {}
  for name in pairs(t) do k[#k + 1] = name end
  table.sort(k)
  return k
end

--- Pids of launchers started by the server `s` (their --parent-pid is the server's).
-- (but not a launch it started ahead of a run: corral-launch --prestart, idle until one comes)
local function launchers_of(s)
  local pids = {}
  for _, pid in ipairs(H.pids_with("--parent-pid " .. s.pid .. " ")) do
    local f = io.open("/proc/" .. pid .. "/cmdline")
    local cmd = f and f:read("a") or ""
    if f then f:close() end
    -- (not one started ahead that no run took yet)
    if not H.idle_launch(cmd:gsub("%z", " ")) then pids[#pids + 1] = pid end
  end
  return pids
end

--- The value of a metric line, e.g. metric(text, 'corral_runs_total{reason="exit"}').
local function metric(text, name)
  for line in text:gmatch("[^\n]+") do
    local n, v = line:match("^(%S+) (%S+)$")
    if n == name then return tonumber(v) end
  end
  return nil
end

--- Run `script` (shell) in the background; returns the path of a file that exists once it ended.
local function background(script)
  bodies = bodies + 1
  local done = dir .. "/done" .. bodies
  os.execute("( " .. script .. " ; touch " .. q(done) .. " ) >/dev/null 2>&1 &")
  return done
end

--- A curl command line (for `background`) that POSTs `body` to `path` and writes the status
-- line, headers and body to `out`.
local function curl_line(s, path, body, out, extra)
  bodies = bodies + 1
  local inp = dir .. "/bin" .. bodies
  write(inp, body)
  return "curl -s -i " .. (extra or "") .. " --unix-socket " .. q(s.sock) .. " --data-binary @" .. q(inp)
    .. " " .. q("http://corral" .. path) .. " > " .. q(out)
end

describe("corral serve", function()
  local snap
  before_each(function()
    snap = H.snapshot()
    dir = core.mkdtemp("/tmp/corral-serve.XXXXXX")
    core.chmod(dir, 493) -- 0755: as root, nothing inside needs more
  end)
  after_each(function()
    for _, s in ipairs(servers) do stop_server(s) end
    servers = {}
    core.rmtree(dir)
    -- nothing a server started survives it
    assert.is_true(H.eventually(function() return #H.stray_processes() == 0 end, 5), "stray processes")
    H.assert_clean(snap)
  end)

  it("answers a run whose sandbox cannot be set up with 500 sandbox_failed, and serves the next", function()
    -- a policy whose run cgroup is required and cannot be made: the launcher's fatal line
    core.mkdir(dir .. "/policies", 448)
    write(dir .. "/policies/broken.lua", 'return require("corral.policy").load("default"):extend ' ..
      '{ name = "broken", budgets = "cgroup", cgroup = "/nonexistent/corral-spec" }\n')
    os.execute("chmod -R a+rX " .. q(dir))
    local s = start_server("--policy broken --concurrency 1", "CORRAL_POLICY_PATH=" .. q(dir .. "/policies"))
    for _ = 1, 2 do
      local code, _, body, obj, rc = http(s, "POST", "/v1/run", json { code = "print(1)" }, "--max-time 20")
      assert.are.equal(0, rc, "curl: " .. tostring(rc))
      assert.are.equal(500, code, body)
      assert.are.equal("sandbox_failed", obj.error.code, body)
      assert.is_truthy(obj.error.message:find("cgroup", 1, true), body)
      assert.is_false(obj.ok)
    end
    assert.is_falsy((read(s.log) or ""):find("internal-error", 1, true), read(s.log))
    stop_server(s)
  end)

  it("answers a run with exactly the fields of `corral run --json`", function()
    local s = start_server("--concurrency 2")
    assert.are.equal(432, core.lstat(s.sock).mode & 511) -- 0660
    local status, headers, body, r = http(s, "POST", "/v1/run",
      json { code = "import sys; print(sys.stdin.read()); sys.exit(7)", stdin = "abc", timeout = 5 })
    assert.are.equal(200, status, body)
    assert.is_truthy(headers["content-type"]:find("application/json", 1, true))
    -- the CLI's own output has the same keys
    write(dir .. "/prog.py", "print(1)")
    local cli = cjson.decode((H.sh(H.cli .. " run --json " .. q(dir .. "/prog.py"))))
    assert.are.same(keys(cli), keys(r))
    assert.are.same({ "limits", "network_isolated", "ok", "reason", "refused", "returncode", "signal", "stderr",
                      "stdout", "timed_out", "truncated", "usage" }, keys(r))
    assert.are.same(keys(cli.usage), keys(r.usage))
    assert.are.equal("abc\n", r.stdout)
    assert.are.equal(7, r.returncode)
    assert.are.equal("exit", r.reason)
    assert.is_false(r.ok)
    assert.are.equal(cjson.null, r.signal)
    assert.is_truthy(H.has(r.limits, "timeout"))
    -- a timeout is a result, not an error
    local _
    status, _, body, r = http(s, "POST", "/v1/run", json { code = "import time; time.sleep(5)", timeout = 0.3 })
    assert.are.equal(200, status, body)
    assert.is_true(r.timed_out)
    assert.are.equal("timeout", r.reason)
    -- the request log: one line per request, method path status duration reason
    -- (written once the answer went: a moment after the client read it, on a busy machine)
    local log
    H.eventually(function()
      log = read(s.log)
      return log:find("POST /v1/run 200 %d+%.%d+s timeout") ~= nil
    end, 10)
    assert.is_truthy(log:find("POST /v1/run 200 %d+%.%d+s exit"), log)
    assert.is_truthy(log:find("POST /v1/run 200 %d+%.%d+s timeout"), log)
  end)

  it("refuses bad requests with 400 and an error naming the field", function()
    local s = start_server("")
    local cases = {
      -- body, expected code, expected field
      { "print(1)", "bad_json" },
      { "", "bad_json" },
      { '{"code": "print(1)"', "bad_json" },
      { '{"code": "\255"}', "bad_json" },                      -- not UTF-8
      { '{"code": "a\1b"}', "bad_json" },                      -- a raw control character in a string
      { '{"code": "print(1)\n"}', "bad_json" },                -- a raw newline in a string
      { '[{"code": "print(1)"}]', "bad_request" },
      { '"print(1)"', "bad_request" },
      { "{}", "missing_field", "code" },
      { '{"code": null}', "missing_field", "code" },
      { '{"code": 5}', "invalid_field", "code" },
      { '{"code": "1", "timeout": "5"}', "invalid_field", "timeout" },
      { '{"code": "1", "memory_mb": 1.5}', "invalid_field", "memory_mb" },
      { '{"code": "1", "timeout": -1}', "invalid_field", "timeout" },
      { '{"code": "1", "processes": 0}', "invalid_field", "processes" },
      { '{"code": "1", "stdin": ["a"]}', "invalid_field", "stdin" },
      { '{"code": "1", "require_network_isolation": "yes"}', "invalid_field", "require_network_isolation" },
      { '{"code": "1", "python": "/bin/sh"}', "unknown_field", "python" },
      { '{"code": "1", "env": {"A": "1"}}', "unknown_field", "env" },
      { '{"code": "1", "cpu": 1}', "unknown_field", "cpu" },
      { '{"code": "1", "policy": "bwrap"}', "policy_not_allowed", "policy" },
      { '{"code": "1", "policy": "../../etc/passwd"}', "policy_not_allowed", "policy" },
    }
    for _, c in ipairs(cases) do
      local status, headers, body, r = http(s, "POST", "/v1/run", c[1])
      assert.are.equal(400, status, c[1] .. " → " .. body)
      assert.is_truthy(headers["content-type"]:find("application/json", 1, true))
      assert.is_table(r, body)
      assert.are.equal(c[2], r.error.code, c[1] .. " → " .. body)
      assert.is_string(r.error.message)
      if c[3] then
        assert.are.equal(c[3], r.error.field, c[1] .. " → " .. body)
        assert.is_truthy(r.error.message:find(c[3], 1, true), body)
      end
    end
    -- the error about a raw control character names the body and where it is
    local status, _, body, r = http(s, "POST", "/v1/run", '{"code": "a\1b"}')
    assert.are.equal(400, status, body)
    assert.matches("^the body is not valid JSON: a raw control character %(U%+0001%) inside a string at byte 12", r.error.message)
    -- eval has seed 003's names
    status, _, body, r = http(s, "POST", "/v1/eval", '{"code": "1", "mem_max_mb": "a"}')
    assert.are.equal(400, status, body)
    assert.are.same({ "invalid_field", "mem_max_mb" }, { r.error.code, r.error.field })
    status, _, body, r = http(s, "POST", "/v1/eval", '{"code": "1", "memory_mb": 100}')
    assert.are.equal(400, status, body)
    assert.are.same({ "unknown_field", "memory_mb" }, { r.error.code, r.error.field })
    -- routes and methods
    local headers
    status, _, body, r = http(s, "GET", "/v1/nothing")
    assert.are.equal(404, status, body)
    assert.are.equal("not_found", r.error.code)
    status, headers, body, r = http(s, "GET", "/v1/run")
    assert.are.equal(405, status, body)
    assert.are.equal("method_not_allowed", r.error.code)
    assert.are.equal("POST", headers["allow"])
    status, headers = http(s, "POST", "/healthz", "{}")
    assert.are.equal(405, status)
    assert.are.equal("GET", headers["allow"])
    -- nothing of it ran; all of it was counted
    local _, _, text = http(s, "GET", "/metrics")
    assert.are.equal(0, metric(text, "corral_run_duration_seconds_count"))
    assert.are.equal(7, metric(text, 'corral_rejected_total{code="bad_json"}'))
    assert.are.equal(8, metric(text, 'corral_rejected_total{code="invalid_field"}'), text)
    assert.are.equal(23, metric(text, 'corral_http_requests_total{route="/v1/run",status="400"}'), text)
    assert.are.equal(1, metric(text, 'corral_http_requests_total{route="other",status="404"}'), text)
  end)

  it("takes files in base64 and args, and hands back the files asked for in base64", function()
    local s = start_server("")
    local b64 = core.b64encode
    local status, _, body, r = http(s, "POST", "/v1/run", json {
      code = "import sys\nprint(sys.argv[1:], open('in/d.csv', 'rb').read())\nopen('p.png', 'wb').write(b'\\x89PNG\\0')\n"
        .. "open(b'caf\\xe9.png', 'w').write('c')\n",
      files = { { path = "in/d.csv", content = b64("a,b\n\0\255") } }, args = { "x", "y z" }, collect = { "*.png" } })
    assert.are.equal(200, status, body)
    assert.are.equal("['x', 'y z'] b'a,b\\n\\x00\\xff'\n", r.stdout)
    assert.are.equal(2, #r.files, body)
    assert.are.same({ path = "caf\239\191\189.png", path_b64 = b64("caf\233.png"), type = "file", size = 1, mode = 420,
                      content = b64("c"), truncated = false }, r.files[1])
    assert.are.same({ path = "p.png", type = "file", size = 5, mode = 420, content = b64("\137PNG\0"), truncated = false },
      r.files[2])
    -- no code: args[0] names the file of files that runs
    status, _, body, r = http(s, "POST", "/v1/run", json {
      files = { { path = "main.py", content = b64("import sys; print(sys.argv)") } }, args = { "main.py", "1" } })
    assert.are.equal(200, status, body)
    assert.are.equal("['main.py', '1']\n", r.stdout)
    -- an empty list of files comes back as []
    status, _, body = http(s, "POST", "/v1/run", json { code = "pass", collect = { "*.png" } })
    assert.are.equal(200, status, body)
    assert.is_truthy(body:find('"files":[]', 1, true), body)
    for _, c in ipairs({
      { { code = "1", files = { { path = "a", content = "not base64!" } } }, "invalid_field", "files", "not base64" },
      { { code = "1", files = { { path = "../a", content = "" } } }, "invalid_field", "files", "'%.%./a'%): the path has a '%.%.' segment" },
      { { code = "1", files = "a" }, "invalid_field", "files", "must be an array" },
      { { code = "1", collect = "*.png" }, "invalid_field", "collect", "must be an array or boolean" },
      { { code = "1", collect = { "/etc/*" } }, "invalid_field", "collect", "is absolute" },
      { { code = "1", args = { 1 } }, "invalid_field", "args", "entry 1 must be a string" },
      { { files = { { path = "a.py", content = "" } }, args = { "b.py" } }, "invalid_field", "args", "args%[0%] must name a file" },
      { { files = { { path = "a.py", content = "" } } }, "missing_field", "code" },
    }) do
      status, _, body, r = http(s, "POST", "/v1/run", json(c[1]))
      assert.are.equal(400, status, body)
      assert.are.same({ c[2], c[3] }, { r.error.code, r.error.field }, body)
      if c[4] then assert.matches(c[4], r.error.message) end
    end
  end)

  it("answers 413 for a body over --max-body, with a JSON error", function()
    local s = start_server("--max-body 1000")
    local status, _, body, r = http(s, "POST", "/v1/run", json { code = "print(1)  #" .. ("x"):rep(5000) })
    assert.are.equal(413, status, body)
    assert.are.equal("body_too_large", r.error.code, body)
    assert.is_string(r.error.message, body)
    -- under the cap it runs
    status, _, body = http(s, "POST", "/v1/run", json { code = "print(1)  #" .. ("x"):rep(500) })
    assert.are.equal(200, status, body)
  end)

  it("refuses a request over the policy's maximum, naming the option", function()
    write(dir .. "/capped.lua", [[
      return require("corral.policy").load("default"):extend {
        name = "capped", maxima = { timeout = 2, memory_mb = 512 } }]])
    local s = start_server("--policy " .. q(dir .. "/capped.lua"))
    local status, _, body, r = http(s, "POST", "/v1/run", json { code = "print(1)", timeout = 5 })
    assert.are.equal(400, status, body)
    assert.are.equal("over_limit", r.error.code)
    assert.are.equal("timeout", r.error.field)
    assert.is_truthy(r.error.message:find("capped", 1, true), body)
    status, _, body, r = http(s, "POST", "/v1/run", json { code = "print(1)", timeout = 1, memory_mb = 1024 })
    assert.are.equal(400, status, body)
    assert.are.equal("memory_mb", r.error.field)
    -- the policy may be named by the request when it is the server's own
    status, _, body, r = http(s, "POST", "/v1/run", json { code = "print(1)", timeout = 1, policy = "capped" })
    assert.are.equal(200, status, body)
    assert.are.equal("1\n", r.stdout)
    assert.is_nil(r.clamped)
  end)

  it("clamps when the policy says so and lists what it clamped", function()
    write(dir .. "/clamp.lua", [[
      return require("corral.policy").load("default"):extend {
        name = "clamp", maxima = { timeout = 2, memory_mb = 128 }, clamp = true }]])
    local s = start_server("--policy " .. q(dir .. "/clamp.lua"))
    local status, _, body, r = http(s, "POST", "/v1/run",
      json { code = "print('ok')", timeout = 50, memory_mb = 200, cpu_seconds = 1 })
    assert.are.equal(200, status, body)
    assert.are.equal("ok\n", r.stdout)
    table.sort(r.clamped)
    assert.are.same({ "memory_mb", "timeout" }, r.clamped)
  end)

  it("says in refused why a protection is missing from limits", function()
    -- a scratch mount whose mount point does not exist: the kernel refuses it, the run goes on
    write(dir .. "/holey.lua", [[
      return require("corral.policy").load("default"):extend {
        name = "holey", tmpfs = { ["/tmp"] = 16, ["/no-such-dir-for-corral"] = 1 } }]])
    local s = start_server("--policy " .. q(dir .. "/holey.lua"))
    local status, _, body, r = http(s, "POST", "/v1/run", json { code = "print(1)" })
    assert.are.equal(200, status, body)
    assert.are.equal("1\n", r.stdout)
    local has = {}
    for _, l in ipairs(r.limits) do has[l] = true end
    assert.is_nil(has["private-tmp"], body)
    assert.are.equal("ENOENT", r.refused["private-tmp"].errno, body)
    assert.is_truthy(r.refused["private-tmp"].message:find("/no-such-dir-for-corral", 1, true), body)
  end)

  it("runs seed 003's eval_in_sandbox", function()
    local s = start_server("")
    local status, _, body, r = http(s, "POST", "/v1/eval", json { code = "print('  hi  ')" })
    assert.are.equal(200, status, body)
    -- what applied and what was refused come with the answer, as from /v1/run
    assert.is_table(r.limits, body)
    assert.is_table(r.refused, body)
    r.limits, r.refused = nil, nil
    assert.are.same({ ok = true, returncode = 0, stdout = "hi", stderr = "" }, r)
    status, _, body, r = http(s, "POST", "/v1/eval", json { code = "import time; time.sleep(5)", timeout_max_time_sec = 0.3 })
    assert.are.equal(200, status, body)
    assert.is_false(r.ok)
    assert.are.same({ "sandbox_error", "timeout" }, { r.error.code, r.error.kind })
  end)

  it("answers /healthz and /v1/probe", function()
    local s = start_server("--concurrency 3 --queue 5 --json-log")
    local status, _, body, r = http(s, "GET", "/healthz")
    assert.are.equal(200, status, body)
    assert.is_true(r.ok)
    assert.is_false(r.draining)
    assert.are.same({ 3, 5, 0, 0 }, { r.concurrency, r.queue, r.in_flight, r.queued })
    status, _, body, r = http(s, "GET", "/v1/probe")
    assert.are.equal(200, status, body)
    assert.are.equal(core.geteuid(), r.euid)
    assert.are.equal("default", r.policy.name)
    assert.is_truthy(H.has(r.policy.limits, "timeout"))
    local again = select(3, http(s, "GET", "/v1/probe"))
    assert.are.equal(body, again) -- cached
    -- --json-log: every line is a JSON object; one per request
    local requests = {}
    for line in read(s.log):gmatch("[^\n]+") do
      local e = cjson.decode(line)
      assert.is_string(e.time)
      if e.method then requests[#requests + 1] = e.method .. " " .. e.path .. " " .. math.tointeger(e.status) end
      assert.is_true(e.method == nil or type(e.duration_s) == "number")
    end
    assert.are.same({ "GET /healthz 200", "GET /v1/probe 200", "GET /v1/probe 200" }, requests)
  end)

  it("stops on SIGINT and removes its socket", function()
    local s = start_server("")
    assert.is_true(core.exists(s.sock))
    core.kill(s.pid, 2)
    assert.are.equal(0, exit_status(s, 5), read(s.log))
    assert.is_false(core.exists(s.sock))
  end)

  it("admits `concurrency` runs, queues `queue` more and answers 503 with Retry-After beyond", function()
    local s = start_server("--concurrency 1 --queue 1")
    local slow = json { code = "import time; time.sleep(1.5); print('slept')", timeout = 5 }
    local outs = { dir .. "/a", dir .. "/b", dir .. "/c" }
    -- staggered, so that the first runs, the second queues and the third finds both taken
    local done = background(curl_line(s, "/v1/run", slow, outs[1]) .. " & sleep 0.2; "
      .. curl_line(s, "/v1/run", slow, outs[2]) .. " & sleep 0.2; "
      .. curl_line(s, "/v1/run", slow, outs[3]) .. " & wait")
    -- while they run: one in flight, one queued
    H.eventually(function() return (read(outs[3]) or "") ~= "" end, 10)
    local _, _, text = http(s, "GET", "/metrics")
    assert.are.equal(1, metric(text, "corral_in_flight"), text)
    assert.are.equal(1, metric(text, "corral_queue_depth"), text)
    assert.is_true(H.eventually(function() return core.exists(done) end, 6), "the runs did not end")
    local statuses, retry = {}, nil
    for _, o in ipairs(outs) do
      local resp = read(o)
      local st = tonumber(resp:match("^HTTP/1%.1 (%d+)"))
      statuses[#statuses + 1] = st
      if st == 503 then
        retry = resp:match("\n[Rr]etry%-[Aa]fter: *(%d+)")
        assert.is_truthy(resp:find('"code":"overloaded"', 1, true), resp)
      else
        assert.is_truthy(resp:find('"stdout":"slept\\n"', 1, true), resp)
      end
    end
    assert.are.same({ 200, 200, 503 }, statuses)
    assert.is_truthy(tonumber(retry) and tonumber(retry) >= 1, "Retry-After")
    _, _, text = http(s, "GET", "/metrics")
    assert.are.equal(2, metric(text, 'corral_runs_total{reason="exit"}'), text)
    assert.are.equal(0, metric(text, 'corral_runs_total{reason="timeout"}'), text)
    assert.are.equal(1, metric(text, 'corral_rejected_total{code="overloaded"}'), text)
    assert.are.equal(2, metric(text, 'corral_http_requests_total{route="/v1/run",status="200"}'), text)
    assert.are.equal(1, metric(text, 'corral_http_requests_total{route="/v1/run",status="503"}'), text)
    assert.are.equal(2, metric(text, "corral_run_duration_seconds_count"), text)
    assert.are.equal(0, metric(text, 'corral_run_duration_seconds_bucket{le="0.5"}'), text)
    assert.are.equal(2, metric(text, 'corral_run_duration_seconds_bucket{le="+Inf"}'), text)
    assert.is_truthy(metric(text, "corral_run_duration_seconds_sum") >= 3, text)
    assert.are.equal(0, metric(text, "corral_in_flight"), text)
    assert.are.equal(0, metric(text, "corral_queue_depth"), text)
    assert.is_truthy(text:find("# TYPE corral_runs_total counter", 1, true))
    assert.is_truthy(text:find("# TYPE corral_run_duration_seconds histogram", 1, true))
  end)

  it("kills the run of a client that goes away, and drops a queued one", function()
    local s = start_server("--concurrency 1 --queue 4")
    -- the first client gives up after 5 s of a 30 s run (its run has started by then, on a busy
    -- machine too); the second, queued behind it, after 0.3 s
    local done = background(curl_line(s, "/v1/run", json { code = "import time; time.sleep(30)", timeout = 40 }, dir .. "/a", "--max-time 5") .. " & sleep 0.1; "
      .. curl_line(s, "/v1/run", json { code = "print('never')", timeout = 5 }, dir .. "/b", "--max-time 0.3")
      .. " & wait")
    assert.is_true(H.eventually(function() return #launchers_of(s) > 0 end, 10), "the run did not start")
    assert.is_true(H.eventually(function() return core.exists(done) end, 15))
    -- the run is killed: nothing of it survives, and the launcher is gone
    assert.is_true(H.eventually(function()
      return #H.stray_processes() == 0 and #launchers_of(s) == 0
    end, 3), "the run of a client that went away survived")
    local text
    assert.is_true(H.eventually(function()
      text = select(3, http(s, "GET", "/metrics"))
      return metric(text, 'corral_runs_total{reason="cancelled"}') == 1
    end, 3), text)
    -- the queued one never ran
    assert.are.equal(1, metric(text, "corral_run_duration_seconds_count"), text)
    assert.are.equal(0, metric(text, "corral_queue_depth"), text)
    assert.are.equal(0, metric(text, "corral_in_flight"), text)
    assert.are.equal(2, metric(text, 'corral_http_requests_total{route="/v1/run",status="499"}'), text)
    -- and the server still serves
    local status, _, body = http(s, "POST", "/v1/run", json { code = "print(2)" })
    assert.are.equal(200, status, body)
  end)

  it("drains on SIGTERM: the run in flight completes, new connections are refused, exit 0", function()
    local s = start_server("--drain-seconds 10")
    local out = dir .. "/a"
    local done = background(curl_line(s, "/v1/run", json { code = "import time; time.sleep(1); print('finished')",
      timeout = 5 }, out))
    assert.is_true(H.eventually(function() return #launchers_of(s) > 0 end, 10), "the run did not start")
    core.kill(s.pid, 15)
    H.eventually(function() return (read(s.log) or ""):find("draining", 1, true) ~= nil end, 10)
    local status, _, _, _, rc = http(s, "GET", "/healthz")
    assert.are.equal(0, status)
    assert.are.equal(7, rc) -- curl: failed to connect
    assert.is_true(H.eventually(function() return core.exists(done) end, 5))
    local resp = read(out)
    assert.is_truthy(resp:match("^HTTP/1%.1 200"), resp)
    assert.is_truthy(resp:find('"stdout":"finished\\n"', 1, true), resp)
    assert.are.equal(0, exit_status(s, 5), read(s.log))
    assert.is_truthy(read(s.log):find("stopped", 1, true))
  end)

  it("kills what is still running when the drain time is over", function()
    local s = start_server("--drain-seconds 0.3")
    local out = dir .. "/a"
    local done = background(curl_line(s, "/v1/run", json { code = "import time; time.sleep(20)", timeout = 30 }, out))
    assert.is_true(H.eventually(function() return #launchers_of(s) > 0 end, 10), "the run did not start")
    core.kill(s.pid, 15)
    assert.are.equal(0, exit_status(s, 5), read(s.log))
    assert.is_true(H.eventually(function() return core.exists(done) end, 10))
    local resp = read(out)
    assert.is_truthy(resp:match("^HTTP/1%.1 503"), resp)
    assert.is_truthy(resp:find('"code":"shutdown"', 1, true), resp)
  end)

  it("serves the warm policy: its interpreter is up before the first request, every run is fresh, none outlives the server", function()
    -- the zygote itself: the server's child (its spawner, and the runs' processes it starts, have
    -- the same command line)
    local function zygotes(srv)
      local out = {}
      for _, pid in ipairs(H.pids_with("corral-zygote --control-fd 3 --parent-pid " .. srv.pid .. " ")) do
        local st = read("/proc/" .. pid .. "/stat")
        if st and tonumber(st:match("^%d+ %b() %a (%d+)")) == srv.pid then out[#out + 1] = pid end
      end
      return out
    end
    -- the warm policy with its runs' directories in one of this test's own: what is left there is
    -- these servers', never another controller's
    local runs = dir .. "/runs"
    assert(core.mkdir(runs, 493)) -- 0755: run uids pass through to their code
    local pfile = dir .. "/warm-here.lua"
    write(pfile, 'return require("corral.policy").load("warm"):extend { name = "warm-here", tmp_dir = '
      .. string.format("%q", runs) .. " }\n")
    os.execute("chmod a+r " .. q(pfile))
    local function left() return core.listdir(runs) or {} end
    local s = start_server("--policy " .. q(pfile) .. " --concurrency 2")
    assert.is_true(H.eventually(function() return #zygotes(s) == 1 end, 5), "no warm interpreter: " .. tostring(read(s.log)))
    -- a name set at module level by one run is not there for the next; a preloaded module is
    local code = "import sys\nprint(globals().get('left', 'fresh'), 'json' in sys.modules, sys.argv[0].endswith('/code/main.py'))\nleft = 'stale'"
    for _ = 1, 3 do
      local status, _, body, r = http(s, "POST", "/v1/run", json { code = code, timeout = 5 })
      assert.are.equal(200, status, body)
      assert.are.equal("fresh True True\n", r.stdout, r.stderr)
      assert.is_truthy(H.has(r.limits, "pid-namespace") and H.has(r.limits, "seccomp"), table.concat(r.limits, " "))
    end
    assert.are.equal(1, #zygotes(s))
    core.kill(s.pid, 15)
    assert.are.equal(0, exit_status(s, 10), read(s.log))
    assert.is_true(H.eventually(function() return #zygotes(s) == 0 end, 5), "the warm interpreter outlived its server")
    assert.are.same({}, left(), "a run directory outlived its server")
    -- stopped as soon as it listens, its warm-up run (and the interpreter's start) in flight: the
    -- drain waits for that run's end and clean-up
    local t = start_server("--policy " .. q(pfile))
    core.kill(t.pid, 15)
    assert.are.equal(0, exit_status(t, 10), read(t.log))
    assert.is_true(H.eventually(function() return #zygotes(t) == 0 end, 5), "the warm interpreter outlived its server")
    assert.are.same({}, left(), "the warm-up run's directory outlived its server")
    -- killed outright, the server takes its warm interpreter along (its parent-death signal); the
    -- directory of a run it had then (its warm-up run's, on a slow machine) it cannot remove: its
    -- flock is free, for the next controller's sweep, which this test does now
    local k = start_server("--policy " .. q(pfile))
    assert.is_true(H.eventually(function() return #zygotes(k) == 1 end, 5), "no warm interpreter")
    core.kill(k.pid, 9)
    assert.is_true(H.eventually(function() return #zygotes(k) == 0 end, 5), "the warm interpreter outlived its server")
    for _, name in ipairs(left()) do
      local lock
      assert.is_true(H.eventually(function() lock = core.lock(runs .. "/" .. name) return lock ~= nil end, 5),
        "the killed server's run directory is still locked")
      core.rmtree(runs .. "/" .. name)
      lock:close()
    end
  end)

  it("leaves no sandboxed process behind when the server is SIGKILLed", function()
    local s = start_server("")
    -- the program and a setsid escapee it forked
    local done = background(curl_line(s, "/v1/run", json { code = "import os, time\nif os.fork() == 0:\n os.setsid()\n"
      .. "time.sleep(30)", timeout = 30 }, dir .. "/a"))
    assert.is_true(H.eventually(function() return #H.stray_processes() >= 2 end, 10), "the run did not start")
    local run_dirs = H.temp_dirs()
    core.kill(s.pid, 9)
    assert.is_true(H.eventually(function()
      return #launchers_of(s) == 0 and #H.stray_processes() == 0
    end, 5), "a sandboxed process outlived its server")
    assert.is_true(H.eventually(function() return core.exists(done) end, 10))
    -- the run's directory stays (its controller died before it could remove it); its lock is
    -- free, so the next controller's sweep takes it: do that here
    for _, d in ipairs(run_dirs) do
      if not snap.dirs[d] then
        local lock = assert(core.lock(d .. "/.lock"), "the dead server's run dir is still locked")
        core.rmtree(d)
        lock:close()
      end
    end
  end)

  describe("sessions", function()
    local b64 = core.b64encode

    -- POST /v1/sessions; returns its id (asserting 201) and the decoded answer.
    local function open_session(s, body)
      local status, headers, text, obj = http(s, "POST", "/v1/sessions", json(body or {}))
      assert.are.equal(201, status, text)
      assert.are.equal("/v1/sessions/" .. obj.id, headers.location)
      return obj.id, obj
    end

    local function exec(s, id, body, extra)
      return http(s, "POST", "/v1/sessions/" .. id .. "/exec", json(body), extra)
    end

    it("opens a session whose cells keep their state, answers each cell as JSON, and closes it", function()
      local s = start_server("--instance c1")
      local id, opened = open_session(s, { memory_mb = 512, lifetime = 600, idle_timeout = 60,
        files = { { path = "data.txt", content = b64("a\nb\n") } } })
      assert.is_truthy(id:match("^c1%-" .. ("%x"):rep(32) .. "$"), id)
      assert.is_true(H.has(opened.limits, "memory"), json(opened.limits))
      assert.is_true(H.has(opened.limits, "no-network"), json(opened.limits))
      assert.is_truthy(opened.expires_at:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"), opened.expires_at)
      local status, _, text, r = exec(s, id, { code = "x = len(open('data.txt').read().split())\nx" })
      assert.are.equal(200, status, text)
      assert.are.equal("2", r.value)
      assert.are.equal("ok", r.reason)
      assert.is_true(r.ok)
      assert.are.equal(1, r.execution_count)
      assert.are.same({}, r.images)
      assert.are.equal(cjson.null, r.error)
      status, _, text, r = exec(s, id, { code = "print('x is', x)\nx += 1\n1/0", timeout = 10 })
      assert.are.equal(200, status, text)
      assert.are.equal("error", r.reason)
      assert.is_false(r.ok)
      assert.are.equal("x is 2\n", r.stdout)
      assert.are.equal("ZeroDivisionError", r.error.type)
      assert.is_truthy(r.error.traceback:find("<cell 2>", 1, true), text)
      assert.are.equal(2, r.execution_count)
      assert.is_number(r.usage.wall_s)
      status, _, text, r = exec(s, id, { code = "import matplotlib.pyplot as plt\nplt.plot([1, x])\nx", timeout = 60 })
      assert.are.equal(200, status, text)
      assert.are.equal("3", r.value)
      assert.are.equal(1, #r.images, text)
      assert.are.equal("\137PNG", core.b64decode(r.images[1]):sub(1, 4))
      -- DELETE: 204 once it is gone; then 410 naming why
      status = http(s, "DELETE", "/v1/sessions/" .. id)
      assert.are.equal(204, status)
      status, _, text, r = exec(s, id, { code = "x" })
      assert.are.equal(410, status, text)
      assert.are.equal("session_gone", r.error.code)
      assert.is_truthy(r.error.message:find("(closed)", 1, true), text)
      -- sys.exit() ends a session too: its cell says so, later requests are told why
      local id2 = open_session(s)
      status, _, text, r = exec(s, id2, { code = "import sys\nsys.exit(3)" })
      assert.are.equal(200, status, text)
      assert.are.equal("exit", r.reason)
      assert.are.equal(3, r.returncode)
      assert.is_true(H.eventually(function()
        local st, _, _, o = exec(s, id2, { code = "1" })
        return st == 410 and o.error.message:find("(exit)", 1, true) ~= nil
      end, 5))
      local _, _, m = http(s, "GET", "/metrics")
      assert.are.equal(0, metric(m, "corral_sessions_open"), m)
      assert.are.equal(2, metric(m, "corral_sessions_created_total"), m)
      assert.are.equal(1, metric(m, 'corral_sessions_ended_total{why="closed"}'), m)
      assert.are.equal(1, metric(m, 'corral_sessions_ended_total{why="exit"}'), m)
      assert.are.equal(0, metric(m, 'corral_sessions_ended_total{why="idle"}'), m)
      assert.are.equal(4, metric(m, 'corral_http_requests_total{route="/v1/sessions/{id}/exec",status="200"}'), m)
    end)

    it("puts, gets and lists a session's files; checks their paths and never follows a link", function()
      local s = start_server("")
      local id = open_session(s)
      local base = "/v1/sessions/" .. id .. "/files/"
      local bytes = "bin\0ary\255\n"
      local status, _, text = http(s, "PUT", base .. "sub%2Fdata.bin", bytes)
      assert.are.equal(201, status, text)
      status, _, text = http(s, "PUT", base .. "sub/data.bin", bytes)
      assert.are.equal(200, status, text)
      local headers, body
      status, headers, body = http(s, "GET", base .. "sub/data.bin")
      assert.are.equal(200, status, body)
      assert.are.equal("application/octet-stream", headers["content-type"])
      assert.are.equal(bytes, body)
      -- the program sees it, and its own files come back
      local r
      status, _, text, r = http(s, "POST", "/v1/sessions/" .. id .. "/exec", json { code =
        "import os\nopen('out.txt', 'w').write('from the cell')\nos.symlink('/etc/passwd', 'ln')\n"
        .. "len(open('sub/data.bin', 'rb').read())" })
      assert.are.equal(200, status, text)
      assert.are.equal(tostring(#bytes), r.value)
      status, _, body = http(s, "GET", base .. "out.txt")
      assert.are.equal(200, status, body)
      assert.are.equal("from the cell", body)
      status, _, text, r = http(s, "GET", "/v1/sessions/" .. id .. "/files")
      assert.are.equal(200, status, text)
      local kinds = {}
      for _, e in ipairs(r.entries) do kinds[e.path] = e.type end
      assert.are.equal("file", kinds["sub/data.bin"], text)
      assert.are.equal("directory", kinds["sub"], text)
      assert.are.equal("link", kinds["ln"], text)
      -- a link is an error, not its target
      status, _, text, r = http(s, "GET", base .. "ln")
      assert.are.equal(400, status, text)
      assert.are.equal("file_error", r.error.code)
      assert.is_falsy(text:find("root:", 1, true), text)
      status, _, text = http(s, "PUT", base .. "ln", "x")
      assert.are.equal(400, status, text)
      status, _, text, r = http(s, "GET", base .. "missing")
      assert.are.equal(404, status, text)
      assert.are.equal("file_not_found", r.error.code)
      -- paths are checked once percent-decoded, as `files` paths are
      for _, bad in ipairs({ "../etc/passwd", "%2E%2E%2Fx", "a//b", "a%00b", "%2Fetc%2Fpasswd", "a%zz" }) do
        for _, method in ipairs({ "GET", "PUT" }) do
          status, _, text, r = http(s, method, base .. bad, method == "PUT" and "x" or nil, "--path-as-is")
          assert.are.equal(400, status, bad .. ": " .. text)
          assert.are.equal("invalid_path", r.error.code, text)
        end
      end
      assert.are.equal(200, (http(s, "GET", base .. "out.txt")))
    end)

    it("gives a cell's collected files as a run's: base64, path_b64, links never followed", function()
      local s = start_server("")
      local id = open_session(s)
      local status, _, text, r = exec(s, id, { code = "import os\nopen('a.png', 'wb').write(b'\\x89PNG\\0')\n"
        .. "open(b'caf\\xe9.png', 'w').write('c')\nos.symlink('/etc/passwd', 'p.png')\nos.mkfifo('f.png')",
        collect = { "*.png" } })
      assert.are.equal(200, status, text)
      assert.are.equal("ok", r.reason, text)
      assert.are.equal(3, #r.files, text)
      local f = {}
      for _, e in ipairs(r.files) do f[e.path] = e end
      assert.are.equal(b64("\137PNG\0"), f["a.png"].content)
      assert.are.equal("file", f["a.png"].type)
      assert.are.equal(5, f["a.png"].size)
      assert.is_false(f["a.png"].truncated)
      assert.are.equal(b64("caf\233.png"), f["caf\239\191\189.png"].path_b64, text)
      assert.are.equal("link", f["p.png"].type)
      assert.are.equal("/etc/passwd", f["p.png"].target)
      assert.is_nil(f["p.png"].content)
      assert.is_nil(r.files_truncated)
      -- true: this cell's files only; none is an empty list
      status, _, text, r = exec(s, id, { code = "open('b.txt', 'w').write('b')", collect = true })
      assert.are.equal(200, status, text)
      assert.are.equal(1, #r.files, text)
      assert.are.equal("b.txt", r.files[1].path)
      status, _, text = exec(s, id, { code = "1", collect = true })
      assert.are.equal(200, status, text)
      assert.is_truthy(text:find('"files":[]', 1, true), text)
      -- without collect: no files
      status, _, text, r = exec(s, id, { code = "1" })
      assert.are.equal(200, status, text)
      assert.is_nil(r.files)
    end)

    it("keeps what the session prints during a file request for the next cell", function()
      local s = start_server("")
      local id = open_session(s)
      -- the kernel's own os.write, as the program may change it: it prints while the kernel
      -- writes the file the PUT sends, so during the request
      local status, _, text = exec(s, id, { code = "import os, sys\n_write = os.write\n"
        .. "def write(fd, data):\n"
        .. "    if bytes(data) == b'PAYLOAD':\n"
        .. "        print('during the put', flush=True)\n"
        .. "        print('and on stderr', file=sys.stderr, flush=True)\n"
        .. "    return _write(fd, data)\n"
        .. "os.write = write" })
      assert.are.equal(200, status, text)
      status, _, text = http(s, "PUT", "/v1/sessions/" .. id .. "/files/p.txt", "PAYLOAD")
      assert.are.equal(201, status, text)
      local r
      status, _, text, r = exec(s, id, { code = "print(open('p.txt').read())" })
      assert.are.equal(200, status, text)
      assert.are.equal("during the put\nPAYLOAD\n", r.stdout)
      assert.are.equal("and on stderr\n", r.stderr)
    end)

    it("refuses bad session requests with an error naming the field, an unknown id with 404", function()
      local s = start_server("--instance c1")
      local cases = {
        { {}, nil },
        { { code = "1" }, "unknown_field", "code" },
        { { stdin = "x" }, "unknown_field", "stdin" },
        { { timeout = 5 }, "unknown_field", "timeout" },
        { { python = "/bin/sh" }, "unknown_field", "python" },
        { { lifetime = "5" }, "invalid_field", "lifetime" },
        { { lifetime = 0 }, "invalid_field", "lifetime" },
        { { idle_timeout = -1 }, "invalid_field", "idle_timeout" },
        { { memory_mb = 1.5 }, "invalid_field", "memory_mb" },
        { { policy = "bwrap" }, "policy_not_allowed", "policy" },
        { { files = { { path = "../x", content = "" } } }, "invalid_field", "files" },
      }
      local id
      for _, c in ipairs(cases) do
        local status, _, text, r = http(s, "POST", "/v1/sessions", json(c[1]))
        if c[2] == nil then
          assert.are.equal(201, status, text)
          id = r.id
        else
          assert.are.equal(400, status, text)
          assert.are.equal(c[2], r.error.code, text)
          assert.are.equal(c[3], r.error.field, text)
        end
      end
      local status, headers, text, r = http(s, "POST", "/v1/sessions", "[1]")
      assert.are.equal(400, status, text)
      assert.are.equal("bad_request", r.error.code, text)
      assert.are.equal("application/json", headers["content-type"])
      local cells = {
        { {}, "missing_field", "code" },
        { { code = 1 }, "invalid_field", "code" },
        { { code = "1", timeout = 0 }, "invalid_field", "timeout" },
        { { code = "1", cpu_seconds = "1" }, "invalid_field", "cpu_seconds" },
        { { code = "1", memory_mb = 5 }, "unknown_field", "memory_mb" },
        { { code = "1", collect = "*.png" }, "invalid_field", "collect" },
        { { code = "1", collect = {} }, "invalid_field", "collect" },
        { { code = "1", collect = { "../x" } }, "invalid_field", "collect" },
        { { code = "1", collect = { 1 } }, "invalid_field", "collect" },
      }
      for _, c in ipairs(cells) do
        status, _, text, r = exec(s, id, c[1])
        assert.are.equal(400, status, text)
        assert.are.equal(c[2], r.error.code, text)
        assert.are.equal(c[3], r.error.field, text)
      end
      -- another id, a malformed one, one that differs by a character: never this session
      local other = id:sub(1, -2) .. (id:sub(-1) == "0" and "1" or "0")
      for _, bad in ipairs({ "c1-" .. ("0"):rep(32), other, id:sub(4), id .. "x", "%2e%2e", "x" }) do
        status, _, text, r = http(s, "POST", "/v1/sessions/" .. bad .. "/exec", json { code = "1" }, "--path-as-is")
        assert.are.equal(404, status, bad .. ": " .. text)
        assert.are.equal("session_not_found", r.error.code, text)
        status = http(s, "DELETE", "/v1/sessions/" .. bad)
        assert.are.equal(404, status, bad)
      end
      status, headers, text = http(s, "GET", "/v1/sessions/" .. id .. "/exec")
      assert.are.equal(405, status, text)
      assert.are.equal("POST", headers.allow)
      status, headers = http(s, "DELETE", "/v1/sessions/" .. id .. "/files/x")
      assert.are.equal(405, status)
      assert.are.equal("GET, PUT", headers.allow)
      status = http(s, "GET", "/v1/sessions")
      assert.are.equal(405, status)
      status, headers, text = http(s, "POST", "/v1/sessions/" .. id .. "/nope", "{}")
      assert.are.equal(404, status, text)
      assert.are.equal("application/json", headers["content-type"])
      -- the session is untouched by all that
      local st, _, answer, cell = exec(s, id, { code = "6 * 7" })
      assert.are.equal(200, st, answer)
      assert.are.equal("42", cell.value)
    end)

    it("answers 409 while a cell runs, and 429 with Retry-After beyond --max-sessions", function()
      local s = start_server("--max-sessions 1")
      local id = open_session(s, { idle_timeout = 100 })
      local out = dir .. "/slow"
      local done = background(curl_line(s, "/v1/sessions/" .. id .. "/exec",
        json { code = "import time\ntime.sleep(1.5)\nprint('slept')", timeout = 20 }, out))
      assert.is_true(H.eventually(function()
        local _, _, _, h = http(s, "GET", "/healthz")
        return h and h.sessions_busy == 1
      end, 5), "the cell did not start")
      local status, _, text, r = exec(s, id, { code = "1" })
      assert.are.equal(409, status, text)
      assert.are.equal("busy", r.error.code)
      status, _, text = http(s, "GET", "/v1/sessions/" .. id .. "/files")
      assert.are.equal(409, status, text)
      local headers
      status, headers, text, r = http(s, "POST", "/v1/sessions", "{}")
      assert.are.equal(429, status, text)
      assert.are.equal("too_many_sessions", r.error.code)
      local retry = tonumber(headers["retry-after"])
      assert.is_truthy(retry and retry >= 1 and retry <= 3600, tostring(headers["retry-after"]))
      assert.is_true(H.eventually(function() return core.exists(done) end, 10), "the cell did not end")
      local resp = read(out)
      assert.is_truthy(resp:match("^HTTP/1%.1 200"), resp)
      assert.is_truthy(resp:find('"stdout":"slept\\n"', 1, true), resp)
      -- one closed, one may open
      assert.are.equal(204, (http(s, "DELETE", "/v1/sessions/" .. id)))
      open_session(s)
      local _, _, m = http(s, "GET", "/metrics")
      assert.are.equal(1, metric(m, 'corral_rejected_total{code="too_many_sessions"}'), m)
      assert.are.equal(2, metric(m, 'corral_rejected_total{code="busy"}'), m)
      assert.are.equal(1, metric(m, "corral_sessions_open"), m)
    end)

    it("ends a session at its idle timeout: later requests get 410 (idle)", function()
      local s = start_server("")
      local id = open_session(s, { idle_timeout = 1 })
      -- (a request would keep it alive: /healthz says when it has ended)
      assert.is_true(H.eventually(function()
        local _, _, _, h = http(s, "GET", "/healthz")
        return h and h.sessions == 0
      end, 10), "the session did not end")
      local status, _, text, r = exec(s, id, { code = "1" })
      assert.are.equal(410, status, text)
      assert.are.equal("session_gone", r.error.code)
      assert.is_truthy(r.error.message:find("(idle)", 1, true), text)
      local _, _, m = http(s, "GET", "/metrics")
      assert.are.equal(1, metric(m, 'corral_sessions_ended_total{why="idle"}'), m)
      assert.are.equal(0, metric(m, "corral_sessions_open"), m)
    end)

    it("closes every session on SIGTERM, after the cell that runs has answered", function()
      local s = start_server("--drain-seconds 10")
      local idle_one = open_session(s)
      local busy_one = open_session(s)
      local out = dir .. "/cell"
      local done = background(curl_line(s, "/v1/sessions/" .. busy_one .. "/exec",
        json { code = "import time\ntime.sleep(1)\nprint('finished')", timeout = 20 }, out))
      assert.is_true(H.eventually(function()
        local _, _, _, h = http(s, "GET", "/healthz")
        return h and h.sessions_busy == 1
      end, 5), "the cell did not start")
      core.kill(s.pid, 15)
      assert.is_true(H.eventually(function() return core.exists(done) end, 10), "the cell did not end")
      local resp = read(out)
      assert.is_truthy(resp:match("^HTTP/1%.1 200"), resp)
      assert.is_truthy(resp:find('"stdout":"finished\\n"', 1, true), resp)
      assert.are.equal(0, exit_status(s, 10), read(s.log))
      local log = read(s.log)
      assert.is_truthy(log:find("session-ended id=" .. idle_one .. " why=shutdown", 1, true), log)
      assert.is_truthy(log:find("session-ended id=" .. busy_one .. " why=shutdown", 1, true), log)
    end)

    it("kills a session's cell still running when the drain time is over: 503 shutdown", function()
      local s = start_server("--drain-seconds 0.3")
      local id = open_session(s)
      local out = dir .. "/cell"
      local done = background(curl_line(s, "/v1/sessions/" .. id .. "/exec",
        json { code = "import time\ntime.sleep(30)", timeout = 60 }, out))
      assert.is_true(H.eventually(function()
        local _, _, _, h = http(s, "GET", "/healthz")
        return h and h.sessions_busy == 1
      end, 5), "the cell did not start")
      core.kill(s.pid, 15)
      assert.are.equal(0, exit_status(s, 10), read(s.log))
      assert.is_true(H.eventually(function() return core.exists(done) end, 5))
      local resp = read(out)
      assert.is_truthy(resp:match("^HTTP/1%.1 503"), resp)
      assert.is_truthy(resp:find('"code":"shutdown"', 1, true), resp)
    end)
  end)

  describe("from Lua", function()
    local serve = require "corral.serve"

    it("refuses a bad config before it listens, naming the option", function()
      local cases = {
        { { listen = "0.0.0.0:8080" }, "token" },
        { { listen = "127.0.0.1:8080" }, "token" },
        { { listen = "localhost:8080" }, "token" },
        { { listen = "local host:8080" }, "listen" },
        { { listen = "unix:" .. dir .. "/x.sock", bogus = 1 }, "bogus" },
        { { listen = "unix:" .. dir .. "/x.sock", concurrency = 0 }, "concurrency" },
        { { listen = "unix:" .. dir .. "/x.sock", policy = "no-such-policy" }, "no-such-policy" },
        { { listen = "unix:" .. dir .. "/x.sock", policies = { "default", "nope" } }, "nope" },
        { { listen = "unix:" .. dir .. "/x.sock", instance = "a b" }, "instance" },
        { { listen = "unix:" .. dir .. "/x.sock", instance = "" }, "instance" },
        { { listen = "unix:" .. dir .. "/x.sock", max_sessions = -1 }, "max_sessions" },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(serve.start, c[1])
        assert.is_false(ok, c[2])
        assert.is_truthy(tostring(err):find(c[2], 1, true), tostring(err))
      end
      assert.is_false(core.exists(dir .. "/x.sock"))
    end)

    it("parses listen addresses and picks a default", function()
      assert.are.same({ unix = "/run/x.sock" }, serve.parse_listen("unix:/run/x.sock"))
      assert.are.same({ host = "127.0.0.1", port = 80, loopback = true, bind = "127.0.0.1:80" },
        serve.parse_listen("127.0.0.1:80"))
      assert.are.same({ host = "::1", port = 9, loopback = true, bind = "[::1]:9" }, serve.parse_listen("[::1]:9"))
      -- a host name is resolved: its first address is bound
      local l = assert(serve.parse_listen("localhost:8080"))
      assert.are.equal("localhost", l.name)
      assert.is_true(l.loopback, l.host)
      assert.are.equal(8080, l.port)
      assert.is_false(serve.parse_listen("0.0.0.0:80").loopback)
      assert.is_nil(serve.parse_listen("127.0.0.1:99999"))
      assert.is_nil(serve.parse_listen("unix:"))
      assert.is_nil(serve.parse_listen("local host:80"))
      assert.is_nil(serve.parse_listen("localhost"))
      assert.is_truthy(serve.default_listen():match("^unix:/.*%.sock$"))
    end)

    it("serves in the embedder's loop and stops when asked", function()
      local stopped = false
      local srv = assert(serve.start { listen = "unix:" .. dir .. "/e.sock", signals = false, concurrency = 1,
                                       log = function() end, on_stop = function() stopped = true end })
      local out
      assert(core.spawn { file = "/usr/bin/curl", args = { "-s", "--unix-socket", dir .. "/e.sock",
        "--data-binary", '{"code": "print(40 + 2)"}', "http://corral/v1/run" },
        on_exit = function(res) out = res.stdout srv:shutdown() end })
      assert.is_true(srv:run())
      assert.is_true(stopped)
      assert.are.equal("42\n", cjson.decode(out).stdout)
      assert.is_false(core.exists(dir .. "/e.sock"))
      assert.are.same({ in_flight = 0, queued = 0, draining = true, stopped = true, sessions = 0 }, srv:stats())
    end)
  end)

  describe("over TCP", function()
    local function free_port()
      return tonumber((H.sh(H.python .. [[ -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])']])))
    end

    it("refuses to start without a token", function()
      for _, addr in ipairs({ "0.0.0.0:" .. free_port(), "127.0.0.1:" .. free_port() }) do
        local out, status = H.sh("env -u CORRAL_TOKEN timeout 5 " .. H.cli .. " serve --listen " .. addr .. " </dev/null")
        assert.are.equal(2, status, out)
        assert.is_truthy(out:find("token", 1, true), out)
      end
    end)

    it("needs the bearer token on every route but /healthz", function()
      write(dir .. "/token", "s3cret-token\n")
      local port = free_port()
      local s = start_server("--listen 127.0.0.1:" .. port .. " --token-file " .. q(dir .. "/token"))
      local base = "http://127.0.0.1:" .. port
      local status, headers, body, r = http(base, "GET", "/metrics")
      assert.are.equal(401, status, body)
      assert.are.equal("unauthorized", r.error.code)
      assert.is_truthy(headers["www-authenticate"])
      local _
      status, _, body = http(base, "POST", "/v1/run", json { code = "print(1)" }, "-H 'Authorization: Bearer wrong'")
      assert.are.equal(401, status, body)
      status = http(base, "POST", "/v1/run", json { code = "print(1)" }, "-H 'Authorization: Bearer s3cret-token-'")
      assert.are.equal(401, status)
      status, _, body, r = http(base, "POST", "/v1/run", json { code = "print(1)" },
        "-H 'Authorization: Bearer s3cret-token'")
      assert.are.equal(200, status, body)
      assert.are.equal("1\n", r.stdout)
      status = http(base, "GET", "/healthz")
      assert.are.equal(200, status)
      stop_server(s)
    end)

    it("listens on a host name (localhost) at the address it resolves to", function()
      write(dir .. "/token", "s3cret-token\n")
      local port = free_port()
      local s = start_server("--listen localhost:" .. port .. " --token-file " .. q(dir .. "/token"))
      local log = read(s.log) or ""
      local addr = log:match("listening address=(%S+)")
      assert.is_truthy(addr, log)
      assert.is_truthy(addr == "127.0.0.1:" .. port or addr == "[::1]:" .. port, addr)
      local status, _, body = http("http://" .. addr, "GET", "/healthz")
      assert.are.equal(200, status, body)
      stop_server(s)
      assert.are.equal(0, exit_status(s))
    end)

    it("names the host it cannot resolve", function()
      local out, status = H.sh("env CORRAL_TOKEN=t timeout 30 " .. H.cli .. " serve --listen no-such-host.invalid:80 </dev/null")
      assert.are.equal(2, status, out)
      assert.is_truthy(out:find("--listen 'no-such-host.invalid:80': cannot resolve 'no-such-host.invalid'", 1, true), out)
    end)
  end)
end)
