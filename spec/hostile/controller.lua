--- A controller process of its own for one hostile case, for cases about the controller itself:
-- a secret in the controller's environment, a program that signals or reads its controller.
-- Started by spec/hostile_spec.lua from the tree's root:
--   lua5.4 spec/hostile/controller.lua CASE_NAME PREFIX TREE
-- with HOSTILE_CTX (JSON: the values the case's setup made) in the environment. Writes
-- "top <run dir>" to stderr when the run starts (so the runner can clean up if this process is
-- killed) and one JSON object to stdout when it ends.
package.path = "lua/?.lua;lua/?/init.lua;spec/?.lua;" .. package.path
package.cpath = "csrc/?.so;" .. package.cpath
local cjson = require "cjson"
local core = require "corral.core"
local corral = require "corral"
local S = require "hostile.support"

local name, prefix, tree = arg[1], arg[2], arg[3]
S.base = os.getenv("HOSTILE_BASE") or "default"
local case
for _, c in ipairs(S.load_cases()) do
  if c.name == name then case = c end
end
if not case then
  io.write(cjson.encode({ err = "no case named " .. tostring(name), code = "EINVAL" }), "\n")
  os.exit(1)
end
local extra = os.getenv("HOSTILE_CTX") and cjson.decode(os.getenv("HOSTILE_CTX")) or {}
local ctx = S.make_ctx(case, prefix, tree, extra)
local sink = { marker = ctx.marker, ignore = {} }
for _, pid in ipairs(extra.helper_pids or {}) do sink.ignore[pid] = true end
sink.on_start = function(run)
  io.stderr:write("top ", run.top, "\n")
  io.stderr:flush()
end
local code = S.case_code(case, ctx)
local opts = S.case_opts(case, ctx, sink)
local t0 = core.hrtime()
local res, err, ecode = corral.run_python(code, opts)
local out = {
  res = res, err = err, code = ecode, elapsed = core.hrtime() - t0, controller_pid = core.getpid(),
  sink = { top = sink.top, uid = sink.uid, code_dir = sink.code_dir, strays = sink.strays,
           top_extra = sink.top_extra },
}
io.write(cjson.encode(out), "\n")
