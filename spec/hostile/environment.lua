--- Hostile cases: the environment. The program's environment is exactly the policy's; a secret in
-- the controller's environment is nowhere the program can look. See spec/hostile_spec.lua.
local assert = require "luassert"

-- Everything the program can read about environments and command lines: its own, and every
-- process in sight, the controller's (by pid) included.
local function snoop(ctx)
  return string.format([[
import os
CTRL = %d
print("environ", sorted(os.environ.items()))
try:
    print("proc self", open("/proc/self/environ", "rb").read())
    in_sight = [p for p in os.listdir("/proc") if p.isdigit()]
except PermissionError as e:
    print("proc denied", e.errno)    # the host's /proc under Landlock: none of it in reach
    in_sight = []
# with a pid namespace, every process in sight; without one, the host's are too many to print
pids = sorted(set((in_sight if len(in_sight) < 50 else []) + [str(CTRL), "1", str(os.getpid())]))
for pid in pids:
    for entry in ("environ", "cmdline"):
        try:
            print(pid, entry, open("/proc/%%s/%%s" %% (pid, entry), "rb").read())
        except OSError as e:
            print(pid, entry, "denied", e.errno)
]], ctx.controller_pid)
end

local function no_secret(r, ctx)
  assert.is_truthy(ctx.secret and #ctx.secret > 10)
  assert.is_falsy(r.stdout:find(ctx.secret, 1, true), "the controller's secret is in the program's reach")
  assert.is_falsy(r.stderr:find(ctx.secret, 1, true), "the controller's secret is in the program's reach")
end

return {
  {
    name = "the environment is exactly PATH, LANG, HOME and TMPDIR, in os.environ and /proc/self/environ",
    code = [[
import os, json
print(json.dumps(dict(os.environ), sort_keys=True))
raw = open("/proc/self/environ", "rb").read().split(b"\0")
print(json.dumps(sorted(x.decode() for x in raw if x)))
print("cwd", os.getcwd())
]],
    opts = { timeout = 2 },
    expect = { reason = "exit", returncode = 0 },
    -- /proc/self/environ: Landlock grants /proc only when it is the run's own
    needs = { "empty-env", "private-proc" },
    check = function(r)
      local env_line, raw_line, cwd = r.stdout:match("^([^\n]*)\n([^\n]*)\ncwd ([^\n]*)\n$")
      assert.is_truthy(env_line, r.stdout)
      local expected = string.format('{"HOME": "%s", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin", "TMPDIR": "%s"}', cwd, cwd)
      assert.are.equal(expected, env_line)
      assert.are.equal(string.format('["HOME=%s", "LANG=C.UTF-8", "PATH=/usr/bin:/bin", "TMPDIR=%s"]', cwd, cwd), raw_line)
    end,
  },
  {
    name = "a secret in the controller's environment is not in any environ or cmdline in sight",
    controller = "child",
    code = snoop,
    opts = { timeout = 3, max_output = 200000 },
    expect = { reason = "exit", returncode = 0, stdout = "1 environ denied 13" },
    needs = { "pid-namespace", "private-proc" },
    check = no_secret,
  },
  {
    name = "without a pid namespace, the controller's environment is still out of reach",
    -- As root the run's uid cannot read root's /proc/PID/environ. As nobody the run shares the
    -- controller's uid, but sits in a user namespace of its own (for its network namespace), and
    -- ptrace access (which /proc/PID/environ needs) does not reach into a parent user namespace.
    variant = "no-pidns",
    prologue = false,    -- without a pid namespace there is no mount namespace: no private /tmp
    controller = "child",
    code = snoop,
    opts = { timeout = 3, max_output = 200000 },
    expect = { reason = "exit", returncode = 0 },
    check = no_secret,
  },
  {
    name = "with no namespace at all, the controller's environment is still out of reach",
    -- As nobody with user_namespace = "never" nothing separates the run from its controller but
    -- Landlock: a sandboxed process may not ptrace (nor read /proc/PID/environ of) a process
    -- outside its domain. Without it the secret is read: the library, unlike the CLI, leaves the
    -- controller dumpable. As root the run uid alone keeps it out.
    variant = "bare",
    prologue = false,
    controller = "child",
    code = snoop,
    opts = { timeout = 3, max_output = 200000 },
    expect = { reason = "exit", returncode = 0 },
    needs = { "filesystem" },
    check = no_secret,
  },
}
