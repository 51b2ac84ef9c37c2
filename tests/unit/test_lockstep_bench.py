"""benchmarks/lockstep.py's arithmetic: the split of N ranks' overhead into the host's part and the code's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import lockstep


def test_step_times_are_differences_of_elapsed(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": 1, "elapsed_s": 0.5}, {"step": 2, "elapsed_s": 0.9}, {"eval_loss": 0.1, "step": 2},
               {"step": 3, "elapsed_s": 1.6}]
    metrics.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert lockstep.step_times(metrics) == pytest.approx([0.4, 0.7])


def test_decompose_multiplies_back_to_the_overhead() -> None:
    times = {"alone": [[0.30, 0.30, 0.30]],
             "together": [[0.30, 0.40, 0.30], [0.40, 0.30, 0.30, 0.9]],  # the longer run is cut to the shorter
             "ranks": [[0.42, 0.42, 0.42]]}
    split = lockstep.decompose(times)
    together = (0.30 + 0.40 + 0.30 + 0.40 + 0.30 + 0.30) / 6
    slowest = (0.40 + 0.40 + 0.30) / 3
    assert split["co_running"] == pytest.approx(together / 0.30 - 1)
    assert split["lockstep"] == pytest.approx(slowest / together - 1)
    assert split["code"] == pytest.approx(0.42 / slowest - 1)
    product = (1 + split["co_running"]) * (1 + split["lockstep"]) * (1 + split["code"]) - 1
    assert product == pytest.approx(split["overhead"]) and split["overhead"] == pytest.approx(0.4)


def test_equal_runs_have_no_lockstep_cost() -> None:
    same = [0.3, 0.35, 0.32]
    split = lockstep.decompose({"alone": [same], "together": [same, same], "ranks": [same]})
    assert split["lockstep"] == 0.0 and split["overhead"] == pytest.approx(0.0)


def test_train_args_skip_evaluation_and_log_every_step(tmp_path: Path) -> None:
    ns = argparse.Namespace(model="default", data="d.tsv", steps=50, batch_size=16)
    cmd = lockstep.train_args(ns, tmp_path / "o")
    assert cmd[cmd.index("--eval-data") + 1] == "none" and cmd[cmd.index("--log-every") + 1] == "1"
    assert cmd[cmd.index("--max-steps") + 1] == "50" and cmd[cmd.index("--batch-size") + 1] == "16"
