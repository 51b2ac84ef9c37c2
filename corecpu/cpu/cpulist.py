"""The kernel's CPU list format ("0-3,8,10-11"), both ways."""

from __future__ import annotations

from typing import Iterable

from corecpu.errors import CoreCPUError


def parse_cpu_list(text: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11), sorted and de-duplicated."""
    stripped = text.strip()
    if not stripped:
        if allow_empty:
            return ()
        raise CoreCPUError(f"bad CPU list '{text}': it is empty; expected e.g. 0-3,8")
    cpus: set[int] = set()
    for part in stripped.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            start = int(lo)
            end = int(hi) if dash else start
        except ValueError:
            raise CoreCPUError(
                f"bad CPU list '{text}': '{part}' is not a CPU number or range; expected e.g. 0-3,8"
            ) from None
        if start < 0 or end < start:
            raise CoreCPUError(f"bad CPU list '{text}': range '{part}' runs backwards; expected e.g. 0-3,8")
        cpus.update(range(start, end + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8, 10, 11) -> '0-3,8,10-11'; the kernel's own cpulist format."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
