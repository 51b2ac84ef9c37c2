"""Tier 2: two gloo processes on CPU."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, free_port

pytestmark = pytest.mark.multiprocess


def spawn(script: str, world: int, *args: str, timeout: float = 180) -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "workers" / script), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def test_ddp_gradients_equal_single_process_on_concatenated_batch(tmp_path):
    out = tmp_path / "grads.json"
    for r in spawn("ddp_grads.py", 2, str(out)):
        assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["n"] > 10 and result["scale"] > 0
    assert result["max_diff"] <= 1e-5 * max(1.0, result["scale"]), result
