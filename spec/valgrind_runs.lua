-- Driven under valgrind by spec/valgrind.sh: the host module through a few kinds of run.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = (os.getenv("CORRAL_CPATH") or "csrc/?.so") .. ";" .. package.cpath
local corral = require "corral"
local function check(cond, what) if not cond then io.stderr:write("failed: " .. what .. "\n") os.exit(1) end end
local r = corral.run_python("print('hi')")
check(r and r.stdout == "hi\n", "plain run")
r = corral.run_python("import time; time.sleep(5)", { timeout = 0.5 })
check(r and r.timed_out, "timeout")
r = corral.run_python("import sys\nfor i in range(200): sys.stdout.write('x' * 10000)", { max_output = 1000 })
check(r and r.truncated, "flood")
r = corral.run_python("import sys; print(len(sys.stdin.read()))", { stdin = string.rep("a", 100000) })
check(r and r.stdout == "100000\n", "stdin")
local res = corral.run_python("print(1)", { python = "/nonexistent" })
check(res == nil, "bad interpreter")
local results = corral.run_many({ "print(1)", "print(2)", "import time; time.sleep(3)" }, { concurrency = 3 })
check(#results == 3, "run_many")
-- files in (written while the launcher starts), and out: as given, changed, large, a link
local given = { { path = "in/a", content = ("a"):rep(70000) }, { path = "in/b", content = "b" },
                { path = "c", content = "c", mode = 384 } }
r = corral.run_python("import os\nopen('in/b', 'w').write('B')\nos.symlink('c', 'l')\n"
  .. "open('big', 'wb').write(b'x' * 200000)", { files = given, collect = { "**" } })
check(r and r.ok and #r.files == 5 and r.files[4].content == "B" and rawequal(r.files[3].content, given[1].content)
  and #r.files[1].content == 200000, "files in and out")
check(#corral.run_python("pass", { files = given, collect = true }).files == 0, "collect all")
local rcore = require "corral.core"
check(#rcore.records_unpack("f\0p\0" .. "3\0" .. "644\0" .. "5\0ab") == 0, "records cut short")
-- within caps: a content cut and the rest passed over, records past the entries' cap made into nothing
local many = ("f\0p\0" .. "4\0" .. "644\0" .. "4\0abcd"):rep(1000) .. "end\0" .. "1000\0\0"
local capped, capped_done, _, capped_flags = rcore.records_unpack(many, nil, { files = 10, file_bytes = 3, bytes = 20 })
check(#capped == 10 and capped_done and capped_flags == "files,bytes" and capped[1].content == "abc", "records capped")
-- from a file: a content cut past its 64 KiB buffer and the rest read and dropped
local rdir = assert(rcore.mkdtemp("/tmp/corral-vg-rec.XXXXXX"))
local big = ("y"):rep(200000)
assert(rcore.write_file(rdir .. "/r", "f\0a\0" .. #big .. "\0" .. "644\0" .. #big .. "\0" .. big .. many))
capped, capped_done = rcore.records_read(rdir .. "/r", 1 << 30, nil, { files = 5, file_bytes = 70000 })
check(#capped == 5 and capped_done and #capped[1].content == 70000 and capped[2].content == "abcd", "records read capped")
assert(rcore.rmtree(rdir))
collectgarbage()

-- The HTTP server (core.http_listen), core.signal and core.timer, with real clients.
local core = require "corral.core"
local function wait(pred)
  local expired = false
  local t = core.timer(30, function() expired = true end)
  while not pred() and not expired do core.run("once") end
  t:close()
  check(pred(), "http: timed out")
end
local function client(file, args)
  local out
  assert(core.spawn { file = file, args = args, timeout = 20, on_exit = function(x) out = x end })
  wait(function() return out end)
  return out
end
local dir = core.mkdtemp("/tmp/corral-vg-XXXXXX")
local sock = dir .. "/s.sock"
local held, closed = nil, false
local srv = assert(core.http_listen {
  listen = "unix:" .. sock, max_body_bytes = 4096, header_timeout = 1, body_timeout = 1,
  on_request = function(req, reply)
    if req.path == "/boom" then error("boom") end
    if req.path == "/hold" then
      held = reply
      reply:on_close(function() closed = true end)
      return
    end
    reply:send(200, { ["Content-Type"] = "text/plain" }, req.method .. " " .. #req.body)
  end,
  on_error = function() end,
})
local body = dir .. "/body"
assert(core.write_file(body, string.rep("x", 3000)))
r = client("/usr/bin/curl", { "-q", "-sS", "--unix-socket", sock, "http://x/a", "http://x/boom",
  "-d", "abc", "http://x/b" })
check(r.exit_status == 0 and r.stdout:find("POST 3", 1, true), "http: curl keep-alive")
r = client("/usr/bin/curl", { "-q", "-sS", "--unix-socket", sock, "-H", "Expect: 100-continue",
  "-H", "Transfer-Encoding: chunked", "--data-binary", "@" .. body, "http://x/up" })
check(r.stdout == "POST 3000", "http: chunked upload")
r = client("/usr/bin/curl", { "-q", "-sS", "--unix-socket", sock, "--data-binary", "@" .. body,
  "-H", "Content-Length: 9000", "http://x/big" })
check(r.stdout:find("body_too_large", 1, true), "http: 413")
r = client("/usr/bin/python3", { "-c", [[
import socket, sys, time
def c():
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); return s
s = c(); s.sendall(b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\nBAD / HTTP/1.1\r\n\r\n"); time.sleep(0.3)
s = c(); s.sendall(b"GET / HTTP/1.1\r\n"); time.sleep(1.5)
s = c(); s.sendall(b"GET /hold HTTP/1.1\r\n\r\n"); time.sleep(0.3); s.close()
]], sock })
check(r.exit_status == 0, "http: raw client")
wait(function() return closed end)
check(held:send(200) == false, "http: send after the client left")
local got
local w = assert(core.signal(10, function(n) got = n end))
core.kill(core.getpid(), 10)
wait(function() return got == 10 end)
w:close()
srv:close()
core.run("nowait")
assert(core.rmtree(dir))
-- a run directory renamed away with a link in its place: removed through the lock's fd
do
  local top = assert(core.mkdtemp("/tmp/corral-vg-XXXXXX"))
  local lock = assert(core.lock(top))
  assert(core.mkdir(top .. "/work"))
  local f = assert(core.create_file(top .. "/out"))
  check(f:append({ "f\0a\0" .. "1\0" .. "644\0" .. "1\0" .. "A", "end\0" .. "1\0" .. "\0" }), "create_file: append")
  local list, complete = core.records_read(f, 4096)
  check(complete and #list == 1 and list[1].content == "A", "records_read of a file")
  f:close()
  assert(os.rename(top, top .. ".moved"))
  assert(core.symlink("/nonexistent", top))
  check(core.rmtree(top, lock) and not core.lstat(top) and not core.lstat(top .. ".moved"), "rmtree: held")
  lock:close()
end
-- stream mode: writes round-trip, an on_output error is re-raised, queued writes are dropped by
-- a kill, and a run left streaming is closed by the loop's teardown
do
  local out, fin = "", nil
  local p = assert(core.spawn { file = "/bin/sh", args = { "-c", "while read -r l; do echo \"$l\"; done" },
    stream = true, stdin = "a\n", timeout = 20, on_exit = function(x) fin = x end,
    on_output = function(_, b) out = out .. b; if b:find("boom") then error("boom") end end })
  wait(function() return out == "a\n" end)
  check(p:write("b\n") and p:write("boom\n"), "stream: write")
  local ok = true
  while ok and not fin do ok = pcall(core.run, "once") end
  check(not ok, "stream: on_output error")
  check(p:close_stdin(), "stream: close_stdin")
  wait(function() return fin end)
  check(out == "a\nb\nboom\n" and fin.stdout_bytes == #out, "stream: output")
  fin = nil
  p = assert(core.spawn { file = "/bin/sh", args = { "-c", "exec sleep 20" }, stream = true,
    timeout = 20, grace = 0.1, on_exit = function(x) fin = x end })
  check(p:write(string.rep("x", 4000000)) and p:write("y"), "stream: queue")
  p:kill()
  wait(function() return fin end)
  assert(core.spawn { file = "/bin/cat", args = {}, stream = true, stdin = "z", timeout = 20,
    on_output = function() end })
end
-- a server left open: the loop's teardown (at lua_close) closes it without Lua
assert(core.http_listen { listen = "127.0.0.1:0", on_request = function() end })
core.timer(100, function() end)
collectgarbage()
