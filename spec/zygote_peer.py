"""A protocol peer for core.zygote's host side (spec/zygote_host_spec.lua): it speaks
corral-zygote's control protocol on fd 3 but, instead of forking a warm interpreter, execs
argv[1] with each request's arguments on the request's four fds. Also misbehaves on request:
a first argument of "--error" is answered with an error message, "--die" kills the peer,
"--slow-pid" delays the pid message; started with --fail-start, it fails at once."""
import os, socket, sys, signal, select
s = socket.socket(fileno=3)
launcher = sys.argv[1]
if "--fail-start" in sys.argv:
    s.send(b"failed\0fatal no-network EPERM the peer was told to fail\0")
    sys.exit(1)
s.send(b"ready\0applied fake\0")
kids = {}
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
            s.send(b"exit\0%s\0%d\0" % (kids.pop(pid), st))
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
            args = [p.decode() for p in parts[2:] if p != b"--slow-pid"]
            os.execv(launcher, [launcher] + args)
        for f in fds: os.close(f)
        kids[pid] = parts[1]
        if len(parts) > 2 and parts[2] == b"--slow-pid":
            import time; time.sleep(0.3)
        s.send(b"pid\0%s\0%d\0" % (parts[1], pid))
