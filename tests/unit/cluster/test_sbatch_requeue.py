"""Tier 1: examples/slurm/train.sbatch's requeue rule with a stand-in srun that only exits (the whole
path with real ranks and SIGUSR1: tests/chaos/test_slurm_requeue.py): exit 75, or a stopped.json this
run wrote, requeues; a normal end, a failure, or a stale marker from an earlier run does not."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers.slurm import JOB_ID, SBATCH, sbatch_env, scontrol_calls


def sbatch_with_srun(tmp_path, srun_body: str, out) -> subprocess.CompletedProcess:
    env = sbatch_env(tmp_path, [os.uname().nodename], 2)
    srun = tmp_path / "bin" / "srun"
    srun.unlink()
    srun.write_text(f"#!/bin/sh\n{srun_body}\n")
    srun.chmod(0o755)
    return subprocess.run(["bash", str(SBATCH), "--output-dir", str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("body, requeued", [
    ("exit 75", True),
    ('echo "{}" > "$OUT/stopped.json"; exit 137', True),  # rank 0 wrote the marker, then srun killed it
    ("exit 0", False),
    ("exit 1", False),
])
def test_requeue_rule(tmp_path, body, requeued):
    out = tmp_path / "run"
    out.mkdir()
    r = sbatch_with_srun(tmp_path, body.replace("$OUT", str(out)), out)
    expected_rc = {"exit 75": 75, "exit 0": 0, "exit 1": 1}.get(body, 137)
    assert r.returncode == expected_rc, r.stderr
    assert scontrol_calls(tmp_path) == ([f"requeue {JOB_ID}"] if requeued else []), r.stderr


def test_a_stale_marker_from_an_earlier_run_does_not_requeue(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    marker = out / "stopped.json"
    marker.write_text("{}")
    os.utime(marker, (0, 0))  # written long before this run started
    r = sbatch_with_srun(tmp_path, "exit 1", out)
    assert r.returncode == 1 and scontrol_calls(tmp_path) == [], r.stderr


def test_the_script_passes_resume_auto_before_the_users_arguments(tmp_path):
    out = tmp_path / "run"
    r = sbatch_with_srun(tmp_path, 'echo "$@"', out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("train.py ", 1)[1].split() == ["--resume", "auto", "--output-dir", str(out)]
