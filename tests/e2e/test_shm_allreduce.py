"""The shared-memory gradient all-reduce in whole runs: launch.sh with --allreduce shm logs what gloo logs and
resumes exactly after a kill; under srun (tests/helpers/fake_srun.py) it lands on gloo's weights; across two
network-namespace "hosts" under Intel MPI's mpirun, hierarchically, too (tests/helpers/netns.py builds the hosts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from corecpu.distributed.shm_allreduce import shm_status
from helpers.common import ROOT, WORKERS
from helpers.shm_checks import bf16_wire_as_expected
from helpers.launching import TINY, crash_at_step, launch, records
from helpers.netns import find_mpirun, two_hosts
from helpers.slurm import FAKE_SRUN, sbatch_env

usable, why = shm_status()
needs_shm = pytest.mark.skipif(not usable, reason=f"shared-memory all-reduce unusable: {why}")
needs_mpirun = pytest.mark.skipif(find_mpirun() is None, reason="Intel MPI mpirun not found (pip install impi-rt)")


def corecpu_segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("deepspeed_allreduce_buffer_") and "_corecpu-" in f}


@needs_shm
@needs_mpirun
def test_launch_with_shm_logs_gloos_losses_and_resumes_exactly_after_a_kill(tmp_path):
    common = [*TINY, "--max-steps", "12", "--grad-accum", "2", "--log-every", "1", "--save-every", "4",
              "--eval-data", "none"]
    before = corecpu_segments()
    runs = {}
    for name in ("shm", "gloo"):
        out = tmp_path / name
        proc = launch(2, *common, "--allreduce", name, "--output-dir", str(out))
        assert f"gradient all-reduce {name} (requested" in proc.stdout
        config = json.loads((out / "config.json").read_text())
        assert (config["allreduce"], config["allreduce_dtype"]) == (name, "fp32")
        runs[name] = ([(r["step"], r["loss"]) for r in records(out)[0]],
                      [v["param_checksum"] for v in json.loads((out / "summary.json").read_text())["ranks"]])
    assert len(runs["shm"][0]) == 12
    assert runs["shm"] == runs["gloo"]  # 2 ranks: the same sums, bit for bit

    out = tmp_path / "interrupted"
    saved = crash_at_step(2, [*common, "--allreduce", "shm"], out, 9)
    assert saved and 8 <= saved[-1] < 12, f"run was not interrupted mid-way: checkpoints {saved}"
    # SIGKILL gave no rank a chance to clean up: the segments were unlinked as soon as both ranks had mapped them.
    assert corecpu_segments() <= before
    launch(2, *common, "--allreduce", "shm", "--output-dir", str(out), "--resume", "auto")
    assert [(r["step"], r["loss"]) for r in records(out)[0]] == runs["shm"][0]


@needs_mpirun
@pytest.mark.parametrize("ppn", [1, pytest.param(2, marks=needs_shm)])
def test_hierarchical_across_two_namespace_hosts_equals_gloo(tmp_path, ppn):
    """1 rank per host: the leaders' leg alone, over MPI. 2 per host: shared memory inside each host (the two
    hosts share this machine's /dev/shm, so only their namespaces keep them apart), MPI between leaders."""
    out = tmp_path / "reports.json"
    with two_hosts() as h:
        env = {"MASTER_ADDR": h.hostfile.read_text().split()[0], "MASTER_PORT": "29517", "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": h.iface, "PYTHONPATH": str(ROOT)}
        cmd = [find_mpirun(), "-f", str(h.hostfile), "-n", str(2 * ppn), "-ppn", str(ppn),
               sys.executable, str(WORKERS / "shm_hook.py"), str(out)]
        r = h.run_in(h.namespaces[0], cmd, env=env, timeout=600)
    assert r.returncode == 0, f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    reports = json.loads(out.read_text())
    assert [x["launcher"] for x in reports] == ["intel-mpi"] * 2 * ppn
    for x in reports:
        assert x["moved"] == x["n_params"] > 10 and x["max_diff"] <= 1e-6 and x["direct_rel_diff"] <= 1e-6, x
        assert bf16_wire_as_expected(x) and x["fp32_wire"] and x["error_reached"] and x["thread_alive"], x
        assert x["segments_left"] == [], x
    assert len({x["checksum"] for x in reports}) == 1
    local = "1 rank per host" if ppn == 1 else "shared memory among 2 rank(s) per host"
    assert reports[0]["describe"] == f"{local}, 2 hosts' leaders over mpi, fp32 on the wire"
    if ppn == 2:
        assert len({x["namespace"] for x in reports}) == 2


@needs_shm
def test_under_srun_two_tasks_on_one_node_equal_gloo(tmp_path):
    out = tmp_path / "reports.json"
    env = sbatch_env(tmp_path, [os.uname().nodename], 2, {"OMP_NUM_THREADS": "1"})
    r = subprocess.run([sys.executable, str(FAKE_SRUN), "-n", "2", sys.executable, str(WORKERS / "shm_hook.py"),
                        str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    reports = json.loads(out.read_text())
    assert [x["launcher"] for x in reports] == ["slurm", "slurm"]
    assert all(x["identical"] and bf16_wire_as_expected(x) and x["segments_left"] == [] for x in reports), reports
    assert reports[0]["describe"] == "shared memory among 2 rank(s) per host, fp32 on the wire"
