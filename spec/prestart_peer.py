"""A launch started ahead, driven as the host drives it: corral-launch --prestart with the report
socket, the program a shell that writes MARKER. Prints whether MARKER exists before the host's
byte and after it, and whether the report says the PID namespace was refused.

    python3 spec/prestart_peer.py LAUNCHER MARKER
"""
import os
import socket
import subprocess
import sys
import time

launcher, marker = sys.argv[1], sys.argv[2]
host, ours = socket.socketpair()
fd = ours.fileno()
p = subprocess.Popen([launcher, "--report-fd", str(fd), "--pidns", "--prestart", "--", "/bin/sh", "-c",
                      "echo ran > " + marker], pass_fds=[fd])
ours.close()
# long enough for a program started at once to have run
time.sleep(1.0)
print("before the byte:", os.path.exists(marker))
try:
    host.send(b"x")
except OSError as e:
    print("send:", e.strerror)
p.wait(timeout=30)
print("after the byte:", os.path.exists(marker))
host.settimeout(5)
report = b""
try:
    while True:
        d = host.recv(65536)
        if not d:
            break
        report += d
except OSError:
    pass
print("pid-namespace refused:", b"refused pid-namespace" in report)
