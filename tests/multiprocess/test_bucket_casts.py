"""Tier 2: Linear weights' bf16 gradients cast straight into DDP's buckets (corecpu.distributed.bucket_casts) give
plain DDP's gradients and parameters bit for bit on 2 ranks, through wrap_model: with gradient accumulation, a layer
called twice in a forward, and a loss that also reads a weight."""

from __future__ import annotations

import json

from helpers.spawn import mpirun, needs_mpirun, spawn


def check(reports: list[dict]) -> None:
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        cases = r["cases"]
        assert set(cases) == {"bert-accum1", "bert-accum2", "twice-accum1", "penalty-accum1"}
        for name, case in cases.items():
            assert case["on"].startswith("on (") and case["off"] == "off (switched off)", (name, case)
        for name, case in cases.items():
            assert case["grads_equal"] and case["params_equal"], (name, case)
        # Every Linear weight of the tiny BERT (14) placed on each step after the first (the views come from a sync).
        assert cases["bert-accum1"]["placed"] == 14 * 3
        # Accumulating micro-steps: the sync step's gradient is already defined, so autograd adds as usual.
        assert cases["bert-accum2"]["placed"] == 0
        # A layer called twice shares one cast (as autocast's cache does): placed once a step, all three weights;
        # the penalised weight is placed too, autograd adding the penalty's gradient to it.
        assert cases["twice-accum1"]["placed"] == cases["penalty-accum1"]["placed"] == 3 * 3


def test_bucket_casts_equal_plain_ddp_on_gloo(tmp_path):
    out = tmp_path / "casts.json"
    for r in spawn("bucket_casts.py", 2, str(out), "gloo", timeout=300):
        assert r.returncode == 0, r.stderr[-3000:]
    check(json.loads(out.read_text()))


@needs_mpirun
def test_bucket_casts_through_the_mpi_hook(tmp_path):
    # The comm thread's hook: it scales what the casts did not and only sums.
    out = tmp_path / "casts.json"
    proc = mpirun("bucket_casts.py", str(out), "mpi", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    check(json.loads(out.read_text()))
