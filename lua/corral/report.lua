--- Decoding the launcher's report (the text it writes on fd 3; see docs/internals.md).
-- The input crosses a process boundary, so every line is treated as untrusted: malformed lines
-- and unknown records are skipped, numbers are checked, and nothing here can raise.
local M = {}

local tonumber, tointeger, match, gmatch = tonumber, math.tointeger, string.match, string.gmatch

-- A decimal that fits a Lua integer, or nil: tonumber() turns a longer one (20 digits, or 19 above
-- 2^63 - 1) into an imprecise float.
local function int(s)
  if s == nil or #s > 20 or not s:match("^%-?%d+$") then return nil end
  return tointeger(tonumber(s))
end

--- Parse a report.
-- @param text the bytes read from the report fd (may be empty or cut short)
-- @return a table: `version`, `applied` (name → value string or true), `applied_order` (names in
-- the order applied), `refused` (name → {errno=, message=}), `fatal` ({step=, errno=, message=}
-- or nil), `pid`, `status` ({kind="exit"|"signal", code=n} or nil), `usage` ({user_us=, sys_us=,
-- maxrss_kb=} or nil), `exceeded` ({name="cpu"|"memory"|"tasks", used=n, limit=n} or nil: a
-- whole-run budget ended the run; tasks: too many to measure), `total` ({cpu_us=, peak_kb=} or nil: the whole run's CPU and summed
-- resident memory), `observed` (name → number, what the supervisor saw: `tasks` the most tasks of
-- the run at once, `vm` the largest address space of one process in KiB, `file` the largest file
-- left in the run's directories in bytes; each only when measured)
function M.parse(text)
  local r = { applied = {}, applied_order = {}, refused = {}, observed = {} }
  if type(text) ~= "string" then return r end
  -- each line that starts with a record's name: the newline put in front makes the first line
  -- one, and keeps a name in the middle of a line from counting
  for kind, rest in gmatch("\n" .. text, "\n(%a[%w%-]*) ?([^\n]*)") do
    if kind == "corral-launch" then
      r.version = int(rest)
    elseif kind == "applied" then
      -- NAME, then " VALUE" or nothing: what follows the value must be empty. The last capture
      -- always matches, so nothing goes back over the name ("^([%w%-]+) ?(%S*)$" would, for
      -- each of its bytes, when the value holds a space: quadratic in the line)
      local name, value, junk = match(rest, "^([%w%-]+) ?(%S*)(.*)$")
      if junk ~= "" then value = nil end
      if value then
        if r.applied[name] == nil then r.applied_order[#r.applied_order + 1] = name end
        r.applied[name] = (value ~= "" and value) or true
      end
    elseif kind == "refused" then
      local name, errno, msg = match(rest, "^([%w%-]+) (%u[%u%d]*) ?(.*)$")
      if name then r.refused[name] = { errno = errno, message = msg } end
    elseif kind == "fatal" then
      local step, errno, msg = match(rest, "^([%w%-]+) (%u[%u%d]*) ?(.*)$")
      if step and not r.fatal then r.fatal = { step = step, errno = errno, message = msg } end
    elseif kind == "pid" then
      r.pid = int(rest)
    elseif kind == "status" then
      local how, n = match(rest, "^(%a+) (%-?%d+)$")
      n = int(n)
      if (how == "exit" or how == "signal") and n then r.status = { kind = how, code = n } end
    elseif kind == "exceeded" then
      local name, used, limit = match(rest, "^(%a+) (%d+) (%d+)$")
      used, limit = int(used), int(limit)
      if (name == "cpu" or name == "memory" or name == "tasks") and used and limit and not r.exceeded then
        r.exceeded = { name = name, used = used, limit = limit }
      end
    elseif kind == "total" then
      local c, m = match(rest, "^(%d+) (%d+)$")
      c, m = int(c), int(m)
      if c and m then r.total = { cpu_us = c, peak_kb = m } end
    elseif kind == "observed" then
      local name, v = match(rest, "^(%a+) (%d+)$")
      v = int(v)
      if (name == "tasks" or name == "vm" or name == "file") and v and not r.observed[name] then
        r.observed[name] = v
      end
    elseif kind == "usage" then
      local u, s, m = match(rest, "^(%d+) (%d+) (%d+)$")
      u, s, m = int(u), int(s), int(m)
      if u and s and m then r.usage = { user_us = u, sys_us = s, maxrss_kb = m } end
    end
  end
  return r
end

return M
