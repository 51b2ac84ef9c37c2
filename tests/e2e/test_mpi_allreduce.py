"""Gradient all-reduce through MPI in a whole run: launch.sh with --allreduce mpi logs what gloo logs."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers.launching import TINY, launch, records

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun on PATH (pip install impi-rt)")


@needs_mpirun
def test_launch_with_mpi_allreduce_logs_the_same_losses_as_gloo(tmp_path):
    runs = {}
    for name in ("mpi", "gloo"):
        out = tmp_path / name
        proc = launch(2, *TINY, "--max-steps", "6", "--grad-accum", "2", "--log-every", "1", "--eval-data", "none",
                      "--allreduce", name, "--output-dir", str(out))
        assert f"gradient all-reduce {name} (requested" in proc.stdout
        assert json.loads((out / "config.json").read_text())["allreduce"] == name
        runs[name] = ([(r["step"], r["loss"]) for r in records(out)[0]],
                      [v["param_checksum"] for v in json.loads((out / "summary.json").read_text())["ranks"]])
    assert len(runs["mpi"][0]) == 6
    assert runs["mpi"] == runs["gloo"]
