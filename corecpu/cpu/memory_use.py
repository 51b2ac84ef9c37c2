"""This process's memory as the kernel counts it: peak resident set (getrusage) and proportional set size.

PSS divides each shared page among the processes that map it, so the PSS of a node's ranks adds up to
what they cost the node together: N ranks that share one copy of frozen weights through the page cache
count about one copy between them, where their RSS would count it N times.
"""

from __future__ import annotations

import resource
from pathlib import Path

SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")


def parse_rollup(text: str) -> dict[str, int]:
    """{field: bytes} of a smaps_rollup text (Rss, Pss, Pss_Anon, Pss_File, ...; the kernel writes kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * 1024
    return out


def memory_use() -> dict[str, float | None]:
    """{"peak_rss_mb", "pss_mb", "pss_file_mb"}: None where the kernel does not say (no smaps_rollup: pre-4.14, or
    not Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports kB
    try:
        rollup = parse_rollup(SMAPS_ROLLUP.read_text())
    except OSError:
        rollup = {}
    mb = 1024 * 1024
    return {"peak_rss_mb": round(peak, 1),
            "pss_mb": round(rollup["Pss"] / mb, 1) if "Pss" in rollup else None,
            "pss_file_mb": round(rollup["Pss_File"] / mb, 1) if "Pss_File" in rollup else None}
