--- datasets: the default policy, plus a read-only datasets directory the programs may read.
-- Landlock is required (a host without it refuses to run rather than expose every file), and
-- the directory is added to the default read list, not written over it: the interpreter's
-- files must stay readable. The directory comes from CORRAL_DATASETS in the controller's
-- environment (default /srv/datasets). Use it with
--   corral run --policy examples/policies/datasets.lua analysis.py
local policy = require "corral.policy"

local base = policy.load("default")
local dir = os.getenv("CORRAL_DATASETS") or "/srv/datasets"

local read = {}
for _, p in ipairs(base.fs_read) do read[#read + 1] = p end
read[#read + 1] = dir

return base:extend {
  name = "datasets",
  description = "default policy + read-only " .. dir .. "; Landlock required",
  filesystem = "require",
  fs_read = read,
}
