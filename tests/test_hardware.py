"""Tier 1: CPU flag detection and the precision rule."""

import pytest
import torch

from corecpu.errors import CoreCPUError
from corecpu.hardware import CpuFeatures, choose_precision, parse_proc_cpuinfo, read_cpu_features

SPR = CpuFeatures("Intel Xeon Platinum 8480+", frozenset({"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile"}))
ICX = CpuFeatures("Intel Xeon Platinum 8380", frozenset({"avx512f", "avx512_vnni"}))
ZEN4 = CpuFeatures("AMD EPYC", frozenset({"avx512f", "avx512_bf16"}))


def test_auto_picks_bf16_only_with_native_support():
    assert choose_precision("auto", SPR).name == "bf16"
    assert choose_precision("auto", ZEN4).name == "bf16"
    icx = choose_precision("auto", ICX)
    assert icx.name == "fp32" and icx.autocast_dtype is None and icx.warning is None


def test_forced_bf16_without_hardware_warns_once():
    choice = choose_precision("bf16", ICX)
    assert choice.name == "bf16" and choice.autocast_dtype == torch.bfloat16
    assert "slower" in choice.warning
    assert choose_precision("bf16", SPR).warning is None


def test_fp32_is_always_fp32():
    assert choose_precision("fp32", SPR).name == "fp32"


def test_unknown_precision():
    with pytest.raises(CoreCPUError, match="unknown precision 'fp8'"):
        choose_precision("fp8", SPR)


CPUINFO = """processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu sse avx512f avx512_vnni amx_bf16 amx_tile avx512_bf16

processor	: 1
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu sse
"""


def test_parse_proc_cpuinfo_reads_first_processor():
    model, flags = parse_proc_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"amx_bf16", "avx512_bf16", "avx512f"} <= flags


def test_read_cpu_features_from_fake_proc(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    feats = read_cpu_features(path, use_cpuinfo_lib=False)
    assert feats.has_native_bf16 and feats.tracked()["amx_tile"] and not feats.tracked()["amx_int8"]
    path.write_text(CPUINFO.replace(" amx_bf16 amx_tile avx512_bf16", ""))
    assert not read_cpu_features(path, use_cpuinfo_lib=False).has_native_bf16


def test_this_machine_agrees_with_the_kernel():
    # Whatever this CPU is, the union must contain every flag the kernel reports that we track.
    kernel = parse_proc_cpuinfo(open("/proc/cpuinfo").read())[1]
    feats = read_cpu_features()
    for flag, present in feats.tracked().items():
        if flag in kernel:
            assert present
