--- The eval_in_sandbox face: its options as run options, and a run's outcome as its
-- ProcessOutput or SandboxError (seed 003's semantics: it raises on a timeout, on output over the
-- cap and on output that is not UTF-8, and strips the output).
local core = require "corral.core"
local schema = require "corral.schema"

local M = {}

local SandboxError = { __name = "SandboxError" }
SandboxError.__index = SandboxError
SandboxError.__tostring = function(e) return "SandboxError(" .. e.kind .. "): " .. e.message end
M.SandboxError = SandboxError

--- Is `e` an error raised by `eval_in_sandbox`?
function M.is_sandbox_error(e)
  return getmetatable(e) == SandboxError
end

local function sandbox_error(kind, message)
  return setmetatable({ kind = kind, message = message }, SandboxError)
end

--- Its settings that are not public options: a stream over the cap ends the run.
M.EXTRA = { kill_on_overflow = true }

--- Its options (checked) → run options (corral.schema: its names, defaults and units; the policy
-- `bwrap` unless given).
M.run_options = schema.eval_to_run

-- What Python's str.strip() removes: the ASCII whitespace, \x1c-\x1f, and the Unicode spaces
-- and line separators (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
-- U+3000), as UTF-8.
local UNICODE_SPACE = {}
for _, cp in ipairs({ 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000 }) do
  UNICODE_SPACE[utf8.char(cp)] = true
end
for cp = 0x2000, 0x200A do UNICODE_SPACE[utf8.char(cp)] = true end

local function strip(s)
  local first, last = 1, #s
  while first <= last do
    local b = s:byte(first)
    if b <= 0x20 and (b == 0x20 or (b >= 0x09 and b <= 0x0D) or (b >= 0x1C and b <= 0x1F)) then
      first = first + 1
    else
      local n = b >= 0xE0 and 3 or (b >= 0xC0 and 2 or 0)
      if n > 0 and UNICODE_SPACE[s:sub(first, first + n - 1)] then first = first + n else break end
    end
  end
  while last >= first do
    local b = s:byte(last)
    if b <= 0x20 and (b == 0x20 or (b >= 0x09 and b <= 0x0D) or (b >= 0x1C and b <= 0x1F)) then
      last = last - 1
    else
      local matched = false
      for n = 2, 3 do
        if last - n + 1 >= first and UNICODE_SPACE[s:sub(last - n + 1, last)] then
          last, matched = last - n, true
          break
        end
      end
      if not matched then break end
    end
  end
  return s:sub(first, last)
end
M.strip = strip

--- A run's outcome (`res, err, ecode, raw`) → eval_in_sandbox's ProcessOutput, or nil and a SandboxError.
function M.outcome(res, err, ecode, raw)
  if not res then
    return nil, sandbox_error(ecode == "ENOENT" and "unavailable" or "sandbox", err)
  end
  if res.timed_out then return nil, sandbox_error("timeout", "Process timed out") end
  if res.reason == "output" or res.truncated then return nil, sandbox_error("output", "I/O buffer size exceeded") end
  local _, out_ok = core.utf8_repair(raw.stdout)
  local _, err_ok = core.utf8_repair(raw.stderr)
  if not (out_ok and err_ok) then
    return nil, sandbox_error("encoding", "Subprocess did not produce valid UTF-8")
  end
  return { returncode = res.returncode, stdout = strip(res.stdout), stderr = strip(res.stderr),
           ok = res.returncode == 0 }
end

return M
