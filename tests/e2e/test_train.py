"""Tier 3: whole runs through launch.sh and train.py with the tiny model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.common import ROOT, fresh_cache
from helpers.launching import TINY, crash_at_step, launch, one_rank_vs_two, records, single


def test_launch_two_ranks_tiny(tmp_path):
    out = tmp_path / "run"
    proc = launch(2, *TINY, "--max-steps", "12", "--log-every", "1", "--save-every", "5", "--output-dir", str(out))
    assert "model saved to" in proc.stdout
    train, evals = records(out)
    assert [r["step"] for r in train] == list(range(1, 13))
    for r in train:
        assert {"step", "loss", "lr", "samples_per_s", "tokens_per_s"} <= r.keys() and r["samples_per_s"] > 0
    assert len(evals) == 1 and evals[0]["step"] == 12 and 0 <= evals[0]["eval_f1"] <= 1
    # Two ranks, each on its own CPU with one thread (this machine has 2 cores).
    ranks = json.loads((out / "topology.json").read_text())["ranks"]
    assert len(ranks) == 2
    if len(os.sched_getaffinity(0)) >= 2:
        assert set(ranks[0]["cpus"]).isdisjoint(ranks[1]["cpus"])
        assert [r["torch_threads"] for r in ranks] == [1, 1]
    # Checkpoints: step 5, 10 and the final 12; keep the newest 2.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000012"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"][0]["param_checksum"] == summary["ranks"][1]["param_checksum"]
    # With the optimizer sharded through shared memory every record says how long each rank waited for the other.
    shard = json.loads((out / "config.json").read_text())["decisions"]["shard_optimizer"]
    if shard.startswith("shm"):
        for r in train:
            assert len(r["rank_wait"]) == 2 and all(0 <= w <= 1 for w in r["rank_wait"])
            assert r["wait"] == pytest.approx(sum(r["rank_wait"]) / 2, abs=1e-4)
        assert 0 <= summary["wait_after_warmup"] <= 1 and len(summary["rank_wait_after_warmup"]) == 2
    else:
        assert all("wait" not in r for r in train) and summary["wait_after_warmup"] is None
    # Each rank on CPUs of its own watches them: what other processes and the hypervisor took, each record's and
    # after warm-up (how much depends on what else this machine runs; tests/chaos/test_neighbour.py loads one).
    # A rank's share over less than MIN_COUNTED_S of its CPU time (a few /proc/stat ticks) has nothing to tell: null
    # there, and a record where no rank's can tell has neither key (the tiny model's one-step intervals); never a
    # made-up share. The first record counts from the rank's start, so it always tells.
    if set(ranks[0]["cpus"]).isdisjoint(ranks[1]["cpus"]):
        told = [r for r in train if "rank_cpu_others" in r]
        assert told and told[0]["step"] == 1
        for r in told:
            values = r["rank_cpu_others"] + r["rank_cpu_steal"]
            assert len(values) == 4 and all(v is None or 0 <= v <= 1 for v in values), r
        assert None not in told[0]["rank_cpu_others"] + told[0]["rank_cpu_steal"]
        assert [set(t) for t in summary["rank_cpu_taken_after_warmup"]] == [{"others", "steal"}] * 2
    # The final model loads with plain transformers, in a process that never imports corecpu.
    code = ("import sys, torch; from transformers import AutoModelForSequenceClassification as M, AutoTokenizer as T;"
            "m = M.from_pretrained(sys.argv[1]); t = T.from_pretrained(sys.argv[1]);"
            "x = t(['a fine kettle'], return_tensors='pt'); print(m(**x).logits.shape[-1], m.config.id2label[1]);"
            "assert 'corecpu' not in sys.modules")
    check = subprocess.run([sys.executable, "-c", code, str(out / "final")], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
    assert check.returncode == 0, check.stderr
    assert check.stdout.split() == ["2", "positive"]


def test_auto_precision_is_measured_once_then_cached(tmp_path, monkeypatch):
    from corecpu.cpu.hardware import read_cpu_features
    from corecpu.compute.precision import has_amx

    if has_amx(read_cpu_features()):
        pytest.skip("AMX means bf16 without measuring")
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(fresh_cache(tmp_path / "cache")))
    sources = []
    for run in ("first", "second"):
        out = tmp_path / run
        proc = launch(2, "--model", "tiny", "--progress", "off", "--max-steps", "1", "--output-dir", str(out))
        resolved = json.loads((out / "config.json").read_text())["resolved"]
        assert resolved["precision"] in ("fp32", "bf16") and resolved["bf16_speedup"] > 0
        assert f"precision {resolved['precision']} (measured bf16 {resolved['bf16_speedup']:.2f}x" in proc.stdout
        sources.append(resolved["source"])
    assert sources == ["measured", "cached"]
    assert len(json.loads((tmp_path / "cache" / "precision.json").read_text())["entries"]) == 1


def test_plain_torchrun_ranks_are_planned_in_process(tmp_path):
    # torchrun binds nothing and sets OMP_NUM_THREADS=1; train.py must plan this node itself.
    out = tmp_path / "torchrun"
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2",
                           str(ROOT / "train.py"), *TINY, "--max-steps", "3", "--eval-data", "none",
                           "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 rank(s) via torchrun" in proc.stdout
    ranks = json.loads((out / "topology.json").read_text())["ranks"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert [r["binding"] for r in ranks] == ["planned and bound in-process"] * 2
        assert set(ranks[0]["cpus"]).isdisjoint(ranks[1]["cpus"])


def test_one_rank_batch_8_equals_two_ranks_batch_4(tmp_path):
    one_rank_vs_two(tmp_path, [*TINY, "--max-steps", "8", "--log-every", "1", "--eval-data", "none"], 8)


def test_killed_run_resumes_with_identical_losses(tmp_path):
    # grad-accum 2 x batch 16 x 2 ranks: 32 optimizer steps per epoch (the last one short), so 40 steps cross an
    # epoch boundary, and the resume starts in the second epoch.
    common = [*TINY, "--max-steps", "40", "--log-every", "1", "--save-every", "5", "--grad-accum", "2",
              "--batch-size", "16", "--eval-data", "none"]
    launch(2, *common, "--output-dir", str(tmp_path / "straight"))
    out = tmp_path / "interrupted"
    saved = crash_at_step(2, common, out, 37)
    assert saved and 33 <= saved[-1] < 40, f"run was not interrupted in its second epoch: checkpoints {saved}"
    resumed = launch(2, *common, "--output-dir", str(out), "--resume", "auto")
    assert f"resuming from {out / 'checkpoints'}" in resumed.stdout.replace("\n", "")
    a, _ = records(tmp_path / "straight")
    b, _ = records(out)
    assert [r["step"] for r in b] == list(range(1, 41))
    assert a[31]["epoch"] <= 1 < a[32]["epoch"], (a[31], a[32])  # the epoch boundary is where this test says
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["lr"] for r in a] == [r["lr"] for r in b]


def test_default_model_learns_the_builtin_task(tmp_path):
    # A short run of the real pretrained model: well above chance (0.5) on held-out data (measured: 0.83 after
    # 40 steps, 0.96 after 60, 0.52 after 10).
    out = tmp_path / "minilm"
    launch(2, "--max-steps", "40", "--log-every", "20", "--progress", "off", "--output-dir", str(out), timeout=600)
    _, evals = records(out)
    assert evals[-1]["eval_accuracy"] > 0.7, evals


def test_resume_keeps_or_refuses_the_batch_layout(tmp_path):
    # 2 ranks x 8 for 20 steps, a checkpoint at step 10; resumed from it elsewhere with another layout.
    common = [*TINY, "--max-steps", "20", "--log-every", "1", "--eval-data", "none"]
    launch(2, *common, "--batch-size", "8", "--save-every", "10", "--keep-checkpoints", "3",
           "--output-dir", str(tmp_path / "straight"))
    straight, _ = records(tmp_path / "straight")

    def from_step_10(name: str) -> Path:
        out = tmp_path / name
        (out / "checkpoints").mkdir(parents=True)
        shutil.copytree(tmp_path / "straight" / "checkpoints" / "step-00000010", out / "checkpoints" / "step-00000010")
        return out

    # 1 rank x 16: the same examples in every micro-batch, so the same losses.
    same = single(*common, "--batch-size", "16", "--resume", "auto", "--output-dir", str(from_step_10("same")))
    assert same.returncode == 0, same.stderr
    resumed, _ = records(tmp_path / "same")
    assert [r["step"] for r in resumed] == list(range(11, 21))
    for a, b in zip(straight[10:], resumed):
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a, b)
    # 1 rank x 8 would read the position under another layout: refused, one line, unless accepted.
    refused = single(*common, "--batch-size", "8", "--resume", "auto", "--output-dir", str(from_step_10("other")))
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("corecpu: error: cannot resume exactly from") and "--resume-approximate" in last
    assert "saved by 2 rank(s) x batch 8 x --grad-accum 1 and this run is 1 rank(s) x batch 8" in last
    accepted = single(*common, "--batch-size", "8", "--resume", "auto", "--resume-approximate",
                      "--output-dir", str(tmp_path / "other"))
    assert accepted.returncode == 0, accepted.stderr
    assert "resuming approximately" in accepted.stdout and "are trained on a second time" in accepted.stdout
