"""benchmarks/lockstep.py's arithmetic: the split of N ranks' overhead into the host's part and the code's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import lockstep


def _metrics(path: Path, steps: list[tuple[float, int]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    records = [{"step": i + 1, "elapsed_s": t, "tokens": k} for i, (t, k) in enumerate(steps)]
    records.insert(1, {"eval_loss": 0.1, "step": 1})  # an evaluation record is not a step
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def _flat(steps: list[tuple[float, float]]) -> list[float]:
    return [x for step in steps for x in step]


def test_step_times_are_differences_of_elapsed_with_a_rank_s_tokens(tmp_path: Path) -> None:
    _metrics(tmp_path, [(0.5, 100), (0.9, 120), (1.6, 80)])
    assert _flat(lockstep.step_times(tmp_path / "metrics.jsonl")) == pytest.approx([0.4, 120, 0.7, 80])
    assert _flat(lockstep.step_times(tmp_path / "metrics.jsonl", world=2)) == pytest.approx([0.4, 60, 0.7, 40])


def _steps(times: list[float], tokens: float = 100.0) -> list[tuple[float, float]]:
    return [(t, tokens) for t in times]


def test_decompose_multiplies_back_to_the_overhead() -> None:
    steps = {"alone": [_steps([0.30, 0.30, 0.30])],
             "together": [_steps([0.30, 0.40, 0.30]), _steps([0.40, 0.30, 0.30, 0.9])],  # cut to the shorter
             "ranks": [_steps([0.42, 0.42, 0.42])]}
    split = lockstep.decompose(steps)
    together = (0.30 + 0.40 + 0.30 + 0.40 + 0.30 + 0.30) / 6
    slowest = (0.40 + 0.40 + 0.30) / 3
    assert split["co_running"] == pytest.approx(together / 0.30 - 1)
    assert split["lockstep"] == pytest.approx(slowest / together - 1)
    assert split["code"] == pytest.approx(0.42 / slowest - 1)
    product = (1 + split["co_running"]) * (1 + split["lockstep"]) * (1 + split["code"]) - 1
    assert product == pytest.approx(split["overhead"]) and split["overhead"] == pytest.approx(0.4)


def test_ranks_stepping_over_fewer_tokens_are_compared_per_token() -> None:
    # Two ranks whose slices of the global batches hold 20% fewer tokens than the one-rank runs' batches: a
    # step 20% shorter is no gain, and a step as long is a 25% cost.
    one = {"alone": [_steps([0.5] * 4)], "together": [_steps([0.5] * 4)] * 2}
    assert lockstep.decompose({**one, "ranks": [_steps([0.4] * 4, 80.0)]})["overhead"] == pytest.approx(0.0)
    split = lockstep.decompose({**one, "ranks": [_steps([0.5] * 4, 80.0)]})
    assert split["overhead"] == pytest.approx(0.25) and split["code"] == pytest.approx(0.25)
    assert split["ranks_tokens"] == 80.0 and split["one_rank_tokens"] == 100.0


def test_equal_runs_have_no_lockstep_cost() -> None:
    same = _steps([0.3, 0.35, 0.32])
    split = lockstep.decompose({"alone": [same], "together": [same, same], "ranks": [same]})
    assert split["lockstep"] == 0.0 and split["overhead"] == pytest.approx(0.0)


def test_kept_runs_are_read_back_by_part(tmp_path: Path) -> None:
    for name, steps in (("alone0", [(1.0, 10), (1.5, 10), (2.0, 10)]), ("together0", [(1.0, 10), (1.6, 10), (2.2, 10)]),
                        ("together1", [(1.0, 10), (1.5, 10), (2.0, 10)]), ("ranks", [(1.0, 20), (1.7, 20), (2.4, 20)])):
        _metrics(tmp_path / name, steps)
    read = lockstep.read_repeat(tmp_path, ranks=2, warmup=1)
    assert _flat(read["alone"][0]) == pytest.approx([0.5, 10]) and len(read["together"]) == 2
    assert _flat(read["ranks"][0]) == pytest.approx([0.7, 10])  # the job's 20 tokens over its 2 ranks


def test_train_args_skip_evaluation_and_log_every_step(tmp_path: Path) -> None:
    ns = argparse.Namespace(model="default", data="d.tsv", steps=50, batch_size=16)
    cmd = lockstep.train_args(ns, tmp_path / "o")
    assert cmd[cmd.index("--eval-data") + 1] == "none" and cmd[cmd.index("--log-every") + 1] == "1"
    assert cmd[cmd.index("--max-steps") + 1] == "50" and cmd[cmd.index("--batch-size") + 1] == "16"


def test_a_failed_run_stops_the_ones_still_going(tmp_path: Path) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [lockstep.start(["false"], logs[0]), lockstep.start(["sleep", "30"], logs[1])]
    with pytest.raises(SystemExit, match=r"a run failed \(exit 1\); its output: .*a\.log"):
        lockstep.finish(procs, logs, timeout=20)
    assert procs[1].returncode is not None  # killed, not left running
