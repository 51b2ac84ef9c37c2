"""Backend choice, MASTER_ADDR defaults, where the store listens, start-up timeout and teardown."""

import os
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from corecpu.cpu.hardware import Extension
from corecpu.distributed.process_group import (choose_backend, init_distributed, master_address, open_agent_store,
                                              resolve_master, route_interface, store_bind_address, teardown)
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import detect_launcher
from helpers.common import ROOT, free_port


MISSING_CCL = lambda: Extension("oneccl_bindings_for_pytorch", False, "oneccl_bindings_for_pytorch is not installed")  # noqa: E731
WORKING_CCL = lambda: Extension("oneccl_bindings_for_pytorch", True, "oneccl_bindings_for_pytorch 2.13.0+x matches torch 2.13.0")  # noqa: E731


def test_auto_backend_is_gloo_without_torch_ccl():
    backend, reason = choose_backend("auto", status=MISSING_CCL)
    assert backend == "gloo" and "oneccl_bindings_for_pytorch is not installed" in reason


def test_auto_backend_is_ccl_with_working_bindings_and_says_why():
    assert choose_backend("auto", status=WORKING_CCL) == ("ccl", "oneccl_bindings_for_pytorch 2.13.0+x matches torch 2.13.0")
    # --allreduce gloo needs gloo's process group: auto gives it that, whatever is installed.
    backend, reason = choose_backend("auto", "gloo", status=WORKING_CCL)
    assert backend == "gloo" and "--allreduce gloo" in reason


def test_ccl_without_bindings_is_an_error_not_a_fallback():
    with pytest.raises(CoreCPUError, match="--backend ccl needs oneccl_bindings_for_pytorch.*corecpu build-ccl"):
        choose_backend("ccl", status=MISSING_CCL)
    with pytest.raises(CoreCPUError, match="--allreduce ccl needs the ccl backend"):
        choose_backend("auto", "ccl", status=MISSING_CCL)


def test_mpi_backend_needs_mpi_build():
    if dist.is_mpi_available():
        pytest.skip("this torch has MPI")
    with pytest.raises(CoreCPUError, match="PyTorch built with MPI"):
        choose_backend("mpi")


def test_unknown_backend():
    with pytest.raises(CoreCPUError, match="unknown backend 'nccl'; use one of: auto, gloo, ccl, mpi"):
        choose_backend("nccl")


def test_master_defaults_on_one_host():
    info = detect_launcher({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    assert master_address({}, info) == ("127.0.0.1", 29500)
    assert master_address({"MASTER_ADDR": "h0", "MASTER_PORT": "1234"}, info) == ("h0", 1234)


def test_master_addr_required_across_hosts():
    info = detect_launcher({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(CoreCPUError, match="MASTER_ADDR is not set but the 4 ranks span several hosts"):
        master_address({}, info)
    with pytest.raises(CoreCPUError, match="MASTER_PORT='x' is not a TCP port"):
        master_address({"MASTER_ADDR": "h", "MASTER_PORT": "x"}, info)


def test_loopback_route():
    assert route_interface("127.0.0.1") == "lo"


def test_single_process_needs_no_group():
    ctx = init_distributed("auto", env={})
    assert ctx.backend == "none" and not dist.is_initialized()


def test_one_rank_group_and_teardown():
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())}
    ctx = init_distributed("gloo", env=env)
    assert ctx.backend == "none"  # one rank: nothing to synchronise
    teardown()
    assert not dist.is_initialized()


def test_a_group_made_before_setup_is_used_and_left_to_its_maker():
    # Ray Train makes the gloo group in each worker before the train function runs (issue 27 item 10).
    from corecpu.cluster.launchers import LaunchInfo
    from corecpu.distributed.process_group import adopt_existing

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        info = LaunchInfo("ray", 0, 1, 0, 1)
        pg = adopt_existing("auto", info, {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "42703"})
        assert (pg.backend, pg.master_addr, pg.master_port) == ("gloo", "10.0.0.2", 42703) and pg.store is not None
        assert pg.backend_reason == "made by ray before setup(); used as it is, left open at close"
        with pytest.raises(CoreCPUError, match=r"^backend ccl was asked for, but a gloo process group was made before "
                                               r"setup\(\) \(under ray\) and corecpu uses it; ask for backend auto or gloo$"):
            adopt_existing("ccl", info, {})
        with pytest.raises(CoreCPUError, match="rank 0 of 1 already exists but ray says rank 1 of 2"):
            adopt_existing("auto", LaunchInfo("ray", 1, 2, 1, 2), {})
        teardown()  # what run.close() calls: not corecpu's group, so not destroyed
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_missing_rank_times_out_with_a_clear_message():
    # Rank 0 of 2 alone: must fail fast, naming the address and the fix.
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT)}
    code = "from corecpu.errors import run_cli; from corecpu.distributed.process_group import init_distributed; run_cli(lambda: init_distributed('gloo', 3))"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 40
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 0 waited 3s" in lines[0] and "MASTER_ADDR" in lines[0], proc.stderr


def test_store_listens_on_master_addr_only_when_every_rank_is_local():
    assert store_bind_address("127.0.0.1", all_local=True) == "127.0.0.1"
    # Several hosts: MASTER_ADDR's own interface when it is this host's address; all only for NAT or loopback.
    assert store_bind_address("10.0.0.5", all_local=False, local_ips=["127.0.0.1", "10.0.0.5"]) == "10.0.0.5"
    assert store_bind_address("10.0.0.5", all_local=False, local_ips=["127.0.0.1", "192.168.1.9"]) == "0.0.0.0"
    assert store_bind_address("127.0.1.1", all_local=False, local_ips=["127.0.1.1", "10.0.0.5"]) == "0.0.0.0"
    assert store_bind_address("fd00::5", all_local=False, local_ips=[]) == "::"


def test_unresolvable_master_addr_is_named():
    assert resolve_master("127.0.0.1") == "127.0.0.1"
    with pytest.raises(CoreCPUError, match="MASTER_ADDR 'no-such-host.invalid' does not resolve"):
        resolve_master("no-such-host.invalid")


def test_a_wildcard_torchrun_store_on_one_host_is_named():
    # torch's TCPStore binds every interface whatever address torchrun is given; corecpu launch's torchrun does not.
    line = open_agent_store(29500, find=lambda port: object())
    assert line is not None and "every interface (port 29500)" in line and "--launcher torchrun" in line
    assert open_agent_store(29500, find=lambda port: None) is None


def test_rank0_alone_decides_and_every_rank_reads_its_answer():
    from corecpu.distributed.process_group import rank0_decides

    store, asked = dist.HashStore(), []

    def ask(answer: str):
        return lambda: asked.append(answer) or answer

    assert rank0_decides(store, 0, "k", ask("gloo: because")) == "gloo: because"
    # Another rank never asks its own view (which could differ), it reads rank 0's.
    assert rank0_decides(store, 1, "k", ask("")) == "gloo: because" and asked == ["gloo: because"]
    assert rank0_decides(store, 0, "k2", ask("")) == "" and rank0_decides(store, 1, "k2", ask("x")) == ""
