"""Runs a command as if the kernel's Landlock were older, absent or refusing (for
spec/landlock_spec.lua, which tests the launcher's degradations on a kernel that has it all).

usage: fake_landlock.py MODE[,MODE...] COMMAND [ARGS...]

MODE
  abi=N           landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) returns N:
                  a seccomp user notification, answered by this process; every other Landlock
                  call reaches the kernel, which accepts what an ABI N kernel would
  ENAME           every Landlock system call fails with errno ENAME (ENOSYS: a kernel built
                  without Landlock; EOPNOTSUPP: Landlock not enabled at boot)
  restrict=ENAME  only landlock_restrict_self fails with ENAME
Several modes, comma-separated, go into one filter (abi=3,restrict=EPERM).

The filter is a real seccomp filter (it also binds the command's children). Exits as COMMAND does.
"""
import ctypes
import errno
import os
import platform
import select
import socket
import struct
import sys

ARCH = {"x86_64": (0xC000003E, 317), "aarch64": (0xC00000B7, 277)}  # audit arch, seccomp(2)
LL_CREATE, LL_ADD, LL_RESTRICT = 444, 445, 446     # the same number on every architecture

BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
RET_ALLOW, RET_NOTIFY, RET_ERRNO = 0x7FFF0000, 0x7FC00000, 0x00050000
SET_MODE_FILTER, FLAG_NEW_LISTENER = 1, 1 << 3
PR_SET_NO_NEW_PRIVS = 38
NOTIF_SIZE, RESP_SIZE = 80, 24                  # struct seccomp_notif, seccomp_notif_resp
IOCTL_RECV = (3 << 30) | (NOTIF_SIZE << 16) | (ord("!") << 8) | 0
IOCTL_SEND = (3 << 30) | (RESP_SIZE << 16) | (ord("!") << 8) | 1

libc = ctypes.CDLL(None, use_errno=True)


class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def ins(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)


def program(arch, modes):
    """The filter's instructions: anything else, or another architecture, is allowed."""
    body = [ins(BPF_LD_W_ABS, 0)]                  # nr
    abi = None
    for mode in modes:
        if mode.startswith("abi="):
            abi = mode
            continue
        name = mode.split("=", 1)[-1]
        nrs = [LL_RESTRICT] if mode.startswith("restrict=") else [LL_CREATE, LL_ADD, LL_RESTRICT]
        for nr in nrs:
            body += [ins(BPF_JEQ_K, nr, 0, 1), ins(BPF_RET_K, RET_ERRNO | getattr(errno, name))]
    if abi:                                         # last: it loads args[2] over nr
        body += [
            ins(BPF_JEQ_K, LL_CREATE, 0, 3),
            ins(BPF_LD_W_ABS, 32),                 # low half of args[2]: flags
            ins(BPF_JEQ_K, 1, 0, 1),               # LANDLOCK_CREATE_RULESET_VERSION
            ins(BPF_RET_K, RET_NOTIFY),
        ]
    return [ins(BPF_LD_W_ABS, 4), ins(BPF_JEQ_K, arch, 0, len(body))] + body + \
        [ins(BPF_RET_K, RET_ALLOW)]


def install(nr_seccomp, code, notify):
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    blob = b"".join(code)
    prog = Prog(len(code), blob)
    fd = libc.syscall(nr_seccomp, SET_MODE_FILTER, FLAG_NEW_LISTENER if notify else 0,
                      ctypes.byref(prog))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
    return fd


def serve(lfd, abi):
    """Answer every version query with abi until no process uses the filter any more."""
    notif = ctypes.create_string_buffer(NOTIF_SIZE)
    poll = select.poll()
    poll.register(lfd, select.POLLIN)
    while True:
        for _, ev in poll.poll():
            if ev & select.POLLIN:
                ctypes.memset(notif, 0, NOTIF_SIZE)
                if libc.ioctl(lfd, IOCTL_RECV, notif) != 0:
                    continue                        # the caller died meanwhile
                nid = struct.unpack_from("=Q", notif.raw, 0)[0]
                resp = ctypes.create_string_buffer(struct.pack("=QqiI", nid, abi, 0, 0), RESP_SIZE)
                libc.ioctl(lfd, IOCTL_SEND, resp)
            elif ev & (select.POLLHUP | select.POLLERR):
                return


def main():
    modes, cmd = sys.argv[1].split(","), sys.argv[2:]
    arch, nr_seccomp = ARCH[platform.machine()]
    abi = [int(m[4:]) for m in modes if m.startswith("abi=")]
    notify = bool(abi)
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        fd = install(nr_seccomp, program(arch, modes), notify)
        if notify:
            socket.send_fds(child, [b"l"], [fd])
            os.close(fd)
        child.close()
        os.execv(cmd[0], cmd)
    child.close()
    if notify:
        _, fds, _, _ = socket.recv_fds(parent, 1, 1)
        if fds:
            serve(fds[0], abi[-1])
            os.close(fds[0])
    parent.close()
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status) % 256 if os.WIFEXITED(status)
             else 128 + os.WTERMSIG(status))


main()
