"""What this CPU and this Python environment can do: ISA flags, IPEX, oneCCL. Torch-free at import.

Which precision to train in is decided in corecpu/precision.py, from these flags
(AMX) and, where flags cannot tell, from a measurement.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from corecpu import atomic, envvars

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
        lib_model, lib_flags = _cpuid_flags()
        model = model or lib_model
    flags = set(kernel_flags) | {f for f in lib_flags if not f.startswith("amx")}
    if kernel_flags:
        flags |= {f for f in lib_flags if f.startswith("amx") and f in kernel_flags}
    else:
        flags |= lib_flags
    return CpuFeatures(model_name=model or "unknown CPU", flags=frozenset(flags))


def _cpuid_flags(boot_id: str | Path = "/proc/sys/kernel/random/boot_id") -> tuple[str, frozenset[str]]:
    """py-cpuinfo's (brand, flags), once per boot. It reads CPUID in a subprocess of its own, 1.2 CPU seconds
    (measured) that every rank paid at every start; the CPU does not change until the next boot."""
    try:
        boot = Path(boot_id).read_text().strip()
    except OSError:
        boot = ""
    cache = envvars.cache_dir() / f"cpuid-{boot}.json" if boot else None
    if cache is not None:
        try:
            saved = json.loads(cache.read_text())
            return saved["brand"], frozenset(saved["flags"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        import cpuinfo  # py-cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception:  # py-cpuinfo can fail in odd sandboxes; /proc/cpuinfo still answers
        return "", frozenset()
    brand, flags = info.get("brand_raw", ""), frozenset(info.get("flags", []))
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            # Ranks starting together: each writes its own temporary, the last rename wins.
            atomic.write_json(cache, {"brand": brand, "flags": sorted(flags)})
        except OSError:
            pass  # a read-only home: pay the subprocess next time
    return brand, flags


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


def installed_extension(module: str, dist_names: tuple[str, ...]) -> Extension | None:
    """From package metadata alone (nothing imported, so torch stays out): None when `module` is
    installed and built for this torch's minor release, else why it cannot be used."""
    version = installed_version(dist_names)
    if version is None:
        return Extension(module, False, f"{module} is not installed")
    if not _matches_torch(version):
        return Extension(module, False, f"{module} {version} does not match torch {_torch_version()}")
    return None


def installed_version(dist_names: tuple[str, ...]) -> str | None:
    for dist in dist_names:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _probe_extension(module: str, dist_names: tuple[str, ...]) -> Extension:
    problem = installed_extension(module, dist_names)
    if problem is not None:
        return problem
    version = installed_version(dist_names)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)  # imports torch: only ever called from a rank that has it
    except Exception as exc:  # a broken native extension must not take training down
        return Extension(module, False, f"{module} {version} failed to import: {exc}".splitlines()[0])
    return Extension(module, True, f"{module} {version} matches torch {_torch_version()}")


# IPEX 2.8 (the last) imports transformers.modeling_attn_mask_utils, which transformers 5.24 removed;
# its import then fails with a NameError that names neither package.
IPEX_TRANSFORMERS_HINT = "IPEX 2.8 imports modules transformers 5.24 removed: pip install 'transformers<5.24'"


def ipex_status() -> Extension:
    status = _probe_extension("intel_extension_for_pytorch", ("intel_extension_for_pytorch", "intel-extension-for-pytorch"))
    if not status.usable and "failed to import" in status.reason and _transformers_at_least(5, 24):
        return Extension(status.name, False, f"{status.reason}; {IPEX_TRANSFORMERS_HINT}")
    return status


def _transformers_at_least(major: int, minor: int) -> bool:
    version = installed_version(("transformers",)) or "0"
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()]
    return tuple(parts) >= (major, minor)


CCL = ("oneccl_bindings_for_pytorch", ("oneccl_bind_pt", "oneccl-bind-pt"))


def ccl_status() -> Extension:
    return _probe_extension(*CCL)


def ccl_installed() -> bool:
    """Whether oneCCL bindings matching torch are installed, by metadata only: for planning before torch."""
    return installed_extension(*CCL) is None
