--- The one list of a run's options, and of `corral serve`'s settings; every face derives from it.
--
-- The library's validator (corral.options), the default policies' defaults and the policy's
-- numeric checks (corral.policy), the command line's flags, `--help` and error messages
-- (corral.cli), the JSON fields of `corral serve` and its error messages (corral.serve), the
-- eval_in_sandbox face (corral.eval) and README's option table (`corral options`) all read
-- these tables. A new run option is one entry here plus its mechanism in a policy.
--
-- An entry of `M.run`:
--   name      the library's name (run_python's): the key of an options table
--   kind      "number", "integer", "boolean", "string", "policy" (a name, a path or a policy
--             table), "env" (a table of NAME = value strings), "files", "args" or "collect"
--             (lists: corral.workspace checks them)
--   min, max  for numbers: the accepted range; it rejects the absurd (a negative timeout, a
--             10 TB memory limit), not the merely large: a policy narrows it with its maxima
--   unit      of a number, as the option table shows it
--   default   the default policy's value (nil: none; `default_doc` says what happens instead);
--             `policy`'s is the policy a run without one gets
--   flag      `corral run`'s flag (nil: none), with `metavar` for its value; `file`: the flag
--             names a file whose bytes are the value; `cli_doc`: the flag's line when it
--             differs from `doc`
--   repeated  the flag may be given more than once: its values make a list
--   json      true: a field of `POST /v1/run` with the same name
--   eval      eval_in_sandbox's option for it: `{name, default, scale (its value times scale
--             is the run's), json (a field of POST /v1/eval)}`
--   doc       one line of documentation
local M = {}

M.run = {
  { name = "policy", kind = "policy", default = "default", flag = "--policy", metavar = "P", json = true,
    eval = { name = "policy", default = "bwrap" },
    doc = "policy name or path to a .lua policy file (or, from Lua, a policy table)",
    cli_doc = "policy name or path to a .lua policy file" },
  { name = "timeout", kind = "number", min = 0.001, max = 86400, unit = "s", default = 5,
    flag = "--timeout", metavar = "S", json = true,
    eval = { name = "timeout_max_time_sec", default = 10, json = true },
    doc = "wall-clock seconds" },
  { name = "cpu_seconds", kind = "integer", min = 1, max = 86400, unit = "s", default = 3,
    flag = "--cpu", metavar = "S", json = true,
    eval = { name = "cpu_max_time_sec", default = 1, json = true },
    doc = "CPU seconds" },
  { name = "memory_mb", kind = "integer", min = 16, max = 1048576, unit = "MiB", default = 256,
    flag = "--memory", metavar = "MB", json = true,
    eval = { name = "mem_max_mb", default = 100, json = true },
    doc = "address-space limit in MiB" },
  { name = "file_mb", kind = "integer", min = 0, max = 1048576, unit = "MiB", default = 1,
    flag = "--file-size", metavar = "MB", json = true,
    doc = "largest file the program may write, MiB" },
  { name = "processes", kind = "integer", min = 1, max = 1000000, default = 32,
    flag = "--processes", metavar = "N", json = true,
    doc = "process limit: tasks the program may hold, itself included", cli_doc = "process limit" },
  { name = "open_files", kind = "integer", min = 4, max = 1048576, default = 64,
    flag = "--open-files", metavar = "N", json = true,
    doc = "open-file limit" },
  { name = "max_output", kind = "integer", min = 0, max = 1073741824, unit = "bytes", default = 20000,
    flag = "--max-output", metavar = "BYTES", json = true,
    eval = { name = "io_max_kb", default = 128, scale = 1024, json = true },
    doc = "bytes kept per stream" },
  { name = "require_network_isolation", kind = "boolean", default = false,
    flag = "--require-network-isolation", json = true,
    doc = "fail instead of running with the host network",
    cli_doc = "fail (exit 125) instead of running with the host network" },
  { name = "stdin", kind = "string", default_doc = "empty", flag = "--stdin", metavar = "FILE", file = true,
    json = true, eval = { name = "stdin", json = true },
    doc = "bytes fed to the program's stdin",
    cli_doc = "feed FILE to the program's stdin" },
  { name = "python", kind = "string", default_doc = "python3 from the sandbox's PATH",
    flag = "--python", metavar = "PATH", eval = { name = "python" },
    doc = "interpreter: a path, or a name looked up in the sandbox's PATH" },
  { name = "env", kind = "env",
    doc = "extra environment variables, NAME = value" },
  { name = "files", kind = "files", default_doc = "none", flag = "--file", metavar = "LOCAL[=PATH]", json = true,
    repeated = true,
    doc = "files made in the work dir before the program starts: a list of {path (relative), content "
      .. "(bytes; base64 over JSON), mode (default 0644)}; args[1] may name one to run instead of code",
    cli_doc = "copy the local file LOCAL into the work dir, as PATH (default: its base name); repeatable" },
  { name = "args", kind = "args", default_doc = "none", json = true,
    doc = "the program's sys.argv[1:] (with code) or its sys.argv (without: args[1] names the file of "
      .. "`files` that runs)" },
  { name = "collect", kind = "collect", default_doc = "none", flag = "--collect", metavar = "GLOB", json = true,
    repeated = true,
    doc = "files handed back in `files` after the run, however it ended: globs relative to the work dir "
      .. "(`*.png`, `out/**`), or true for every file the run made or changed",
    cli_doc = "hand back the work dir's files matching GLOB (relative; ** for any depth), written under "
      .. "--out-dir; repeatable" },
}

--- `corral serve`'s settings that have a flag (serve.start takes more from Lua). `file`: the
-- flag names a file holding the value.
M.serve = {
  { name = "listen", kind = "string", flag = "--listen", metavar = "ADDR",
    doc = "unix:/path.sock or HOST:PORT, HOST an address (127.0.0.1, [::1]) or a name (localhost) "
      .. "whose first address is bound (default: unix:/run/corral.sock as root, else "
      .. "unix:$XDG_RUNTIME_DIR/corral.sock or unix:/tmp/corral-$UID.sock); a unix socket is made "
      .. "with mode 0660" },
  { name = "policy", kind = "string", flag = "--policy", metavar = "P",
    doc = "policy of every run (name or path; default: default); requests may not choose another" },
  { name = "concurrency", kind = "integer", min = 1, flag = "--concurrency", metavar = "N",
    doc = "runs at once (default: the number of CPUs)" },
  { name = "queue", kind = "integer", min = 0, default = 64, flag = "--queue", metavar = "N",
    doc = "requests waiting for a slot before 503 \"overloaded\"" },
  { name = "token", kind = "string", flag = "--token-file", metavar = "F", file = true,
    doc = "require 'Authorization: Bearer <token>' with the token in F (default: the CORRAL_TOKEN "
      .. "environment variable); required for a TCP listener" },
  { name = "max_body_bytes", kind = "integer", min = 1, default = 1048576, flag = "--max-body", metavar = "BYTES",
    doc = "largest request body, else 413" },
  { name = "drain_seconds", kind = "number", min = 0, default = 30, flag = "--drain-seconds", metavar = "S",
    doc = "on SIGTERM, how long runs may finish before they are killed" },
  { name = "json_log", kind = "boolean", flag = "--json-log", doc = "log JSON lines instead of text" },
  { name = "max_sessions", kind = "integer", min = 0, default = 64, flag = "--max-sessions", metavar = "N",
    doc = "sessions open at once; beyond them POST /v1/sessions gets 429 \"too_many_sessions\" with Retry-After" },
  { name = "instance", kind = "string", flag = "--instance", metavar = "NAME",
    doc = "this controller's name, the prefix of its session ids (NAME-HEX), by which a gateway routes a "
      .. "session's requests to it: letters, digits, _ and -, at most 64" },
}

local function index(list)
  local t = {}
  for _, e in ipairs(list) do t[e.name] = e end
  return t
end

--- `M.run` and `M.serve` by name.
M.run_by_name = index(M.run)
M.serve_by_name = index(M.serve)

--- The entry of `run` for an eval_in_sandbox name.
M.eval_by_name = {}
for _, e in ipairs(M.run) do
  if e.eval then M.eval_by_name[e.eval.name] = e end
end

-- The validator's view of an entry: kind and range.
local function check_spec(e, scale)
  if e.min == nil then return { kind = e.kind } end
  if not scale then return { kind = e.kind, min = e.min, max = e.max } end
  return { kind = e.kind, min = e.min // scale, max = e.max // scale }
end

--- The options run_python accepts: name → {kind, min, max} (corral.options checks them).
function M.run_checks()
  local t = {}
  for _, e in ipairs(M.run) do t[e.name] = check_spec(e) end
  return t
end

--- The options eval_in_sandbox accepts, by its names: name → {kind, min, max}.
function M.eval_checks()
  local t = {}
  for _, e in ipairs(M.run) do
    if e.eval then t[e.eval.name] = check_spec(e, e.eval.scale) end
  end
  return t
end

--- The names of the numeric run options (each has a maximum a policy may set).
function M.numeric()
  local list = {}
  for _, e in ipairs(M.run) do
    if e.kind == "number" or e.kind == "integer" then list[#list + 1] = e.name end
  end
  return list
end

--- The default policy's defaults: every option that has a default value (but the policy's own).
function M.defaults()
  local t = {}
  for _, e in ipairs(M.run) do
    if e.default ~= nil and e.kind ~= "policy" then t[e.name] = e.default end
  end
  return t
end

--- eval_in_sandbox's defaults as run options (the `bwrap` policy's defaults).
function M.eval_defaults()
  local t = {}
  for _, e in ipairs(M.run) do
    if e.eval and e.eval.default ~= nil and e.kind ~= "policy" then
      t[e.name] = e.eval.default * (e.eval.scale or 1)
    end
  end
  return t
end

--- eval_in_sandbox's options (checked) as the run options they become, its defaults filled in.
function M.eval_to_run(opts)
  local ro = {}
  for _, e in ipairs(M.run) do
    if e.eval then
      local v = opts[e.eval.name]
      if v == nil then v = e.eval.default end
      if v ~= nil and e.eval.scale then v = v * e.eval.scale end
      ro[e.name] = v
    end
  end
  return ro
end

local JSON_TYPE = { number = "number", integer = "integer", boolean = "boolean", string = "string",
                    policy = "string", files = "array", args = "array", collect = "array or boolean" }

--- The JSON fields of a route's body and their JSON types ("integer": a whole number), `code`
-- included: "run" (POST /v1/run, the library's names) or "eval" (POST /v1/eval, eval_in_sandbox's).
-- `python` and `env` are no fields: the interpreter and the environment are the operator's choice
-- (the policy's), not a caller's; nor is /v1/eval's policy, the server's `eval_policy`.
function M.json_fields(route)
  local t = { code = "string" }
  for _, e in ipairs(M.run) do
    if route == "run" and e.json then
      t[e.name] = JSON_TYPE[e.kind]
    elseif route == "eval" and e.eval and e.eval.json then
      t[e.eval.name] = JSON_TYPE[e.kind]
    end
  end
  return t
end

--- A library error that names an option ("fn: option 'memory_mb' must be ...") restated in a
-- face's words, and the name it has there.
-- @param message the error
-- @param face "flag" (the command line's, of `list`), "field" (a /v1/run field) or "eval" (a
-- /v1/eval field: eval_in_sandbox's name, the run option's after it when they differ)
-- @param list the entries whose flags apply (face "flag"; default `M.run`)
-- @return the message without the function's name, and the flag or field it is about (nil: none)
function M.restate(message, face, list)
  local msg = tostring(message):gsub("^[%w_]+: ", "")
  local key = msg:match("option '([%w_]+)'")
  if face == "flag" then
    local by = list and index(list) or M.run_by_name
    if key then
      local e = by[key]
      if e and e.flag then return (msg:gsub("option '" .. key .. "'", e.flag, 1)), e.flag end
      return msg, nil
    end
    -- policy.load's errors name the policy ("policy 'x' not found ..."): "--policy 'x' not found"
    if msg:match("^policy ") and by.policy and by.policy.flag then
      return by.policy.flag .. msg:sub(7), by.policy.flag
    end
    return msg, nil
  end
  if not key then return msg, nil end
  local field = key
  if face == "eval" then
    local e = M.run_by_name[key]
    field = e and e.eval and e.eval.name or key
  end
  return (msg:gsub("option '" .. key .. "'", "field '" .. field .. "'"
    .. (field ~= key and (" (" .. key .. ")") or ""), 1)), field
end

-- `text` wrapped to `width` columns, continuation lines indented by `indent` spaces.
local function wrap(text, width, indent)
  local lines, line = {}, ""
  for word in text:gmatch("%S+") do
    if line ~= "" and indent + #line + 1 + #word > width then
      lines[#lines + 1] = line
      line = word
    else
      line = line == "" and word or (line .. " " .. word)
    end
  end
  lines[#lines + 1] = line
  return table.concat(lines, "\n" .. (" "):rep(indent))
end

-- An entry's default in words ("" when none is said).
local function default_words(e)
  if e.default ~= nil and e.kind ~= "boolean" then
    local numeric = e.kind == "number" or e.kind == "integer"
    return (numeric and "default " or "default: ") .. tostring(e.default)
  end
  if e.default_doc then return "default: " .. e.default_doc end
  return ""
end

--- The options part of a command's `--help`: one line per flag of `list`, then `extra`
-- ({flag text, doc} pairs: the command's own flags such as --json).
function M.help(list, extra)
  local rows = {}
  for _, e in ipairs(list) do
    if e.flag then
      local doc = e.cli_doc or e.doc
      local d = default_words(e)
      -- a doc that already says its default ("(default: ...)") is left as it is
      if d ~= "" and not doc:find("default", 1, true) then doc = doc .. " (" .. d .. ")" end
      rows[#rows + 1] = { e.flag .. (e.metavar and (" " .. e.metavar) or ""), doc }
    end
  end
  for _, r in ipairs(extra or {}) do rows[#rows + 1] = r end
  local w = 0
  for _, r in ipairs(rows) do w = math.max(w, #r[1]) end
  local out = {}
  for _, r in ipairs(rows) do
    out[#out + 1] = "  " .. r[1] .. (" "):rep(w - #r[1] + 2) .. wrap(r[2], 98, w + 4)
  end
  return table.concat(out, "\n") .. "\n"
end

local function code(s) return "`" .. s .. "`" end

--- README's option table (Markdown): one row per run option.
function M.markdown()
  local out = {
    "| option | CLI flag | `/v1/run` field | `eval_in_sandbox` (`/v1/eval`) | type | default | meaning |",
    "|---|---|---|---|---|---|---|",
  }
  for _, e in ipairs(M.run) do
    local range = e.kind
    if e.min then
      range = range .. ", " .. tostring(e.min) .. "–" .. tostring(e.max) .. (e.unit and (" " .. e.unit) or "")
    end
    local default = e.default ~= nil and code(tostring(e.default)) or (e.default_doc or "")
    local ev = ""
    if e.eval then
      ev = code(e.eval.name)
      if e.eval.scale then ev = ev .. " (× " .. e.eval.scale .. ")" end
      if e.eval.default ~= nil then ev = ev .. ", default " .. code(tostring(e.eval.default)) end
      if not e.eval.json then ev = ev .. ", Lua only" end
    end
    out[#out + 1] = "| " .. table.concat({ code(e.name),
      e.flag and code(e.flag .. (e.metavar and (" " .. e.metavar) or "")) or "",
      e.json and code(e.name) or "", ev, range, default, e.doc }, " | ") .. " |"
  end
  return table.concat(out, "\n") .. "\n"
end

return M
