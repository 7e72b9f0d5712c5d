-- The gateways of deploy/nginx, for real: Debian's nginx (and libnginx-mod-http-lua with
-- lua-resty-core for the OpenResty config) started on loopback in front of `corral serve`
-- controllers. The shipped config files are used as they are, with only their socket paths,
-- ports and Lua path pointed at this test's directory.
local core = require "corral.core"
local H = require "helper"

local NGINX = "/usr/sbin/nginx"
local MODULES = "/usr/lib/nginx/modules"
local have_nginx = core.access(NGINX, "x") and core.access(MODULES .. "/ngx_http_lua_module.so", "r")

local cjson = require "cjson"

local read = H.read

local function write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

-- A free loopback TCP port (bound then released by a short python).
local function free_port()
  return tonumber((H.sh(H.python .. " -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])'")))
end

-- Start a controller on a unix socket; returns its pid once the socket answers /healthz.
local function start_controller(sock, extra)
  local pid = tonumber((H.sh("lua5.4 bin/corral serve --listen unix:" .. sock .. " " .. (extra or "")
    .. " >" .. sock .. ".log 2>&1 & echo $!")))
  assert.is_true(H.eventually(function()
    return H.sh("curl -s -o /dev/null -w '%{http_code}' --unix-socket " .. sock .. " http://x/healthz") == "200"
  end, 5), "the controller did not come up: " .. (core.exists(sock .. ".log") and read(sock .. ".log") or ""))
  return pid
end

-- Start nginx with the shipped site config `name`, its paths replaced by `subst` (plain
-- string replacements); returns a stop function.
local function start_nginx(dir, name, subst)
  local site = read("deploy/nginx/" .. name)
  for from, to in pairs(subst) do
    site = site:gsub(from:gsub("%p", "%%%0"), (to:gsub("%%", "%%%%")))
  end
  write(dir .. "/site.conf", site)
  write(dir .. "/nginx.conf", table.concat({
    "load_module " .. MODULES .. "/ndk_http_module.so;",
    "load_module " .. MODULES .. "/ngx_http_lua_module.so;",
    -- as root nginx's workers would be nobody, outside the socket's owner and group (0660);
    -- a deployment runs the controller as a user in nginx's group instead
    H.root and "user root root;" or "",
    "worker_processes 1;",
    "pid " .. dir .. "/nginx.pid;",
    "error_log " .. dir .. "/error.log notice;",
    "events { worker_connections 256; }",
    "http {",
    "  access_log off;",
    "  client_body_temp_path " .. dir .. "/body;",
    "  proxy_temp_path " .. dir .. "/proxy;",
    "  fastcgi_temp_path " .. dir .. "/fastcgi;",
    "  uwsgi_temp_path " .. dir .. "/uwsgi;",
    "  scgi_temp_path " .. dir .. "/scgi;",
    "  include " .. dir .. "/site.conf;",
    "}", "" }, "\n"))
  local out, status = H.sh(NGINX .. " -t -p " .. dir .. " -c " .. dir .. "/nginx.conf")
  assert.are.equal(0, status, out)
  H.sh(NGINX .. " -p " .. dir .. " -c " .. dir .. "/nginx.conf")
  assert.is_true(H.eventually(function() return core.exists(dir .. "/nginx.pid") end, 10), "nginx did not start")
  return function()
    local pid = tonumber(read(dir .. "/nginx.pid"))
    if pid then core.kill(pid, 15) end
    H.eventually(function() return not core.exists(dir .. "/nginx.pid") end, 10)
  end
end

local function request(method, url, body, extra)
  local tmp = os.tmpname()
  write(tmp, body or "")
  local out = H.sh("curl -s -w '\\n%{http_code}' -X " .. method .. (body and (" --data-binary @" .. tmp) or "")
    .. " " .. (extra or "") .. " " .. url)
  os.remove(tmp)
  local text, code = out:match("^(.*)\n(%d+)$")
  return tonumber(code), text
end

local function post(url, body, extra) return request("POST", url, body, extra) end

describe("gateways (deploy/nginx)", function()
  local snap, dir, stop, controllers

  before_each(function()
    snap = H.snapshot()
    dir = assert(core.mkdtemp("/tmp/corral-gw-XXXXXX"))
    assert(core.chmod(dir, 493))
    controllers = {}
  end)

  after_each(function()
    if stop then stop() stop = nil end
    for _, pid in ipairs(controllers) do core.kill(pid, 15) end
    for _, pid in ipairs(controllers) do
      H.eventually(function() return H.sh("kill -0 " .. pid .. " 2>/dev/null; echo $?") ~= "0" end, 5)
    end
    core.rmtree(dir)
    H.assert_clean(snap)
  end)

  it("runs code through a plain proxy_pass to a unix socket", function()
    if not have_nginx then pending("nginx with the lua module is not installed") return end
    local sock = dir .. "/corral.sock"
    controllers[1] = start_controller(sock)
    local port = free_port()
    stop = start_nginx(dir, "single.conf", { ["/run/corral.sock"] = sock, ["127.0.0.1:8080"] = "127.0.0.1:" .. port })
    local code, body = post("http://127.0.0.1:" .. port .. "/v1/run", cjson.encode { code = "print(6 * 7)" })
    assert.are.equal(200, code, body)
    local r = cjson.decode(body)
    assert.are.equal("42\n", r.stdout)
    assert.is_true(r.ok)
    assert.are.equal("exit", r.reason)
    -- the controller's own errors pass through
    code, body = post("http://127.0.0.1:" .. port .. "/v1/run", "{not json")
    assert.are.equal(400, code, body)
  end)

  it("runs code from Lua in the gateway with resty.corral, and keeps an access check in Lua", function()
    if not have_nginx then pending("nginx with the lua module is not installed") return end
    local sock = dir .. "/corral.sock"
    controllers[1] = start_controller(sock)
    local port = free_port()
    stop = start_nginx(dir, "openresty.conf", {
      ["/run/corral.sock"] = sock, ["127.0.0.1:8082"] = "127.0.0.1:" .. port,
      ["/usr/local/share/lua/5.1/?.lua"] = core.realpath("lua") .. "/?.lua",
    })
    for i = 1, 3 do   -- the second and third reuse the worker's pooled connection
      local code, body = post("http://127.0.0.1:" .. port .. "/run", "print('through resty', " .. i .. ")")
      assert.are.equal(200, code, body)
      local r = cjson.decode(body)
      assert.are.equal("through resty " .. i .. "\n", r.stdout)
      assert.are.equal("exit", r.reason)
    end
    local code = post("http://127.0.0.1:" .. port .. "/v1/run", cjson.encode { code = "print(1)" })
    assert.are.equal(403, code)
    local body
    code, body = post("http://127.0.0.1:" .. port .. "/v1/run", cjson.encode { code = "print(1)" }, "-H 'X-Tenant: a'")
    assert.are.equal(200, code, body)
    assert.are.equal("1\n", cjson.decode(body).stdout)
    -- the controller down: the gateway answers 502 by itself, the worker survives
    core.kill(controllers[1], 9)
    H.eventually(function() return H.sh("kill -0 " .. controllers[1] .. " 2>/dev/null; echo $?") ~= "0" end, 5)
    controllers = {}
    -- the launch it had started ahead dies with it; its directory waits for a sweep
    H.sweep_dead_run_dirs(snap)
    code = post("http://127.0.0.1:" .. port .. "/run", "print(1)")
    assert.are.equal(502, code)
    assert.is_falsy(read(dir .. "/error.log"):find("[alert]", 1, true), read(dir .. "/error.log"))
  end)

  it("loses no request that nginx could retry when one of two controllers is killed", function()
    if not have_nginx then pending("nginx with the lua module is not installed") return end
    local s1, s2 = dir .. "/corral-1.sock", dir .. "/corral-2.sock"
    controllers[1] = start_controller(s1)
    controllers[2] = start_controller(s2)
    local port = free_port()
    stop = start_nginx(dir, "upstream.conf", {
      ["/run/corral/corral-1.sock"] = s1, ["/run/corral/corral-2.sock"] = s2,
      ["127.0.0.1:8081"] = "127.0.0.1:" .. port,
    })
    local ok = 0
    for i = 1, 20 do
      if i == 6 then
        core.kill(controllers[1], 9)   -- between requests: none of its runs is in flight
      end
      local code, body = post("http://127.0.0.1:" .. port .. "/v1/run", cjson.encode { code = "print(" .. i .. ")" })
      assert.are.equal(200, code, "request " .. i .. ": " .. tostring(body))
      assert.are.equal(i .. "\n", cjson.decode(body).stdout)
      ok = ok + 1
    end
    assert.are.equal(20, ok)
    H.eventually(function() return H.sh("kill -0 " .. controllers[1] .. " 2>/dev/null; echo $?") ~= "0" end, 5)
    table.remove(controllers, 1)
    -- the launch the killed one had started ahead died with it; its directory waits for a sweep
    H.sweep_dead_run_dirs(snap)
  end)

  it("sends each session's requests to the controller that opened it", function()
    if not have_nginx then pending("nginx with the lua module is not installed") return end
    local s1, s2 = dir .. "/corral-1.sock", dir .. "/corral-2.sock"
    controllers[1] = start_controller(s1, "--instance corral-1")
    controllers[2] = start_controller(s2, "--instance corral-2")
    local port = free_port()
    stop = start_nginx(dir, "upstream.conf", {
      ["/run/corral/corral-1.sock"] = s1, ["/run/corral/corral-2.sock"] = s2,
      ["127.0.0.1:8081"] = "127.0.0.1:" .. port,
    })
    local base = "http://127.0.0.1:" .. port
    -- open sessions through the gateway until each controller owns one
    local owned, others = {}, {}
    for _ = 1, 20 do
      local code, body = post(base .. "/v1/sessions", "{}")
      assert.are.equal(201, code, body)
      local id = cjson.decode(body).id
      local owner = id:match("^(corral%-%d)%-" .. ("%x"):rep(32) .. "$")
      assert.is_truthy(owner, id)
      if owned[owner] then others[#others + 1] = id else owned[owner] = id end
      if owned["corral-1"] and owned["corral-2"] then break end
    end
    assert.is_truthy(owned["corral-1"] and owned["corral-2"], "one controller owns no session")
    for _, id in pairs(owned) do
      local code, body = post(base .. "/v1/sessions/" .. id .. "/exec", cjson.encode { code = "x = 0" })
      assert.are.equal(200, code, body)
    end
    -- every request reaches the session's state: x counts up in each, interleaved
    for i = 1, 10 do
      for _, owner in ipairs({ "corral-1", "corral-2" }) do
        local code, body = post(base .. "/v1/sessions/" .. owned[owner] .. "/exec",
          cjson.encode { code = "x += 1\nx" })
        assert.are.equal(200, code, owner .. " cell " .. i .. ": " .. tostring(body))
        assert.are.equal(tostring(i), cjson.decode(body).value, owner .. " cell " .. i)
      end
    end
    -- files go to the owner too
    local id = owned["corral-2"]
    local code, body = request("PUT", base .. "/v1/sessions/" .. id .. "/files/in.txt", "through nginx")
    assert.are.equal(201, code, body)
    code, body = request("GET", base .. "/v1/sessions/" .. id .. "/files/in.txt")
    assert.are.equal(200, code, body)
    assert.are.equal("through nginx", body)
    -- an id no controller has: 404, from the gateway or from the controller its prefix names
    code, body = post(base .. "/v1/sessions/corral-9-" .. ("0"):rep(32) .. "/exec", cjson.encode { code = "1" })
    assert.are.equal(404, code, body)
    code, body = post(base .. "/v1/sessions/corral-1-" .. ("0"):rep(32) .. "/exec", cjson.encode { code = "1" })
    assert.are.equal(404, code, body)
    assert.are.equal("session_not_found", cjson.decode(body).error.code)
    for _, sid in ipairs(others) do
      assert.are.equal(204, (request("DELETE", base .. "/v1/sessions/" .. sid)))
    end
    for _, sid in pairs(owned) do
      assert.are.equal(204, (request("DELETE", base .. "/v1/sessions/" .. sid)))
      code = post(base .. "/v1/sessions/" .. sid .. "/exec", cjson.encode { code = "x" })
      assert.are.equal(410, code)
    end
  end)
end)
