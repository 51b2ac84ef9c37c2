"""Tier 1: classification scores from summed counts (corecpu.tasks.classification)."""

from __future__ import annotations

import pytest
import torch

from corecpu.tasks.classification import eval_counts, scores_from_counts


def test_binary_and_macro_f1_from_counts():
    logits = torch.tensor([[0.0, 1], [0, 1], [1, 0], [1, 0], [0, 1]])  # predictions 1 1 0 0 1
    labels = torch.tensor([1, 0, 0, 1, 1])
    weights = torch.tensor([1, 1, 1, 1, 0])  # the last is padding
    s = scores_from_counts(eval_counts(logits, labels, weights, 2), 2)
    # tp=1 fp=1 fn=1 for label 1 -> F1 0.5; accuracy 2/4
    assert (s["eval_accuracy"], s["eval_f1"], s["eval_examples"]) == (0.5, 0.5, 4)
    # Split the batch in two and add the counts: identical scores (what all-reduce relies on).
    halves = eval_counts(logits[:2], labels[:2], weights[:2], 2) + eval_counts(logits[2:], labels[2:], weights[2:], 2)
    assert scores_from_counts(halves, 2) == s
    three = scores_from_counts(eval_counts(torch.eye(3), torch.tensor([0, 1, 1]), torch.ones(3), 3), 3)
    assert three["eval_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
