"""Run a command under a container seccomp profile, loaded the way a container runtime loads it.

    python3 spec/seccomp_exec.py PROFILE.json [--runtime-default] -- COMMAND [ARGS...]

For spec/deploy_spec.lua: it shows, without Docker or a cluster, what corral can do inside a
container that uses deploy/k8s/seccomp-corral.json, and inside one that uses the runtime's
default profile (--runtime-default: the same file without the rules whose comment starts with
"corral:", which is the runtime default as applied to a container without capabilities).

The profile is read in the OCI runtime-spec format (defaultAction, defaultErrnoRet,
architectures, syscalls[].names/action/errnoRet/args), built with libseccomp as runc does
(names unknown on this architecture are skipped, arguments become libseccomp comparisons, a
MASKED_EQ takes `value` as the mask and `valueTwo` as the datum) and loaded with no_new_privs,
as for a container with allowPrivilegeEscalation false / no-new-privileges. Then COMMAND is
executed under it. Exit 125 when the profile cannot be built or loaded.
"""
import ctypes
import errno
import json
import os
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_KILL_THREAD = 0x00000000
SCMP_ACT_TRAP = 0x00030000
SCMP_ACT_LOG = 0x7FFC0000
OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4,
       "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
NR_SCMP_ERROR = -1


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def fail(msg):
    sys.stderr.write("seccomp_exec: " + msg + "\n")
    sys.exit(125)


def action(name, errno_ret):
    if name == "SCMP_ACT_ALLOW":
        return SCMP_ACT_ALLOW
    if name == "SCMP_ACT_ERRNO":
        return 0x00050000 | (errno.EPERM if errno_ret is None else errno_ret)
    if name == "SCMP_ACT_KILL_PROCESS":
        return SCMP_ACT_KILL_PROCESS
    if name in ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD"):
        return SCMP_ACT_KILL_THREAD
    if name == "SCMP_ACT_TRAP":
        return SCMP_ACT_TRAP
    if name == "SCMP_ACT_LOG":
        return SCMP_ACT_LOG
    fail("unsupported action " + name)
    return None


def main(argv):
    if len(argv) < 4 or "--" not in argv:
        fail("usage: seccomp_exec.py PROFILE [--runtime-default] -- COMMAND [ARGS...]")
    split = argv.index("--")
    opts, command = argv[1:split], argv[split + 1:]
    if not command:
        fail("no COMMAND")
    runtime_default = "--runtime-default" in opts
    with open(opts[0], encoding="utf-8") as f:
        profile = json.load(f)

    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]

    default = action(profile["defaultAction"], profile.get("defaultErrnoRet"))
    ctx = lib.seccomp_init(default)
    if not ctx:
        fail("seccomp_init failed")
    for arch in profile.get("architectures") or []:
        token = lib.seccomp_arch_resolve_name(arch.replace("SCMP_ARCH_", "").lower().encode())
        if token == 0:
            fail("unknown architecture " + arch)
        rc = lib.seccomp_arch_add(ctx, token)
        if rc not in (0, -errno.EEXIST):
            fail("seccomp_arch_add(%s): %s" % (arch, os.strerror(-rc)))

    for rule in profile["syscalls"]:
        if runtime_default and (rule.get("comment") or "").startswith("corral:"):
            continue
        act = action(rule["action"], rule.get("errnoRet"))
        args = rule.get("args") or []
        cmps = (ArgCmp * max(1, len(args)))()
        for i, a in enumerate(args):
            # for MASKED_EQ, libseccomp's datum_a is the mask: the profile's `value`
            cmps[i] = ArgCmp(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
        for name in rule["names"]:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == NR_SCMP_ERROR:
                continue  # not a system call of this architecture (runc skips it too)
            rc = lib.seccomp_rule_add_array(ctx, act, nr, len(args), cmps)
            # a rule whose action is the default's adds nothing; a name that exists only on
            # another architecture of the filter cannot be added here
            if rc not in (0, -errno.EACCES, -errno.EDOM, -errno.EEXIST):
                fail("rule %s: %s" % (name, os.strerror(-rc)))

    rc = lib.seccomp_load(ctx)
    if rc != 0:
        fail("seccomp_load: " + os.strerror(-rc))
    try:
        os.execvp(command[0], command)
    except OSError as e:
        fail("cannot execute %s: %s" % (command[0], e))


if __name__ == "__main__":
    main(sys.argv)
