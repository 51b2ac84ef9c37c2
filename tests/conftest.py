"""Shared fixtures and the tiers.

Tiers are folders, and a test's folder gives its marker (pytest_collection_modifyitems below; the
markers are registered in pyproject.toml): tests/unit/ -> unit, tests/multiprocess/ -> multiprocess,
tests/e2e/ -> e2e, tests/chaos/ -> chaos and e2e (real jobs end to end, so `-m "not e2e"` leaves
unit and multiprocess, as test.sh says), tests/ipex/ -> e2e (train.py runs, from the IPEX env only),
tests/ccl/ -> ccl and e2e (runs on the oneCCL backend; skipped where `corecpu build-ccl` has not run),
tests/ray/ -> e2e (Ray Train workers; skipped where the `ray` extra is not installed).
A test outside those folders, or a tier marker written by hand, stops the run with a usage error.

Imports: pytest imports test files with --import-mode=importlib, and pyproject.toml's `pythonpath`
puts the repository (corecpu, benchmarks) and tests/ itself on sys.path. So test files may share
basenames across folders, never import each other or this file, and take shared code from one
place, the `helpers` package (tests/helpers/): `from helpers.launching import launch`. Scripts that
spawned processes run are in tests/helpers/workers/ (helpers.common.WORKERS).

Every test must leave os.environ, torch.distributed and corecpu's threads as it found them: a test
that leaks one fails (as Lightning Fabric's test suite does), after the state is restored where it
can be, so one careless test cannot make later ones pass or fail by accident.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.register_assert_rewrite("helpers")  # their asserts explain themselves like a test's

from corecpu import envvars  # noqa: E402
from helpers.common import fresh_cache  # noqa: E402
from helpers.leaks import corecpu_threads, lingering_threads  # noqa: E402

TESTS = Path(__file__).resolve().parent
TIER_MARKERS = {"unit": ("unit",), "multiprocess": ("multiprocess",), "e2e": ("e2e",), "chaos": ("chaos", "e2e"),
                "ipex": ("e2e",), "ccl": ("ccl", "e2e"), "ray": ("e2e",)}
MARKERS = {"unit", "multiprocess", "e2e", "chaos", "ccl"}

# Set once by libraries at import (tokenizers, torch, the oneCCL bindings' FI_PROVIDER_PATH); not a test's doing.
# corecpu itself sets nothing at import (tests/unit/test_environ.py).
IMPORT_TIME_VARIABLES = {"TOKENIZERS_PARALLELISM",
                         "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "PYTORCH_NVML_BASED_CUDA_CHECK",
                         "CUDA_MODULE_LOADING", "TF_CPP_MIN_LOG_LEVEL", "HF_DATASETS_OFFLINE",
                         "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "FI_PROVIDER_PATH"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS).parts[0]
        except ValueError:  # not under tests/
            continue
        if folder not in TIER_MARKERS:
            problems.append(f"{item.nodeid}: not in a tier folder ({', '.join(TIER_MARKERS)}); move it there")
            continue
        by_hand = sorted({m.name for m in item.iter_markers()} & MARKERS)
        if by_hand:
            problems.append(f"{item.nodeid}: remove @pytest.mark.{', '.join(by_hand)}; the tier comes from the folder")
        for name in TIER_MARKERS[folder]:
            item.add_marker(name)
    if problems:
        raise pytest.UsageError("tests/conftest.py:\n  " + "\n  ".join(dict.fromkeys(problems)))


@pytest.fixture(autouse=True, scope="session")
def _private_precision_cache(tmp_path_factory):
    # Runs with --precision auto cache their calibration; keep it out of the user's ~/.cache. Builds are no
    # measurement: DeepSpeed's shared-memory op is the user's, so the one .ci/run's shm tier builds before
    # its tests (or an earlier session) is not compiled again in each session.
    saved = os.environ.get("CORECPU_CACHE_DIR")
    os.environ["CORECPU_CACHE_DIR"] = str(fresh_cache(tmp_path_factory.mktemp("corecpu-cache"), envvars.cache_dir()))
    yield
    if saved is None:
        os.environ.pop("CORECPU_CACHE_DIR", None)
    else:
        os.environ["CORECPU_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def _no_leaked_state():
    saved = dict(os.environ)
    threads_before = corecpu_threads()
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
    lingering = lingering_threads(threads_before)
    if lingering:
        problems.append(f"left corecpu threads running ({', '.join(lingering)}); stop what started them (run.close())")
    if problems:
        pytest.fail("test leaked state: " + "; ".join(problems), pytrace=False)
