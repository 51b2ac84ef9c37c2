"""What must not train silently wrong: a non-finite flag, a gradient accumulation longer than an epoch,
a loss or weights that stop being finite, a summary.json that is not JSON."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

import corecpu
from corecpu.errors import CoreCPUError
from corecpu.reporting.reporter import Reporter
from corecpu.tasks.registry import parse_config
from corecpu.training.schedule import Schedule


@pytest.mark.parametrize("argv, fragment", [
    (["--weight-decay", "nan"], "--weight-decay must be a finite number, got nan"),
    (["--weight-decay", "inf"], "--weight-decay must be a finite number, got inf"),
    (["--max-grad-norm", "nan"], "--max-grad-norm must be a finite number"),  # nan would turn clipping off
    (["--warmup-ratio", "nan"], "--warmup-ratio must be a finite number"),
    (["--lr", "inf"], "--lr must be a finite number"),
])
def test_float_flags_must_be_finite(argv, fragment):
    with pytest.raises(CoreCPUError, match=fragment.replace("[", r"\[")):
        parse_config(argv)


def test_grad_accum_longer_than_an_epoch_is_refused():
    with pytest.raises(CoreCPUError, match="grad_accum 1000 is more than the 63 batches an epoch gives each rank; "
                                           "use --grad-accum 63 or less"):
        Schedule.for_data(2000, 16, 2, grad_accum=1000, epochs=3)
    assert Schedule.for_data(2000, 16, 2, grad_accum=63, epochs=3).steps_per_epoch == 1  # the whole epoch is fine


def _step(number: int, last: bool = False) -> SimpleNamespace:
    return SimpleNamespace(number=number, is_last=last, epoch=0, epochs=1, position=(0, number), epochs_done=number / 10)




def test_a_non_finite_loss_stops_the_run_with_one_line(one_process, tmp_path):
    report = Reporter(one_process, tmp_path / "out", {}, total_steps=10, progress="off", log_every=2)
    report.add(torch.tensor(0.7), 8, {"num_tokens": 80})
    report.step_done(_step(1), 1e-3)
    report.add(torch.tensor(0.6), 8, {"num_tokens": 80})
    report.step_done(_step(2), 1e-3)  # logged: finite
    report.add(torch.tensor(float("nan")), 8, {"num_tokens": 80})
    report.step_done(_step(3), 1e-3)  # not a log step: no sync, no check
    report.add(torch.tensor(0.5), 8, {"num_tokens": 80})
    with pytest.raises(CoreCPUError, match=r"the training loss became nan by step 4 \(finite at step 2\)"):
        report.step_done(_step(4), 1e-3)
    report.close()
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2]  # the non-finite record is not written


def test_non_finite_weights_are_never_saved_over_a_good_checkpoint(one_process, tmp_path):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = corecpu.Checkpoints(tmp_path / "out", every=1, resume="")
    model, opt = one_process.wrap(model, opt, checkpoint=ckpt)
    good = ckpt.save(_step(1))
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(CoreCPUError, match=r"not finite at step 2 \(training diverged\); not saved; .*step-00000001"):
        ckpt.save(_step(2))
    assert [p.name for p in (tmp_path / "out" / "checkpoints").iterdir()] == [good.name]


def test_summary_files_are_strict_json(one_process, tmp_path):
    report = Reporter(one_process, tmp_path / "out", {"x": math.nan}, total_steps=1, progress="off")
    report._write("summary.json", {"final_loss": math.nan, "ranks": [{"loss": math.inf}], "ok": 1.5})
    report.close()
    text = (tmp_path / "out" / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"final_loss": None, "ranks": [{"loss": None}], "ok": 1.5}


def test_after_wrap_the_records_and_the_summary_carry_mfu(one_process, tmp_path):
    import json as _json

    model, _ = one_process.wrap(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2)), None)
    report = Reporter(one_process, tmp_path / "out", {}, total_steps=4, progress="off", log_every=1)
    report.start(0)
    assert report.matmul["precision"] == "fp32" and report.matmul["job_flops"] > 0
    assert report.matmul["non_embedding_params"] == 64 * 64 + 64 + 64 * 2 + 2
    # Each micro-batch's model FLOPs are summed with its tokens: 6 x N per token, no attention in a Sequential.
    # A 100-s interval with the tokens for an MFU of about a half, so that the rounded MFU keeps its digits.
    params = 64 * 64 + 64 + 64 * 2 + 2
    report._interval.t0 -= 100.0
    report.add(torch.tensor(0.5), 8, {"num_tokens": int(0.5 * report.matmul["job_flops"] * 100 / (6 * params)),
                                      "num_padded": 0})
    report.step_done(_step(1), 1e-3)
    record = _json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["mfu"] == pytest.approx(6 * params * record["tokens_per_s"] / report.matmul["job_flops"], rel=1e-3)
    assert 0.4 < record["mfu"] < 0.6
    report.close()
    assert "mfu" in _json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])


def test_a_matmul_rate_the_model_outruns_is_not_divided_by_and_is_timed_again(one_process, tmp_path, capsys):
    from corecpu.compute import flops

    model, _ = one_process.wrap(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2)), None)
    report = Reporter(one_process, tmp_path / "out", {}, total_steps=4, progress="off", log_every=1)
    report.start(0)
    key = report._matmul_key
    rate = report.matmul["job_flops"]
    params = 64 * 64 + 64 + 64 * 2 + 2
    for number, mfu in ((1, 0.5), (2, 1.5), (3, 0.5)):  # the second interval runs at 1.5x the measured rate
        report._interval.t0 -= 100.0
        report.add(torch.tensor(0.5), 8, {"num_tokens": int(mfu * rate * 100 / (6 * params)), "num_padded": 0})
        report.step_done(_step(number, last=number == 3), 1e-3)
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert "mfu" in records[0] and "mfu" not in records[1] and "mfu" not in records[2]  # none after the proof
    assert report.mfu is None and report.matmul["outrun"].startswith("MFU 150% in a log interval")
    err = capsys.readouterr().err
    assert "this run's model outran the matmul rate measured for this machine" in err
    assert "and the next run times it again" in err
    report.close()
    # The next run measures again and keeps the higher rate: a lower timing cannot replace the cached one.
    assert flops.rank_matmul_rate("fp32", key, measure=lambda p: rate / 2) == (rate, False)
    assert flops.rank_matmul_rate("fp32", key, measure=lambda p: 0.0) == (rate, True)  # no longer suspect
    flops.suspect(key)
    assert flops.rank_matmul_rate("fp32", key, measure=lambda p: rate * 2) == (rate * 2, False)
