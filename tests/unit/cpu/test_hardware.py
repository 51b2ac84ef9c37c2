"""Tier 1: CPU flag detection (the precision decision is tested in tests/unit/compute/test_precision.py)."""

import sys
import types

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


def fake_cpuinfo_lib(monkeypatch, flags, brand="Lib Brand CPU"):
    """py-cpuinfo replaced by a module that reports `flags` (what CPUID would say)."""
    fake = types.ModuleType("cpuinfo")
    fake.get_cpu_info = lambda: {"flags": list(flags), "brand_raw": brand}
    monkeypatch.setitem(sys.modules, "cpuinfo", fake)


def test_kernel_and_cpuid_flags_are_merged_by_the_rules(tmp_path, monkeypatch):
    # The kernel lists avx512f and amx_tile; CPUID (py-cpuinfo) adds avx512_bf16, which this older kernel
    # does not print, and amx_bf16, which the kernel hides (no AMX permission) and so must not count.
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: Kernel CPU\nflags\t\t: fpu avx512f amx_tile\n")
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))  # CPUID's answer is cached per boot
    fake_cpuinfo_lib(monkeypatch, ["fpu", "avx512_bf16", "amx_bf16"])
    feats = read_cpu_features(path)
    assert feats.model_name == "Kernel CPU"
    assert feats.tracked() == {"avx512f": True, "avx512_vnni": False, "avx512_bf16": True, "amx_bf16": False,
                               "amx_tile": True, "amx_int8": False}  # kernel-only, CPUID-only, hidden AMX, absent
    # Without the kernel's word (no /proc/cpuinfo), CPUID alone answers, AMX included, and names the CPU.
    alone = read_cpu_features(tmp_path / "missing")
    assert alone.flags == {"fpu", "avx512_bf16", "amx_bf16"} and alone.model_name == "Lib Brand CPU"
    # A py-cpuinfo that fails leaves the kernel's flags.
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(sys.modules["cpuinfo"], "get_cpu_info", lambda: 1 / 0)
    assert read_cpu_features(path).flags == {"fpu", "avx512f", "amx_tile"}


def test_cpuid_flags_are_read_once_per_boot(tmp_path, monkeypatch):
    import corecpu.cpu.hardware as hw

    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))
    boot = tmp_path / "boot_id"
    boot.write_text("b1\n")
    calls = []

    class FakeCpuinfo:
        @staticmethod
        def get_cpu_info():
            calls.append(1)
            return {"brand_raw": "Fake Xeon", "flags": ["avx512_bf16", "sse2"]}

    monkeypatch.setitem(__import__("sys").modules, "cpuinfo", FakeCpuinfo)
    first = hw._cpuid_flags(boot)
    assert first == ("Fake Xeon", frozenset({"avx512_bf16", "sse2"})) and len(calls) == 1
    assert hw._cpuid_flags(boot) == first and len(calls) == 1  # the cache answered
    boot.write_text("b2\n")  # a reboot (or another machine sharing the home directory's cache)
    assert hw._cpuid_flags(boot) == first and len(calls) == 2


def test_ipex_import_failure_names_the_transformers_bound_only_where_it_applies(monkeypatch):
    from corecpu.cpu import hardware

    failed = hardware.Extension("intel_extension_for_pytorch", False,
                                "intel_extension_for_pytorch 2.8.0 failed to import: name 'X' is not defined")
    monkeypatch.setattr(hardware, "_probe_extension", lambda *a: failed)
    versions = {"transformers": "5.24.0"}
    monkeypatch.setattr(hardware, "installed_version", lambda names: versions.get(names[0]))
    status = hardware.ipex_status()
    assert not status.usable and status.reason.endswith("pip install 'transformers<5.24'")
    versions["transformers"] = "5.23.0"
    assert hardware.ipex_status() == failed
    missing = hardware.Extension("intel_extension_for_pytorch", False, "intel_extension_for_pytorch is not installed")
    monkeypatch.setattr(hardware, "_probe_extension", lambda *a: missing)
    versions["transformers"] = "5.24.0"
    assert hardware.ipex_status() == missing
