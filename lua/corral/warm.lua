--- Warm interpreters: the zygotes of a controller.
--
-- A policy with `warm = {preload = {...}}` runs its programs in processes forked from a
-- pre-started interpreter (`corral-zygote`) instead of a freshly exec'd one. The zygote holds
-- the long-lived part of the sandbox (the network namespace, and the user namespace that needs
-- when not root) and an interpreter that has imported the preload list; every run follows the
-- launcher's usual plan (PID, mount and IPC namespaces, mounts, rlimits, uid, Landlock, seccomp,
-- budgets) with its program forked from that interpreter into the run's namespaces, so each run
-- still gets its own process tree, work dir, limits and kill, and nothing of one run reaches
-- another (each is a fresh fork of the same warm state). Warm runs need a PID namespace: without
-- one (the policy's or the kernel's choice) corral runs the policy cold.
--
-- One zygote per distinct (policy, interpreter, set-up) is started on first use and kept for
-- the controller's life; a zygote that failed or died is replaced on the next run. An idle
-- zygote does not keep `corral.run_loop()` running, and it dies with the controller.
local core = require "corral.core"
local paths = require "corral.paths"

local M = {}

local MAX_ZYGOTES = 8
local pool = {}   -- key -> {z = zygote, used = counter}
local uses = 0

--- The zygote's command line (without the executable) for a policy and prepared options.
-- The environment is given as --env (the interpreter's locale comes from it): see environment().
function M.args(pol, opts, env)
  local a = { "--control-fd", "3", "--parent-pid", tostring(core.getpid()), "--python", opts.python_exe }
  local function add(...) for _, v in ipairs({ ... }) do a[#a + 1] = v end end
  -- "new" or "shared": the zygote makes one namespace, which its runs share
  add("--net", pol.network == "host" and "host" or "new")
  if pol.user_namespace then add("--userns", pol.user_namespace) end
  local preload = pol.warm and pol.warm.preload or {}
  if #preload > 0 then add("--preload", table.concat(preload, ",")) end
  -- the prelude's handlers in every program, which runs its file itself; the prelude, which a
  -- program with a NUL byte still runs through, compiled once
  if pol:prelude() then add("--flush-handlers", "--command", require("corral.prelude").source) end
  for _, e in ipairs(env) do add("--env", e) end
  return a
end

--- The zygote's environment: the policy's, without what differs per run (HOME, TMPDIR), so
-- that the interpreter starts as a run's would (LANG decides its encodings).
function M.environment(pol)
  local names = {}
  for k in pairs(pol.env or {}) do
    if k ~= "HOME" and k ~= "TMPDIR" then names[#names + 1] = k end
  end
  table.sort(names)
  local env = {}
  for i, k in ipairs(names) do env[i] = k .. "=" .. pol.env[k] end
  return env
end

local function evict_one()
  local oldest, oldest_key
  for key, e in pairs(pool) do
    if not oldest or e.used < oldest.used then oldest, oldest_key = e, key end
  end
  if oldest then
    oldest.z:close()
    pool[oldest_key] = nil
  end
end

--- The zygote for this policy and these options: a live one, or a new one.
-- @return zygote, or nil, message, code
function M.get(pol, opts)
  local env = M.environment(pol)
  local args = M.args(pol, opts, env)
  local key = tostring(pol.name) .. "\0" .. table.concat(args, "\0") .. "\0\0" .. table.concat(env, "\0")
  uses = uses + 1
  local e = pool[key]
  if e then
    local st = e.z:state()
    if st == "starting" or st == "ready" then
      e.used = uses
      return e.z
    end
    e.z:close()
    pool[key] = nil
  end
  local file, err = paths.zygote()
  if not file then return nil, err, "ENOENT" end
  local n = 0
  for _ in pairs(pool) do n = n + 1 end
  if n >= MAX_ZYGOTES then evict_one() end
  local z, zerr, zcode = core.zygote { file = file, args = args, env = env }
  if not z then return nil, zerr, zcode end
  pool[key] = { z = z, used = uses }
  return z
end

--- The live zygotes: list of {policy =, pid =, state =, info =}.
function M.list()
  local out = {}
  for key, e in pairs(pool) do
    out[#out + 1] = { policy = key:match("^[^\0]*"), pid = e.z:pid(), state = e.z:state(), info = e.z:info() }
  end
  table.sort(out, function(a, b) return a.pid < b.pid end)
  return out
end

--- Close every zygote: each exits once its runs are done.
-- @return the pids of the zygotes closed
function M.close_all()
  local pids = {}
  for key, e in pairs(pool) do
    pids[#pids + 1] = e.z:pid()
    e.z:close()
    pool[key] = nil
  end
  return pids
end

return M
