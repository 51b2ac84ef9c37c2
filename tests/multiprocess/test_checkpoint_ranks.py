"""Tier 2: checkpoints across two ranks: a disk-full on rank 0 reaches rank 1, both fall back past a
truncated checkpoint and get their own RNG back (the single-process rules: tests/unit/training/test_checkpoint.py)."""

from __future__ import annotations

import json

from helpers.spawn import spawn


def test_two_ranks_share_outcomes_and_keep_their_own_rng(tmp_path):
    for r in spawn("ckpt_ranks.py", 2, str(tmp_path / "run"), str(tmp_path)):
        assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    # Rank 0's disk-full reached rank 1 as the same line, instead of leaving it at a barrier.
    assert ranks[0]["disk_full"] == ranks[1]["disk_full"] and ranks[0]["disk_full"].startswith("no space left on")
    for r in ranks:  # both fell back past the truncated step 2 to step 1, and got their own RNG back
        assert r["step"] == 1 and r["draw"] == r["expected_draw"]
        assert len(r["notes"]) == 1 and "step-00000002: state.pt has 100 bytes" in r["notes"][0]
    assert ranks[0]["draw"] != ranks[1]["draw"]
