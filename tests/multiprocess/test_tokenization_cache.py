"""Tier 2: the per-host tokenization cache with two ranks on one host: one tokenizes, the other reads
(the cache's rules: tests/unit/data/test_hf_data.py)."""

from __future__ import annotations

import json

import pytest

from helpers.spawn import spawn

datasets = pytest.importorskip("datasets")
from datasets import Dataset  # noqa: E402


def test_two_ranks_one_host_tokenize_once(tmp_path):
    spec = tmp_path / "train.parquet"
    Dataset.from_dict({"text": [f"example number {i}" for i in range(40)], "label": [i % 2 for i in range(40)]}) \
        .to_parquet(str(spec))
    out = tmp_path / "result"
    for attempt in ("cold", "warm"):
        for r in spawn("tokcache.py", 2, str(out), str(tmp_path / "cache"), str(spec)):
            assert r.returncode == 0, r.stderr[-3000:]
        results = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1)]
        assert results[0]["digest"] == results[1]["digest"] and results[0]["n"] == 40
        expected = [1, 0] if attempt == "cold" else [0, 0]
        assert [r["tokenized"] for r in results] == expected, (attempt, results)
    assert len(list((tmp_path / "cache").glob("tokenized-*.pt"))) == 1
