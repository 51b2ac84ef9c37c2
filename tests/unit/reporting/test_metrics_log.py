"""Tier 1: the metrics.jsonl log (corecpu.reporting.metrics_log)."""

from __future__ import annotations

import json

from corecpu.reporting.metrics_log import MetricsLog


def test_metrics_log_drops_records_after_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 8)) + '{"step": 8, "lo')
    log = MetricsLog(path, resume_step=5)
    log.write({"step": 6})
    log.close()
    assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
