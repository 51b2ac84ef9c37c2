"""The ccl tier's shared parts: skip where no bindings are built, and the bindings' own patched source."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corecpu.cpu.hardware import CCL, installed_extension
from corecpu.launching import ccl_source
from corecpu.launching.build_ccl import PATCH

_problem = installed_extension(*CCL)
needs_ccl = pytest.mark.skipif(
    _problem is not None,
    reason=f"{_problem.reason if _problem else ''} in this environment: run `corecpu build-ccl` first "
           "(.ci/run does; CORECPU_CCL_SOURCE=<vendored tarball> offline)")

VENDORED = Path(__file__).resolve().parents[3] / "shared" / "vendor" / "torch-ccl-1fc0c38.tar.gz"


def patched_source(dest: Path) -> Path:
    """The bindings' source tree (with their tests) as build-ccl builds it: verified, then patched."""
    if not VENDORED.exists():
        pytest.skip(f"the bindings' own tests need their source: {VENDORED} is missing")
    tree, _ = ccl_source.fetch_source(ccl_source.Source("tarball", str(VENDORED)), dest / "torch-ccl")
    subprocess.run(["patch", "-p1", "--forward", "--batch", "-s", "-i", str(PATCH)], cwd=tree, check=True)
    return tree
