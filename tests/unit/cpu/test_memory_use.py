"""Tier 1: reading this process's memory (peak RSS, PSS) for summary.json."""

from __future__ import annotations

from corecpu.cpu.memory_use import mapped_pss, memory_use, parse_rollup

ROLLUP = """559e1949d000-7ffcf1b62000 ---p 00000000 00:00 0                          [rollup]
Rss:                1612 kB
Pss:                 299 kB
Pss_File:            191 kB
Shared_Clean:       1460 kB
"""


def test_rollup_fields_are_bytes():
    assert parse_rollup(ROLLUP) == {"Rss": 1612 * 1024, "Pss": 299 * 1024, "Pss_File": 191 * 1024,
                                    "Shared_Clean": 1460 * 1024}


def test_this_process_has_a_peak_at_least_its_pss():
    use = memory_use()
    assert use["peak_rss_mb"] > 10
    if use["pss_mb"] is not None:  # Linux >= 4.14
        assert 0 < use["pss_mb"] <= use["peak_rss_mb"] * 1.01 and use["pss_file_mb"] <= use["pss_mb"]


SMAPS = """7f0000000000-7f0010000000 r--p 00000000 fd:01 123 /cache/models/llama-135m-v1/model.safetensors
Size:             262144 kB
Rss:              262144 kB
Pss:              131072 kB
7f0010000000-7f0010001000 rw-p 00000000 00:00 0
Pss:                   4 kB
7f0020000000-7f0020100000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6
Pss:                 100 kB
VmFlags: rd mr mw me
"""


def test_weight_files_pss_counts_only_their_mappings():
    assert mapped_pss(SMAPS) == 131072 * 1024
    assert mapped_pss(SMAPS, (".so.6",)) == 100 * 1024
