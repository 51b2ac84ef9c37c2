"""The cgroup limits on this process's CPUs: its cpuset and its CPU quota. The one reader of both.

v1 and v2, with or without a cgroup namespace; every function takes the mount and
/proc/self/cgroup as parameters so tests hand in fake trees.
"""

from __future__ import annotations

import math
from pathlib import Path

from corecpu.cpu.cpulist import parse_cpu_list

REAL_CGROUP = "/sys/fs/cgroup"


def read_file(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    text = read_file(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def quota_threads(quota: float | None) -> int | None:
    """Busy threads a CPU quota sustains without throttling: 2.5 CPUs -> 2; None: no quota."""
    if quota is None:
        return None
    return max(1, math.floor(quota + 1e-9))


def _cgroup_lines(proc_self_cgroup: str | Path) -> list[tuple[str, str]]:
    """(controllers, path) pairs from /proc/self/cgroup; v2's line has controllers ''."""
    text = read_file(Path(proc_self_cgroup)) or "0::/\n"
    pairs = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            pairs.append((parts[1], parts[2] or "/"))
    return pairs


def _cgroup_dirs(cgroup_root: Path, proc_self_cgroup: str | Path, controller: str) -> list[Path]:
    """This process's cgroup dir for `controller` and its ancestors, innermost first.

    Inside a container the path in /proc/self/cgroup may not exist under the
    mount (no cgroup namespace), so every ancestor that exists is tried and
    the mount root last.
    """
    lines = _cgroup_lines(proc_self_cgroup)
    candidates: list[tuple[Path, str]] = []
    for ctrls, path in lines:
        if controller in ctrls.split(","):  # v1 hierarchy holding this controller
            candidates += [(cgroup_root / ctrls, path), (cgroup_root / controller, path)]
    v2_path = next((p for ctrls, p in lines if ctrls == ""), "/")
    # v2 last: on hybrid hosts the v1 hierarchy is the one that owns the controller.
    candidates += [(cgroup_root, v2_path), (cgroup_root / "unified", v2_path)]
    for base, path in candidates:
        if base.is_dir() and (base != cgroup_root or (base / "cgroup.controllers").exists()):
            dirs = []
            rel = Path(path.lstrip("/"))
            while True:
                candidate = base / rel
                if candidate.is_dir():
                    dirs.append(candidate)
                if rel == Path("."):
                    break
                rel = rel.parent
            return dirs
    return []


def read_cpu_quota(cgroup_root: str | Path = REAL_CGROUP, proc_self_cgroup: str | Path = "/proc/self/cgroup") -> float | None:
    """CPU bandwidth limit in CPUs (cpu.max or cfs_quota_us/cfs_period_us); the tightest ancestor wins."""
    quotas: list[float] = []
    for d in _cgroup_dirs(Path(cgroup_root), proc_self_cgroup, "cpu"):
        text = read_file(d / "cpu.max")
        if text is not None:
            fields = text.split()
            if len(fields) >= 1 and fields[0] != "max":
                period = float(fields[1]) if len(fields) > 1 else 100000.0
                if period > 0 and float(fields[0]) > 0:
                    quotas.append(float(fields[0]) / period)
            continue
        quota, period = read_int(d / "cpu.cfs_quota_us"), read_int(d / "cpu.cfs_period_us")
        if quota is not None and quota > 0 and period:
            quotas.append(quota / period)
    return min(quotas) if quotas else None


def read_cpuset(cgroup_root: str | Path = REAL_CGROUP, proc_self_cgroup: str | Path = "/proc/self/cgroup") -> tuple[int, ...] | None:
    """CPUs this process's cgroup may use, or None when the cpuset cannot be read."""
    for d in _cgroup_dirs(Path(cgroup_root), proc_self_cgroup, "cpuset"):
        for name in ("cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"):
            text = read_file(d / name)
            if text and text.strip():
                return parse_cpu_list(text)
    return None


def read_memory_limit(cgroup_root: str | Path = REAL_CGROUP, proc_self_cgroup: str | Path = "/proc/self/cgroup") -> int | None:
    """Memory limit in bytes (memory.max or memory.limit_in_bytes); the tightest ancestor wins; None for none."""
    limits: list[int] = []
    for d in _cgroup_dirs(Path(cgroup_root), proc_self_cgroup, "memory"):
        text = read_file(d / "memory.max")
        if text is None:
            text = read_file(d / "memory.limit_in_bytes")
        if text and text.strip().isdigit() and int(text) < 2**62:  # v1 writes "no limit" as a huge number
            limits.append(int(text))
    return min(limits) if limits else None
