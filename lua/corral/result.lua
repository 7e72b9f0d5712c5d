--- The public JSON shape of a run's result, shared by `corral run --json` and `corral serve`.
-- Exactly the fields `ok stdout stderr returncode timed_out truncated network_isolated limits
-- reason signal usage refused`, plus `error {kind, message}` when the sandbox itself failed, and
-- `files` (contents in base64: corral.workspace.json_files) and `files_truncated` when the run
-- collected files.
-- `refused` is an object: each protection the kernel refused, `{errno, message}`, so that a
-- missing name in `limits` explains itself. Fields that
-- are absent in the Lua result (a signal, the budget totals) are JSON null, never missing, so a
-- client sees the same keys every time.
local M = {}

-- name -> {errno, message}, copied: only the two fields, whatever else the policy kept
local function refused(r)
  local out = {}
  for name, why in pairs(r or {}) do out[name] = { errno = why.errno, message = why.message } end
  return out
end

--- The JSON object for a result.
-- @param res the result of `run_python`/`start`, or nil when the sandbox failed
-- @param err, code the failure's message and symbolic code (when `res` is nil)
-- @param null the JSON null value (`cjson.null`)
-- @return a plain table ready for `M.encode`
function M.object(res, err, code, null)
  if not res then
    return {
      ok = false, stdout = "", stderr = "", returncode = null, timed_out = false, truncated = false,
      network_isolated = false, limits = {}, reason = null, signal = null, refused = {},
      usage = { wall_s = 0, cpu_user_s = 0, cpu_sys_s = 0, max_rss_kb = 0, cpu_total_s = null,
                memory_peak_kb = null },
      error = { kind = code or "error", message = err },
    }
  end
  local u = res.usage
  local ws = res.files and require("corral.workspace")
  return {
    files = ws and ws.json_files(res.files) or nil,
    files_truncated = res.files_truncated,
    ok = res.ok, stdout = res.stdout, stderr = res.stderr, returncode = res.returncode,
    timed_out = res.timed_out, truncated = res.truncated, network_isolated = res.network_isolated,
    limits = res.limits, reason = res.reason, signal = res.signal or null, refused = refused(res.refused),
    usage = { wall_s = u.wall_s, cpu_user_s = u.cpu_user_s, cpu_sys_s = u.cpu_sys_s,
              max_rss_kb = u.max_rss_kb, cpu_total_s = u.cpu_total_s or null,
              memory_peak_kb = u.memory_peak_kb or null },
  }
end

--- JSON text with lua-cjson's `\/` escapes written as plain `/`, as every face of corral writes
-- it (this lua-cjson has no `encode_escape_forward_slash`). An odd run of backslashes before
-- "/" ends in that escape; an even one is escaped backslashes, left alone.
-- @return the text
function M.unslash(text)
  return (text:gsub("(\\+)/", function(bs)
    if #bs % 2 == 1 then return bs:sub(2) .. "/" end
  end))
end

--- Encode `obj` with lua-cjson, writing the arrays named in `arrays` (default: `limits` and
-- `clamped`) as `[]` when empty: lua-cjson cannot tell an empty array from an empty object.
-- A "/" is written as is (`M.unslash`).
-- @return the JSON text
function M.encode(obj, cjson, arrays)
  local empty = {}
  for _, k in ipairs(arrays or { "limits", "clamped", "files" }) do
    if type(obj[k]) == "table" and next(obj[k]) == nil then
      empty[#empty + 1] = k
      obj[k] = cjson.null
    end
  end
  local text = cjson.encode(obj)
  for _, k in ipairs(empty) do
    obj[k] = {}
    -- only a top-level key of this name can be followed by null here: string values are
    -- escaped, so '"limits":null' cannot occur inside one
    text = text:gsub('"' .. k .. '":null', '"' .. k .. '":[]', 1)
  end
  return M.unslash(text)
end

return M
