"""The image job's pure parts: examples/image_classification.py's data, FLOP count and throughput, plain_image.py's
CPU split, and the variants benchmarks/image_throughput.py plans."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.common import ROOT


def _example():
    spec = importlib.util.spec_from_file_location("image_classification", ROOT / "examples" / "image_classification.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # main() runs only as a script
    return module


job = _example()


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/ on sys.path as the scripts expect (restored after), and image_throughput imported."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    return importlib.import_module("image_throughput")


# ---------------------------------------------------------------- data

def test_images_are_the_same_for_a_seed_and_differ_across_seeds_and_splits() -> None:
    a, b = job.SyntheticImages(40, 4, 16, seed=0), job.SyntheticImages(40, 4, 16, seed=0)
    for i in (0, 7, 39):
        assert torch.equal(a.pixels(i)[0], b.pixels(i)[0]) and a[i][1] == b[i][1]
    other_seed = job.SyntheticImages(40, 4, 16, seed=1)
    held_out = job.SyntheticImages(40, 4, 16, seed=0, split="eval")
    assert not torch.equal(a.pixels(3)[0], other_seed.pixels(3)[0])
    assert not torch.equal(a.pixels(3)[0], held_out.pixels(3)[0])
    assert torch.equal(a.patterns, held_out.patterns)  # the same classes in both splits


def test_labels_are_balanced_and_items_are_normalised_uint8_pixels() -> None:
    data = job.SyntheticImages(60, 6, 12)
    assert Counter(data[i][1] for i in range(len(data))) == {k: 10 for k in range(6)}
    pixels, label = data.pixels(5)
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, 12, 12)
    x, same = data[5]
    assert same == label and x.dtype == torch.float32
    assert torch.allclose(x, (pixels.float() / 255 - job.MEAN) / job.STD)


def test_a_class_is_closer_to_its_own_pattern_than_to_others() -> None:
    # Learnable: averaged over items, an image correlates best with its own class's pattern.
    data = job.SyntheticImages(200, 5, 24)
    hits = 0
    for i in range(len(data)):
        image = data.pixels(i)[0].float() / 255
        scores = [-(image - (0.25 + 0.5 * p)).abs().mean() for p in data.patterns]
        hits += int(torch.stack(scores).argmax()) == i % 5
    assert hits / len(data) > 0.5  # chance is 0.2


# ---------------------------------------------------------------- model, FLOPs, throughput

def test_the_default_model_is_resnet50_sized() -> None:
    model = job.build_model("resnet50", 1000)
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's resnet50


def test_flop_count_of_the_tiny_model_is_positive_stable_and_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = job.build_model("tiny", 10).train()
    stats = {k: v.clone() for k, v in model.state_dict().items()}
    first, second = job.flops_per_sample(model, 32), job.flops_per_sample(model, 32)
    assert first > 0 and first == second
    assert job.flops_per_sample(job.build_model("tiny", 10), 64) == pytest.approx(4 * first, rel=0.02)  # ~ pixels
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in stats.items())  # batch-norm statistics untouched


def test_samples_per_s_times_steps_after_the_warmup() -> None:
    ends, samples = [1.0, 2.0, 2.5, 3.0, 4.0], [8, 8, 8, 8, 4]
    assert job.samples_per_s(ends, samples, warmup=2) == pytest.approx((8 + 8 + 4) / (4.0 - 2.0))
    assert job.samples_per_s(ends, samples, warmup=5) is None
    assert job.samples_per_s(ends, samples, warmup=0) is None


# ---------------------------------------------------------------- the plain script's CPU split

def _node(root: Path, n: int, cpus: str) -> None:
    (root / f"node{n}").mkdir(parents=True)
    (root / f"node{n}" / "cpulist").write_text(cpus + "\n")


def test_split_cpus_takes_a_numa_node_per_rank_or_an_equal_share(tmp_path, monkeypatch, bench) -> None:
    plain = importlib.import_module("plain_image")
    monkeypatch.setattr(plain.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    _node(tmp_path / "two", 0, "0-3")
    _node(tmp_path / "two", 1, "4-7")
    assert plain.split_cpus(1, 2, tmp_path / "two") == [4, 5, 6, 7]
    _node(tmp_path / "one", 0, "0-7")
    assert [plain.split_cpus(r, 2, tmp_path / "one") for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


# ---------------------------------------------------------------- the benchmark's variants

def _args(**kw) -> argparse.Namespace:
    base = dict(model="tiny", image_size=32, batch_size=8, steps=4, warmup=3, eval_size=16, split_ranks=2)
    return argparse.Namespace(**{**base, **kw})


def _value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_every_variant_trains_the_same_global_batch_with_its_levers(bench) -> None:
    libs = {"jemalloc": "/lib/libjemalloc.so.2", "tcmalloc": None}
    plans = {v: bench.command(v, _args(), Path("/w"), libs, {"PATH": "/bin"})
             for v in ("plain", "plain+cl+bf16+compile", "plain+split+jemalloc", "corecpu+split+nocl")}
    for v, (cmd, env) in plans.items():
        ranks = 2 if "split" in v else 1
        assert int(_value(cmd, "--batch-size")) * ranks == 8
        assert _value(cmd, "--steps") == "4" and _value(cmd, "--image-size") == "32"
    assert {"--channels-last", "--bf16", "--compile"} <= set(plans["plain+cl+bf16+compile"][0])
    assert "LD_PRELOAD" not in plans["plain"][1]
    cmd, env = plans["plain+split+jemalloc"]
    assert "torchrun" in cmd[0] and "--numa-split" in cmd and env["LD_PRELOAD"] == "/lib/libjemalloc.so.2"
    cmd, _ = plans["corecpu+split+nocl"]
    assert cmd[0].endswith("launch.sh") and cmd[1] == "2" and _value(cmd, "--channels-last") == "off"
    assert "tcmalloc" in bench.command("plain+tcmalloc", _args(), Path("/w"), libs, {})  # absent: a reason
    assert "split" in bench.command("plain+split", _args(batch_size=7), Path("/w"), libs, {})


def test_read_log_takes_the_step_lines_and_the_summary(bench) -> None:
    text = "\n".join(['corecpu 2 rank(s)', '{"step": 1, "loss": 2.3, "samples": 8, "elapsed": 0.5}',
                      '{"step": 2, "loss": 2.1, "samples": 8, "elapsed": 0.9}',
                      '{"summary": true, "eval_accuracy": 0.5, "flops_per_sample": 10.0, "matmul_flops": 100.0}'])
    steps, summary = bench.read_log(text)
    assert steps == [{"step": 1, "t": 0.5, "samples": 8, "loss": 2.3}, {"step": 2, "t": 0.9, "samples": 8, "loss": 2.1}]
    assert summary["eval_accuracy"] == 0.5
    with pytest.raises(RuntimeError):
        bench.read_log("no records")


def test_summary_gives_bf16_runs_a_share_of_the_fp32_rate_too(bench) -> None:
    def run(variant: str, precision: str, rate: float, matmul: float) -> dict:
        window = {"samples_per_s": rate, "ms_per_step": 1.0, "wall_s": 10.0, "eval_accuracy": 0.5, "eval_f1": 0.0,
                  "final_loss": 1.0, "loss_ok": True}
        return {"variant": variant, **window, "mfu": rate * 100 / matmul, "flops_per_sample": 100.0,
                "matmul_flops": matmul, "precision": precision, "channels_last": False, "compile": False,
                "ranks": 1, "threads": 2, "ld_preload": None}

    result = bench.summarize([run("plain", "fp32", 10.0, 4000.0), run("plain+bf16", "bf16", 5.0, 50.0)],
                             ["plain", "plain+bf16"])
    bf16 = result["medians"]["plain+bf16"]
    assert bf16["mfu"] == pytest.approx(10.0) and bf16["mfu_fp32"] == pytest.approx(5.0 * 100 / 4000.0)
    assert result["ratios"]["plain+bf16"]["throughput"] == pytest.approx(0.5)
    assert "| 1.000 | 0.500 | 1000.0% | 12.5% |" in bench.markdown({**result, "skipped": {}, "config": {
        "model": "tiny", "image_size": 32, "batch_size": 8, "steps": 4, "warmup": 3, "repeats": 1, "numa_nodes": 1,
        "split_note": "x"}, "machine": {"cpu_model": "c", "usable_cpus": 2, "cpu_flags": {}}})
