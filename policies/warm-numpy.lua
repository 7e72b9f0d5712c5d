--- warm-numpy: warm, with numpy imported by the interpreter every run is forked from.
-- For code interpreters whose programs use numpy: importing it costs a fresh python3 about 60 ms
-- (the 2-CPU development VM), a run forked from an interpreter that has it nothing. The price is
-- a bigger interpreter, so that every run, numpy or not, costs more than under `warm` (print:
-- about 4.6 ms a run against 3.3 ms). numpy.random's global generator is reseeded in each run
-- (the zygote does it after the fork, as Python's own random does), so runs do not draw the same
-- numbers. BLAS libraries that start threads are kept to one: the zygote refuses to fork threads,
-- and each run's processes are bounded (RLIMIT_NPROC). Without numpy installed (Debian:
-- python3-numpy), this is `warm`, and the zygote's ready message says `preload-failed numpy`.
local policy = require "corral.policy"

local warm = policy.load("warm")
local preload = {}
for i, m in ipairs(warm.warm.preload) do preload[i] = m end
preload[#preload + 1] = "numpy"
local env = {}
for k, v in pairs(warm.env or {}) do env[k] = v end
env.OPENBLAS_NUM_THREADS = "1"
env.OMP_NUM_THREADS = "1"
env.MKL_NUM_THREADS = "1"

return warm:extend {
  name = "warm-numpy",
  description = "warm, with numpy preloaded in the interpreter every run is forked from",
  env = env,
  warm = { preload = preload },
}
