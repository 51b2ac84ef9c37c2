"""What this CPU and this Python environment can do: ISA flags, precision, IPEX, oneCCL.

Precision follows the hardware: bf16 autocast only pays off where the CPU has
native bf16 instructions (AVX512-BF16 or AMX-BF16). Without them PyTorch emulates
bf16 and a step is about twice as slow as fp32, so `auto` picks fp32 there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from dataclasses import dataclass
from pathlib import Path

from corecpu.errors import CoreCPUError

# Flags corecpu reports and acts on; /proc/cpuinfo spells them this way.
TRACKED_FLAGS = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class CpuFeatures:
    model_name: str
    flags: frozenset[str]

    @property
    def has_native_bf16(self) -> bool:
        return any(f in self.flags for f in BF16_FLAGS)

    def tracked(self) -> dict[str, bool]:
        return {f: f in self.flags for f in TRACKED_FLAGS}


def parse_proc_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Model name and the flags of the first processor entry in /proc/cpuinfo text."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if model and flags:
            break
    return model, flags


def read_cpu_features(proc_cpuinfo: str | Path = "/proc/cpuinfo", use_cpuinfo_lib: bool = True) -> CpuFeatures:
    """Union of py-cpuinfo's flags and the kernel's.

    py-cpuinfo reads CPUID, which knows flags an older kernel does not print; the
    kernel hides flags it cannot support (e.g. AMX without XSAVE permission), so
    a flag the kernel lists but CPUID lacks is still trusted, and for AMX the
    kernel's word is required: AMX needs kernel support to be usable.
    """
    try:
        model, kernel_flags = parse_proc_cpuinfo(Path(proc_cpuinfo).read_text())
    except OSError:
        model, kernel_flags = "", frozenset()
    lib_flags: frozenset[str] = frozenset()
    if use_cpuinfo_lib:
        try:
            import cpuinfo  # py-cpuinfo

            info = cpuinfo.get_cpu_info()
            lib_flags = frozenset(info.get("flags", []))
            model = model or info.get("brand_raw", "")
        except Exception:  # py-cpuinfo can fail in odd sandboxes; /proc/cpuinfo still answers
            pass
    flags = set(kernel_flags) | {f for f in lib_flags if not f.startswith("amx")}
    if kernel_flags:
        flags |= {f for f in lib_flags if f.startswith("amx") and f in kernel_flags}
    else:
        flags |= lib_flags
    return CpuFeatures(model_name=model or "unknown CPU", flags=frozenset(flags))


@dataclass(frozen=True)
class PrecisionChoice:
    name: str  # "fp32" or "bf16"
    reason: str
    warning: str | None = None

    @property
    def autocast_dtype(self):  # torch.dtype | None; torch is imported lazily so `corecpu plan` stays fast
        import torch

        return torch.bfloat16 if self.name == "bf16" else None


def choose_precision(requested: str, features: CpuFeatures) -> PrecisionChoice:
    """Pure: the precision to train in, given the request and the CPU's flags."""
    native = features.has_native_bf16
    found = ", ".join(f for f in BF16_FLAGS if f in features.flags)
    if requested == "auto":
        if native:
            return PrecisionChoice("bf16", f"CPU has native bf16 ({found})")
        return PrecisionChoice("fp32", "CPU has no amx_bf16/avx512_bf16; emulated bf16 is slower than fp32")
    if requested == "fp32":
        return PrecisionChoice("fp32", "requested")
    if requested == "bf16":
        if native:
            return PrecisionChoice("bf16", f"requested; CPU has native bf16 ({found})")
        return PrecisionChoice(
            "bf16",
            "requested",
            warning="bf16 forced on a CPU without amx_bf16/avx512_bf16: PyTorch emulates it and "
            "training will be about 2x slower than fp32; use --precision auto or fp32",
        )
    raise CoreCPUError(f"unknown precision {requested!r}; use one of: auto, fp32, bf16")


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _matches_torch(dist_version: str) -> bool:
    """IPEX and torch-ccl are built against one torch minor release and crash on another."""
    want = _torch_version().split("+")[0].split(".")[:2]
    have = dist_version.split("+")[0].split(".")[:2]
    return want == have


@dataclass(frozen=True)
class Extension:
    name: str
    usable: bool
    reason: str


def _probe_extension(module: str, dist_names: tuple[str, ...]) -> Extension:
    version = None
    for dist in dist_names:
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if version is None:
        return Extension(module, False, f"{module} is not installed")
    if not _matches_torch(version):
        return Extension(module, False, f"{module} {version} does not match torch {_torch_version()}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as exc:  # a broken native extension must not take training down
        return Extension(module, False, f"{module} {version} failed to import: {exc}".splitlines()[0])
    return Extension(module, True, f"{module} {version} matches torch {_torch_version()}")


def ipex_status() -> Extension:
    return _probe_extension("intel_extension_for_pytorch", ("intel_extension_for_pytorch", "intel-extension-for-pytorch"))


def ccl_status() -> Extension:
    return _probe_extension("oneccl_bindings_for_pytorch", ("oneccl_bind_pt", "oneccl-bind-pt"))
