"""`--shard-optimizer shm` through launch.sh and train.py: the same training as DDP's all-reduce within fp32
rounding, a checkpoint it writes resumes exactly, and nothing is left in /dev/shm."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers.launching import TINY, launch, records

SHM = Path("/dev/shm")


def test_shared_optimizer_trains_as_ddp_does_and_resumes_exactly(tmp_path):
    common = [*TINY, "--max-steps", "16", "--log-every", "1", "--eval-data", "none", "--precision", "fp32"]
    before = set(SHM.glob("corecpu-*"))
    launch(2, *common, "--shard-optimizer", "off", "--output-dir", str(tmp_path / "ddp"))
    proc = launch(2, *common, "--shard-optimizer", "shm", "--save-every", "8", "--keep-checkpoints", "3",
                  "--output-dir", str(tmp_path / "shm"))
    banner = proc.stdout.replace("\n", "")
    assert "no gradient all-reduce: optimizer sharded through shared memory (requested)" in banner
    decisions = json.loads((tmp_path / "shm" / "config.json").read_text())
    assert "shm (requested)" in json.dumps(decisions)
    ddp, _ = records(tmp_path / "ddp")
    shm, _ = records(tmp_path / "shm")
    assert [r["step"] for r in shm] == list(range(1, 17))
    for a, b in zip(ddp, shm):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * abs(a["grad_norm"]), (a, b)
    ranks = json.loads((tmp_path / "shm" / "summary.json").read_text())["ranks"]
    assert ranks[0]["param_checksum"] == ranks[1]["param_checksum"]  # one set of weights, read by both ranks

    # Resumed from its step-8 checkpoint, the run repeats steps 9-16 exactly.
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "shm" / "checkpoints" / "step-00000008", out / "checkpoints" / "step-00000008")
    launch(2, *common, "--shard-optimizer", "shm", "--resume", "auto", "--output-dir", str(out))
    resumed, _ = records(out)
    assert [r["step"] for r in resumed] == list(range(9, 17))
    for a, b in zip(shm[8:], resumed):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], (a, b)
    assert set(SHM.glob("corecpu-*")) == before  # every buffer's file was unlinked once mapped
