"""This process's memory as the kernel counts it: peak resident set (getrusage) and proportional set size.

PSS divides each shared page among the processes that map it, so the PSS of a node's ranks adds up to
what they cost the node together: N ranks that share one copy of frozen weights through the page cache
count about one copy between them, where their RSS would count it N times.
"""

from __future__ import annotations

import resource
from pathlib import Path

SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")
SMAPS = Path("/proc/self/smaps")
WEIGHT_FILES = (".safetensors",)  # what transformers maps straight from the page cache


def parse_rollup(text: str) -> dict[str, int]:
    """{field: bytes} of a smaps_rollup text (Rss, Pss, Pss_Anon, Pss_File, ...; the kernel writes kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * 1024
    return out


def mapped_pss(smaps: str, suffixes: tuple[str, ...] = WEIGHT_FILES) -> int:
    """Bytes of PSS in the mappings of files whose name ends with one of `suffixes`, from a /proc/PID/smaps text:
    this process's share of the model weights it reads from the page cache."""
    total, counting = 0, False
    for line in smaps.splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's header: addr perms off dev inode path
            counting = len(head) >= 6 and head[-1].endswith(suffixes)
        elif counting and head[:1] == ["Pss:"]:
            total += int(head[1]) * 1024
    return total


def peak_rss_mb() -> float:
    """This process's peak resident set so far, in MiB: one getrusage call, cheap enough for every log step."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux reports kB


def memory_use() -> dict[str, float | None]:
    """{"peak_rss_mb", "pss_mb", "pss_file_mb", "weights_pss_mb"} (the last: mapped .safetensors): None where the kernel does not say (no smaps_rollup: pre-4.14, or
    not Linux)."""
    try:
        rollup = parse_rollup(SMAPS_ROLLUP.read_text())
        weights: float | None = mapped_pss(SMAPS.read_text())
    except OSError:
        rollup, weights = {}, None
    mb = 1024 * 1024
    return {"peak_rss_mb": peak_rss_mb(),
            "pss_mb": round(rollup["Pss"] / mb, 1) if "Pss" in rollup else None,
            "pss_file_mb": round(rollup["Pss_File"] / mb, 1) if "Pss_File" in rollup else None,
            "weights_pss_mb": round(weights / mb, 1) if weights is not None else None}
