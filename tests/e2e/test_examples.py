"""Tier 3: the examples run under launch.sh and show the same rank-count equivalence as train.py."""

from __future__ import annotations

import json

import pytest

from helpers.launching import launch


def losses(stdout: str) -> dict[int, float]:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def perplexities(stdout: str) -> list[float]:
    return [json.loads(line)["eval_perplexity"] for line in stdout.splitlines()
            if line.startswith("{") and "eval_perplexity" in line]


def test_custom_loop_same_losses_on_1x8_and_2x4_and_exact_resume(tmp_path):
    common = ["examples/custom_loop.py", "--precision", "fp32", "--steps", "16", "--save-every", "8"]
    one = losses(launch(1, *common, "--batch-size", "8", "--out", str(tmp_path / "a")).stdout)
    two = losses(launch(2, *common, "--batch-size", "4", "--out", str(tmp_path / "b")).stdout)
    assert sorted(one) == sorted(two) == list(range(1, 17))
    assert max(abs(one[s] - two[s]) for s in one) < 1e-5, (one, two)
    assert one[16] < one[1]  # it learns
    # Stop at 8, resume to 16: the same per-step losses as the uninterrupted run.
    first = losses(launch(2, *common[:-2], "--save-every", "4", "--batch-size", "4", "--out", str(tmp_path / "c"),
                          "--steps", "8").stdout)
    rest = losses(launch(2, *common[:-2], "--save-every", "4", "--batch-size", "4", "--out", str(tmp_path / "c"),
                         "--resume").stdout)
    assert sorted(first) == list(range(1, 9)) and sorted(rest) == list(range(9, 17))
    assert {**first, **rest} == pytest.approx(two, abs=1e-6)


def test_causal_lm_same_losses_on_1x8_and_2x4_and_learns(tmp_path):
    common = ["examples/causal_lm.py", "--precision", "fp32", "--steps", "12", "--block", "32"]
    one = launch(1, *common, "--batch-size", "8", "--out", str(tmp_path / "a")).stdout
    two = launch(2, *common, "--batch-size", "4", "--out", str(tmp_path / "b")).stdout
    l1, l2 = losses(one), losses(two)
    assert sorted(l1) == sorted(l2) == list(range(1, 13))
    assert max(abs(l1[s] - l2[s]) for s in l1) < 1e-4, (l1, l2)
    p1, p2 = perplexities(one), perplexities(two)
    assert len(p1) == 2 and p1 == pytest.approx(p2, rel=1e-4)
    assert p1[1] < p1[0] / 2  # far better than the untrained model's ~257 after 12 steps


def test_image_classification_trains_reports_accuracy_and_resumes(tmp_path):
    common = ["examples/image_classification.py", "--model", "tiny", "--image-size", "32", "--precision", "fp32",
              "--batch-size", "4", "--eval-size", "30", "--out", str(tmp_path / "run")]
    first = launch(2, *common, "--steps", "3").stdout
    rows = [json.loads(line) for line in first.splitlines() if line.startswith("{")]
    assert [(r["step"], r["samples"]) for r in rows if "loss" in r] == [(1, 8), (2, 8), (3, 8)]
    summary = rows[-1]
    assert summary["summary"] and summary["ranks"] == 2 and summary["eval_examples"] == 30  # every image once
    assert 0 <= summary["eval_accuracy"] <= 1 and summary["flops_per_sample"] > 0 and summary["matmul_flops"] > 0
    assert (tmp_path / "run" / "checkpoints" / "step-00000003").is_dir()  # saved at the last step
    rest = losses(launch(2, *common, "--steps", "5", "--resume").stdout)
    assert sorted(rest) == [4, 5]
