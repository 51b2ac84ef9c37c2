"""The bindings' own CPU tests (tests/test_c10d_ccl.py of the source build-ccl builds, with corecpu's patch:
the coalesced test's missing .wait()), run as upstream runs them: `python tests/test_c10d_ccl.py`, nothing
exported by hand. XPU tests skip themselves on a machine without XPUs.

test_broadcast_stress queues 1000 async broadcasts. Unpatched, the bindings' completion thread waited on
each oneCCL event while holding their global lock, which the main thread needs to submit the next one;
corecpu's patch tests instead of waiting under the lock. It must pass 20 times in a row.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.ccl import needs_ccl, patched_source

pytestmark = needs_ccl
STRESS_RUNS = 20


@pytest.fixture(scope="module")
def upstream_tests(tmp_path_factory) -> Path:
    return patched_source(tmp_path_factory.mktemp("torch-ccl")) / "tests"


def _suite(tests: Path, *names: str, timeout: float) -> subprocess.CompletedProcess:
    # A clean environment as a user's shell has it: no CCL_*, FI_* or corecpu variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCL_", "FI_", "CORECPU_", "PYTEST_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    try:
        return subprocess.run([sys.executable, "test_c10d_ccl.py", *names], cwd=tests, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{' '.join(names) or 'the suite'} hung for {timeout:g}s:\n"
                             f"{(exc.stderr or b'')[-2000:]!r}") from None


def test_the_bindings_cpu_suite_passes(upstream_tests):
    proc = _suite(upstream_tests, timeout=600)
    tail = proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    ran = re.search(r"Ran (\d+) tests", proc.stderr)
    assert ran and int(ran.group(1)) >= 50, tail
    assert re.search(r"^OK \(skipped=\d+\)$", proc.stderr, re.M), tail
    skipped = re.findall(r"^(test_\w+) .*\.\.\. skipped '(.*)'$", proc.stderr, re.M)
    not_xpu = [name for name, why in skipped if "xpu" not in name.lower() and "xpu" not in why.lower()
               and "gpu" not in why.lower()]
    assert not not_xpu, f"CPU tests skipped: {not_xpu}"


def test_broadcast_stress_passes_20_times_in_a_row(upstream_tests):
    for i in range(STRESS_RUNS):
        proc = _suite(upstream_tests, "ProcessGroupCCLTest.test_broadcast_stress", timeout=120)
        assert proc.returncode == 0, f"run {i + 1} of {STRESS_RUNS}:\n{proc.stderr[-2000:]}"
