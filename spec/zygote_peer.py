"""A protocol peer for core.zygote's host side (spec/zygote_host_spec.lua): it speaks
corral-zygote's control protocol on fd 3 but, instead of forking a warm interpreter, execs
argv[1] with each request's arguments on the request's four fds. Also misbehaves on request:
a first argument of "--error" is answered with an error message, "--die" kills the peer,
"--slow-pid" delays the pid message; started with --fail-start, it fails at once. As for a
direct run of corral-zygote, "--pidfd" sends the process's pidfd with its pid message, and
"--ended=STATUS" does too, then says `ended ID STATUS` at once and never `exit` for it (a
zygote slow to reap it: the host must end the run when the process is gone)."""
import os, socket, sys, signal, select
s = socket.socket(fileno=3)
launcher = sys.argv[1]
if "--fail-start" in sys.argv:
    s.send(b"failed\0fatal no-network EPERM the peer was told to fail\0")
    sys.exit(1)
s.send(b"ready\0applied fake\0")
kids = {}
quiet = set()  # runs that got `ended`: no exit message
r, w = os.pipe(); os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGCHLD, lambda *a: None)
while True:
    rl, _, _ = select.select([s, r], [], [])
    if r in rl:
        os.read(r, 100)
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0: break
            rid = kids.pop(pid)
            if rid not in quiet:
                s.send(b"exit\0%s\0%d\0" % (rid, st))
    if s in rl:
        try:
            msg, fds, _, _ = socket.recv_fds(s, 65536, 8)
        except OSError:
            break
        if not msg: break
        parts = msg.split(b"\0")[:-1]
        if len(parts) > 2 and parts[2] == b"--die":
            os._exit(3)
        if len(parts) > 2 and parts[2] == b"--error":
            s.send(b"error\0%s\0refused by the peer\0" % parts[1]); [os.close(f) for f in fds]; continue
        if parts[0] != b"run" or len(fds) != 4:
            s.send(b"error\0%s\0bad request\0" % parts[1]); [os.close(f) for f in fds]; continue
        pid = os.fork()
        if pid == 0:
            # as corral-zygote's process A: its own session, and it dies with the zygote
            os.setsid()
            import ctypes; ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
            for i, f in enumerate(fds): os.dup2(f, i)
            for f in fds:
                if f > 3: os.close(f)
            args = [p.decode() for p in parts[2:]
                    if p not in (b"--slow-pid", b"--pidfd") and not p.startswith(b"--ended=")]
            os.execv(launcher, [launcher] + args)
        for f in fds: os.close(f)
        kids[pid] = parts[1]
        if len(parts) > 2 and parts[2] == b"--slow-pid":
            import time; time.sleep(0.3)
        ended = [p[8:] for p in parts[2:] if p.startswith(b"--ended=")]
        if b"--pidfd" in parts[2:] or ended:
            pidfd = os.pidfd_open(pid)
            socket.send_fds(s, [b"pid\0%s\0%d\0" % (parts[1], pid)], [pidfd])
            os.close(pidfd)
        else:
            s.send(b"pid\0%s\0%d\0" % (parts[1], pid))
        if ended:
            quiet.add(parts[1])
            s.send(b"ended\0%s\0%s\0" % (parts[1], ended[0]))
