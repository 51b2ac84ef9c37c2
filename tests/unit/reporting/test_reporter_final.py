"""The end of a run: final/ replaced whole, and summary.json written last (a summary names a final/ that exists)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from corecpu.reporting.reporter import Reporter


class Model(torch.nn.Linear):
    def __init__(self, fail: bool = False) -> None:
        super().__init__(2, 2)
        self.fail, self.summary_existed = fail, None

    def save_pretrained(self, directory: Path, safe_serialization: bool = True) -> None:
        self.summary_existed = (Path(directory).parent / "summary.json").exists()
        (Path(directory) / "model.safetensors").write_bytes(b"new")
        if self.fail:
            raise OSError(28, "No space left on device")


def test_summary_json_is_written_after_final(one_process, tmp_path):
    out = tmp_path / "out"
    report = Reporter(one_process, out, {}, total_steps=1, progress="off")
    cards = []
    model = Model()
    final = report.finish(model, None, 1, card=lambda d, summary: cards.append(dict(summary)))
    assert model.summary_existed is False
    assert cards and cards[0]["steps"] == 1  # the card sees the summary, before its phase split
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and "final_save_s" in summary["phases"]
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == ["final", "metrics.jsonl", "summary.json"]  # no temporaries


def test_a_failed_final_keeps_the_old_one_and_writes_no_summary(one_process, tmp_path):
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "model.safetensors").write_bytes(b"old")
    report = Reporter(one_process, out, {}, total_steps=1, progress="off")
    with pytest.raises(OSError, match="No space left"):
        report.finish(Model(fail=True), None, 1)
    assert (out / "final" / "model.safetensors").read_bytes() == b"old"
    assert sorted(p.name for p in out.iterdir()) == ["final", "metrics.jsonl"]
