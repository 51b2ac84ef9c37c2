"""Shared fixtures. Every test must leave os.environ and torch.distributed as it found them:
a test that leaks either fails (as Lightning Fabric's test suite does), after the state is restored,
so one careless test cannot make later ones pass or fail by accident."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Set once by libraries at import (transformers, tokenizers, corecpu.training.modeling's offline switch); not a test's doing.
IMPORT_TIME_VARIABLES = {"HF_HUB_OFFLINE", "TRANSFORMERS_NO_ADVISORY_WARNINGS", "TOKENIZERS_PARALLELISM",
                         "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "PYTORCH_NVML_BASED_CUDA_CHECK",
                         "CUDA_MODULE_LOADING", "TF_CPP_MIN_LOG_LEVEL", "HF_DATASETS_OFFLINE",
                         "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: real jobs that get signalled, stopped, starved or blocked (tests/chaos/)")


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
def _no_leaked_state():
    saved = dict(os.environ)
    yield
    changed = sorted(k for k in set(saved) | set(os.environ)
                     if saved.get(k) != os.environ.get(k) and k not in IMPORT_TIME_VARIABLES)
    os.environ.clear()
    os.environ.update(saved)
    problems = [f"changed os.environ ({', '.join(changed)}); use monkeypatch"] if changed else []
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        problems.append("left a torch.distributed process group alive; destroy it (run.close())")
    if problems:
        pytest.fail("test leaked state: " + "; ".join(problems), pytrace=False)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
