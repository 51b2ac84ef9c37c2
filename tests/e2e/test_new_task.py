"""Tier 3: a task that corecpu does not know (tests/helpers/toy_task.py, regression), registered with one
line and run through the unchanged train.py: a few steps of the tiny model in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.common import ROOT
from helpers.launching import TINY, records

# What a user's script does: register the task, then hand train.py its command line.
REGISTER_AND_TRAIN = (
    "import sys; sys.path[:0] = sys.argv.pop(1).split(':')\n"
    "from corecpu.tasks.registry import register; from helpers.toy_task import Regression; register(Regression)\n"
    "import corecpu, train; corecpu.run_cli(train.main)\n")


def test_a_registered_task_runs_through_train_py(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", REGISTER_AND_TRAIN, f"{ROOT}:{ROOT / 'tests'}", "--task", "regression",
                           *TINY, "--max-steps", "3", "--log-every", "1", "--scale", "2", "--output-dir", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train, _ = records(out)
    assert [r["step"] for r in train] == [1, 2, 3]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_mse" in line]
    assert len(evals) == 1 and evals[0]["step"] == 3 and evals[0]["eval_examples"] == 400
    assert "eval  step 3 | mse" in proc.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "regression" and config["scale"] == 2.0 and "doc_stride" not in config
    assert (out / "final" / "README.md").read_text().startswith("# Regression")
