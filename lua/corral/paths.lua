--- Where corral's files are: the launcher executable and the policy directory.
-- From a source tree (after `make`) both are found next to the Lua modules; an installed copy has
-- its prefix written in by `make install`. `CORRAL_LAUNCH` and `CORRAL_POLICY_PATH` override both.
local M = {}

-- `make install` rewrites this line with the install prefix.
local INSTALLED_PREFIX = nil

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

--- The directory of this file (…/lua/corral/), found through the module search path.
local function here()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then
    return (src:sub(2):match("^(.*)/[^/]*$")) or "."
  end
  return "."
end

local function source_root()
  -- here() is <root>/lua/corral when running from a source tree
  local root = here():match("^(.*)/lua/corral$")
  if root and exists(root .. "/csrc/corral-launch") then return root end
  if here() == "lua/corral" and exists("csrc/corral-launch") then return "." end
  return nil
end

--- Path of the `corral-launch` executable, or nil and a message.
function M.launcher()
  local env = os.getenv("CORRAL_LAUNCH")
  if env and env ~= "" then return env end
  local root = source_root()
  if root then
    -- absolute, so that a later chdir of the host does not lose it
    local core = require "corral.core"
    return core.realpath(root .. "/csrc/corral-launch") or (root .. "/csrc/corral-launch")
  end
  local candidates = {}
  if INSTALLED_PREFIX then candidates[#candidates + 1] = INSTALLED_PREFIX .. "/libexec/corral/corral-launch" end
  -- a luarocks tree: <tree>/share/lua/5.4/corral/paths.lua → <tree>/lib/luarocks/... is not fixed,
  -- so luarocks installs the launcher next to the modules as well.
  candidates[#candidates + 1] = here() .. "/corral-launch"
  candidates[#candidates + 1] = "/usr/local/libexec/corral/corral-launch"
  candidates[#candidates + 1] = "/usr/libexec/corral/corral-launch"
  for _, c in ipairs(candidates) do
    if exists(c) then return c end
  end
  return nil, "ENOENT: corral-launch not found (looked in " .. table.concat(candidates, ", ")
    .. "); run `make` or set CORRAL_LAUNCH"
end

--- Path of the `corral-zygote` executable (the warm interpreter), or nil and a message. It is
-- built and installed next to the launcher; CORRAL_ZYGOTE overrides.
function M.zygote()
  local env = os.getenv("CORRAL_ZYGOTE")
  if env and env ~= "" then return env end
  local launcher, err = M.launcher()
  if not launcher then return nil, err end
  local path = launcher:gsub("corral%-launch$", "corral-zygote")
  if path ~= launcher and exists(path) then return path end
  return nil, "ENOENT: corral-zygote not found next to " .. launcher
    .. " (it needs libpython3.11-dev to build; run `make`) or set CORRAL_ZYGOTE"
end

--- Directories searched for policies by name, in order.
function M.policy_dirs()
  local dirs = {}
  local env = os.getenv("CORRAL_POLICY_PATH")
  if env and env ~= "" then
    for d in env:gmatch("[^:]+") do dirs[#dirs + 1] = d end
  end
  local root = source_root()
  if root then dirs[#dirs + 1] = root .. "/policies" end
  if INSTALLED_PREFIX then dirs[#dirs + 1] = INSTALLED_PREFIX .. "/share/corral/policies" end
  dirs[#dirs + 1] = here() .. "/policies"
  return dirs
end

M.exists = exists

return M
