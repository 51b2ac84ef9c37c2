"""Shared fixtures: every test leaves os.environ and torch.distributed as it found them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _restore_environment():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_configure(config):
    # Here, not in pyproject.toml (owned elsewhere): runs that kill, truncate and fill disks on purpose.
    config.addinivalue_line("markers", "chaos: process-level failure injection (kills, corrupt files, full disks)")
