"""Chaos tier, part 2: a stopped rank is named, and the job ends instead of waiting 30 minutes."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

from helpers.chaoslib import TINY, launch_env, rank_pids, start, survivors, wait_for_step


def listening_addresses(port: int) -> set[str]:
    """Addresses with a TCP socket in LISTEN state on `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(addr)
            if len(raw) == 4:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_sigstopped_rank_is_named_and_the_job_ends(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = start(tmp_path, 2, *TINY, "--max-steps", "100000", "--log-every", "1", "--batch-size", "8",
                "--step-timeout", "10", env=launch_env(MASTER_PORT=str(port)))
    wait_for_step(job, 5)
    # A local run's rendezvous store listens on loopback only, not on every interface.
    assert listening_addresses(port) == {"127.0.0.1"}
    os.kill(rank_pids(job.marker)[1], signal.SIGSTOP)
    rc, waited = job.wait(timeout=90)
    text = job.text()
    assert rc != 0, text[-3000:]
    named = re.findall(r"corecpu: error: rank 1 on (\S+) stopped responding at step (\d+); (\d+) s without progress",
                       text)
    assert len(named) == 1 and named[0][0] == socket.gethostname(), text[-3000:]
    assert int(named[0][1]) >= 5 and int(named[0][2]) >= 10
    assert survivors(job.marker, within=10) == {}
