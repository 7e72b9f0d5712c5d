"""Drive corral-zygote through its control protocol, for spec/zygote_spec.lua and bench/zygote.lua.

    python3 spec/zygote_driver.py SCRIPT.json

SCRIPT: {"zygote": [argv with "{ctl}" for the control fd], "steps": [...]}. The zygote starts with an
empty environment, its control socket on a SOCK_SEQPACKET socketpair. Each step is an object with
"op":
  ready                     wait for the ready message
  run   id args [stdin]     send `run` with four fresh pipes (stdin gets the bytes, then EOF)
  await_exit [timeout]      the zygote exits by itself (EOF without our closing the socket)
  kill_spawner              SIGKILL to the zygote's corral-spawner child
  maps                      the memory maps of the zygote and of its spawner
  wait  [ids] [timeout] [eof]
                            until those runs (default: all) have their exit (or error) and EOF on
                            their pipes (eof: EOF alone)
  kill  id sig              once the run's pid is known, send it sig
  raw   fields nfds         send a message of these fields with nfds fds (/dev/null); wait for
                            the answer
  close                     shut the control socket; wait for the zygote to exit
  signal sig                send the zygote sig; wait for it to exit
  hang                      print the pids and sleep (the spec kills this driver)
  bare  argv n              spawn argv n times (posix_spawn), stdout to /dev/null: wall times
  bench n cases             n rounds of the cases, interleaved; a case is {name, argv} (bare, as
                            above) or {name, args[, new_filter]} (a run: from `run` sent to `exit`
                            received; new_filter: a deny list never seen, the filter is built)
  sleep s
Events are printed as JSON lines: ready, run (per run: pid, status, stdout, stderr, report (those
three in hex), error, times; for a direct run, ended (its status in the ended message, before
exit) and pidfd_pid (the pid its pid message's fd is a pidfd of)), message (anything unexpected), exit (the zygote's), times; the last line is {"event": "done"}.
"""
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def spawners(zygote):
    """The pids of the zygote's children named corral-spawner (spawner.c)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name == "corral-spawner" and int(rest[1]) == zygote:
            found.append(int(pid))
    return found


class Run:
    def __init__(self, rid):
        self.id = rid
        self.pid = None
        self.pidfd_pid = None
        self.ended = None
        self.status = None
        self.error = None
        self.out = {"stdout": b"", "stderr": b"", "report": b""}
        self.open = 0
        self.t_send = None
        self.t_pid = None
        self.t_exit = None
        self.reported = False

    def done(self):
        return (self.status is not None or self.error is not None) and self.open == 0

    def event(self):
        return {
            "event": "run", "id": self.id, "pid": self.pid, "status": self.status,
            "error": self.error, "ended": self.ended, "pidfd_pid": self.pidfd_pid,
            # hex: the bytes as they came
            "stdout": self.out["stdout"].hex(),
            "stderr": self.out["stderr"].hex(),
            "report": self.out["report"].hex(),
            "wall": (self.t_exit - self.t_send) if self.t_exit else None,
        }


class Driver:
    def __init__(self, argv):
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [a.replace("{ctl}", str(child.fileno())) for a in argv]
        self.proc = subprocess.Popen(argv, pass_fds=[child.fileno()], env={},
                                     stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        child.close()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, ("ctl", None))
        self.runs = {}
        self.ready = None
        self.eof = False
        self.unexpected = 0

    def message(self, fields, fds=()):
        kind = fields[0] if fields else ""
        if kind == "ready" or kind == "failed":
            self.ready = fields
            emit({"event": "ready", "fields": fields})
            return
        if kind in ("pid", "ended", "exit", "error") and len(fields) == 3 and fields[1] in self.runs:
            r = self.runs[fields[1]]
            if kind == "pid":
                r.pid = int(fields[2])
                r.t_pid = time.monotonic()
                for fd in fds:
                    with open("/proc/self/fdinfo/%d" % fd) as f:
                        for line in f:
                            if line.startswith("Pid:"):
                                r.pidfd_pid = int(line.split()[1])
            elif kind == "ended":
                if r.status is not None:
                    self.unexpected += 1
                    emit({"event": "message", "fields": fields, "why": "ended after exit"})
                r.ended = int(fields[2])
            elif kind == "exit":
                r.status = int(fields[2])
                r.t_exit = time.monotonic()
            else:
                r.error = fields[2]
            return
        self.unexpected += 1
        emit({"event": "message", "fields": fields})

    def pump(self, timeout):
        for key, _ in self.sel.select(timeout):
            what, run = key.data
            if what == "ctl":
                fds = []
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 4)
                except ConnectionResetError:
                    data = b""
                if not data:
                    self.sel.unregister(self.sock)
                    self.eof = True
                    continue
                self.message([f.decode("utf-8", "replace") for f in data.split(b"\0")[:-1]], fds)
                for fd in fds:
                    os.close(fd)
            else:
                data = os.read(key.fd, 65536)
                if data:
                    run.out[what] += data
                else:
                    self.sel.unregister(key.fd)
                    os.close(key.fd)
                    run.open -= 1

    def send_run(self, rid, args, stdin=None):
        r = Run(rid)
        self.runs[rid] = r
        ends = []
        # no stdin: /dev/null, as the host module gives a launcher
        ins = os.pipe() if stdin is not None else (os.open("/dev/null", os.O_RDONLY), None)
        for name in ("stdout", "stderr", "report"):
            rd, wr = os.pipe()
            self.sel.register(rd, selectors.EVENT_READ, (name, r))
            r.open += 1
            ends.append(wr)
        msg = b"\0".join([b"run", rid.encode()] + [os.fsencode(a) for a in args]) + b"\0"
        r.t_send = time.monotonic()
        socket.send_fds(self.sock, [msg], [ins[0]] + ends)
        os.close(ins[0])
        for fd in ends:
            os.close(fd)
        if ins[1] is not None:
            os.write(ins[1], stdin.encode())
            os.close(ins[1])
        return r

    def wait(self, ids, timeout, eof=False):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.runs[i].open == 0 if eof else self.runs[i].done() for i in ids):
                break
            self.pump(0.05)
        for i in ids:
            r = self.runs[i]
            if not r.reported:
                r.reported = True
                ev = r.event()
                ev["timed_out"] = not r.done()
                emit(ev)

    def close(self, timeout=10):
        self.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self.pump(0.05)
        try:
            status = self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            status = None
        err = self.proc.stderr.read().decode("utf-8", "replace") if status is not None else ""
        emit({"event": "exit", "status": status, "stderr": err})


def bare(argv, n):
    times = []
    null = os.open("/dev/null", os.O_WRONLY)
    for _ in range(n):
        t0 = time.monotonic()
        pid = os.posix_spawn(argv[0], argv, {}, file_actions=[(os.POSIX_SPAWN_DUP2, null, 1)])
        os.waitpid(pid, 0)
        times.append(time.monotonic() - t0)
    os.close(null)
    return times


def main():
    with open(sys.argv[1]) as f:
        script = json.load(f)
    d = Driver(script["zygote"])
    seq = 0
    for step in script["steps"]:
        op = step["op"]
        if op == "ready":
            deadline = time.monotonic() + step.get("timeout", 20)
            while d.ready is None and not d.eof and time.monotonic() < deadline:
                d.pump(0.05)
            if d.ready is None:
                emit({"event": "ready", "fields": None})
        elif op == "run":
            d.send_run(str(step["id"]), step["args"], step.get("stdin"))
        elif op == "wait":
            d.wait([str(i) for i in step.get("ids", list(d.runs))], step.get("timeout", 30),
                   step.get("eof", False))
        elif op == "kill":
            r = d.runs[str(step["id"])]
            deadline = time.monotonic() + 10
            while r.pid is None and r.error is None and time.monotonic() < deadline:
                d.pump(0.02)
            if step.get("delay"):
                end = time.monotonic() + step["delay"]
                while time.monotonic() < end:
                    d.pump(0.02)
            if r.pid:
                os.kill(r.pid, step["sig"])
        elif op == "raw":
            fields = [os.fsencode(x) for x in step["fields"]]
            data = b"\0".join(fields) + (b"\0" if fields and step.get("terminate", True) else b"")
            fds = [os.open("/dev/null", os.O_RDWR) for _ in range(step.get("nfds", 0))]
            if fds:
                socket.send_fds(d.sock, [data], fds)
            else:
                d.sock.send(data)
            for fd in fds:
                os.close(fd)
            # until the answer (any message not about a run) comes
            deadline = time.monotonic() + step.get("timeout", 5)
            seen = d.unexpected
            while time.monotonic() < deadline and d.unexpected == seen:
                d.pump(0.05)
        elif op == "kill_spawner":
            for pid in spawners(d.proc.pid):
                os.kill(pid, signal.SIGKILL)
                emit({"event": "spawner-killed", "pid": pid})
        elif op == "maps":
            # the memory maps of the zygote and of its spawner
            # (both are not dumpable: only root may read them)
            for who, pid in [("zygote", d.proc.pid)] + [("spawner", p) for p in spawners(d.proc.pid)]:
                try:
                    with open("/proc/%d/maps" % pid) as f:
                        emit({"event": "maps", "who": who, "pid": pid, "maps": f.read()})
                except OSError as e:
                    emit({"event": "maps", "who": who, "pid": pid, "error": e.strerror})
        elif op == "await_exit":
            # the zygote ends by itself: its socket reaches EOF without our closing it
            deadline = time.monotonic() + step.get("timeout", 10)
            while not d.eof and time.monotonic() < deadline:
                d.pump(0.05)
            status = None
            if d.eof:
                try:
                    status = d.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            emit({"event": "exit", "status": status, "stderr": ""})
            d.close(1)
        elif op == "close":
            d.close(step.get("timeout", 10))
        elif op == "signal":
            d.proc.send_signal(step["sig"])
            try:
                status = d.proc.wait(step.get("timeout", 10))
            except subprocess.TimeoutExpired:
                status = None
            emit({"event": "exit", "status": status, "stderr": ""})
        elif op == "hang":
            emit({"event": "hang", "driver": os.getpid(), "zygote": d.proc.pid})
            signal.pause()
        elif op == "bare":
            emit({"event": "times", "name": step.get("name", "bare"),
                  "times": bare(step["argv"], step["n"])})
        elif op == "bench":
            times = {c["name"]: [] for c in step["cases"]}
            cases = step["cases"]
            for i in range(step["n"]):
                # each round in another order: no case always follows the same one
                for c in cases[i % len(cases):] + cases[:i % len(cases)]:
                    if "argv" in c:
                        times[c["name"]] += bare(c["argv"], 1)
                        continue
                    seq += 1
                    rid = str(1000000 + seq)
                    args = c["args"]
                    if c.get("new_filter"):
                        # a deny list never seen: the filter is built for this run
                        k = args.index("--seccomp") + 2
                        args = args[:k] + ["--deny-syscall", "nosuchcall%d" % seq] + args[k:]
                    r = d.send_run(rid, args)
                    deadline = time.monotonic() + 30
                    while not r.done() and time.monotonic() < deadline:
                        d.pump(1)
                    if r.status != 0 or r.error:
                        emit({"event": "message", "fields": ["bench run failed", str(r.status), str(r.error),
                                                             r.out["stderr"].decode("utf-8", "replace")]})
                    else:
                        times[c["name"]].append(r.t_exit - r.t_send)
                    del d.runs[rid]
            for name, t in times.items():
                emit({"event": "times", "name": name, "times": t})
        elif op == "sleep":
            end = time.monotonic() + step["s"]
            while time.monotonic() < end:
                d.pump(0.02)
    emit({"event": "done"})


if __name__ == "__main__":
    main()
