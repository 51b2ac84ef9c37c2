"""Gradient all-reduce through MPI: the choice (pure) and the comm thread (fake communicator).
2 ranks under Intel MPI's mpirun: tests/multiprocess/test_mpi_hook.py; through launch.sh: tests/e2e/test_mpi_allreduce.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from corecpu.distributed.allreduce import MpiGradientAllreduce, apply_wait_mode, choose_allreduce
from corecpu.distributed.comm_thread import comm_cpu_of
from corecpu.errors import CoreCPUError
from corecpu.cluster.launchers import LaunchInfo, detect_launcher
from helpers.common import ROOT

LAUNCHER_ENVS = {
    "intel-mpi": {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
    "mvapich": {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "4"},
    "torchrun": {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
    "slurm": {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
}
HAVE = lambda: (True, "mpi4py found")  # noqa: E731
MISSING = lambda: (False, "mpi4py is not installed")  # noqa: E731


def info_for(launcher: str) -> LaunchInfo:
    info = detect_launcher(LAUNCHER_ENVS[launcher])
    assert info.launcher == launcher
    return info


# ---------------------------------------------------------------- choose_allreduce (pure)


@pytest.mark.parametrize("launcher", ["intel-mpi", "openmpi", "mvapich"])
def test_auto_picks_mpi_under_an_mpi_launcher(launcher):
    assert choose_allreduce("auto", info_for(launcher), {}, HAVE) == ("mpi", f"started by {launcher}, mpi4py found")


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_auto_picks_gloo_when_not_started_by_mpi(launcher):
    assert choose_allreduce("auto", info_for(launcher), {}, HAVE) == ("gloo", f"started by {launcher}, not MPI")


def test_auto_without_mpi4py_falls_back_to_gloo_and_says_why():
    name, why = choose_allreduce("auto", info_for("intel-mpi"), {}, MISSING)
    assert (name, why) == ("gloo", "started by intel-mpi but mpi4py is not installed")


def test_auto_names_wait_mode_when_the_plan_set_it():
    name, why = choose_allreduce("auto", info_for("intel-mpi"), {"I_MPI_WAIT_MODE": "1"}, HAVE)
    assert name == "mpi" and "I_MPI_WAIT_MODE=1" in why


def test_one_process_needs_no_allreduce():
    single = LaunchInfo("single", 0, 1, 0, 1)
    for requested in ("auto", "gloo", "mpi"):
        assert choose_allreduce(requested, single, {}, MISSING) == ("none", "single process")


def test_gloo_when_asked_even_under_mpi():
    assert choose_allreduce("gloo", info_for("intel-mpi"), {}, HAVE) == ("gloo", "requested")


def test_mpi_requested_under_torchrun_is_an_error():
    with pytest.raises(CoreCPUError, match=r"^MPI all-reduce needs ranks started by an MPI launcher \(mpirun\), "
                                           r"but torchrun started them; launch with mpirun"):
        choose_allreduce("mpi", info_for("torchrun"), {}, HAVE)


def test_mpi_requested_without_mpi4py_is_an_error():
    with pytest.raises(CoreCPUError, match=r"^MPI all-reduce needs mpi4py \(mpi4py is not installed\); .*pip install 'corecpu\[mpi\]'"):
        choose_allreduce("mpi", info_for("intel-mpi"), {}, MISSING)


def test_mpi_requested_and_possible():
    assert choose_allreduce("mpi", info_for("openmpi"), {}, HAVE) == ("mpi", "requested; started by openmpi")


def test_on_a_ccl_process_group_auto_is_ddp_on_ccl_under_any_launcher():
    for launcher in ("intel-mpi", "torchrun", "slurm"):
        name, why = choose_allreduce("auto", info_for(launcher), {}, HAVE, backend="ccl")
        assert name == "ccl" and why.startswith("DDP on the ccl process group")


def test_ddp_paths_need_their_process_group():
    assert choose_allreduce("ccl", info_for("torchrun"), {}, HAVE, backend="ccl") == ("ccl", "requested")
    with pytest.raises(CoreCPUError, match="^--allreduce gloo runs DDP's all-reduce on the process group, which is "
                                           "ccl; use --backend gloo or --allreduce ccl"):
        choose_allreduce("gloo", info_for("intel-mpi"), {}, HAVE, backend="ccl")
    with pytest.raises(CoreCPUError, match="^--allreduce ccl .* which is gloo"):
        choose_allreduce("ccl", info_for("intel-mpi"), {}, HAVE, backend="gloo")
    # The MPI hook does not use the process group: it works beside ccl too.
    assert choose_allreduce("mpi", info_for("intel-mpi"), {}, HAVE, backend="ccl")[0] == "mpi"


def test_unknown_choice_is_an_error():
    with pytest.raises(CoreCPUError, match="'nccl' is not one of: auto, gloo, mpi, ccl"):
        choose_allreduce("nccl", info_for("intel-mpi"), {}, HAVE)


# ---------------------------------------------------------------- I_MPI_WAIT_MODE for ranks not started by bind


def test_wait_mode_copied_from_the_plan():
    env: dict[str, str] = {}
    assert apply_wait_mode(env, lambda: {"I_MPI_WAIT_MODE": "1", "OMP_PLACES": "cores"}) == "1"
    assert env == {"I_MPI_WAIT_MODE": "1"}


def test_wait_mode_left_alone_when_set_or_not_planned():
    env = {"I_MPI_WAIT_MODE": "0"}
    assert apply_wait_mode(env, lambda: {"I_MPI_WAIT_MODE": "1"}) is None
    assert env == {"I_MPI_WAIT_MODE": "0"}
    empty: dict[str, str] = {}
    assert apply_wait_mode(empty, lambda: {"OMP_PLACES": "cores"}) is None
    assert empty == {}


# ---------------------------------------------------------------- the comm thread, with a fake communicator


class FakeComm:
    """Two identical ranks: the sum is twice this rank's buffer. Records the calling thread."""

    def __init__(self, rank: int = 0, size: int = 2, fail: bool = False) -> None:
        self.rank, self.size, self.fail, self.threads = rank, size, fail, []

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Allreduce(self, sendbuf, recvbuf, op) -> None:
        assert sendbuf == "IN_PLACE" and op == "SUM" and isinstance(recvbuf, np.ndarray)
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("MPI_ERR_TRUNCATE: message truncated")
        recvbuf *= self.size


FAKE_MPI = SimpleNamespace(IN_PLACE="IN_PLACE", SUM="SUM")
TWO = LaunchInfo("intel-mpi", 0, 2, 0, 2)


def test_scaled_sum_happens_on_the_comm_thread_in_place():
    comm = FakeComm()
    with MpiGradientAllreduce(TWO, comm, FAKE_MPI) as ar:
        t = torch.tensor([1.0, 3.0, -5.0])
        out = ar.allreduce_async(t, 0.5).wait()
    assert out is t and torch.equal(t, torch.tensor([1.0, 3.0, -5.0]))  # (x * 0.5) * 2 ranks
    assert comm.threads == ["corecpu-mpi-allreduce"]


def test_bf16_travels_as_fp32_and_returns_bf16():
    with MpiGradientAllreduce(TWO, FakeComm(), FAKE_MPI) as ar:
        t = torch.tensor([0.5, 1.25], dtype=torch.bfloat16)
        out = ar.allreduce_async(t).wait()
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.tensor([1.0, 2.5], dtype=torch.bfloat16))


def test_comm_thread_error_reaches_the_future_and_the_thread_survives():
    comm = FakeComm(fail=True)
    with MpiGradientAllreduce(TWO, comm, FAKE_MPI) as ar:
        with pytest.raises(RuntimeError, match="MPI_ERR_TRUNCATE"):
            ar.allreduce_async(torch.ones(2)).wait()
        comm.fail = False
        assert torch.equal(ar.allreduce_async(torch.ones(2)).wait(), torch.full((2,), 2.0))


def test_closed_allreduce_refuses_new_work():
    ar = MpiGradientAllreduce(TWO, FakeComm(), FAKE_MPI)
    ar.close()
    with pytest.raises(CoreCPUError, match="^the MPI all-reduce thread has stopped"):
        ar.allreduce_async(torch.ones(1))


def test_mpi_and_torch_disagreeing_on_the_world_is_an_error():
    with pytest.raises(CoreCPUError, match=r"^MPI says rank 0 of 3 but torch.distributed says rank 0 of 2; "
                                           r"start the ranks with one mpirun"):
        MpiGradientAllreduce(TWO, FakeComm(size=3), FAKE_MPI)


def test_the_comm_thread_cpu_comes_from_the_environment_it_is_given():
    assert comm_cpu_of({"CORECPU_COMM_CPU": "12"}) == 12
    assert comm_cpu_of({"CORECPU_COMM_CPU": ""}) is None and comm_cpu_of({}) is None


# In a child process that leaves with os._exit: with the bf16 wire, gloo's worker thread may still be releasing the
# hook's Python callback (it needs the GIL) when the test's last reference to the DDP goes, and the Reducer's
# destructor joins that thread while holding the GIL. torch deadlocks there (it hung a CI run once); a real run
# drops its DDP many collectives after its last backward, never inside that window.
_WIRE_CHILD = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from corecpu.distributed.allreduce import ProcessGroupAllreduce
wire = sys.argv[1]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
layer = torch.nn.Linear(8, 8)
ddp = DistributedDataParallel(layer)
ProcessGroupAllreduce(wire).register(ddp)
x = torch.randn(4, 8)
ddp(x).square().sum().backward()
reference = torch.nn.Linear(8, 8)
reference.load_state_dict(layer.state_dict())
reference(x).square().sum().backward()
expected = reference.weight.grad if wire == "fp32" else reference.weight.grad.to(torch.bfloat16).float()
print(torch.equal(layer.weight.grad, expected), torch.equal(layer.weight.grad, reference.weight.grad), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("wire", ["fp32", "bf16"])
def test_ddp_on_gloo_takes_the_wire_dtype_on_a_cpu_only_torch(wire):
    """torch refuses its bf16_compress_hook by name without CUDA or XPU; corecpu's registration must still work
    on CPU, and bf16 on the wire must round the averaged gradient to bf16 (one rank: the gradient itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    child = subprocess.run([sys.executable, "-c", _WIRE_CHILD, wire], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"},
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    as_expected, unchanged = child.stdout.split()
    assert as_expected == "True"  # fp32: the gradient itself; bf16: it, rounded to bf16
    assert unchanged == ("True" if wire == "fp32" else "False")  # the bf16 rounding did happen
