"""Chaos tier, part 3: start-up never hangs, whatever is (or is not) at MASTER_ADDR:MASTER_PORT, whatever a rank
does during it, and `corecpu launch` ends the job when one rank fails (issue 30: before, Intel MPI's
mpiexec.hydra waited for every rank, and a failed rank's MPI_Finalize waited for the others, so a rank
killed or refusing during start-up left the job running for minutes and the launcher ignored SIGTERM)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers.chaoslib import ROOT, TINY, descendants, launch_env, rank_pids, start, survivors
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
    job = start(tmp_path, 2, *TINY, "--dist-timeout", "100", env=launch_env(MASTER_PORT=str(port)))
    rc, _ = job.wait(timeout=120)  # start-up (imports) plus a second or two: rank 1 does not wait its 100 s
    text = job.text()
    assert rc == 2, text[-3000:]
    assert text.count(f"corecpu: error: MASTER_PORT {port} is already in use on this host") == 1, text[-3000:]
    assert len(re.findall(r"corecpu: error: rank 0 \(pid \d+\) on \S+ failed during start-up \(its error is above\); "
                          r"corecpu launch ended the job", text)) == 1, text[-3000:]
    assert "frame #" not in text and "Traceback" not in text and "BAD TERMINATION" not in text, text[-3000:]
    assert not (job.out / "checkpoints").exists()
    assert survivors(job.marker, within=10) == {}


def test_a_rank_facing_a_foreign_listener_gives_up_in_one_line(foreign_listener):
    proc = rank_alone("--dist-timeout", "3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(foreign_listener))
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert line.startswith(f"corecpu: error: rank 1 reached 127.0.0.1:{foreign_listener} but no corecpu rank 0 "
                           "answered there within 3s: another program may be listening on MASTER_PORT"), line


def first_rank(job, rank: int, timeout: float = 120) -> int:
    """The PID of `rank`'s train.py as soon as it exists (the job still starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (pid := rank_pids(job.marker).get(rank)) is not None:
            return pid
        assert job.proc.poll() is None, job.text()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no rank {rank} within {timeout:g}s")


def job_processes(job) -> list[int]:
    """Every process below launch.sh: mpirun, mpiexec.hydra, hydra_pmi_proxy (no marker on its command line), ranks."""
    return [p for p in descendants(job.proc.pid) if p != job.proc.pid]


def alive(pids: list[int]) -> list[str]:
    left = []
    for pid in pids:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                left.append(open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:120])
        except OSError:
            pass
    return left


def test_rank_0_killed_during_start_up_is_named_and_the_job_ends(tmp_path):
    job = start(tmp_path, 2, *TINY, "--dist-timeout", "100")
    victim = first_rank(job, 0)
    time.sleep(1.0)  # importing, or waiting for rank 1: before the process group either way
    everyone = job_processes(job)
    os.kill(victim, signal.SIGKILL)
    rc, waited = job.wait(timeout=60)  # before: hydra waited for rank 1 (its 100 s, then MPI_Finalize for ever)
    text = job.text()
    assert rc == 128 + signal.SIGKILL, text[-3000:]
    assert re.findall(r"corecpu: error: rank (\d) \(pid (\d+)\) on \S+ was killed by SIGKILL during start-up; "
                      r"corecpu launch ended the job", text) == [("0", str(victim))], text[-3000:]
    assert "BAD TERMINATION" not in text and "Traceback" not in text, text[-3000:]
    assert waited < 30
    assert survivors(job.marker, within=10) == {} and alive(everyone) == []


def test_sigterm_during_start_up_ends_the_launcher_within_10s(tmp_path):
    job = start(tmp_path, 2, *TINY, "--dist-timeout", "100")
    os.kill(first_rank(job, 0), signal.SIGSTOP)  # rank 0 never answers: rank 1 waits in its rendezvous
    first_rank(job, 1)
    time.sleep(3.0)
    everyone = job_processes(job)
    os.kill(job.proc.pid, signal.SIGTERM)  # as `timeout` does
    rc, waited = job.wait(timeout=60)  # before: forwarded, then ignored until SIGKILL; four processes orphaned
    text = job.text()
    assert waited < 10, text[-3000:]
    assert rc == 128 + signal.SIGTERM, text[-3000:]
    assert text.splitlines()[-1] == "corecpu: stopped by SIGTERM during start-up; nothing to save", text[-3000:]
    assert survivors(job.marker, within=10) == {} and alive(everyone) == []  # the stopped rank 0 too


def test_research_loop_error_on_rank_1_is_named_by_the_launcher(tmp_path):
    script = str(ROOT / "tests" / "helpers" / "workers" / "raise_at_step.py")
    job = start(tmp_path, 2, script)
    rc, _ = job.wait(timeout=120)
    text = job.text()
    assert rc == 1, text[-3000:]
    assert "RuntimeError: research bug: a NaN check failed on rank 1" in text, text[-3000:]  # its traceback
    # The report rank 0's lost-peer line promises (when rank 0 gets to print one): rank, exception, step.
    assert re.findall(r"corecpu: error: rank 1 \(pid \d+\) on \S+ failed at step 5: RuntimeError: research bug: "
                      r"a NaN check failed on rank 1; corecpu launch ended the job", text), text[-3000:]
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
