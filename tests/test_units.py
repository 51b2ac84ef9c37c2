"""Tier 1: thread decisions, metric arithmetic and the config surface."""

from __future__ import annotations

import json

import pytest
import torch

from corecpu.config import TrainConfig, build_parser, parse_config
from corecpu.errors import CoreCPUError
from corecpu.launchers import LaunchInfo
from corecpu.metrics import MetricsLog, eval_counts, scores_from_counts
from corecpu.threads import decide_threads

ALL = frozenset(range(8))
TWO_LOCAL = LaunchInfo("torchrun", 1, 2, 1, 2)


def test_threads_respect_an_explicit_request():
    d = decide_threads(3, {}, ALL, ALL, TWO_LOCAL, frozenset({4, 5, 6, 7}))
    assert (d.threads, d.bind_to) == (3, None)


def test_threads_when_bound_by_corecpu():
    d = decide_threads(0, {"CORECPU_BOUND_CPUS": "4-7", "OMP_NUM_THREADS": "4"}, frozenset({4, 5, 6, 7}), ALL,
                       TWO_LOCAL, None)
    assert (d.threads, d.bind_to) == (4, None)


def test_threads_respect_a_launcher_binding():
    # ipexrun / Intel MPI already narrowed this rank to 2 CPUs: use them, do not re-plan.
    d = decide_threads(0, {"OMP_NUM_THREADS": "1"}, frozenset({2, 3}), ALL, TWO_LOCAL, frozenset({4, 5, 6, 7}))
    assert (d.threads, d.bind_to) == (2, None)


def test_unbound_torchrun_ranks_get_their_planned_share():
    # torchrun sets OMP_NUM_THREADS=1 and binds nothing: every rank would see all 8 CPUs.
    d = decide_threads(0, {"OMP_NUM_THREADS": "1"}, ALL, ALL, TWO_LOCAL, frozenset({4, 5, 6, 7}))
    assert (d.threads, d.bind_to) == (4, frozenset({4, 5, 6, 7}))
    fallback = decide_threads(0, {}, ALL, ALL, TWO_LOCAL, None)
    assert (fallback.threads, fallback.bind_to) == (4, None)


def test_single_rank_uses_everything_it_may():
    d = decide_threads(0, {}, ALL, ALL, LaunchInfo("single", 0, 1, 0, 1), None)
    assert d.threads == 8


def test_binary_and_macro_f1_from_counts():
    logits = torch.tensor([[0.0, 1], [0, 1], [1, 0], [1, 0], [0, 1]])  # predictions 1 1 0 0 1
    labels = torch.tensor([1, 0, 0, 1, 1])
    weights = torch.tensor([1, 1, 1, 1, 0])  # the last is padding
    s = scores_from_counts(eval_counts(logits, labels, weights, 2), 2)
    # tp=1 fp=1 fn=1 for label 1 -> F1 0.5; accuracy 2/4
    assert (s["eval_accuracy"], s["eval_f1"], s["eval_examples"]) == (0.5, 0.5, 4)
    # Split the batch in two and add the counts: identical scores (what all-reduce relies on).
    halves = eval_counts(logits[:2], labels[:2], weights[:2], 2) + eval_counts(logits[2:], labels[2:], weights[2:], 2)
    assert scores_from_counts(halves, 2) == s
    three = scores_from_counts(eval_counts(torch.eye(3), torch.tensor([0, 1, 1]), torch.ones(3), 3), 3)
    assert three["eval_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_metrics_log_drops_records_after_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 8)) + '{"step": 8, "lo')
    log = MetricsLog(path, resume_step=5)
    log.write({"step": 6})
    log.close()
    assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


def test_every_config_field_is_a_flag_with_help():
    parser = build_parser()
    text = parser.format_help()
    for name, f in TrainConfig.__dataclass_fields__.items():
        assert "--" + name.replace("_", "-") in text and f.metadata["help"]
    assert parse_config([]) == TrainConfig()
    assert parse_config(["--no-compile", "--lr", "3e-5"]).lr == 3e-5


@pytest.mark.parametrize("argv, fragment", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--lr", "0"], "--lr must be a positive number"),
    (["--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1)"),
    (["--precision", "fp16"], "invalid choice: 'fp16'"),
    (["--max-steps", "-1"], "--max-steps must not be negative"),
])
def test_config_errors_are_one_line(argv, fragment):
    with pytest.raises(CoreCPUError) as err:
        parse_config(argv)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_make_data_writes_the_builtin_task_and_refuses_to_overwrite(tmp_path):
    import subprocess
    import sys

    from corecpu.data import load_data

    path = tmp_path / "builtin.tsv"
    cmd = [sys.executable, "-m", "corecpu.cli", "make-data", str(path), "--n", "50"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    data = load_data(str(path))
    assert len(data) == 50 and data.label_names == ["negative", "positive"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr
