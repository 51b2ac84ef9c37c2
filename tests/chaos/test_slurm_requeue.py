"""Chaos tier: examples/slurm/train.sbatch under preemption, through the fake srun and a fake scontrol
(tests/helpers/slurm.py). `#SBATCH --signal=USR1@90` makes Slurm send SIGUSR1 to the tasks of the job's
steps 90 s before the end; the ranks save and exit 75, the script's shell sees the 75 and runs
`scontrol requeue $SLURM_JOB_ID`, and Slurm runs the same script again, where `--resume auto` continues."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

from corecpu.reliability.preempt import EXIT_STOPPED
from helpers.chaoslib import TINY, Job, complete_checkpoint, losses, rank_pids, survivors, wait_for_step
from helpers.common import ROOT
from helpers.slurm import JOB_ID, SBATCH, sbatch_env, scontrol_calls

ARGS = [*TINY, "--max-steps", "40", "--log-every", "1", "--batch-size", "8"]


def sbatch(tmp_path, out, restart: int = 0) -> Job:
    """Run the batch script as Slurm's batch step would: one node, two tasks, srun."""
    env = sbatch_env(tmp_path, [os.uname().nodename], 2, {"SLURM_RESTART_COUNT": str(restart)})
    log = tmp_path / f"{out.name}-{restart}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["bash", str(SBATCH), *ARGS, "--output-dir", str(out)], env=env, cwd=ROOT,
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return Job(proc, out, log)


def test_sbatch_requeues_itself_on_sigusr1_and_resumes_exactly(tmp_path):
    (tmp_path / "straight-job").mkdir()
    straight = sbatch(tmp_path / "straight-job", tmp_path / "straight")
    rc, _ = straight.wait(timeout=300)
    assert rc == 0, straight.text()[-3000:]
    assert scontrol_calls(tmp_path / "straight-job") == []

    job = sbatch(tmp_path, tmp_path / "run")
    wait_for_step(job, 7)
    ranks = rank_pids(job.marker)
    assert sorted(ranks) == [0, 1], ranks
    for pid in ranks.values():  # what --signal=USR1@90 does: every task of the step, the batch shell spared
        os.kill(pid, signal.SIGUSR1)
    rc, _ = job.wait(timeout=120)
    text = job.text()
    assert rc == EXIT_STOPPED, text[-3000:]
    found = re.findall(r"stopped by SIGUSR1 at step (\d+); checkpoint (step-\d+) written", text)
    assert len(found) == 1, text[-3000:]
    step = int(found[0][0])
    assert 7 <= step < 40
    complete_checkpoint(job.out, step)
    assert json.loads((job.out / "stopped.json").read_text())["step"] == step
    assert scontrol_calls(tmp_path) == [f"requeue {JOB_ID}"], text[-3000:]
    assert survivors(job.marker, within=10) == {}

    # Slurm runs the requeued job's script again, with the same arguments.
    again = sbatch(tmp_path, tmp_path / "run", restart=1)
    rc, _ = again.wait(timeout=300)
    text = again.text()
    assert rc == 0, text[-3000:]
    assert "restart 1" in text and f"(step {step})" in text, text[-3000:]
    assert scontrol_calls(tmp_path) == [f"requeue {JOB_ID}"]  # not requeued again
    assert losses(job.out) == losses(straight.out)  # bit-identical to the run that was never stopped
    assert len(losses(job.out)) == 40
