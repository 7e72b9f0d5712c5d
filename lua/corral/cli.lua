--- The `corral` command line: run, repl, probe, policies, serve.
-- Exit codes of `corral run`: the program's own code; 124 when it timed out; 128+N when a signal
-- ended it; 125 when the sandbox itself failed; 2 for a usage error.
local schema = require "corral.schema"

local M = {}

local EXIT_USAGE, EXIT_SANDBOX, EXIT_TIMEOUT = 2, 125, 124

local USAGE = {
  main = [[
usage: corral COMMAND [OPTIONS]

Run untrusted Python under hard limits and report exactly what happened.

commands:
  run        run a Python file (or - for stdin) in the sandbox
  repl       an interactive Python session in the sandbox
  probe      show what this host supports and what a policy will apply
  policies   list the policies corral can load
  options    list the options of a run (flag, JSON field, range, default)
  serve      run the HTTP controller (HTTP/1.1 + JSON on a unix socket or loopback TCP)
  help       show this text; `corral help COMMAND` (or `corral COMMAND --help`) shows a
             command's options

`corral --version` prints the version.
]],
  -- run and serve: their options come from corral.schema (below)
  probe = [[
usage: corral probe [--policy P] [--json]

Shows what this host supports (namespaces, uid switching, rlimits, bubblewrap) and what the
policy will apply here.
]],
  policies = [[
usage: corral policies [--json]

Lists the policies found on the policy path (CORRAL_POLICY_PATH, then the shipped ones).
]],
}

local function say(stream, s) stream:write(s) end

-- Each command's flags: corral.schema's entries, and the command's own.
local JSON_FLAG = { name = "json", kind = "boolean", flag = "--json",
                    doc = "print one JSON object with the result instead of the output" }
local HELP_ROW = { { "-h, --help", "show this text" } }

local OUT_DIR_FLAG = { name = "out_dir", kind = "string", flag = "--out-dir", metavar = "DIR",
                       doc = "write the files --collect hands back under DIR (made if missing); "
                         .. "a file there already is not overwritten" }
local RUN_FLAGS = { table.unpack(schema.run) }
RUN_FLAGS[#RUN_FLAGS + 1] = OUT_DIR_FLAG
RUN_FLAGS[#RUN_FLAGS + 1] = JSON_FLAG
-- `corral repl`: the run's flags that make sense for a session (no program file, stdin or
-- arguments, nothing collected), --timeout per cell, and the session's own settings.
local function entry(name, over)
  local e = {}
  for k, v in pairs(schema.run_by_name[name] or {}) do e[k] = v end
  for k, v in pairs(over or {}) do e[k] = v end
  return e
end
local REPL_FLAGS = {
  entry("policy"),
  entry("timeout", { default = 30, doc = "wall-clock seconds each statement may run before it is interrupted" }),
  entry("cpu_seconds", { default = 600, doc = "CPU seconds of the whole session" }),
  entry("memory_mb"), entry("file_mb"), entry("processes"), entry("open_files"),
  entry("max_output", { doc = "bytes kept per stream of each statement" }),
  entry("require_network_isolation"), entry("python"), entry("files"),
  { name = "lifetime", kind = "number", flag = "--lifetime", metavar = "S", default = 3600,
    doc = "wall-clock seconds the session may live" },
  { name = "idle_timeout", kind = "number", flag = "--idle-timeout", metavar = "S",
    default_doc = "the lifetime", doc = "the session ends after this long without a statement" },
}
local SERVE_FLAGS = schema.serve
local PROBE_FLAGS = { schema.run_by_name.policy, JSON_FLAG }
local POLICIES_FLAGS = { JSON_FLAG }

USAGE.run = [[
usage: corral run [OPTIONS] FILE|- [-- ARGS...]

Runs FILE (or the code read from standard input, for -) with the policy's limits, prints the
program's stdout and stderr and exits with its exit code. ARGS are the program's sys.argv[1:].

options:
]] .. schema.help(RUN_FLAGS, HELP_ROW) .. [[

exit status: the program's; 124 timed out; 128+N killed by signal N; 125 the sandbox failed;
2 usage error.
]]

USAGE.repl = [[
usage: corral repl [OPTIONS]

An interactive Python session in the sandbox, with the policy's confinement for its whole life:
a prompt (>>> , and ... while a statement goes on), each statement's output printed when it
ends, values as Python's REPL shows them. Lines are read as the terminal gives them (its own
line editing; no history). Ctrl-C interrupts the running statement (the session keeps its
state) or clears the line at the prompt; Ctrl-D ends the session.

options:
]] .. schema.help(REPL_FLAGS, HELP_ROW) .. [[

exit status: 0 at Ctrl-D (end of input); exit(N) or sys.exit(N): N; 124 the lifetime ran out;
128+N killed by signal N (the CLI's); 125 the sandbox failed or the session ended by a limit;
2 usage error.
]]

USAGE.serve = [[
usage: corral serve [OPTIONS]

Runs the HTTP controller: POST /v1/run, POST /v1/eval, GET /healthz, GET /v1/probe, GET /metrics
(HTTP/1.1 + JSON). Logs one line per request to stderr. SIGTERM or SIGINT drains: no new
connections, the runs in progress and queued finish (a second signal kills them), exit 0.

options:
]] .. schema.help(SERVE_FLAGS, HELP_ROW) .. [[

exit status: 0 after a drain; 1 when it cannot listen; 2 usage or configuration error.
]]

USAGE.options = [[
usage: corral options [--json]

Lists the options of a run: the library's name, the flag of `corral run`, the field of
POST /v1/run, eval_in_sandbox's name (POST /v1/eval), the range, the default and the meaning.
]]

--- A library error (options.check, a policy's maxima, serve's config) in the words of the
-- command line: "option 'memory_mb' must be ..." becomes "--memory must be ...".
-- @param flags the command's flag entries
-- @return the message, and the flag it is about (nil when it names none)
local function flag_error(message, flags)
  return schema.restate(message, "flag", flags)
end

local function json_lib()
  local ok, cjson = pcall(require, "cjson")
  if not ok then return nil end
  return cjson
end

-- The JSON text of `obj`, written as `corral serve` writes it ("/" unescaped).
local function json_text(cjson, obj)
  return require("corral.result").unslash(cjson.encode(obj)) .. "\n"
end

--- The usage-error reporter of one command: with --json among `args` (and lua-cjson present),
-- `{"error": {"code": "usage", "flag": ..., "message": ...}}` on stdout, else two lines on
-- stderr; either way the exit status is 2.
-- @return function(message, flag) that reports and returns the exit status
local function usage_reporter(cmd, args)
  local json = false
  for i = 2, #args do
    if args[i] == "--" then break end
    if args[i] == "--json" then json = true end
  end
  local cjson = json and json_lib()
  return function(msg, flag)
    if cjson then
      say(io.stdout, json_text(cjson, { error = { code = "usage", flag = flag or cjson.null, message = msg } }))
    else
      say(io.stderr, "corral" .. (cmd and (" " .. cmd) or "") .. ": " .. msg .. "\n")
      say(io.stderr, "try 'corral " .. (cmd and (cmd .. " ") or "") .. "--help'\n")
    end
    return EXIT_USAGE
  end
end

--- Parse `args` (from index `i`) against the flag entries `flags`: a boolean's flag takes no
-- value, a number's must be one (the range is the library's to check), a `file` flag's value is
-- the path (the command reads it).
-- @return options table (by entry name; a `repeated` flag's values in a list), positional
-- arguments, those after `--`; or nil, error message, the flag
local function parse(args, i, flags)
  local by_flag = {}
  for _, e in ipairs(flags) do if e.flag then by_flag[e.flag] = e end end
  local opts, pos, rest = {}, {}, {}
  while i <= #args do
    local a = args[i]
    local name, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
    name = name or a
    if a == "--" then
      for j = i + 1, #args do rest[#rest + 1] = args[j] end
      break
    elseif a == "-h" or a == "--help" then
      opts.help = true
    elseif name:sub(1, 2) == "--" then
      local e = by_flag[name]
      if not e then return nil, "unknown option " .. name, name end
      local kind = e.kind
      if kind == "boolean" then
        if inline then return nil, name .. " takes no value", name end
        opts[e.name] = true
      else
        local v = inline
        if not v then
          i = i + 1
          v = args[i]
          if v == nil then return nil, name .. " needs a value", name end
        end
        if kind == "number" or kind == "integer" then
          local n = tonumber(v)
          if not n or n ~= n then return nil, name .. " needs a number, got '" .. v .. "'", name end
          if kind == "integer" and math.floor(n) ~= n then
            return nil, name .. " needs a whole number, got '" .. v .. "'", name
          end
          v = kind == "integer" and math.floor(n) or n
        end
        if e.repeated then
          local list = opts[e.name] or {}
          list[#list + 1] = v
          v = list
        end
        opts[e.name] = v
      end
    else
      pos[#pos + 1] = a
    end
    i = i + 1
  end
  return opts, pos, rest
end

-- The start of command `cmd`: its flags parsed from `args` and --help answered.
-- @param positional whether it takes positional arguments (else one is a usage error)
-- @return the options, the positional arguments, the usage-error reporter and the arguments
-- after `--`; or nil and the exit status when that was all
local function begin(cmd, args, flags, positional)
  local usage_error = usage_reporter(cmd, args)
  local opts, pos, rest = parse(args, 2, flags)
  if not opts then return nil, usage_error(pos, rest) end
  if opts.help then say(io.stdout, USAGE[cmd]) return nil, 0 end
  if not positional and (#pos > 0 or #rest > 0) then
    return nil, usage_error("unexpected argument " .. (pos[1] or rest[1]))
  end
  return opts, pos, usage_error, rest
end

-- lua-cjson for command `cmd`'s --json, or nil once it has said that it is missing.
local function json_for(cmd)
  local cjson = json_lib()
  if not cjson then say(io.stderr, "corral " .. cmd .. ": --json needs lua-cjson (apt-get install lua-cjson)\n") end
  return cjson
end

-- `obj` as command `cmd`'s --json output. @return the exit status
local function print_json(cmd, obj)
  local cjson = json_for(cmd)
  if not cjson then return EXIT_SANDBOX end
  say(io.stdout, json_text(cjson, obj))
  return 0
end

-- The whole file (or standard input, for "-").
-- @return its bytes; or nil and the reason alone ("No such file or directory", "Is a directory"):
-- the caller's message names the file
local function read_file(path)
  local f, err
  if path == "-" then
    f = io.stdin
  else
    f, err = io.open(path, "rb")
    -- io.open's message is "PATH: reason"
    if not f then return nil, err:sub(1, #path + 2) == path .. ": " and err:sub(#path + 3) or err end
  end
  local data, rerr = f:read("a")
  if f ~= io.stdin then f:close() end
  if not data then return nil, rerr or "read error" end
  return data
end

local SIGHUP, SIGINT, SIGTERM = 1, 2, 15

-- The run, waited for on the loop; then what it kept (its warm interpreter) let go and gone.
-- SIGTERM, SIGINT or SIGHUP (its terminal closed) kills the run and ends the wait once it has
-- been cleaned up: a CLI stopped mid-run leaves no run directory, process or interpreter behind.
-- @return result, message, code, and the signal that stopped the CLI (nil if none)
local function run_to_end(corral, code, opts)
  local core = require "corral.core"
  local done, proc, signum, res, rerr, rcode = false, nil, nil, nil, nil, nil
  local function on_signal(n)
    if done then return end   -- the run is over: its result stands
    signum = signum or n
    if proc then proc:kill() end
  end
  local watchers = { core.signal(SIGTERM, on_signal), core.signal(SIGINT, on_signal),
                     core.signal(SIGHUP, on_signal) }
  local function unwatch() for _, w in ipairs(watchers) do w:close() end end
  local ok, p, err, ecode = pcall(corral.start, code, opts, function(r, e, c)
    res, rerr, rcode, done = r, e, c, true
  end)
  if not ok then unwatch() error(p, 0) end
  if not p then
    res, rerr, rcode, done = nil, err, ecode, true
  else
    proc = p
    if signum then proc:kill() end
  end
  while not done do core.run("once") end
  -- the warm interpreter exits once idle: wait for it, so that none outlives the command
  local closed, cerr = corral.close(5)
  if not closed then say(io.stderr, "corral run: " .. tostring(cerr) .. "\n") end
  unwatch()
  return res, rerr, rcode, signum
end

-- --file LOCAL[=PATH]: the local files as `files` entries (an executable one keeps its x bits).
-- @return the list, or nil and a message
local function local_files(specs)
  local core = require "corral.core"
  local list = {}
  for _, spec in ipairs(specs) do
    local lpath, path = spec:match("^(.-)=(.*)$")
    lpath = lpath or spec
    path = path or lpath:match("([^/]*)/*$")
    if lpath == "" then return nil, "--file '" .. spec .. "': no local file before '='" end
    local data, err = read_file(lpath)
    if not data then return nil, "cannot read --file " .. lpath .. ": " .. err end
    local st = core.lstat(lpath)
    local exec = st and st.type ~= "link" and (st.mode & 64) ~= 0
    list[#list + 1] = { path = path, content = data, mode = exec and 493 or 420 }   -- 0755 / 0644
  end
  return list
end

-- Make the directory `path` where missing; one there already must be a plain directory (a
-- link is not followed). @return true, or nil and a message
local function plain_dir(path)
  local core = require "corral.core"
  local st = core.lstat(path)
  if not st then return core.mkdir(path, 493) end   -- 0755
  if st.type ~= "directory" then return nil, path .. " is a " .. st.type .. ", not a directory" end
  return true
end

-- The collected files under `dir`, never outside it: each path checked again, every directory on
-- the way made here or a plain one, no file there already replaced; links are not made.
-- @return the count written and what was not, with why; or nil and a message
local function write_collected(dir, files)
  local core = require "corral.core"
  local ws = require "corral.workspace"
  local at = dir:sub(1, 1) == "/" and "" or "."
  for seg in dir:gmatch("[^/]+") do
    at = at .. "/" .. seg
    local ok, err = plain_dir(at)
    if not ok then return nil, err end
  end
  local skipped, written = {}, 0
  for _, f in ipairs(files) do
    local why = ws.path_problem(f.path)
    if not why and f.type ~= "file" then
      why = f.type == "link" and ("a link to " .. f.target) or ("unreadable: " .. tostring(f.error))
    end
    local path = dir
    for seg in (f.path:match("^(.*)/") or ""):gmatch("[^/]+") do
      if why then break end
      path = path .. "/" .. seg
      local ok, err = plain_dir(path)
      if not ok then why = err end
    end
    if not why then
      local ok, err = core.write_file(dir .. "/" .. f.path, f.content, (f.mode or 420) & 511)
      if ok then written = written + 1 else why = err end
    end
    if why then skipped[#skipped + 1] = f.path .. ": " .. why end
  end
  return written, skipped
end

local function cmd_run(args)
  local opts, pos, usage_error, rest = begin("run", args, RUN_FLAGS, true)
  if not opts then return pos end   -- (then `pos` is the exit status)
  -- FILE -- ARGS, or -- FILE ARGS
  if #pos == 0 and #rest > 0 then pos[1] = table.remove(rest, 1) end
  if #pos ~= 1 then return usage_error(#pos == 0 and "missing FILE (or - for stdin)" or "only one FILE may be given (the program's arguments go after --)") end
  if #rest > 0 then opts.args = rest end
  local out_dir = opts.out_dir
  opts.out_dir = nil
  if opts.collect and not out_dir and not opts.json then
    return usage_error("--collect needs --out-dir DIR (or --json, whose result holds the files)", "--collect")
  end
  if out_dir and not opts.collect then return usage_error("--out-dir goes with --collect GLOB", "--out-dir") end
  if opts.files then
    local list, ferr = local_files(opts.files)
    if not list then return usage_error(ferr, "--file") end
    opts.files = list
  end
  local cjson
  if opts.json then
    cjson = json_for("run")
    if not cjson then return EXIT_SANDBOX end
  end
  local code, err = read_file(pos[1])
  if not code then return usage_error("cannot read " .. (pos[1] == "-" and "standard input" or pos[1]) .. ": " .. err) end
  local json = opts.json
  opts.json = nil
  if opts.stdin then
    if pos[1] == "-" and opts.stdin == "-" then return usage_error("FILE and --stdin cannot both be -", "--stdin") end
    local data, e = read_file(opts.stdin)
    if not data then return usage_error("cannot read --stdin " .. opts.stdin .. ": " .. e, "--stdin") end
    opts.stdin = data
  end
  local corral = require "corral"
  -- one run per process: a holder of a shared network namespace, or a launch started ahead,
  -- would be started for it and thrown away. A warm policy still runs in its warm interpreter:
  -- slower for one run than cold, but the sandbox and the program's view are the server's.
  corral.configure { share_network = false, prestart_launches = false }
  -- a bad option value: the message names its flag
  local pok, plan, perr, pcode = pcall(corral.prepare, opts)
  if not pok then return usage_error(flag_error(plan, RUN_FLAGS)) end
  local ok, res, rerr, rcode, signum
  if plan then
    ok, res, rerr, rcode, signum = pcall(run_to_end, corral, code, plan)
    if not ok then return usage_error(flag_error(res, RUN_FLAGS)) end
  else
    res, rerr, rcode = nil, perr, pcode
  end
  if signum then return 128 + signum end
  if json then
    local result = require "corral.result"
    local obj = result.object(res, rerr, rcode, cjson.null)
    -- the same error object as the server's: a machine-readable code beside the errno kind
    if obj.error then obj.error.code = "sandbox_failed" end
    say(io.stdout, result.encode(obj, cjson) .. "\n")
  end
  if res and out_dir and res.files then
    local n, skipped = write_collected(out_dir, res.files)
    if not n then
      say(io.stderr, "corral run: --out-dir " .. out_dir .. ": " .. tostring(skipped) .. "\n")
    else
      for _, why in ipairs(skipped) do say(io.stderr, "corral: not written: " .. why .. "\n") end
    end
    if res.files_truncated then
      say(io.stderr, "corral: collected files cut short: " .. table.concat(res.files_truncated, ", ") .. "\n")
    end
  end
  if res and not json then
    io.stdout:write(res.stdout)
    io.stdout:flush()
    io.stderr:write(res.stderr)
    if res.truncated then say(io.stderr, "\ncorral: output truncated at " .. plan.o.max_output .. " bytes per stream\n") end
    if res.timed_out then say(io.stderr, "corral: timed out\n")
    elseif res.reason ~= "exit" then say(io.stderr, "corral: ended by " .. res.reason .. (res.signal and (" (signal " .. res.signal .. ")") or "") .. "\n") end
  end
  if not res then
    if not json then say(io.stderr, "corral run: " .. tostring(rerr) .. "\n") end
    return EXIT_SANDBOX
  end
  if res.timed_out then return EXIT_TIMEOUT end
  if res.signal then return 128 + res.signal end
  return res.returncode & 255
end

-- The REPL's input: lines from the terminal (or a pipe) read on the loop, so that a signal at
-- the prompt is seen at once; a regular file is read with blocking reads.
-- @return next_line(): a line (with its "\n" when it had one), false after an interrupt at the
-- prompt, or nil at the end of the input; and close()
local function repl_input(core, state)
  local lines, partial, ended = {}, "", false
  local reader = core.reader(0, function(data)
    if data == nil then
      ended = true
      if partial ~= "" then lines[#lines + 1] = partial partial = "" end
      return
    end
    partial = partial .. data
    for line in partial:gmatch("[^\n]*\n") do lines[#lines + 1] = line end
    partial = partial:match("[^\n]*$")
  end)
  if not reader then
    return function() return io.stdin:read("L") end, function() end, function() end
  end
  local function next_line()
    while not lines[1] and not ended and not state.cleared and not state.signum do core.run("once") end
    if state.signum then return nil end
    if state.cleared then state.cleared = false return false end
    return table.remove(lines, 1)
  end
  -- Ctrl-C: the terminal drops what was typed ahead, and so does the REPL
  local function drop() lines, partial = {}, "" end
  return next_line, function() reader:close() end, drop
end

-- The session's end as an exit status, said on stderr when it is not the program's.
local function repl_end(sess)
  local why = sess.gone or "closed"
  say(io.stderr, "corral repl: the session is gone (" .. why .. ")\n")
  if why == "lifetime" then return EXIT_TIMEOUT end
  if why == "signal" and sess.result and sess.result.signal then return 128 + sess.result.signal end
  return EXIT_SANDBOX
end

-- The prompt loop: read a statement (more lines while codeop says it goes on), run it, print
-- what it wrote. @return the exit status
local function repl_loop(sess, state, next_line, drop, timeout)
  local source
  while true do
    io.stdout:write(source and "... " or ">>> ")
    io.stdout:flush()
    local line = next_line()
    if line == nil then
      io.stdout:write("\n")
      return state.signum and 128 + state.signum or 0
    end
    if line == false then
      -- Ctrl-C at the prompt: the statement so far is dropped
      io.stdout:write("\nKeyboardInterrupt\n")
      source = nil
    else
      line = line:gsub("\r?\n$", "")
      source = source and (source .. "\n" .. line) or line
      local c, err = sess:complete(source)
      if not c then say(io.stderr, "corral repl: " .. tostring(err) .. "\n") return repl_end(sess) end
      io.stdout:write(c.stdout) io.stderr:write(c.stderr)
      if state.signum then return 128 + state.signum end
      if state.cleared then
        -- Ctrl-C before the statement ran: it does not run
        state.cleared = false
        io.stdout:write("\nKeyboardInterrupt\n")
        source = nil
      elseif c.complete then
        local text = source
        source = nil
        if text:match("%S") then
          state.running = true
          local r, eerr = sess:exec(text, { interactive = true, timeout = timeout })
          state.running = false
          if not r then say(io.stderr, "corral repl: " .. tostring(eerr) .. "\n") return repl_end(sess) end
          if r.reason == "interrupted" then drop() end
          io.stdout:write(r.stdout)
          io.stdout:flush()
          io.stderr:write(r.stderr)
          if r.truncated then say(io.stderr, "corral: output truncated at " .. sess.max_output .. " bytes per stream\n") end
          if r.reason == "timeout" then say(io.stderr, "corral: interrupted at its timeout (" .. timeout .. " s)\n") end
          if r.reason == "exit" then return (r.returncode or 0) & 255 end
          if state.signum then return 128 + state.signum end
          if not sess:alive() then return repl_end(sess) end
        end
      end
    end
  end
end

local function cmd_repl(args)
  local opts, status, usage_error = begin("repl", args, REPL_FLAGS)
  if not opts then return status end
  if opts.files then
    local list, ferr = local_files(opts.files)
    if not list then return usage_error(ferr, "--file") end
    opts.files = list
  end
  local timeout = opts.timeout or 30
  opts.timeout = nil
  opts.lifetime = opts.lifetime or 3600
  -- a person thinks at the prompt: only the lifetime bounds that, unless told
  opts.idle_timeout = opts.idle_timeout or math.max(1, math.min(opts.lifetime, 7 * 86400))
  local corral = require "corral"
  local core = require "corral.core"
  local session = require "corral.session"
  if timeout < session.CELL.timeout.min or timeout > session.CELL.timeout.max then
    return usage_error("--timeout must be in " .. session.CELL.timeout.min .. ".." .. session.CELL.timeout.max
      .. ", got " .. tostring(timeout), "--timeout")
  end
  corral.configure { share_network = false, prestart_launches = false }
  local ok, sess, err = pcall(session.open, opts)
  if not ok then corral.close(5) return usage_error(flag_error(sess, REPL_FLAGS)) end
  if not sess then
    corral.close(5)
    say(io.stderr, "corral repl: " .. tostring(err) .. "\n")
    return EXIT_SANDBOX
  end
  local state = { running = false, cleared = false }
  local next_line, close_input, drop = repl_input(core, state)
  local function on_signal(n)
    if n == SIGINT then
      -- a running statement is interrupted; at the prompt the line is dropped
      if state.running then sess:interrupt() else state.cleared = true drop() end
      return
    end
    -- SIGTERM, SIGHUP (the terminal closed): the statement is interrupted, the session closed
    state.signum = state.signum or n
    if state.running then sess:interrupt() end
  end
  local watchers = { core.signal(SIGTERM, on_signal), core.signal(SIGINT, on_signal),
                     core.signal(SIGHUP, on_signal) }
  local lok, code = pcall(repl_loop, sess, state, next_line, drop, timeout)
  close_input()
  sess:close()
  local closed, cerr = corral.close(5)
  if not closed then say(io.stderr, "corral repl: " .. tostring(cerr) .. "\n") end
  for _, w in ipairs(watchers) do w:close() end
  if not lok then error(code, 0) end
  return code
end

local function yesno(b) return b and "yes" or "no" end

local function cmd_probe(args)
  local opts, status, usage_error = begin("probe", args, PROBE_FLAGS)
  if not opts then return status end
  local corral = require "corral"
  local ok, p, err = pcall(corral.probe, opts.policy)
  -- a warm policy's probe ran in its warm interpreter: gone before the command is
  corral.close(5)
  if not ok then return usage_error(flag_error(p, PROBE_FLAGS)) end
  if not p then say(io.stderr, "corral probe: " .. tostring(err) .. "\n") return EXIT_SANDBOX end
  if opts.json then return print_json("probe", p) end
  local lines = {
    "launcher            " .. p.launcher,
    "effective uid       " .. tostring(p.euid),
    "network isolation   " .. yesno(p.network_isolation),
    "pid namespace       " .. yesno(p.pid_namespace),
    "landlock            " .. ((p.landlock_abi or 0) > 0 and ("ABI " .. p.landlock_abi) or "no"),
    "seccomp             " .. yesno(p.caps.seccomp and p.caps.seccomp.ok),
    "per-run uid         " .. yesno(p.root and p.setuid),
    "bubblewrap          " .. (p.bwrap or "no"),
  }
  local names = {}
  for name in pairs(p.caps) do names[#names + 1] = name end
  table.sort(names)
  lines[#lines + 1] = "kernel:"
  for _, name in ipairs(names) do
    local c = p.caps[name]
    lines[#lines + 1] = string.format("  %-28s %s%s", name, yesno(c.ok),
      c.ok and "" or ("  (" .. (c.errno or "") .. (c.message and (": " .. c.message) or "") .. ")"))
  end
  local rl = {}
  for name, okr in pairs(p.rlimits) do rl[#rl + 1] = name .. (okr and "" or "(refused)") end
  table.sort(rl)
  lines[#lines + 1] = "rlimits             " .. table.concat(rl, " ")
  local pol = p.policy
  lines[#lines + 1] = "policy " .. pol.name .. ": network " .. tostring(pol.network) ..
    ", pid namespace " .. yesno(pol.pid_namespace) .. (pol.run_uid and (", run uids " .. pol.run_uid) or "")
  if pol.limits then
    lines[#lines + 1] = "  applies           " .. table.concat(pol.limits, " ")
  else
    lines[#lines + 1] = "  cannot run here:  " .. tostring(pol.error)
  end
  local refused = {}
  for name, r in pairs(pol.refused or {}) do
    refused[#refused + 1] = "  refused           " .. name .. ": " .. r.errno .. " " .. r.message
  end
  table.sort(refused)
  for _, l in ipairs(refused) do lines[#lines + 1] = l end
  say(io.stdout, table.concat(lines, "\n") .. "\n")
  return 0
end

local function cmd_policies(args)
  local opts, status = begin("policies", args, POLICIES_FLAGS)
  if not opts then return status end
  local list = require("corral").policies()
  if opts.json then return print_json("policies", list) end
  for _, p in ipairs(list) do
    say(io.stdout, string.format("%-12s %s\n             %s\n", p.name, p.description or "", p.path))
  end
  return 0
end

local function cmd_serve(args)
  local opts, status, usage_error = begin("serve", args, SERVE_FLAGS)
  if not opts then return status end
  if not json_lib() then say(io.stderr, "corral serve: needs lua-cjson (apt-get install lua-cjson)\n") return EXIT_USAGE end
  local token
  if opts.token then
    local file = opts.token
    local data, err = read_file(file)
    if not data then return usage_error("cannot read --token-file " .. file .. ": " .. err, "--token-file") end
    token = data:gsub("%s+$", "")
    if token == "" then return usage_error("--token-file " .. file .. " is empty", "--token-file") end
  else
    local env = os.getenv("CORRAL_TOKEN")
    if env and env ~= "" then token = env end
  end
  opts.token = token
  -- what every run will and will not get, logged before the server listens
  opts.probe = true
  local serve = require "corral.serve"
  local ok, srv, err, code = pcall(serve.start, opts)
  if not ok then return usage_error(flag_error(srv, SERVE_FLAGS)) end
  if not srv and code == "ENOTSUP" then
    say(io.stderr, "corral serve: refusing to start: " .. tostring(err) .. "\n")
    return 1
  end
  if not srv then
    -- the host's message names the socket path or the address it bound: given the address
    -- the user wrote only when that differs (a host name, resolved)
    local listen = tostring(opts.listen or serve.default_listen())
    local msg = tostring(err):gsub("^[%u_]+: ", "")
    if not msg:find((listen:gsub("^unix:", "")), 1, true) then msg = "--listen " .. listen .. ": " .. msg end
    say(io.stderr, "corral serve: " .. msg .. "\n")
    return 1
  end
  -- false only if the loop ran dry while the server still listened, which would be a bug
  return srv:run() and 0 or 1
end

-- The run options, as README's table (Markdown), or under --json corral.schema's entries.
local function cmd_options(args)
  local opts, status = begin("options", args, POLICIES_FLAGS)
  if not opts then return status end
  if opts.json then return print_json("options", schema.run) end
  say(io.stdout, schema.markdown())
  return 0
end

--- Entry point: `args` is the script's `arg` table; returns the exit status.
function M.main(args)
  -- the CLI is the controller: a program that shares its uid (no user namespace, no run uid)
  -- must not read its environment or ptrace it
  require("corral.core").set_dumpable(false)
  local cmd = args[1]
  if cmd == "help" and args[2] ~= nil then
    if USAGE[args[2]] and args[2] ~= "main" then say(io.stdout, USAGE[args[2]]) return 0 end
    return usage_reporter(nil, args)("unknown command '" .. args[2] .. "'")
  end
  if cmd == nil or cmd == "help" or cmd == "-h" or cmd == "--help" then
    say(cmd == nil and io.stderr or io.stdout, USAGE.main)
    return cmd == nil and EXIT_USAGE or 0
  end
  if cmd == "--version" then say(io.stdout, require("corral")._VERSION .. "\n") return 0 end
  if cmd == "run" then return cmd_run(args) end
  if cmd == "probe" then return cmd_probe(args) end
  if cmd == "policies" then return cmd_policies(args) end
  if cmd == "serve" then return cmd_serve(args) end
  if cmd == "repl" then return cmd_repl(args) end
  if cmd == "options" then return cmd_options(args) end
  return usage_reporter(nil, args)("unknown command '" .. cmd .. "'")
end

return M
