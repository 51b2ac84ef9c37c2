"""Chaos tier: a launcher killed outright (SIGKILL) takes every rank with it, under mpirun and torchrun."""

from __future__ import annotations

import os
import signal

from helpers.chaoslib import TINY, launcher_pid, processes, rank_pids, start, survivors, wait_for_step

LONG = [*TINY, "--max-steps", "100000", "--log-every", "1", "--batch-size", "8"]


def test_sigkill_of_launch_sh_leaves_no_orphans(tmp_path):
    job = start(tmp_path, 2, *LONG)
    wait_for_step(job, 3)
    assert len(rank_pids(job.marker)) == 2
    os.kill(job.proc.pid, signal.SIGKILL)
    job.wait(timeout=10)
    # mpirun (a shell script) and mpiexec.hydra lose their parent; the ranks watch launch.sh and go.
    assert survivors(job.marker, within=20) == {}


def test_sigkill_of_torchrun_agent_leaves_no_orphans(tmp_path):
    job = start(tmp_path, 2, "--launcher", "torchrun", *LONG)
    wait_for_step(job, 3)
    ranks = rank_pids(job.marker)
    assert len(ranks) == 2, processes(job.marker)
    os.kill(launcher_pid(job.marker, "torchrun"), signal.SIGKILL)
    # PR_SET_PDEATHSIG (set by corecpu.bind before exec) kills each rank with its agent.
    assert survivors(job.marker, within=20) == {}
    rc, _ = job.wait(timeout=10)
    assert rc != 0


def test_sigterm_of_torchrun_launch_stops_ranks_with_a_checkpoint(tmp_path):
    job = start(tmp_path, 2, "--launcher", "torchrun", *LONG)
    wait_for_step(job, 3)
    os.kill(job.proc.pid, signal.SIGTERM)
    rc, _ = job.wait(timeout=120)
    text = job.text()
    assert rc != 0 and "stopped by SIGTERM at step" in text, text[-3000:]
    assert any((job.out / "checkpoints").glob("step-*/meta.json")), text[-3000:]
    assert survivors(job.marker, within=10) == {}
