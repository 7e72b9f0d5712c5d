--- service: the default policy with maxima for a shared HTTP controller.
-- The default policy has no maxima: a caller of `corral serve` could ask for a day of wall time
-- or a terabyte of address space. Under this one a request over a maximum is refused with 400
-- "over_limit" naming the field (set `clamp = true` to lower it instead and list it in
-- `clamped`). Use it with `corral serve --policy examples/policies/service.lua`.
local policy = require "corral.policy"

return policy.load("default"):extend {
  name = "service",
  description = "default policy with maxima for a shared HTTP controller; requests over them are refused",
  maxima = {
    timeout = 30, cpu_seconds = 10, memory_mb = 512, file_mb = 16, processes = 64,
    open_files = 256,
    -- per stream: a response holds at most twice this, JSON-escaped
    max_output = 1048576,
  },
}
