"""Tier 2: two gloo processes on CPU."""

import json

from helpers.spawn import spawn


def test_ddp_gradients_equal_single_process_on_concatenated_batch(tmp_path):
    out = tmp_path / "grads.json"
    for r in spawn("ddp_grads.py", 2, str(out)):
        assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["n"] > 10 and result["scale"] > 0
    assert result["max_diff"] <= 1e-5 * max(1.0, result["scale"]), result
    # The same buckets over a second gloo group through torch's allreduce hook: the same sums, bit for bit.
    assert result["hook_diff"] == 0.0, result
