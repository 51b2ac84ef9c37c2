"""Tier 2: two ranks through corecpu.setup() with a plain nn.Module stay identical
(one process under each launcher: tests/unit/training/test_run.py)."""

from __future__ import annotations

import json

from helpers.spawn import spawn


def test_two_ranks_through_the_front_door_agree(tmp_path):
    out = tmp_path / "front.json"
    for r in spawn("front_door.py", 2, str(out)):
        assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP replicas stay identical
    assert ranks[0]["batches"] == ranks[1]["batches"] == 3  # 22 examples, 2 ranks, batch 4: padded evenly
    assert result["total"] == [2.0, 1.0]
    assert result["type"] == "DistributedDataParallel"
    assert result["describe"]["backend"].startswith("gloo") and result["resolved"]["world_size"] == 2
