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


def test_run_log_writes_metrics_jsonl_and_the_trackers_of_a_loop_of_ones_own(one_process, tmp_path):
    import json

    import pytest
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import corecpu
    from corecpu.errors import CoreCPUError

    with pytest.raises(CoreCPUError, match=r"^run.log\(\) has nowhere to write; .*corecpu.log_to\(run, "):
        one_process.log({"loss": 1.0}, step=1)
    out = tmp_path / "mine"
    corecpu.log_to(one_process, out, report_to="tensorboard", config={"lr": 1e-4})
    one_process.log({"loss": torch.tensor(0.5), "learning_rate": 1e-4}, step=3)
    one_process.log({"eval_accuracy": 0.75})  # no step given: the step in progress (0 outside a loop)
    with pytest.raises(CoreCPUError, match="'hidden' is a tensor of 4 elements; log one number"):
        one_process.log({"hidden": torch.zeros(4)}, step=4)
    one_process.close()  # closes metrics.jsonl and the trackers with the run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 3, "loss": 0.5, "learning_rate": 1e-4}, {"step": 0, "eval_accuracy": 0.75}]
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(3, 0.5)]


def test_the_step_line_off_a_terminal_says_epoch_elapsed_and_eta():
    from corecpu.reporting.metrics_log import format_step

    record = {"step": 40, "epoch": 0.5, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.25, "samples_per_s": 10.0,
              "tokens_per_s": 500.0, "elapsed_s": 80.4}
    line = format_step(record, 100, seconds_per_step=2.0)
    assert line.startswith("step     40/100 | epoch 0.50 | loss 0.5000 | lr 1.00e-04 | grad_norm 1.25 |")
    assert line.endswith("| 2.00 s/step | elapsed 1:20 | eta 2:00")
    assert format_step({**record, "elapsed_s": 7300.0}, 100, 120.0).endswith("elapsed 2:01:40 | eta 2:00:00")
