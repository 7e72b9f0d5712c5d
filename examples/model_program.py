# A program of the kind a language model writes when asked for "the first primes, some
# statistics about them, and a check that the sandbox really is one".
import json
import os
import socket
import statistics
import sys


def primes(n):
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(sieve[i * i::i]))
    return [i for i, v in enumerate(sieve) if v]


ps = primes(100_000)
print(f"{len(ps)} primes below 100000; the last five: {ps[-5:]}")
gaps = [b - a for a, b in zip(ps, ps[1:])]
print(f"mean gap {statistics.mean(gaps):.3f}, largest gap {max(gaps)}")

# What the sandbox looks like from inside
print("environment:", json.dumps(dict(os.environ), sort_keys=True))
print("working directory is empty:", os.listdir(".") == [])
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1)
    print("network: reachable")
except OSError as e:
    print("network: unreachable:", e.strerror or e)
print("pid inside the sandbox:", os.getpid())
sys.exit(0)
