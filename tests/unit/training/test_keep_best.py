"""Tier 1: --keep-best METRIC. The metric and its direction (corecpu.training.best_metric), the checkpointer
saving a new best and keeping it beside the newest --keep-checkpoints, across a resume, and the flag's
checks at the edge (TrainConfig.validate)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from corecpu.errors import CoreCPUError
from corecpu.tasks.registry import parse_config
from corecpu.training import checkpoint_disk
from corecpu.training.best_metric import BestMetric
from corecpu.training.checkpointer import Checkpoints
from helpers.one_line import one_line_error


# ---------------------------------------------------------------- the metric


@pytest.mark.parametrize("spec, name, mode", [
    ("eval_loss", "eval_loss", "min"), ("loss", "eval_loss", "min"), ("eval_perplexity", "eval_perplexity", "min"),
    ("eval_mse", "eval_mse", "min"), ("f1", "eval_f1", "max"), ("eval_accuracy", "eval_accuracy", "max"),
    ("eval_exact_match", "eval_exact_match", "max"), ("eval_loss:max", "eval_loss", "max"),
    ("accuracy:min", "eval_accuracy", "min")])
def test_the_direction_comes_from_the_table_unless_said(spec, name, mode):
    assert BestMetric.parse(spec) == BestMetric(name, mode)


@pytest.mark.parametrize("spec, says", [("eval_loss:up", "must be min or max"), ("", "is not a metric name"),
                                         ("eval loss", "is not a metric name"), ("1f1", "is not a metric name")])
def test_bad_specs_are_one_line_naming_the_fix(spec, says):
    with pytest.raises(CoreCPUError, match=says) as err:
        BestMetric.parse(spec)
    assert "\n" not in str(err.value)


def test_better_keeps_the_earlier_on_a_tie_and_never_takes_nan():
    low, high = BestMetric("eval_loss", "min"), BestMetric("eval_f1", "max")
    assert low.better(0.5, None) and low.better(0.4, 0.5) and not low.better(0.5, 0.5) and not low.better(0.6, 0.5)
    assert high.better(0.6, 0.5) and not high.better(0.5, 0.5) and not high.better(math.nan, None)


# ---------------------------------------------------------------- the checkpointer


@dataclass
class FakeStep:
    number: int
    is_last: bool = False

    @property
    def position(self) -> tuple[int, int]:
        return 0, self.number


def checkpointer(out: Path, best: str = "eval_accuracy", keep: int = 1, every: int = 2, resume: str = "auto"):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpoints(out, every=every, keep=keep, resume=resume, best=best)
    ckpt.restore(model, opt, None, resolved={}, is_main=True)
    ckpt.attach(model, opt, None)
    return ckpt, model


def train_step(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)


def saved_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in checkpoint_disk.list_checkpoints(out))


def run_steps(ckpt: Checkpoints, model: torch.nn.Module, evals: dict[int, float], steps: range, last: int) -> None:
    for n in steps:
        train_step(model)
        step = FakeStep(n, is_last=n == last)
        if n in evals:
            ckpt.note_eval(step, {"eval_accuracy": evals[n], "eval_examples": 10})
        ckpt.save(step)


def test_the_best_evaluation_is_saved_when_not_due_and_survives_pruning(tmp_path):
    ckpt, model = checkpointer(tmp_path)
    # Evaluations at 3, 5 and 7 (none is a --save-every 2 step); the best is at 5, not the last.
    run_steps(ckpt, model, {3: 0.6, 5: 0.9, 7: 0.7}, range(1, 9), last=8)
    assert saved_steps(tmp_path) == [5, 8]  # keep 1 (the newest) + the best
    assert ckpt.best == {"metric": "eval_accuracy", "value": 0.9, "step": 5, "checkpoint": "step-00000005"}
    meta, _ = checkpoint_disk.read_meta(tmp_path / "checkpoints" / "step-00000005")
    assert meta["extra"]["eval"] == {"eval_accuracy": 0.9, "eval_examples": 10}
    best_weights = torch.load(tmp_path / "checkpoints" / "step-00000005" / "state.pt", weights_only=True)["model"]
    torch.manual_seed(0)
    assert torch.allclose(best_weights["bias"], torch.nn.Linear(3, 2).bias + 5 * 0.01)  # the model after step 5


def test_a_resumed_run_keeps_protecting_the_best_and_compares_against_it(tmp_path):
    ckpt, model = checkpointer(tmp_path)
    run_steps(ckpt, model, {3: 0.9, 6: 0.5}, range(1, 7), last=6)
    assert saved_steps(tmp_path) == [3, 6]
    resumed, model = checkpointer(tmp_path)
    assert resumed.resumed.step == 6 and resumed.best["step"] == 3
    # 0.8 after the resume is worse than the best before it: not saved as a best, and step 3 is still kept.
    run_steps(resumed, model, {9: 0.8, 12: 0.95}, range(7, 11), last=12)
    assert saved_steps(tmp_path) == [3, 10]
    run_steps(resumed, model, {12: 0.95}, range(11, 13), last=12)
    assert saved_steps(tmp_path) == [12] and resumed.best["step"] == 12  # a new best that is also the newest


def test_another_metric_on_resume_starts_a_new_best(tmp_path):
    ckpt, model = checkpointer(tmp_path)
    run_steps(ckpt, model, {3: 0.9}, range(1, 5), last=4)
    other, _ = checkpointer(tmp_path, best="eval_f1")
    assert other.best is None


def test_a_metric_the_evaluation_lacks_is_one_line_listing_what_it_has(tmp_path):
    ckpt, _ = checkpointer(tmp_path, best="eval_f1")
    with pytest.raises(CoreCPUError, match="reports no such metric; use one of eval_accuracy$"):
        ckpt.note_eval(FakeStep(1), {"eval_accuracy": 0.5, "eval_examples": 3})


def test_without_keep_best_evaluations_change_nothing(tmp_path):
    ckpt, model = checkpointer(tmp_path, best="")
    run_steps(ckpt, model, {3: 0.9, 5: 0.1}, range(1, 7), last=6)
    assert saved_steps(tmp_path) == [6]


def test_prune_keeps_named_checkpoints_beside_the_newest(tmp_path):
    ckpt, model = checkpointer(tmp_path, best="", keep=5, every=1)
    run_steps(ckpt, model, {}, range(1, 5), last=4)
    checkpoint_disk.prune(tmp_path, 1, also=["step-00000002", "step-00000099"])
    assert saved_steps(tmp_path) == [2, 4]


# ---------------------------------------------------------------- the flag


def test_keep_best_is_checked_at_the_edge():
    assert parse_config(["--keep-best", "f1"]).keep_best == "f1"
    assert "keep_best" not in parse_config([]).run_defining()  # which files are kept does not change the math
    assert one_line_error(lambda: parse_config(["--keep-best", "eval_bleu"])) == (
        "--keep-best eval_bleu: --task classification reports no such metric; use one of eval_loss, eval_accuracy, "
        "eval_f1")
    assert one_line_error(lambda: parse_config(["--keep-best", "eval_loss", "--eval-data", "none"])) == (
        "--keep-best eval_loss needs evaluations; drop --eval-data none or --keep-best")
    assert parse_config(["--task", "qa", "--keep-best", "f1"]).keep_best == "f1"
