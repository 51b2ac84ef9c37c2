"""Tier 1: `corecpu cache` lists the cache by kind with sizes and ages, and prunes by age and kind, never
an entry in use (corecpu.cache_admin). A fake cache in a temporary directory, as $CORECPU_CACHE_DIR."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corecpu import cache_admin as cache
from corecpu.errors import CoreCPUError
from helpers.common import ROOT

DAY = 86400.0
NOW = time.time()


def put(root: Path, rel: str, size: int = 5000, age_days: float = 40) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    t = NOW - age_days * DAY
    os.utime(path, (t, t))
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    r = tmp_path / "cache"
    put(r, "tokenized/tokenized-old.pt")
    put(r, "tokenized/qa-new.pt", age_days=1)
    put(r, "models/llama-tiny-v1/config.json")
    put(r, "models/llama-tiny-v1/model.safetensors", 20000)
    put(r, "models/.llama-tiny-v1.lock", 0)
    put(r, "ccl/torch2.13.0-oneccl/oneccl_bind_pt.whl")
    put(r, "shm/torch-2.13.0-deepspeed/deepspeed_shm_comm/shm.so")
    put(r, "ipex-2.8.0-py311/bin/python")
    put(r, "ipex-2.8.0-py311/lib/site.py", age_days=2)  # one recently used file makes the whole env recent
    put(r, "wheels/torch-2.8.0.whl")
    put(r, "precision.json", 300)
    put(r, "cpuid-oldboot.json", 300)
    put(r, "my-notes.txt", 100)
    return r


def rel(root: Path, entries) -> dict[str, cache.Entry]:
    return {str(e.path.relative_to(root)): e for e in entries}


def test_every_entry_has_its_kind_size_and_newest_use(root):
    entries = rel(root, cache.scan(root, opened={}))
    assert {k: e.kind for k, e in entries.items()} == {
        "tokenized/tokenized-old.pt": "tokenized", "tokenized/qa-new.pt": "tokenized",
        "models/llama-tiny-v1": "models", "ccl/torch2.13.0-oneccl": "ccl", "shm/torch-2.13.0-deepspeed": "shm",
        "ipex-2.8.0-py311": "ipex", "wheels/torch-2.8.0.whl": "ipex", "precision.json": "measurements",
        "cpuid-oldboot.json": "measurements", "my-notes.txt": "other"}  # the build lock is no entry
    assert entries["models/llama-tiny-v1"].bytes >= 25000
    assert abs(NOW - entries["ipex-2.8.0-py311"].last_use - 2 * DAY) < 60
    assert all(e.busy is None for e in entries.values())


def test_the_listing_sums_each_kind(root):
    lines = cache.summary_lines(root, cache.scan(root, opened={}), NOW, each=True)
    assert lines[0] == f"corecpu cache: {root} (set CORECPU_CACHE_DIR to move it)"
    row = next(line for line in lines if line.startswith("tokenized"))
    on_disk = sum(f.stat().st_blocks * 512 for f in (root / "tokenized").iterdir())  # what du counts, and frees
    assert row.split()[:4] == ["tokenized", "2", *cache._size(on_disk).split()] and "1 d ago" in row
    assert any(line.strip().startswith("tokenized/tokenized-old.pt") and "40 d ago" in line for line in lines)
    assert lines[-1].split()[:2] == ["total", "10"]


def test_select_by_age_and_kind(root):
    entries = cache.scan(root, opened={})
    old = {str(e.path.relative_to(root)) for e in cache.select(entries, older_than=30 * DAY, kinds=[], now=NOW)}
    assert old == {"tokenized/tokenized-old.pt", "models/llama-tiny-v1", "ccl/torch2.13.0-oneccl",
                   "shm/torch-2.13.0-deepspeed", "wheels/torch-2.8.0.whl", "precision.json", "cpuid-oldboot.json"}
    tok = cache.select(entries, older_than=None, kinds=["tokenized"], now=NOW)
    assert sorted(e.path.name for e in tok) == ["qa-new.pt", "tokenized-old.pt"]
    assert [e.path.name for e in cache.select(entries, older_than=None, kinds=["other"], now=NOW)] == ["my-notes.txt"]


def test_dry_run_removes_nothing_and_says_what_it_would_free(root):
    entries = cache.scan(root, opened={})
    said: list[str] = []
    chosen = cache.select(entries, older_than=None, kinds=["tokenized"], now=NOW)
    freed = cache.prune(entries, chosen, dry_run=True, say=said.append)
    assert freed == sum(e.bytes for e in chosen) > 0
    assert (root / "tokenized" / "tokenized-old.pt").exists() and (root / "tokenized" / "qa-new.pt").exists()
    assert said[-1].startswith(f"would free {cache._size(freed)} (2 entries)")


def test_prune_frees_what_it_removes_and_leaves_no_half_deleted_entry(root):
    entries = cache.scan(root, opened={})
    said: list[str] = []
    freed = cache.prune(entries, cache.select(entries, older_than=30 * DAY, kinds=[], now=NOW), dry_run=False,
                        say=said.append)
    left = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert left == {"tokenized/qa-new.pt", "ipex-2.8.0-py311/bin/python", "ipex-2.8.0-py311/lib/site.py",
                    "my-notes.txt", "models/.llama-tiny-v1.lock"}
    assert freed > 30000 and said[-1].startswith(f"freed {cache._size(freed)} (7 entries); 3 kept")
    assert not [p for p in root.rglob("*") if cache.PRUNING in p.name]


def test_entries_in_use_are_kept(root):
    # A built-in model being built (its lock held), a shared-memory op being built (torch's lock file), a
    # tokenized file a process has open, and a file a live process is still writing.
    lock = os.open(root / "models" / ".llama-tiny-v1.lock", os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    # Touched now, not at NOW: the stale-lock rule reads the clock, and a suite may import this an hour earlier.
    os.utime(put(root, "shm/torch-2.13.0-deepspeed/deepspeed_shm_comm/lock", 0))
    writing = put(root, f"tokenized/.tokenized-new.pt.tmp-{os.uname().nodename}-{os.getpid()}")
    with open(root / "tokenized" / "tokenized-old.pt", "rb"):
        entries = cache.scan(root)  # the real /proc: this test process has the file open
    try:
        busy = {str(e.path.relative_to(root)): e.busy for e in entries if e.busy}
        assert busy == {"models/llama-tiny-v1": "its build lock is held (a build is running)",
                        "shm/torch-2.13.0-deepspeed": "a build is running (torch's lock file is new)",
                        "tokenized/tokenized-old.pt": f"open in process {os.getpid()}",
                        writing.relative_to(root).as_posix(): f"being written by process {os.getpid()}"}
        said: list[str] = []
        cache.prune(entries, cache.select(entries, older_than=None, kinds=["models", "shm", "tokenized"], now=NOW),
                    dry_run=False, say=said.append)
        assert (root / "models" / "llama-tiny-v1" / "config.json").exists() and writing.exists()
        assert (root / "tokenized" / "tokenized-old.pt").exists() and not (root / "tokenized" / "qa-new.pt").exists()
        assert sum(line.startswith("kept ") for line in said) == 4
    finally:
        os.close(lock)


def test_a_killed_builds_old_lock_does_not_keep_its_op(root):
    # torch waits forever on a lock its killed builder left: that entry must be prunable, not "in use".
    put(root, "shm/torch-2.13.0-deepspeed/deepspeed_shm_comm/lock", 0, age_days=1)
    (shm,) = [e for e in cache.scan(root, opened={}) if e.kind == "shm"]
    assert shm.busy is None
    cache.prune([shm], [shm], dry_run=False, say=lambda line: None)
    assert not (root / "shm" / "torch-2.13.0-deepspeed").exists()


def test_a_killed_prune_is_finished_by_the_next(root):
    put(root, "tokenized/.tokenized-x.pt.pruning-999999999", age_days=0)
    entries = cache.scan(root, opened={})
    chosen = cache.select(entries, older_than=30 * DAY, kinds=["tokenized"], now=NOW)
    assert ".tokenized-x.pt.pruning-999999999" in {e.path.name for e in chosen}


@pytest.mark.parametrize("text, seconds", [("30d", 30 * DAY), ("12h", 43200), ("2w", 14 * DAY), ("90m", 5400),
                                           ("7", 7 * DAY), ("1.5d", 1.5 * DAY)])
def test_ages(text, seconds):
    assert cache.parse_age(text) == seconds


def test_a_bad_age_names_the_format():
    with pytest.raises(CoreCPUError, match=r"use e.g. 30d, 12h, 2w"):
        cache.parse_age("a month")


def corecpu_cache(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "corecpu.cli", "cache", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env={**os.environ, "CORECPU_CACHE_DIR": str(root)})


def test_the_command_lists_and_prunes_the_cache_the_variable_names(root):
    listed = corecpu_cache(root)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"corecpu cache: {root}") and "\nipex " in listed.stdout
    assert corecpu_cache(root, "list", "--entries").stdout.count("tokenized/") == 2
    refused = corecpu_cache(root, "prune")
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "needs --older-than AGE and/or --kind KIND" in refused.stderr
    size = (root / "tokenized" / "tokenized-old.pt").stat().st_blocks * 512
    pruned = corecpu_cache(root, "prune", "--older-than", "30d", "--kind", "tokenized")
    assert pruned.returncode == 0, pruned.stderr
    assert f"removed {root / 'tokenized' / 'tokenized-old.pt'} (tokenized" in pruned.stdout
    assert f"freed {cache._size(size)} (1 entry)" in pruned.stdout
    assert sorted(p.name for p in (root / "tokenized").iterdir()) == ["qa-new.pt"]
