"""What a fake host's link really carries: `serve ADDR` in one host, `probe ADDR PORT` in another.

The probe sends for 2 s over one TCP connection and reads the server's byte count (one-way throughput),
then times 300 one-byte round trips (median). On a small machine the CPU, not the shaper, can cap the
throughput, so benchmarks/cluster.py reports what was measured beside the rate it asked for.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import sys
import time

SECONDS, PINGS, CHUNK = 2.0, 300, 1 << 20


def serve(addr: str) -> None:
    with socket.create_server((addr, 0)) as s:
        print(s.getsockname()[1], flush=True)
        s.settimeout(30)
        c, _ = s.accept()
        with c:
            total = 0
            while (size := struct.unpack("!Q", _exact(c, 8))[0]) > 0:  # bulk phase: length-prefixed blocks
                total += len(_exact(c, size))
            c.sendall(struct.pack("!Q", total))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while (b := c.recv(1)) and b != b"q":  # ping-pong phase
                c.sendall(b)


def _exact(c: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        got = c.recv(min(left, CHUNK))
        if not got:
            raise ConnectionError("peer closed")
        parts.append(got)
        left -= len(got)
    return b"".join(parts)


def probe(addr: str, port: int) -> dict[str, float]:
    block = b"\0" * CHUNK
    with socket.create_connection((addr, port), timeout=30) as c:
        start = time.perf_counter()
        while time.perf_counter() - start < SECONDS:
            c.sendall(struct.pack("!Q", CHUNK) + block)
        c.sendall(struct.pack("!Q", 0))
        total = struct.unpack("!Q", _exact(c, 8))[0]  # arrives once the server has read everything
        seconds = time.perf_counter() - start
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t = time.perf_counter()
            c.sendall(b"p")
            _exact(c, 1)
            rtts.append(time.perf_counter() - t)
        c.sendall(b"q")
    return {"gbit_s": total * 8 / seconds / 1e9, "rtt_us": 1e6 * statistics.median(rtts)}


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        print(json.dumps(probe(sys.argv[2], int(sys.argv[3]))))
