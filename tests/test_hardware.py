"""Tier 1: CPU flag detection (the precision decision is tested in test_precision.py)."""

from corecpu.cpu.hardware import parse_proc_cpuinfo, read_cpu_features

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
