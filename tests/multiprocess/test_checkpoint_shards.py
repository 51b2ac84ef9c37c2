"""Tier 2: two ranks on one host write one checkpoint together (corecpu.training.checkpoint_shards): rank 1 writes
part of the optimizer state, resume and export put it back exactly, and a failure on rank 1 alone stops both ranks
in one line and leaves no checkpoint behind."""

from __future__ import annotations

import json

from helpers.spawn import spawn


def test_two_ranks_write_one_checkpoint_and_resume_it_exactly(tmp_path):
    for r in spawn("ckpt_shards.py", 2, str(tmp_path / "run"), str(tmp_path)):
        assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    first = ranks[0]
    assert first["files"] == ["meta.json", "optimizer-1.pt", "state.pt"]
    assert first["meta_files"] == ["optimizer-1.pt", "state.pt"]  # both sized and digested, so both verified
    assert first["export_optimizer_equal"]
    for r in ranks:
        assert r["model_equal"] and r["optimizer_equal"]
        # Rank 1's disk-full is the one line every rank raises; nothing of step 2 is left.
        assert r["disk_full"].startswith("CoreCPUError: no space left on"), r["disk_full"]
    assert ranks[0]["disk_full"] == ranks[1]["disk_full"]
    # An error corecpu does not know: rank 1 raises it (its traceback), rank 0 says where to look.
    assert ranks[1]["unexpected"] == "RuntimeError: boom on rank 1"
    assert ranks[0]["unexpected"].startswith("CoreCPUError: rank 1 could not write checkpoint")
    assert "see rank 1's error" in ranks[0]["unexpected"]
    assert first["disk_full_left"] == first["unexpected_left"] == ["step-00000001"]
    assert first["two_hosts_files"] == ["meta.json", "state.pt"]
