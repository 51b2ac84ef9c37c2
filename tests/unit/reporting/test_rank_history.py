"""Which rank count trained a job fastest: the shape runs are compared by, the advice, and its record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corecpu.reporting import rank_history
from corecpu.reporting.reporter import Reporter

CONFIG = {"task": "classification", "model": "m", "data": "paraphrase", "max_seq_len": 128, "batch_size": 8,
          "grad_accum": 1, "lr": 1e-4, "seed": 0, "output_dir": "/a", "precision": "auto", "max_steps": 0}


def shape(ranks: int = 4, config: dict | None = None, binding: str = "core") -> rank_history.JobShape:
    return rank_history.job_shape(config or CONFIG, binding, cpu_model="Xeon", node_cpus=16,
                                  world_size=ranks, local_world_size=ranks, torch_version="2.11")


def test_the_shape_ignores_what_does_not_change_a_steps_cost() -> None:
    a = shape(4)
    assert a.global_batch == 32 and a.ranks_per_node == 4 and a.nodes == 1
    assert shape(4, {**CONFIG, "lr": 3e-5, "seed": 7, "output_dir": "/b", "max_steps": 30}).key == a.key
    assert shape(2, {**CONFIG, "batch_size": 16}).key == a.key  # same global batch, other rank count: comparable
    assert shape(2).key != a.key  # global batch 16: another job
    assert shape(4, {**CONFIG, "precision": "fp32"}).key != a.key
    # A run on a node start-up found shared is never compared with one that had it alone.
    assert shape(4, binding="numa").key != a.key
    busy = rank_history.job_shape(CONFIG, "core", cpu_model="Xeon", node_cpus=16, world_size=4, local_world_size=4,
                                  busy=True, torch_version="2.11")
    assert busy.key != a.key
    assert shape(4, {**CONFIG, "max_seq_len": 256}).key != a.key


def runs(*rates: float) -> list[dict]:
    return [{"samples_per_s": r} for r in rates]


def test_advice_names_the_faster_rank_count_and_the_batch_that_keeps_the_global_batch() -> None:
    entry = {"4": runs(86.0), "2": runs(110.0, 108.0, 111.0), "1": runs(106.0)}
    line = rank_history.advice(entry, shape(4), rate=86.0)
    assert line == ("4 rank(s) per node trains this job at 86.0 samples/s on this machine; 2 per node trained it at "
                    "110.0 (1.28x): run 2 per node (--batch-size 16 keeps the global batch of 32)")
    # Before a run has its own rate: what this rank count recorded earlier.
    assert rank_history.advice(entry, shape(4)).startswith("4 rank(s) per node trained this job at 86.0")


def test_no_advice_within_the_margin_or_without_a_measurement() -> None:
    assert rank_history.advice({"4": runs(100.0), "2": runs(104.0)}, shape(4), rate=100.0) is None
    assert rank_history.advice({"4": runs(110.0), "2": runs(100.0)}, shape(4), rate=110.0) is None
    assert rank_history.advice({"2": runs(150.0)}, shape(4)) is None  # 4 ranks never ran: nothing to compare
    assert rank_history.advice({}, shape(4), rate=100.0) is None


def test_a_global_batch_that_does_not_split_is_said() -> None:
    odd = shape(4, {**CONFIG, "batch_size": 3})  # global 12
    line = rank_history.advice({"8": runs(200.0)}, odd, rate=100.0)
    assert line is not None and line.endswith("(the global batch of 12 does not split over 8 ranks per node)")


def test_the_record_keeps_the_last_few_rates_per_rank_count() -> None:
    entry: dict = {}
    for rate in (1.0, 2.0, 3.0, 4.0):
        entry = rank_history.recorded(entry, shape(4), rate, steps=50)
    assert [r["samples_per_s"] for r in entry["4"]] == [2.0, 3.0, 4.0]


def test_short_runs_are_not_recorded(tmp_path: Path) -> None:
    env = {"CORECPU_CACHE_DIR": str(tmp_path)}
    assert rank_history.store(shape(4), 100.0, rank_history.MIN_STEPS - 1, env) is None
    assert rank_history.store(shape(4), None, 100, env) is None
    assert not (tmp_path / rank_history.CACHE_FILE).exists()
    entry = rank_history.store(shape(4), 100.0, rank_history.MIN_STEPS, env)
    assert entry is not None and entry["4"][0]["samples_per_s"] == 100.0
    assert rank_history.read(shape(4), env) == entry

def test_a_run_records_its_rate_and_says_when_fewer_ranks_did_better(one_process, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))
    report = Reporter(one_process, tmp_path / "out", dict(CONFIG, batch_size=32), total_steps=30, progress="off")
    report.start(0)
    key = report._shape
    assert key is not None and key.ranks_per_node == 1 and key.global_batch == 32
    # Another rank count of the same job, recorded earlier on this machine, trained faster.
    cache = {"CORECPU_CACHE_DIR": str(tmp_path / "cache")}
    rank_history.store(rank_history.JobShape(key.key, 32, 1, 2), 150.0, 40, cache)
    report._timed_from, report._timed_to, report._timed_samples = 0.0, 1.0, 100.0  # 100 samples/s
    report.finish(torch_linear(), None, 30)
    err = capsys.readouterr().err
    assert ("1 rank(s) per node trains this job at 100.0 samples/s on this machine; 2 per node trained it at 150.0 "
            "(1.50x): run 2 per node (--batch-size 16 keeps the global batch of 32)") in err
    stored = json.loads((tmp_path / "cache" / rank_history.CACHE_FILE).read_text())["entries"][key.key]
    assert [r["samples_per_s"] for r in stored["1"]] == [100.0] and stored["2"][0]["samples_per_s"] == 150.0


def test_a_run_whose_cpus_others_took_is_kept_with_the_busy_starts(one_process, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CORECPU_CPUS_BUSY", raising=False)  # an idle start
    report = Reporter(one_process, tmp_path / "out", dict(CONFIG, batch_size=32), total_steps=30, progress="off")
    report.start(0)
    idle, busy = report._shape, report._job_shape(busy=True)
    assert idle is not None and busy.key != idle.key
    cache = {"CORECPU_CACHE_DIR": str(tmp_path / "cache")}
    rank_history.store(rank_history.JobShape(idle.key, 32, 1, 2), 150.0, 40, cache)  # would advise 2 ranks
    # Three log records' running totals (others, steal, counted): after warm-up, others took half of the CPUs.
    for k in range(1, 4):
        report.taken.record([5.0 * k], [0.0], [10.0 * k])
    report._timed_from, report._timed_to, report._timed_samples = 0.0, 1.0, 100.0  # 100 samples/s
    report.finish(torch_linear(), None, 30)
    err = " ".join(capsys.readouterr().err.split())
    assert "this run shared its CPUs while it trained: rank 0" in err and "other processes 50%" in err
    assert "trained it at" not in err  # no advice from a rate taken beside a neighbour
    entries = json.loads((tmp_path / "cache" / rank_history.CACHE_FILE).read_text())["entries"]
    assert [r["samples_per_s"] for r in entries[busy.key]["1"]] == [100.0] and "1" not in entries[idle.key]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rank_cpu_taken_after_warmup"] == [{"others": 0.5, "steal": 0.0}]


def torch_linear():
    import torch

    class Model(torch.nn.Linear):
        def save_pretrained(self, directory: Path, safe_serialization: bool = True) -> None:
            (Path(directory) / "model.safetensors").write_bytes(b"x")

    return Model(2, 2)
