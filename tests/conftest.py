"""Shared fixtures: every test leaves os.environ and torch.distributed as it found them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True, scope="session")
def _private_precision_cache(tmp_path_factory):
    # Runs with --precision auto cache their calibration; keep it out of the user's ~/.cache.
    saved = os.environ.get("CORECPU_CACHE_DIR")
    os.environ["CORECPU_CACHE_DIR"] = str(tmp_path_factory.mktemp("corecpu-cache"))
    yield
    if saved is None:
        os.environ.pop("CORECPU_CACHE_DIR", None)
    else:
        os.environ["CORECPU_CACHE_DIR"] = saved


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
