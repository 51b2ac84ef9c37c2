"""benchmarks/lockstep_jitter.py's arithmetic: what lockstep costs, and whether a split by past ratios recovers it."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import lockstep_jitter  # noqa: E402


def test_independent_jitter_costs_lockstep_and_no_split_by_the_past_recovers_it() -> None:
    rng = random.Random(0)
    a = [0.4 * rng.lognormvariate(0, 0.13) for _ in range(2000)]
    b = [0.4 * rng.lognormvariate(0, 0.13) for _ in range(2000)]
    out = lockstep_jitter.analyse(a, b)
    assert 0.04 < out["lockstep"] < 0.09
    assert abs(out["autocorr"][1]) < 0.1
    assert all(cost > out["lockstep"] - 0.01 for cost in out["ema"].values())  # the past says nothing
    assert out["oracle"] < 0.0


def test_a_rank_slower_for_long_stretches_is_what_a_split_by_the_past_recovers() -> None:
    a = [0.5 if (k // 50) % 2 else 0.4 for k in range(1000)]  # rank 0 1.25x slower every other 50 steps
    b = [0.4] * 1000
    out = lockstep_jitter.analyse(a, b)
    assert out["lockstep"] == pytest.approx(0.5 * 0.05 / 0.425, rel=1e-3)
    assert out["autocorr"][1] > 0.9
    assert out["ema"][0.5] < 0.25 * out["lockstep"]
