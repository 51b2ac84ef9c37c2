"""Gradient all-reduce through MPI, 2 ranks under Intel MPI's mpirun: bit-identical to gloo, and a dying
rank ends the job (the choice and the comm thread: tests/unit/distributed/test_allreduce.py)."""

from __future__ import annotations

import json

import pytest

from helpers.spawn import mpirun, needs_mpirun


@needs_mpirun
def test_mpi_hook_gives_bit_identical_parameters_to_gloo(tmp_path):
    out = tmp_path / "compare.json"
    proc = mpirun("mpi_hook.py", "compare", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    reports = json.loads(out.read_text())
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        # Training moved every parameter, through the hook, once per bucket per synced step only
        # (no_sync micro-steps and the uneven last batch included) ...
        assert r["moved"] == r["n_params"] > 10
        assert r["hook_calls"] > r["sync_steps"] and r["hook_calls"] % r["sync_steps"] == 0
        # ... and landed exactly where gloo's all-reduce lands: 2 ranks sum in the same order.
        assert r["identical"] and r["max_diff"] == 0.0, r
        assert r["ranks_agree"] and r["bf16"] and r["error_reached"] and r["thread_alive"], r


@needs_mpirun
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_rank_dying_mid_allreduce_ends_the_job(how):
    proc = mpirun("mpi_hook.py", how, timeout=240)
    assert proc.returncode != 0
    assert "finished training" not in proc.stdout
