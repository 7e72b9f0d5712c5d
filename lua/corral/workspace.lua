--- A run's files: those it is given (`files`), its arguments (`args`) and those it hands back
-- (`collect`).
--
-- The launcher does the work inside the run (csrc/launch/workspace.c): it unpacks the files into
-- the work dir before the program starts, and after the run's last process it walks the work dir
-- and copies what `collect` asks for into a file of the run's directory, within the policy's caps.
-- This module checks the options, writes the one and reads the other. Paths and contents are
-- bytes here; the JSON faces carry contents in base64 (`json_files`, `json_result`).
local M = {}

-- (the checks are pure Lua: a fuzz harness loads them without the C module)
local function core() return require "corral.core" end

-- What a run may be given, whatever the policy (a policy's `max_files_in_mb` bounds the bytes).
M.MAX_FILES = 1000
M.MAX_PATH = 4095        -- bytes of a relative path (PATH_MAX less its NUL)
M.MAX_SEGMENT = 255      -- bytes of one of its names (NAME_MAX)
M.MAX_ARGS = 256
M.MAX_ARGS_BYTES = 65536
M.MAX_GLOBS = 64

local function fail(what, key, msg, level)
  error(what .. ": option '" .. key .. "' " .. msg, level)
end

local function shown(s)
  s = s:gsub("[%c\128-\255]", function(c) return string.format("\\x%02x", c:byte()) end)
  if #s > 80 then s = s:sub(1, 77) .. "..." end
  return "'" .. s .. "'"
end

local find, byte, sub = string.find, string.byte, string.sub

--- Why `path` is not a relative path inside the work dir, or nil.
function M.path_problem(path)
  local n = #path
  if n == 0 then return "is empty" end
  if find(path, "\0", 1, true) then return "holds a NUL byte" end
  if n > M.MAX_PATH then return "is longer than " .. M.MAX_PATH .. " bytes" end
  if byte(path, 1) == 47 then return "is absolute: paths are relative to the work dir" end
  -- segment by segment, by their bounds (no string made for a good one)
  local start = 1
  while true do
    local slash = find(path, "/", start, true)
    local stop = (slash or n + 1) - 1
    local len = stop - start + 1
    if len == 0 then return "has an empty segment (// or a trailing /)" end
    if len <= 2 and byte(path, start) == 46 and (len == 1 or byte(path, stop) == 46) then
      return "has a '" .. sub(path, start, stop) .. "' segment"
    end
    if len > M.MAX_SEGMENT then return "has a name longer than " .. M.MAX_SEGMENT .. " bytes" end
    if not slash then return nil end
    start = slash + 1
  end
end

-- The length of `v`, a table with keys 1..n only (a list), else an error naming the key found.
-- `kind` says what was expected ("a list", "true or a list").
local function list_length(what, key, v, kind, level)
  local n = #v
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      fail(what, key, "must be " .. kind .. " (keys 1..n), got a key " .. shown(tostring(k)), level)
    end
  end
  return n
end

-- An entry of `files` for a message: its index and its path.
local function entry_name(i, e)
  return "entry " .. i .. " (" .. shown(e.path) .. ")"
end

--- Check `files`: a list of {path = string, content = string, mode = integer 0..0777}.
-- @return the list, each entry a copy with its mode filled in (0644)
function M.check_files(what, key, v, level)
  if type(v) ~= "table" then fail(what, key, "must be a list of {path, content, mode}, got " .. type(v), level) end
  local n = list_length(what, key, v, "a list", level)
  if n > M.MAX_FILES then fail(what, key, "has " .. n .. " entries, more than " .. M.MAX_FILES, level) end
  local out, seen = {}, {}
  for i = 1, n do
    local e = v[i]
    if type(e) ~= "table" then fail(what, key, "entry " .. i .. " must be a table {path, content, mode}, got " .. type(e), level) end
    for k in pairs(e) do
      if k ~= "path" and k ~= "content" and k ~= "mode" then
        fail(what, key, "entry " .. i .. " has an unknown field " .. shown(tostring(k)) .. " (path, content, mode)", level)
      end
    end
    local path = e.path
    if type(path) ~= "string" then fail(what, key, "entry " .. i .. ": path must be a string, got " .. type(path), level) end
    local why = M.path_problem(path)
    if why then fail(what, key, entry_name(i, e) .. ": the path " .. why, level) end
    if type(e.content) ~= "string" then fail(what, key, entry_name(i, e) .. ": content must be a string, got " .. type(e.content), level) end
    local mode = e.mode
    if mode == nil then
      mode = 420   -- 0644
    elseif math.type(mode) ~= "integer" or mode < 0 or mode > 511 then
      if math.type(mode) ~= "integer" and not (type(mode) == "number" and mode == math.floor(mode)) then
        fail(what, key, entry_name(i, e) .. ": mode must be a whole number (0 to 0777), got " .. tostring(mode), level)
      end
      -- (a whole float beyond the integers, 1e300, has no integer value)
      local m = math.tointeger(mode)
      if not m or m < 0 or m > 511 then fail(what, key, entry_name(i, e) .. ": mode must be 0 to 0777 (511), got " .. tostring(mode), level) end
      mode = m
    end
    if seen[path] then fail(what, key, entry_name(i, e) .. ": the path is given twice (entry " .. seen[path] .. ")", level) end
    seen[path] = i
    out[i] = { path = path, content = e.content, mode = mode }
  end
  -- a path through a file: "a" and "a/b"
  for i = 1, n do
    local p = out[i].path
    local cut = find(p, "/", 1, true)
    while cut do
      local parent = sub(p, 1, cut - 1)
      cut = find(p, "/", cut + 1, true)
      if seen[parent] then
        fail(what, key, "entry " .. i .. " (" .. shown(p) .. "): the path goes through the file of entry "
          .. seen[parent] .. " (" .. shown(parent) .. ")", level)
      end
    end
  end
  return out
end

--- Check `args`: a list of strings without NUL bytes, bounded in count and bytes.
function M.check_args(what, key, v, level)
  if type(v) ~= "table" then fail(what, key, "must be a list of strings, got " .. type(v), level) end
  local n, bytes = list_length(what, key, v, "a list", level), 0
  if n > M.MAX_ARGS then fail(what, key, "has " .. n .. " entries, more than " .. M.MAX_ARGS, level) end
  local out = {}
  for i = 1, n do
    local a = v[i]
    if type(a) ~= "string" then fail(what, key, "entry " .. i .. " must be a string, got " .. type(a), level) end
    if a:find("\0", 1, true) then fail(what, key, "entry " .. i .. " holds a NUL byte", level) end
    bytes = bytes + #a + 1
    out[i] = a
  end
  if bytes > M.MAX_ARGS_BYTES then fail(what, key, "holds " .. bytes .. " bytes, more than " .. M.MAX_ARGS_BYTES, level) end
  return out
end

--- Check `collect`: true (every file the run made or changed), false, or a list of globs relative
-- to the work dir ("*.png", "out/**"; `**` matches any number of directories).
function M.check_collect(what, key, v, level)
  if type(v) == "boolean" then return v end
  if type(v) ~= "table" then fail(what, key, "must be true or a list of globs, got " .. type(v), level) end
  local n = list_length(what, key, v, "true or a list", level)
  if n == 0 then fail(what, key, "is an empty list: give globs, or true for every file", level) end
  if n > M.MAX_GLOBS then fail(what, key, "has " .. n .. " globs, more than " .. M.MAX_GLOBS, level) end
  local out = {}
  for i = 1, n do
    local g = v[i]
    if type(g) ~= "string" then fail(what, key, "entry " .. i .. " must be a string, got " .. type(g), level) end
    local why = M.path_problem(g)
    if why then fail(what, key, "entry " .. i .. " (" .. shown(g) .. ") " .. why, level) end
    local stars = 0
    for seg in (g .. "/"):gmatch("([^/]*)/") do
      if seg == "**" then stars = stars + 1 end
    end
    if stars > 2 then fail(what, key, "entry " .. i .. " (" .. shown(g) .. ") has more than two **", level) end
    out[i] = g
  end
  return out
end

--- The run that `opts` (checked) asks for runs a file of `files`: its entry, or nil.
function M.main_file(opts)
  local name = opts.args and opts.args[1]
  if not name or not opts.files then return nil end
  for _, e in ipairs(opts.files) do
    if e.path == name then return e end
  end
  return nil
end

--- The policy's caps on a run's files, filled with the defaults.
function M.caps(pol)
  return {
    in_bytes = math.floor((pol.max_files_in_mb or 16) * 1048576),
    out_files = pol.max_files_out or 100,
    out_file_bytes = math.floor((pol.max_file_out_mb or 8) * 1048576),
    out_bytes = math.floor((pol.max_files_out_mb or 16) * 1048576),
  }
end

--- The bytes of `files` against the policy: an error message naming the option, or nil.
function M.over_caps(pol, files)
  local total = 0
  for _, e in ipairs(files) do total = total + #e.content end
  local cap = M.caps(pol).in_bytes
  if total > cap then
    return "option 'files' holds " .. total .. " bytes, over the maximum of " .. cap
      .. " that policy '" .. tostring(pol.name) .. "' allows (max_files_in_mb)"
  end
  local work = pol.work_mb and math.floor(pol.work_mb * 1048576)
  if work and total > work then
    return "option 'files' holds " .. total .. " bytes, more than the work dir's " .. work
      .. " (policy '" .. tostring(pol.name) .. "': work_mb)"
  end
  return nil
end

--- The records corral-launch --files-in reads: PATH \0 MODE \0 SIZE \0 and the bytes, as a
-- list of strings (core.write_file writes them without joining them).
function M.pack(files)
  local parts, n = {}, 0
  for _, e in ipairs(files) do
    parts[n + 1] = e.path .. "\0" .. string.format("%o", e.mode) .. "\0" .. #e.content .. "\0"
    parts[n + 2] = e.content
    n = n + 2
  end
  return parts
end

--- The most bytes the records of a collection take within `caps`: the contents, and per entry
-- a record head (a path and four numbers) and a link's target.
function M.records_max(caps)
  return caps.out_bytes + (caps.out_files + 1) * (2 * M.MAX_PATH + 128)
end

local FLAG = { files = "files", bytes = "bytes", scan = "scan", depth = "depth", name = "name",
               interrupted = "interrupted" }

-- What core.records_unpack and core.records_read give, as M.unpack returns it.
local function unpacked(list, complete, seen, flags_text)
  local flags = {}
  for f in flags_text:gmatch("[^,]+") do
    if FLAG[f] then flags[#flags + 1] = f end
  end
  return list, { complete = complete, flags = flags, seen = seen }
end

-- `caps` (M.caps's) as core.records_unpack and core.records_read take them, or nil.
local function core_caps(caps)
  if not caps then return nil end
  return { files = caps.out_files, file_bytes = caps.out_file_bytes, bytes = caps.out_bytes }
end

--- What corral-launch --collect-to wrote (or a session's kernel sent): the entries, and what cut
-- the list short. The records are parsed in C (core.records_unpack); nothing in them can make
-- it raise.
-- @param given the run's `files` (checked), or nil: a file the run left with the bytes it was
-- given comes back as a record without them, and its content is the given string itself
-- @param caps M.caps's, or nil: at most `out_files` entries are made (in the order of the
-- records), `out_file_bytes` of content each and `out_bytes` in all; what is past them is
-- passed over in C and never made, and flagged ("files", "bytes"). A producer that is not
-- trusted to keep the caps (a session's kernel) costs the host its bytes and `out_files`
-- entries, however many records it wrote.
-- @return list of {path, type ("file", "link", "error"), size, mode, content, truncated, target,
-- error}, sorted by path; and a table: `complete` (false: the writer did not finish: killed),
-- `flags` (list of what cut the list short: files, bytes, scan, depth, name, interrupted; with
-- `complete` false, only what the caps cut), `seen` (entries looked at)
function M.unpack(data, given, caps)
  return unpacked(core().records_unpack(data, M.by_path(given), core_caps(caps)))
end

--- M.unpack of the records in the file at `path`, at most `max` bytes of it, read in pieces
-- straight into the entries (core.records_read): no string of the whole file is made.
-- @return as M.unpack; a file that cannot be read holds no entry and is not complete
function M.read(path, max, given, caps)
  local list, complete, seen, flags = core().records_read(path, max, M.by_path(given), core_caps(caps))
  if not list then return M.unpack("") end
  return unpacked(list, complete, seen, flags)
end

--- `files` (checked) as a table path -> content, or nil.
function M.by_path(files)
  if not files then return nil end
  local t = {}
  for _, e in ipairs(files) do t[e.path] = e.content end
  return t
end

--- `list` (M.unpack's, made within the caps) from a producer that is not trusted to name its
-- files well (a session's kernel, which the program can change): an entry whose path is not a
-- relative path of the work dir, or given twice, is dropped.
-- @return the list
function M.bound(list)
  local out, seen = {}, {}
  for _, e in ipairs(list) do
    if not (M.path_problem(e.path) or seen[e.path]) then
      seen[e.path] = true
      out[#out + 1] = e
    end
  end
  return out
end

--- A result's files for JSON: contents in base64; a path that is not UTF-8 also as its bytes in
-- base64 (`path_b64`), with `path` the name where each invalid byte reads U+FFFD.
function M.json_files(list)
  local out = {}
  for i, e in ipairs(list or {}) do
    local path, valid = core().utf8_repair(e.path)
    local j = { path = path, type = e.type, size = e.size, mode = e.mode, truncated = e.truncated,
                error = e.error }
    if not valid then j.path_b64 = core().b64encode(e.path) end
    if e.content then j.content = core().b64encode(e.content) end
    if e.target then
      local t, tvalid = core().utf8_repair(e.target)
      j.target = t
      if not tvalid then j.target_b64 = core().b64encode(e.target) end
    end
    out[i] = j
  end
  return out
end

--- `files` of a JSON request (contents in base64) as the library's option: nil and a message
-- naming the entry when one is not base64.
function M.from_json(files)
  if type(files) ~= "table" then return files end
  local out = {}
  for i, e in ipairs(files) do
    if type(e) == "table" and type(e.content) == "string" then
      local bytes, at = core().b64decode(e.content)
      if not bytes then
        return nil, "field 'files' entry " .. i .. ": content is not base64 (RFC 4648, padded): byte " .. at
          .. " is wrong"
      end
      local c = {}
      for k, v in pairs(e) do c[k] = v end
      c.content = bytes
      out[i] = c
    else
      out[i] = e
    end
  end
  return out
end

return M
