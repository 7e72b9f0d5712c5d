"""Drive `corral repl` under a pseudo-terminal, as a person at a terminal would, for spec/repl_spec.lua.

    python3 spec/repl_driver.py SCRIPT.json

SCRIPT: {"argv": [...], "cwd": DIR, "env": {...}, "steps": [...]}. argv runs as the session leader
of a new pseudo-terminal (its controlling terminal, in canonical mode with echo, as a shell leaves
it), so Ctrl-C typed there is SIGINT to its foreground process group. Each step is an object with
"op":
  expect  text [timeout]    read until the output since the last expect holds `text` ("\n"
                            matches the terminal's "\r\n")
  send    text              write `text` to the terminal (\x03 is Ctrl-C, \x04 Ctrl-D)
  busy    [cpu] [timeout]   wait until the command's descendants (the session's interpreter)
                            have used `cpu` seconds of CPU (default 0.5) since this step began:
                            a statement that spins is running
  wait    [timeout]         wait for the command to exit
Prints one JSON object: {"ok": bool, "failed": the step that did not happen (or null),
"output": everything the terminal showed, "status": the exit code (-N: signal N; null: still
running, then it is killed with SIGKILL)}.
"""
import json
import os
import pty
import select
import signal
import sys
import time


def descendants_cpu(root):
    # CPU seconds used so far by every descendant of root (from /proc: pid, ppid, utime, stime)
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        procs[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total = 0.0
    for pid, (ppid, cpu) in procs.items():
        p, seen = ppid, 0
        while p > 1 and seen < 64:
            if p == root:
                total += cpu
                break
            p = procs.get(p, (0, 0))[0]
            seen += 1
    return total


def main():
    script = json.load(open(sys.argv[1]))
    pid, master = pty.fork()
    if pid == 0:
        try:
            os.chdir(script.get("cwd", "."))
            os.execvpe(script["argv"][0], script["argv"], script.get("env", dict(os.environ)))
        finally:
            os._exit(127)
    out = bytearray()
    seen = 0
    status = None
    failed = None

    def pump(deadline):
        # read what the terminal shows until the deadline; False at its end (EIO: all closed)
        timeout = max(0.0, deadline - time.monotonic())
        r, _, _ = select.select([master], [], [], min(timeout, 0.2))
        if r:
            try:
                data = os.read(master, 65536)
            except OSError:
                return False
            if not data:
                return False
            out.extend(data)
        return True

    def reap(block):
        nonlocal status
        if status is not None:
            return True
        p, st = os.waitpid(pid, 0 if block else os.WNOHANG)
        if p == 0:
            return False
        status = os.waitstatus_to_exitcode(st)
        return True

    for step in script["steps"]:
        op = step["op"]
        deadline = time.monotonic() + step.get("timeout", 60)
        if op == "expect":
            # the terminal shows "\n" as "\r\n" (ONLCR): text is matched with "\n" line ends
            want = step["text"].encode()
            while True:
                shown = bytes(out).replace(b"\r\n", b"\n")
                at = shown.find(want, seen)
                if at >= 0:
                    seen = at + len(want)
                    break
                if time.monotonic() > deadline or not pump(deadline):
                    failed = step
                    break
        elif op == "send":
            os.write(master, step["text"].encode())
        elif op == "busy":
            start = descendants_cpu(pid)
            while descendants_cpu(pid) - start < step.get("cpu", 0.5):
                if time.monotonic() > deadline or not pump(min(deadline, time.monotonic() + 0.1)):
                    failed = step
                    break
        elif op == "wait":
            while not reap(False) and time.monotonic() < deadline:
                pump(deadline)
            if status is None:
                failed = step
        if failed:
            break
    # what is left to show
    end = time.monotonic() + 2
    while time.monotonic() < end and pump(end):
        pass
    if not reap(False):
        os.kill(pid, signal.SIGKILL)
        reap(True)
        status = None
    os.close(master)
    print(json.dumps({"ok": failed is None, "failed": failed,
                      "output": out.decode("utf-8", "replace"), "status": status}))


main()
