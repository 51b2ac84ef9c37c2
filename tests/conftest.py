"""Shared fixtures: every test leaves os.environ and torch.distributed as it found them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    # Registered here because pyproject.toml is shared; ./test.sh runs this tier with the others.
    config.addinivalue_line("markers", "chaos: real jobs that get signalled, stopped, or blocked (tests/chaos/)")


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
