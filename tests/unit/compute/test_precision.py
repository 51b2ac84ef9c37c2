"""Tier 1: the precision decision (pure), its cache, the calibration on tiny shapes."""

import json
import math
import os
import stat

import pytest
import torch
from transformers import BertConfig

from corecpu.compute import precision as prec
from corecpu.envvars import cache_dir
from corecpu.errors import CoreCPUError
from corecpu.cpu.hardware import CpuFeatures
from corecpu.compute.precision import (BF16_MARGIN, CalibrationShapes, PrecisionChoice, agree_precision,
                                       alternate_rounds, cache_key, decide_precision, measure_bf16_speedup,
                                       resolve_precision, typical_batch_length)

SPR = CpuFeatures("Intel Xeon Platinum 8480+", frozenset({"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile"}))
ICX = CpuFeatures("Intel Xeon Platinum 8380", frozenset({"avx512f", "avx512_vnni"}))
ZEN = CpuFeatures("AMD EPYC", frozenset({"avx512f", "avx512_bf16"}))
CPX = CpuFeatures("Intel Xeon Gold 6348H", frozenset({"avx512f", "avx512_bf16"}))  # bf16 without AMX
SHAPES = CalibrationShapes(batch_size=2, seq_len=8, linears=((16, 32, 2), (32, 16, 1)), num_params=1000)


# ---------------------------------------------------------------- decision rules

def test_amx_means_bf16_without_measuring():
    choice = decide_precision("auto", SPR, None)
    assert (choice.name, choice.source, choice.warning) == ("bf16", "amx", None)
    assert choice.autocast_dtype == torch.bfloat16


@pytest.mark.parametrize("ratio,name", [(1.48, "bf16"), (BF16_MARGIN, "bf16"), (1.05, "fp32"), (0.65, "fp32")])
def test_auto_follows_the_measured_ratio_with_a_margin(ratio, name):
    choice = decide_precision("auto", CPX, ratio)
    assert choice.name == name and choice.source == "measured" and choice.bf16_speedup == ratio
    assert f"{ratio:.2f}x" in choice.reason and CPX.model_name in choice.reason and choice.warning is None


def test_cached_ratio_says_so():
    choice = decide_precision("auto", ZEN, 1.5, cached=True)
    assert choice.source == "cached" and "(cached)" in choice.reason and choice.name == "bf16"


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), 0.0, -1.0])
def test_auto_without_a_usable_measurement_is_fp32(bad):
    choice = decide_precision("auto", ZEN, bad)
    assert choice.name == "fp32" and choice.bf16_speedup is None


def test_requested_is_as_asked():
    assert decide_precision("fp32", SPR).name == "fp32"
    assert decide_precision("fp32", SPR).source == "requested"
    choice = decide_precision("bf16", ZEN, 1.5)
    assert (choice.name, choice.source, choice.warning) == ("bf16", "requested", None)


def test_requested_bf16_warns_when_measured_or_known_slower():
    measured = decide_precision("bf16", CPX, 0.65)
    assert measured.name == "bf16" and "0.65x" in measured.warning
    emulated = decide_precision("bf16", ICX, None)
    assert emulated.name == "bf16" and "emulates" in emulated.warning
    assert decide_precision("bf16", SPR, None).warning is None
    assert decide_precision("bf16", ZEN, 1.02).warning is None  # about equal: not worth a warning


def test_unknown_precision():
    with pytest.raises(CoreCPUError, match="unknown precision 'fp8'"):
        decide_precision("fp8", SPR)


def test_ranks_agree_on_bf16_only_if_all_chose_it():
    fast, faster = decide_precision("auto", ZEN, 1.3), decide_precision("auto", ZEN, 1.6)
    slow = decide_precision("auto", CPX, 0.7)
    both = agree_precision([faster, fast])
    assert both.name == "bf16" and both.bf16_speedup == 1.3
    mixed = agree_precision([faster, slow])
    assert mixed.name == "fp32" and mixed.bf16_speedup == 0.7 and "1 of 2 ranks" in mixed.reason
    amx_and_slow = agree_precision([decide_precision("auto", SPR), slow])
    assert amx_and_slow.name == "fp32"
    assert agree_precision([decide_precision("bf16", ZEN)] * 3).name == "bf16"


def test_typical_batch_length():
    lengths = list(range(1, 101))  # the longest of 16 random items is near the 94th percentile
    assert typical_batch_length(lengths, 16) == 96
    assert typical_batch_length(lengths, 1, multiple=16) == 64
    assert typical_batch_length([3, 4], 16) == 32 and typical_batch_length([], 16) == 32


# ---------------------------------------------------------------- shapes

def test_shapes_from_a_tiny_hf_config():
    config = BertConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, vocab_size=100,
                        hidden_dropout_prob=0.0)
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification(config)
    shapes = CalibrationShapes.from_model(model, batch_size=4, seq_len=32)
    assert (shapes.hidden_size, shapes.intermediate_size, shapes.num_heads, shapes.num_layers) == (64, 128, 4, 2)
    assert shapes.dropout == 0.0
    assert shapes.tokens == 128 and shapes.num_params == sum(p.numel() for p in model.parameters())


def test_shapes_from_a_plain_module_count_its_linears():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    shapes = CalibrationShapes.from_model(model, 2, 4)
    assert shapes.linears == ((8, 16, 1), (16, 16, 2)) and shapes.hidden_size == 0
    with pytest.raises(CoreCPUError, match="choose the precision explicitly"):
        CalibrationShapes.from_model(torch.nn.ReLU(), 2, 4)


# ---------------------------------------------------------------- calibration

@pytest.mark.parametrize("shapes", [
    SHAPES,
    CalibrationShapes(2, 8, hidden_size=32, intermediate_size=64, num_heads=2, num_layers=2, num_params=500),
])
def test_calibration_returns_a_positive_finite_ratio_and_leaves_threads_and_rng_alone(shapes):
    before = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ratio = measure_bf16_speedup(shapes, threads=1, budget_s=0.0)
    assert math.isfinite(ratio) and ratio > 0
    assert torch.get_num_threads() == before
    assert torch.equal(torch.rand(3), expected)  # training's random stream is where it was


# ---------------------------------------------------------------- cache

class FakeSteps:
    """one(bf16) for alternate_rounds: fixed times per precision, on a fake clock that each call advances."""

    def __init__(self, fp32_s: float, bf16_s: float) -> None:
        self.times, self.clock, self.calls = {False: fp32_s, True: bf16_s}, 0.0, []

    def one(self, bf16: bool) -> float:
        self.calls.append(bf16)
        self.clock += self.times[bf16]
        return self.times[bf16]


@pytest.mark.parametrize("fp32_s, bf16_s", [(0.1, 1.2), (0.3, 0.1)])  # emulated bf16 (0.08x); AMX-like (3x)
def test_a_decisive_first_round_ends_the_calibration(fp32_s, bf16_s):
    steps = FakeSteps(fp32_s, bf16_s)
    fp32, bf16 = alternate_rounds(steps.one, budget_s=10.0, min_rounds=3, max_rounds=20, now=lambda: steps.clock)
    assert (fp32, bf16) == ([fp32_s], [bf16_s]) and steps.calls == [False, True]


@pytest.mark.parametrize("fp32_s, bf16_s", [(0.1, 0.18), (0.1, 0.1), (0.21, 0.1)])  # 0.56x, 1.0x, 2.1x
def test_a_ratio_near_the_margin_gets_the_budget_and_the_minimum_rounds(fp32_s, bf16_s):
    steps = FakeSteps(fp32_s, bf16_s)
    fp32, bf16 = alternate_rounds(steps.one, budget_s=0.0, min_rounds=3, max_rounds=20, now=lambda: steps.clock)
    assert len(fp32) == len(bf16) == 3
    assert steps.calls == [False, True, True, False, False, True]  # the order alternates by round
    steps = FakeSteps(fp32_s, bf16_s)
    fp32, _ = alternate_rounds(steps.one, budget_s=2.0, min_rounds=3, max_rounds=20, now=lambda: steps.clock)
    assert 3 < len(fp32) < 20 and steps.clock >= 2.0  # until the budget is spent


def test_cache_dir_from_env(tmp_path):
    assert cache_dir({"CORECPU_CACHE_DIR": str(tmp_path / "c"), "XDG_CACHE_HOME": "/x"}) == tmp_path / "c"
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "corecpu"
    assert cache_dir({}).parts[-2:] == (".cache", "corecpu")


class FakeMeasure:
    def __init__(self, ratio: float) -> None:
        self.ratio, self.calls = ratio, 0

    def __call__(self, shapes, threads, budget_s):
        self.calls += 1
        return self.ratio


def test_cache_miss_measures_then_hit_reuses(tmp_path):
    measure = FakeMeasure(1.4)
    first = resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=measure)
    assert (first.name, first.source, first.bf16_speedup, measure.calls) == ("bf16", "measured", 1.4, 1)
    again = resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=FakeMeasure(0.5))
    assert (again.name, again.source, again.bf16_speedup) == ("bf16", "cached", 1.4)
    entry = next(iter(json.loads((tmp_path / prec.CACHE_FILE).read_text())["entries"].values()))
    assert entry["bf16_speedup"] == 1.4 and "calibration_s" in entry


@pytest.mark.parametrize("change", ["threads", "shapes", "cpu"])
def test_cache_key_change_measures_again(tmp_path, change):
    resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=FakeMeasure(1.4))
    measure = FakeMeasure(0.9)
    args = {"features": ZEN, "shapes": SHAPES, "threads": 1}
    args.update({"threads": {"threads": 2}, "shapes": {"shapes": CalibrationShapes(4, 8, linears=SHAPES.linears)},
                 "cpu": {"features": CPX}}[change])
    choice = resolve_precision("auto", args["features"], args["shapes"], args["threads"], tmp_path, measure=measure)
    assert measure.calls == 1 and choice.name == "fp32" and choice.source == "measured"
    assert len(json.loads((tmp_path / prec.CACHE_FILE).read_text())["entries"]) == 2


def test_cache_key_names_cpu_torch_threads():
    key = cache_key(ZEN, "2.13.0+cpu", 3, SHAPES)
    assert "AMD EPYC" in key and "avx512_bf16" in key and "2.13.0+cpu" in key and "3 threads" in key
    assert key != cache_key(ZEN, "2.14.0+cpu", 3, SHAPES)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 1, "entries": 7}', ""])
def test_corrupt_cache_is_ignored_and_rewritten(tmp_path, content):
    (tmp_path / prec.CACHE_FILE).write_text(content)
    measure = FakeMeasure(1.3)
    assert resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=measure).source == "measured"
    assert measure.calls == 1
    assert resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=FakeMeasure(0.1)).source == "cached"


@pytest.mark.parametrize("ratio", ["fast", None, [1.2], True, -1.0])
def test_a_damaged_entry_is_measured_again_and_named(tmp_path, ratio, capsys, monkeypatch):
    from corecpu import notices

    monkeypatch.setattr(notices, "_said", set())
    resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=FakeMeasure(1.4))
    path = tmp_path / prec.CACHE_FILE
    data = json.loads(path.read_text())
    key = next(iter(data["entries"]))
    data["entries"][key]["bf16_speedup"] = ratio
    path.write_text(json.dumps(data))
    measure = FakeMeasure(0.8)
    choice = resolve_precision("auto", ZEN, SHAPES, 1, tmp_path, measure=measure)
    assert f"corecpu: warning: ignoring the damaged precision calibration in {path}" in capsys.readouterr().err
    assert (choice.name, choice.source, measure.calls) == ("fp32", "measured", 1)
    assert json.loads(path.read_text())["entries"][key]["bf16_speedup"] == 0.8  # replaced, so the next run is fine


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_cache_dir_warns_once_and_still_decides(tmp_path, monkeypatch, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    assert "Permission denied" in _unwritable_case(ro, monkeypatch, capsys)


def test_cache_dir_that_is_a_file_warns_once_and_still_decides(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a cache dir below a regular file cannot be created, even by root
    line = _unwritable_case(blocker / "corecpu", monkeypatch, capsys)
    assert f"{blocker} is a file where a directory is expected; remove or rename it" in line  # not "File exists"


def _unwritable_case(directory, monkeypatch, capsys) -> str:
    """The one warning line: plain (no file:line, no RuntimeWarning), once, and the run still decides."""
    from corecpu import cachefile, notices

    monkeypatch.setattr(cachefile, "_warned", set())
    monkeypatch.setattr(notices, "_said", set())
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(directory))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing goes through Python's warnings (file:line, once per rank)
        choice = resolve_precision("auto", ZEN, SHAPES, 1, measure=FakeMeasure(1.5))
        assert choice.name == "bf16" and choice.source == "measured"
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("corecpu: warning: not caching the precision calibration in ")
        assert resolve_precision("auto", ZEN, SHAPES, 1, measure=FakeMeasure(1.5)).name == "bf16"
        assert capsys.readouterr().err == ""  # the second failure is silent
    return lines[0]


def test_requested_skips_calibration_but_uses_a_cached_ratio_for_the_warning(tmp_path):
    never = FakeMeasure(1.0)
    assert resolve_precision("fp32", ZEN, SHAPES, 1, tmp_path, measure=never).name == "fp32"
    assert resolve_precision("bf16", CPX, SHAPES, 1, tmp_path, measure=never).warning is None
    assert resolve_precision("auto", SPR, SHAPES, 1, tmp_path, measure=never).source == "amx"
    assert never.calls == 0 and not (tmp_path / prec.CACHE_FILE).exists()
    resolve_precision("auto", CPX, SHAPES, 1, tmp_path, measure=FakeMeasure(0.6))
    assert "0.60x" in resolve_precision("bf16", CPX, SHAPES, 1, tmp_path, measure=never).warning


def test_choice_records_for_config_json():
    record = PrecisionChoice("bf16", "measured", bf16_speedup=1.5, source="measured").to_dict()
    assert record == {"precision": "bf16", "bf16_speedup": 1.5, "source": "measured", "reason": "measured"}


class Refuse:
    def __call__(self, shapes, threads, budget_s):
        raise AssertionError("measured again")


OTHER = CalibrationShapes(batch_size=2, seq_len=32, linears=SHAPES.linears, num_params=1000)
AVX2 = CpuFeatures("AMD EPYC", frozenset({"avx2", "fma"}))


def test_a_cpu_without_fast_bf16_on_one_shape_is_not_timed_again_on_another(tmp_path):
    resolve_precision("auto", AVX2, SHAPES, 1, tmp_path, measure=FakeMeasure(0.2))
    assert resolve_precision("auto", AVX2, SHAPES, 2, tmp_path, measure=Refuse()).bf16_speedup == 0.2
    prec.store_cache(tmp_path / prec.CACHE_FILE, cache_key(AVX2, torch.__version__, 2, SHAPES), {"bf16_speedup": 0.07})
    choice = resolve_precision("auto", AVX2, OTHER, 1, tmp_path, measure=Refuse())
    assert (choice.name, choice.source, choice.bf16_speedup) == ("fp32", "cached", 0.07)  # the lowest, any threads
    assert "from another shape" in choice.reason and "0.07x" in choice.reason
    # Only a measurement of this shape is stored under its key.
    assert len(json.loads((tmp_path / prec.CACHE_FILE).read_text())["entries"]) == 2


@pytest.mark.parametrize("other", ["ratio", "cpu", "torch"])
def test_a_slow_ratio_decides_only_when_far_below_and_on_this_cpu_and_torch(tmp_path, other, monkeypatch):
    # 0.3x: slow, but within what a CPU with native bf16 measured on some shapes (0.77x): each shape is timed.
    resolve_precision("auto", AVX2, SHAPES, 1, tmp_path, measure=FakeMeasure(0.3 if other == "ratio" else 0.07))
    features = CpuFeatures("AMD EPYC", frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})) if other == "cpu" else AVX2
    if other == "torch":
        monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    measure = FakeMeasure(1.5)
    choice = resolve_precision("auto", features, OTHER, 1, tmp_path, measure=measure)
    assert (measure.calls, choice.name, choice.source) == (1, "bf16", "measured")
