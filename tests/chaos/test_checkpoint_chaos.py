"""Chaos: whole runs meeting damaged checkpoints, leftovers of killed saves, and a full disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from corecpu.training import checkpoint_disk as store
from helpers.common import ROOT
from helpers.launching import TINY, launch, records


def test_resume_auto_skips_a_truncated_newest_checkpoint_with_identical_losses(tmp_path):
    out = tmp_path / "run"
    common = [*TINY, "--max-steps", "12", "--log-every", "1", "--save-every", "4", "--keep-checkpoints", "3",
              "--eval-data", "none", "--output-dir", str(out)]
    launch(2, *common)
    straight, _ = records(out)
    newest = out / "checkpoints" / "step-00000012"
    state = newest / "state.pt"
    full = state.stat().st_size
    state.write_bytes(state.read_bytes()[: full // 3])  # what a crash mid-write on a non-atomic copy leaves
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = out / "checkpoints" / f".step-00000016.tmp-{dead.pid}"  # a save that was killed
    leftover.mkdir()
    (leftover / "state.pt").write_bytes(b"\0" * 100_000)

    resumed = launch(2, *common, "--resume", "auto")
    text = resumed.stdout.replace("\n", " ")
    assert f"skipped checkpoint {newest}: state.pt has {full // 3} bytes, meta.json records {full} (truncated)" in text
    assert f"removed {leftover}" in text and not leftover.exists()
    assert "(step 8)" in text
    again, _ = records(out)
    assert [r["step"] for r in again] == list(range(1, 13))
    assert [r["loss"] for r in again] == [r["loss"] for r in straight]
    # The damaged checkpoint was replaced by a good one at the same step.
    meta = json.loads((newest / "meta.json").read_text())
    assert store.verify(newest, meta) is None


@pytest.fixture
def tmpfs_40m(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 40 MB tmpfs to fill for real (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_stops_in_one_line_and_keeps_the_previous_checkpoint(tmpfs_40m):
    # The tiny model's checkpoint is about 25 MB (weights and two AdamW moments): the first fits
    # on a 40 MB disk, the second cannot.
    out = tmpfs_40m / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, "--max-steps", "12", "--save-every", "4",
                           "--eval-data", "none", "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"corecpu: error: no space left on {out / 'checkpoints'}: checkpoint needs about "), last
    assert " MB free" in last
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000004"]  # nothing half-written
    first = out / "checkpoints" / "step-00000004"
    assert store.verify(first, json.loads((first / "meta.json").read_text())) is None
    assert not (out / "final").exists()


def test_space_freed_then_resume_continues(tmpfs_40m, tmp_path):
    # After a disk-full stop, the same run resumes from what it kept once there is room.
    out = tmpfs_40m / "run"
    args = [*TINY, "--max-steps", "8", "--save-every", "4", "--eval-data", "none", "--log-every", "1"]
    subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--output-dir", str(out)], cwd=ROOT,
                   capture_output=True, text=True, timeout=600)
    roomy = tmp_path / "roomy"
    shutil.copytree(out, roomy)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--output-dir", str(roomy), "--resume", "auto"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(step 4)" in proc.stdout.replace("\n", " ")
    assert [r["step"] for r in records(roomy)[0]] == list(range(1, 9))
