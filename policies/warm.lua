--- warm: default's sandbox, with each run forked from a pre-started interpreter.
-- The zygote (corral-zygote) starts once per controller, makes the long-lived namespaces (the
-- network one, and the user one where that needs it), initialises Python as `python3 -I` would
-- and imports the modules below. Each run is then a fork of it that gets, as under `default`,
-- its own PID, mount and IPC namespaces, scratch mounts, work dir, rlimits, uid, Landlock
-- domain, seccomp filter, budgets and kill. Runs are not forked from one another, so nothing
-- passes between them. Trade-offs: concurrent runs share the zygote's network namespace, where
-- they still cannot meet: its only interface is a loopback that is down (no inet packet goes
-- anywhere) and Landlock scopes abstract unix sockets to the run that made them (where Landlock
-- cannot scope, ABI < 6 or gVisor, each run gets a network namespace of its own inside the
-- zygote's, as a cold run does); the preloaded modules are already in sys.modules when a program
-- starts; all runs of one zygote share Python's string-hash seed.
local policy = require "corral.policy"

return policy.load("default"):extend {
  name = "warm",
  description = "default's sandbox, each run forked from a pre-started interpreter (zygote)",
  warm = {
    -- what model-written programs import most; each module makes the interpreter every run's
    -- program is forked from bigger, and a fork of a bigger process costs more (on the 2-CPU
    -- development VM, make bench-zygote: 3.0 ms a run with none of these, 4.2 ms with them;
    -- numpy as well, policy warm-numpy: about 2.5 ms more)
    preload = {
      "json", "re", "collections", "datetime", "decimal", "fractions", "statistics", "csv", "email",
      "math", "itertools", "functools",
      -- not the session kernel's modules (ast, traceback...): its start would be shorter, but
      -- a kernel started ahead, the usual case, then answers its cells later (the modules' pages
      -- are copied from the zygote at their first use in it), and threading alone makes every
      -- run cost more CPU
    },
  },
}
