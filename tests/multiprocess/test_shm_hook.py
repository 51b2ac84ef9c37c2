"""The shared-memory gradient all-reduce with real ranks (torchrun's variables): it lands where gloo's all-reduce
lands, on one host of 2 ranks and, hierarchically, on 2 "hosts" of 2 ranks that share this machine's /dev/shm
(so each host's namespace must keep the groups apart). The choice and names: tests/unit/distributed/test_shm_allreduce.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from corecpu.distributed.shm_allreduce import shm_status
from helpers.common import ROOT
from helpers.shm_checks import bf16_wire_as_expected
from helpers.spawn import spawn

usable, why = shm_status()
needs_shm = pytest.mark.skipif(not usable, reason=f"shared-memory all-reduce unusable: {why}")


def run(tmp_path, world: int, local_world: int) -> list[dict]:
    out = tmp_path / "reports.json"
    procs = spawn("shm_hook.py", world, str(out), timeout=600, local_world=local_world)
    for p in procs:
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    reports = json.loads(out.read_text())
    assert [r["rank"] for r in reports] == list(range(world))
    for r in reports:
        # Training moved every parameter through the hook, once per bucket per synced step only ...
        assert r["moved"] == r["n_params"] > 10
        assert r["hook_calls"] > r["sync_steps"] and r["hook_calls"] % r["sync_steps"] == 0
        # ... to gloo's weights, on every rank alike.
        assert r["max_diff"] <= 1e-6 and r["direct_rel_diff"] <= 1e-6, r
        assert bf16_wire_as_expected(r) and r["fp32_wire"] and r["error_reached"] and r["thread_alive"], r
        assert r["segments_left"] == [], r
    assert len({r["checksum"] for r in reports}) == 1
    return reports


@needs_shm
def test_one_host_of_two_ranks_is_bit_identical_to_gloo(tmp_path):
    reports = run(tmp_path, 2, 2)
    # Two ranks add two numbers: no order to differ in.
    assert all(r["identical"] and r["direct_rel_diff"] == 0.0 for r in reports), reports
    assert reports[0]["describe"] == "shared memory among 2 rank(s) per host, fp32 on the wire"


@needs_shm
def test_two_hosts_of_two_ranks_sharing_one_dev_shm(tmp_path):
    reports = run(tmp_path, 4, 2)
    # One namespace per host, the same on both ranks of a host.
    assert reports[0]["namespace"] == reports[1]["namespace"] != reports[2]["namespace"] == reports[3]["namespace"]
    assert reports[0]["describe"] == ("shared memory among 2 rank(s) per host, 2 hosts' leaders over gloo, "
                                      "fp32 on the wire")


def test_two_hosts_of_one_rank_need_no_deepspeed(tmp_path):
    # One rank per host: the leaders' leg alone (gloo under torchrun), no shared memory and no op to build.
    reports = run(tmp_path, 2, 1)
    assert all(r["identical"] and r["namespace"] == "" for r in reports), reports
    assert reports[0]["describe"] == "1 rank per host, 2 hosts' leaders over gloo, fp32 on the wire"


@needs_shm
def test_once_loaded_the_op_loads_without_importing_deepspeed():
    # `import deepspeed`, which loading through its builder needs, was 3.5 s of every rank's start. A load
    # through it (a build, the first time) stamps the op; a fresh process then imports the module directly.
    code = ("import sys; from corecpu.distributed.shm_allreduce import load_op; op = load_op(); "
            "print(op.vector_kernel_level(), 'deepspeed' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    last = [r.stdout.strip().splitlines()[-1].split() for r in runs]  # DeepSpeed logs to stdout as it loads
    assert last[1] == [last[0][0], "False"], runs[1].stdout + runs[1].stderr[-2000:]


@needs_shm
def test_deepspeeds_import_prints_no_accelerator_guess_on_the_ranks_console():
    # Every rank that builds or first loads the op imports DeepSpeed, which otherwise prints a [WARNING] that it
    # "was unable to detect" a GPU. Told the accelerator, it prints nothing; the environment is put back after.
    code = ("import os; from corecpu.distributed.shm_allreduce import import_builder; b = import_builder(); "
            "print(b.__name__, os.environ.get('DS_ACCELERATOR'))")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["ShareMemCommBuilder", "None"]
    assert "unable to detect" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
