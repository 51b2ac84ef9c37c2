"""Fixtures the unit tier shares."""

from __future__ import annotations

import pytest
import torch

import corecpu


@pytest.fixture
def one_process(monkeypatch, tmp_path):
    """A one-process run (fp32, one thread, no IPEX) with a private cache; the environment and torch's thread
    count as they were afterwards."""
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))
    # setup() sets these; monkeypatch restores them
    for name in ("OMP_NUM_THREADS", "CORECPU_THREADS_DECISION", "DS_ACCELERATOR"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    with corecpu.setup(precision="fp32", ipex="off", threads=1) as run:
        yield run
    torch.set_num_threads(threads)
