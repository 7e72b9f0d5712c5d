--- Invariants of the Lua parsers, for the fuzz harness fuzz/lua.c (and its replay in `make test`).
-- Each check returns nil when everything holds, or a message saying what does not; fuzz/lua.c
-- aborts on a message (and on an error raised here), so libFuzzer keeps the input.
local report = require "corral.report"
local options = require "corral.options"

local M = {}

local type, pairs, next, pcall, tostring, mtype = type, pairs, next, pcall, tostring, math.type

local function int_or_nil(v)
  return v == nil or mtype(v) == "integer"
end

local function is_str(v, pattern)
  return type(v) == "string" and not v:find("\n", 1, true) and (pattern == nil or v:match(pattern) ~= nil)
end

local REPORT_KEYS = { version = true, applied = true, applied_order = true, refused = true, fatal = true,
                      pid = true, status = true, usage = true, observed = true, exceeded = true,
                      total = true }
local OBSERVED_KEYS = { tasks = true, vm = true, file = true }

--- report.parse(text) never raises and returns a table of the documented shape.
-- @param text any Lua value (the harness passes the input's bytes)
-- @return nil, or what is wrong
function M.report(text)
  local ok, r = pcall(report.parse, text)
  if not ok then return "report.parse raised: " .. tostring(r) end
  if type(r) ~= "table" then return "report.parse returned a " .. type(r) end
  for k in pairs(r) do
    if not REPORT_KEYS[k] then return "unknown field " .. tostring(k) end
  end
  if not int_or_nil(r.version) then return "version is " .. tostring(r.version) end
  if not int_or_nil(r.pid) then return "pid is " .. tostring(r.pid) end
  if type(r.applied) ~= "table" or type(r.applied_order) ~= "table" or type(r.refused) ~= "table" then
    return "applied, applied_order or refused is not a table"
  end
  local n_applied, seen = 0, {}
  for name, value in pairs(r.applied) do
    n_applied = n_applied + 1
    if not is_str(name, "^[%w%-]+$") then return "applied name " .. tostring(name) end
    if value ~= true and not is_str(value, "^%S+$") then return "applied value " .. tostring(value) end
  end
  for i, name in pairs(r.applied_order) do
    if mtype(i) ~= "integer" or i < 1 or i > #r.applied_order then return "applied_order is not an array" end
    if seen[name] then return "applied_order repeats " .. tostring(name) end
    seen[name] = true
    if r.applied[name] == nil then return "applied_order has " .. tostring(name) .. " not in applied" end
  end
  if #r.applied_order ~= n_applied then return "applied_order and applied differ" end
  for name, e in pairs(r.refused) do
    if not is_str(name, "^[%w%-]+$") then return "refused name " .. tostring(name) end
    if type(e) ~= "table" or not is_str(e.errno, "^%u[%u%d]*$") or not is_str(e.message) then
      return "refused " .. name .. " is malformed"
    end
  end
  local f = r.fatal
  if f ~= nil and (type(f) ~= "table" or not is_str(f.step, "^[%w%-]+$") or not is_str(f.errno, "^%u[%u%d]*$")
                   or not is_str(f.message)) then
    return "fatal is malformed"
  end
  local s = r.status
  if s ~= nil and (type(s) ~= "table" or (s.kind ~= "exit" and s.kind ~= "signal") or mtype(s.code) ~= "integer") then
    return "status is malformed: " .. tostring(s and s.kind) .. " " .. tostring(s and s.code)
  end
  if type(r.observed) ~= "table" then return "observed is not a table" end
  for k, v in pairs(r.observed) do
    if not OBSERVED_KEYS[k] then return "observed has " .. tostring(k) end
    if mtype(v) ~= "integer" or v < 0 then return "observed." .. k .. " is " .. tostring(v) end
  end
  local u = r.usage
  if u ~= nil then
    if type(u) ~= "table" then return "usage is a " .. type(u) end
    for _, k in pairs({ "user_us", "sys_us", "maxrss_kb" }) do
      if mtype(u[k]) ~= "integer" or u[k] < 0 then return "usage." .. k .. " is " .. tostring(u[k]) end
    end
  end
  return nil
end

-- What the validator must accept, written apart from options.lua: kinds and ranges from the
-- schema, the rules from the README and options.lua's documentation.
local function value_ok(key, spec, v)
  local kind = spec.kind
  if kind == "number" or kind == "integer" then
    if type(v) ~= "number" or v ~= v or v < spec.min or v > spec.max then return false end
    return kind == "number" or v % 1 == 0
  elseif kind == "boolean" then
    return type(v) == "boolean"
  elseif kind == "string" then
    if type(v) ~= "string" then return false end
    return key ~= "python" or (v ~= "" and not v:find("\0", 1, true))
  elseif kind == "policy" then
    return type(v) == "string" or type(v) == "table"
  elseif kind == "env" then
    if type(v) ~= "table" then return false end
    for name, value in pairs(v) do
      if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then return false end
      if type(value) ~= "string" or value:find("\0", 1, true) then return false end
    end
    return true
  end
  return false
end

local function expected_ok(opts, schema)
  for k, v in pairs(opts) do
    if type(k) ~= "string" or not schema[k] or not value_ok(k, schema[k], v) then return false end
  end
  return true
end

--- options.check(what, opts, schema) accepts exactly the valid tables, returns their copy, and
-- raises nothing but "what: option 'NAME' ..." naming one of the table's keys.
-- @return nil, or what is wrong
function M.options(what, opts, schema)
  if opts == nil then
    local ok, res = pcall(options.check, what, opts, schema)
    if not ok or type(res) ~= "table" or next(res) ~= nil then return "nil options are not an empty table" end
    return nil
  end
  local want = expected_ok(opts, schema)
  local ok, res = pcall(options.check, what, opts, schema)
  if ok then
    if not want then return "accepted an invalid table" end
    if type(res) ~= "table" then return "returned a " .. type(res) end
    for k, v in pairs(res) do
      if opts[k] == nil or opts[k] ~= v then return "the copy differs at " .. tostring(k) end
      if schema[k].kind == "integer" and mtype(v) ~= "integer" then
        return "option " .. k .. " comes back as " .. tostring(v) .. ", not an integer"
      end
    end
    for k in pairs(opts) do
      if res[k] == nil then return "the copy lost " .. tostring(k) end
    end
    return nil
  end
  if want then return "rejected a valid table: " .. tostring(res) end
  if type(res) ~= "string" then return "raised a " .. type(res) .. " (" .. tostring(res) .. ")" end
  local prefix = what .. ": option '"
  if res:sub(1, #prefix) ~= prefix then return "error not of the form \"" .. prefix .. "NAME' ...\": " .. res end
  local rest = res:sub(#prefix + 1)
  for k, v in pairs(opts) do
    if type(k) == "string" and rest:sub(1, #k + 2) == k .. "' " and #rest > #k + 2
       and not (schema[k] and value_ok(k, schema[k], v)) then
      return nil
    end
  end
  return "error names none of the table's invalid options: " .. res
end

--- A readable rendering of a decoded value (CORRAL_FUZZ_PRINT=1 prints each options table).
function M.dump(v, depth)
  depth = depth or 0
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" then
    if mtype(v) == "float" then return string.format("%.17g", v) end
    return tostring(v)
  end
  if depth > 3 then return "{...}" end
  local parts = {}
  for k, x in pairs(v) do parts[#parts + 1] = "[" .. M.dump(k, depth + 1) .. "] = " .. M.dump(x, depth + 1) end
  table.sort(parts)
  return "{ " .. table.concat(parts, ", ") .. " }"
end

--- The option names of both schemas, sorted (the harness's decoder draws keys from them).
function M.option_names()
  local set, list = {}, {}
  for _, schema in pairs({ options.run_schema, options.eval_schema }) do
    for k in pairs(schema) do set[k] = true end
  end
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list
end

return M
