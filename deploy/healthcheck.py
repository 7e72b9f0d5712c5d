"""Container health check for `corral serve`: GET /healthz, healthy on 200 only.

    python3 -I healthcheck.py [ADDRESS]

ADDRESS is what `corral serve --listen` takes: `unix:/path/to.sock` or `HOST:PORT`. Without it,
the address is the `--listen` of the container's first process (PID 1's command line: the image
runs `tini -- corral serve ...`, so whatever --listen the container was started with is checked),
else unix:/run/corral/corral.sock. A wildcard host (0.0.0.0, [::]) is checked on loopback.
/healthz needs no token (the controller exempts it from auth), so none is sent.

Exit 0: the controller answered 200. Exit 1: anything else (503 while it drains, no answer
within 2 seconds, nothing listening), with one line on stderr saying what. Standard library
only: the image has python3 for the sandboxed programs and no curl.
"""
import socket
import sys

DEFAULT = "unix:/run/corral/corral.sock"
TIMEOUT = 2.0


def listen_of_pid1():
    try:
        with open("/proc/1/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
    except OSError:
        return None
    if "serve" not in argv:
        return None
    for i, a in enumerate(argv):
        if a == "--listen" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--listen="):
            return a[len("--listen="):]
    return None


def connect(address):
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        s.connect(address[len("unix:"):])
        return s
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("not unix:PATH or HOST:PORT: " + address)
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "*"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


def main(argv):
    address = argv[1] if len(argv) > 1 else (listen_of_pid1() or DEFAULT)
    try:
        with connect(address) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            head = b""
            while b"\r\n" not in head and len(head) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
    except (OSError, ValueError) as e:
        sys.stderr.write("unhealthy: %s: %s\n" % (address, e))
        return 1
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status.split(" ", 2)
    if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1] == "200":
        return 0
    sys.stderr.write("unhealthy: %s answered %r\n" % (address, status or "nothing"))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
