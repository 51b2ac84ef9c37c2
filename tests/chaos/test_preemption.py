"""Chaos tier, part 1: SIGTERM, SIGINT and SIGUSR1 stop every rank at a step boundary with a checkpoint.

Each case signals a real 2-rank job through launch.sh and checks the exit code (75), the one line,
that the checkpoint it names is complete, that no process of the job is left, and (for two of
them) that --resume auto then logs exactly the losses of a run that was never interrupted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from corecpu.reliability.preempt import EXIT_STOPPED
from helpers.chaoslib import ROOT, TINY, complete_checkpoint, losses, rank_pids, run, start, survivors, wait_for_step

# 150 steps of 2 x batch 8 cross the epoch boundary at 125; the signal comes at step 10.
COMMON = [*TINY, "--max-steps", "150", "--log-every", "1", "--batch-size", "8"]
STOP_LINE = re.compile(r"stopped by (SIG\w+) at step (\d+); checkpoint (step-\d+) written; continue with --resume auto")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> list[tuple[int, float]]:
    job = run(tmp_path_factory.mktemp("straight"), 2, *COMMON, name="straight")
    return losses(job.out)


@pytest.mark.parametrize("target, sig, resume", [
    ("rank 1", signal.SIGTERM, True),     # scancel / eviction reaching one rank only
    ("launch.sh", signal.SIGUSR1, True),  # sbatch --signal=USR1@60
    ("launch.sh", signal.SIGINT, False),  # Ctrl-C
    ("launch.sh", signal.SIGTERM, False),  # kill PID of launch.sh
], ids=["term-rank1", "usr1-launch", "int-launch", "term-launch"])
def test_signal_stops_every_rank_with_a_checkpoint(tmp_path, straight, target, sig, resume):
    job = start(tmp_path, 2, *COMMON)
    wait_for_step(job, 10)
    pid = rank_pids(job.marker)[1] if target == "rank 1" else job.proc.pid
    os.kill(pid, sig)
    rc, _ = job.wait(timeout=120)
    text = job.text()
    assert rc == EXIT_STOPPED, text[-3000:]
    found = STOP_LINE.findall(text)
    assert len(found) == 1, text[-3000:]
    name, step, checkpoint = found[0][0], int(found[0][1]), found[0][2]
    assert name == sig.name and 10 <= step < 150 and checkpoint == f"step-{step:08d}"
    assert "Traceback" not in text and "BAD TERMINATION" not in text, text[-3000:]
    complete_checkpoint(job.out, step)
    assert survivors(job.marker, within=10) == {}
    assert [s for s, _ in losses(job.out)] == list(range(1, step + 1))  # every step up to the stop was logged
    if resume:
        resumed = run(tmp_path, 2, *COMMON, "--resume", "auto", name="run")
        assert f"(step {step})" in resumed.text()
        assert losses(job.out) == straight  # same steps, bit-identical losses


def test_second_signal_exits_at_once(tmp_path):
    """The first SIGTERM asks for a stop at the next step boundary; a step that never ends (a peer that
    never answers) must not keep a second SIGTERM from ending the process, even inside a C call."""
    code = ("import ctypes, sys; from corecpu.reliability import preempt; preempt.install(announce=True);"
            "print('ready', flush=True); libc = ctypes.CDLL(None)\n"
            "while True: libc.sleep(1000)  # a step that never reaches its boundary")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # the first signal only raised the flag
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert rc == 128 + signal.SIGTERM, err
    assert "SIGTERM received: stopping after this step" in err and "second SIGTERM: exiting now" in err, err


def test_duplicate_delivery_is_one_signal(tmp_path):
    # Slurm signals every process of a step and the launcher forwards the same signal: one preemption.
    code = ("import os, signal, time; from corecpu.reliability import preempt; preempt.install();"
            "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.3);"
            "print(preempt.stop_requested())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == str(int(signal.SIGTERM)), proc.stderr


def test_sigint_twice_ends_with_a_last_line_and_no_half_written_checkpoint(tmp_path):
    """Ctrl-C twice, 0.1 s apart (issue 30, case 7). Before: mpiexec.hydra's answer to the second was SIGKILL, so
    the job ended with 1, no line saying so, and rank 0's `.step-N.tmp-PID` left behind. Now the second reaches
    the ranks themselves as a second signal: they exit at once, removing a half-written checkpoint, and the last
    line says where a resume starts; or, when the save was already done, the job ends as a stop with it."""
    job = start(tmp_path, 2, *COMMON)
    wait_for_step(job, 5)
    os.kill(job.proc.pid, signal.SIGINT)
    time.sleep(0.1)
    os.kill(job.proc.pid, signal.SIGINT)
    rc, waited = job.wait(timeout=60)
    text = job.text()
    last = text.strip().splitlines()[-1]
    assert not [p.name for p in (job.out / "checkpoints").glob(".*")], "a temporary checkpoint was left behind"
    if rc == EXIT_STOPPED:
        stopped = STOP_LINE.search(last)
        assert stopped, text[-3000:]
        complete_checkpoint(job.out, int(stopped.group(2)))
    else:
        assert rc == 128 + signal.SIGINT, text[-3000:]
        assert re.fullmatch(r"corecpu: exited without saving; (last checkpoint step \d+|no checkpoint)", last), text
    assert "Traceback" not in text and "BAD TERMINATION" not in text, text[-3000:]
    assert waited < 15
    assert survivors(job.marker, within=10) == {}
