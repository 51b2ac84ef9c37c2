"""Chaos tier, part 3: start-up never hangs, whatever is (or is not) at MASTER_ADDR:MASTER_PORT."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from helpers.chaoslib import ROOT, TINY, launch_env, start, survivors
from helpers.common import free_port

RANK1_OF_2 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


@pytest.fixture
def foreign_listener():
    """Another program on a port: accepts connections and never says a word."""
    code = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
            "s.bind(('0.0.0.0', 0)); s.listen(); print(s.getsockname()[1], flush=True); conns = []\n"
            "while True: conns.append(s.accept())")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def rank_alone(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", **RANK1_OF_2, **env})


def one_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_port_taken_by_a_foreign_listener_ends_every_rank(tmp_path, foreign_listener):
    port = foreign_listener
    job = start(tmp_path, 2, *TINY, "--dist-timeout", "10", env=launch_env(MASTER_PORT=str(port)))
    rc, _ = job.wait(timeout=120)  # start-up (imports) plus 10 s plus a few: never the 200 s + of before
    text = job.text()
    assert rc == 2, text[-3000:]
    assert text.count(f"corecpu: error: MASTER_PORT {port} is already in use on this host") == 1, text[-3000:]
    assert len(re.findall(rf"corecpu: error: rank 1 reached 127\.0\.0\.1:{port} but no corecpu rank 0 answered "
                          r"there within 10s: another program may be listening on MASTER_PORT", text)) == 1, text
    assert "frame #" not in text and "Traceback" not in text, text[-3000:]
    assert not (job.out / "checkpoints").exists()
    assert survivors(job.marker, within=10) == {}


def test_unreachable_rank_0_is_one_attempt_one_line():
    port = free_port()
    t0 = time.monotonic()
    proc = rank_alone("--dist-timeout", "5", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert line.startswith(f"corecpu: error: rank 1 could not reach rank 0 at 127.0.0.1:{port} within 5s "
                           "(connection refused: nothing listens there)"), line
    assert time.monotonic() - t0 < 120


def test_unresolvable_master_addr_is_named():
    proc = rank_alone("--dist-timeout", "5", MASTER_ADDR="no-such-host.invalid", MASTER_PORT=str(free_port()))
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert line.startswith("corecpu: error: MASTER_ADDR 'no-such-host.invalid' does not resolve"), line


def test_launch_sh_picks_a_free_port_on_one_host(foreign_listener):
    env = launch_env()
    env.pop("MASTER_PORT", None)
    ports = set()
    for _ in range(2):
        dry = subprocess.run(["bash", str(ROOT / "launch.sh"), "2", "--dry-run"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0, dry.stderr
        ports |= {int(p) for p in re.findall(r"export MASTER_PORT=(\d+)", dry.stdout)}
    assert ports and foreign_listener not in ports
    for port in ports:  # each was free when chosen, and is free again (nothing holds it)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
