--- Strict validation of option tables.
-- Every public entry point checks its options here: an unknown key, a wrong type or a value out of
-- range raises an error that names the option, before anything is created or started.
local M = {}

local workspace = require "corral.workspace"

local type, pairs, tostring, error, floor = type, pairs, tostring, error, math.floor

--- The options `run_python` accepts: kind, and for numbers the accepted range (corral.schema).
M.run_schema = require("corral.schema").run_checks()

--- The options `eval_in_sandbox` accepts (its own names).
M.eval_schema = require("corral.schema").eval_checks()

local function fail(what, key, msg, level)
  error(what .. ": option '" .. key .. "' " .. msg, level)
end

local function is_integer(v)
  return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge and floor(v) == v
end

local function check_env(what, key, v, level)
  if type(v) ~= "table" then fail(what, key, "must be a table of NAME = value strings, got " .. type(v), level) end
  for name, value in pairs(v) do
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
      fail(what, key, "has an invalid variable name " .. string.format("%q", tostring(name)), level)
    end
    if type(value) ~= "string" or value:find("\0", 1, true) then
      fail(what, key, "value of " .. name .. " must be a string without NUL bytes", level)
    end
  end
end

--- Check `opts` against `schema`; raises naming the offending key.
-- @param what the caller's name, used in the message ("run_python")
-- @param opts the table (nil is an empty table)
-- @param schema one of the schemas above
-- @param level error level passed to `error` (default 0: no position; the message names the
-- function and the option, which is what a caller several layers up — a CLI, an HTTP body — needs)
-- @return a shallow copy of `opts`
function M.check(what, opts, schema, level)
  level = level or 0
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(what .. ": options must be a table, got " .. type(opts), level) end
  local out = {}
  for key, v in pairs(opts) do
    if type(key) ~= "string" then error(what .. ": option names must be strings, got " .. type(key), level) end
    local spec = schema[key]
    if not spec then fail(what, key, "is not a known option", level) end
    local kind = spec.kind
    if kind == "number" or kind == "integer" then
      if type(v) ~= "number" or v ~= v then fail(what, key, "must be a number, got " .. type(v), level) end
      if kind == "integer" and not is_integer(v) then fail(what, key, "must be a whole number, got " .. tostring(v), level) end
      if v < spec.min then fail(what, key, "must be at least " .. tostring(spec.min) .. ", got " .. tostring(v), level) end
      if v > spec.max then fail(what, key, "must be at most " .. tostring(spec.max) .. ", got " .. tostring(v), level) end
      if kind == "integer" then v = floor(v) end
    elseif kind == "boolean" then
      if type(v) ~= "boolean" then fail(what, key, "must be a boolean, got " .. type(v), level) end
    elseif kind == "string" then
      if type(v) ~= "string" then fail(what, key, "must be a string, got " .. type(v), level) end
      if key == "python" and (v == "" or v:find("\0", 1, true)) then
        fail(what, key, "must be a non-empty path or command name", level)
      end
    elseif kind == "policy" then
      if type(v) ~= "string" and type(v) ~= "table" then
        fail(what, key, "must be a policy name, a path or a policy table, got " .. type(v), level)
      end
    elseif kind == "env" then
      check_env(what, key, v, level)
    elseif kind == "files" then
      v = workspace.check_files(what, key, v, level)
    elseif kind == "args" then
      v = workspace.check_args(what, key, v, level)
    elseif kind == "collect" then
      v = workspace.check_collect(what, key, v, level)
      if v == false then v = nil end
    end
    out[key] = v
  end
  return out
end

return M
