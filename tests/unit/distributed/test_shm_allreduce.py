"""The shared-memory all-reduce's pure parts: whether it can run here, the choice of path, shared-memory names,
the host layout and the wire dtype. Real ranks: tests/multiprocess/test_shm_hook.py; across namespace hosts
and through launch.sh: tests/e2e/test_shm_allreduce.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from corecpu.cluster.launchers import LaunchInfo, detect_launcher
from corecpu.distributed.allreduce import choose_allreduce, make_gradient_allreduce
from corecpu.distributed.shm_allreduce import (KERNEL_LEVEL_BF16, KERNEL_LEVEL_FP32, check_wire, host_layout,
                                               segment_name, shm_namespace, shm_status)
from corecpu.errors import CoreCPUError
from corecpu.training.run_options import RunOptions

SHM_OK = lambda: (True, "DeepSpeed's shared-memory op")  # noqa: E731
SHM_MISSING = lambda: (False, "DeepSpeed is not installed (pip install 'corecpu[shm]')")  # noqa: E731
MPI_OK = lambda: (True, "mpi4py found")  # noqa: E731
TORCHRUN = detect_launcher({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
INTEL_MPI = detect_launcher({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
SLURM = detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


# ---------------------------------------------------------------- can it run here


def status(deepspeed: bool = True, compiler: bool = True,
           flags: frozenset[str] = frozenset({"avx2", "avx512bw"})) -> tuple[bool, str]:
    return shm_status(cpu_flags=lambda: set(flags), find_module=lambda name: object() if deepspeed else None,
                      which=lambda exe: "/usr/bin/c++" if compiler else None)


def test_status_ready_with_deepspeed_a_compiler_and_avx512():
    assert status() == (True, "DeepSpeed's shared-memory op")


def test_status_with_avx2_alone_says_fp32_only():
    assert status(flags=frozenset({"avx2"})) == (True, "DeepSpeed's shared-memory op (AVX2: fp32 only)")


@pytest.mark.parametrize("kwargs, why", [
    ({"deepspeed": False}, "DeepSpeed is not installed (pip install 'corecpu[shm]')"),
    ({"compiler": False}, "no C++ compiler (c++) to build DeepSpeed's shared-memory op; install g++"),
    ({"flags": frozenset({"sse4_2"})}, "the CPU has neither AVX2 nor AVX-512, which DeepSpeed's shared-memory "
                                       "kernels need"),
])
def test_status_names_the_one_missing_thing(kwargs, why, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    assert status(**kwargs) == (False, why)


def test_status_outside_linux(monkeypatch):
    monkeypatch.setattr("sys.platform", "darwin")
    assert status() == (False, "the shared-memory op is Linux-only (this is darwin)")


# ---------------------------------------------------------------- the choice


@pytest.mark.parametrize("info", [TORCHRUN, INTEL_MPI, SLURM], ids=lambda i: i.launcher)
def test_shm_when_asked_under_every_launcher(info):
    assert choose_allreduce("shm", info, {}, MPI_OK, shm_available=SHM_OK) == (
        "shm", "requested; DeepSpeed's shared-memory op")


def test_shm_asked_but_unusable_is_one_line_naming_the_fix():
    with pytest.raises(CoreCPUError, match=r"^the shared-memory all-reduce cannot run here: DeepSpeed is not "
                                           r"installed \(pip install 'corecpu\[shm\]'\); or use --allreduce gloo$"):
        choose_allreduce("shm", TORCHRUN, {}, MPI_OK, shm_available=SHM_MISSING)


def test_auto_never_picks_shm_even_where_it_works():
    for info in (TORCHRUN, INTEL_MPI, SLURM):
        assert choose_allreduce("auto", info, {}, MPI_OK, shm_available=SHM_OK)[0] in ("gloo", "mpi")


def test_one_process_needs_no_shm_either():
    single = LaunchInfo("single", 0, 1, 0, 1)
    assert choose_allreduce("shm", single, {}, MPI_OK, shm_available=SHM_MISSING) == ("none", "single process")


def test_bf16_on_the_wire_and_mpi():
    with pytest.raises(CoreCPUError, match=r"^MPI has no bf16 sum, so the MPI all-reduce sends fp32; use "
                                           r"--allreduce-dtype fp32, or --allreduce shm or gloo"):
        choose_allreduce("mpi", INTEL_MPI, {}, MPI_OK, dtype="bf16")
    # auto under mpirun would pick MPI; with bf16 asked for on the wire it takes gloo and says why.
    assert choose_allreduce("auto", INTEL_MPI, {}, MPI_OK, dtype="bf16") == (
        "gloo", "bf16 on the wire, which MPI cannot sum")
    assert choose_allreduce("shm", INTEL_MPI, {}, MPI_OK, dtype="bf16", shm_available=SHM_OK)[0] == "shm"
    with pytest.raises(CoreCPUError, match=r"^all-reduce dtype 'fp16' is not one of: fp32, bf16$"):
        choose_allreduce("gloo", INTEL_MPI, {}, MPI_OK, dtype="fp16")


def test_make_refuses_what_no_path_does():
    with pytest.raises(CoreCPUError, match=r"^MPI has no bf16 sum"):
        make_gradient_allreduce("mpi", INTEL_MPI, wire="bf16")
    with pytest.raises(CoreCPUError, match=r"^no gradient all-reduce object for 'nccl'; use one of gloo, ccl, mpi, shm$"):
        make_gradient_allreduce("nccl", INTEL_MPI)


def test_the_option_and_its_flag():
    assert RunOptions().allreduce_dtype == "fp32"
    with pytest.raises(CoreCPUError, match=r"^--allreduce-dtype 'fp16' is not one of: fp32, bf16$"):
        RunOptions(allreduce_dtype="fp16").validate(flags=True)
    RunOptions(allreduce="shm", allreduce_dtype="bf16").validate(flags=True)


# ---------------------------------------------------------------- names, hosts, wire


def test_each_host_of_each_job_has_its_own_namespace():
    names = {shm_namespace(job, node, host) for job in ("1a2b", "1a2c") for node in (0, 1) for host in ("cc-node0",)}
    assert len(names) == 4
    # Two "hosts" that share one hostname (and /dev/shm) still differ by node index.
    assert shm_namespace("1a2b", 0, "box") != shm_namespace("1a2b", 1, "box")


def test_namespace_holds_only_characters_a_shm_name_may():
    ns = shm_namespace("ab/12 x", 3, "node_7.cluster.example.org")
    assert ns == "corecpu-ab-12-x-n3-node-7"
    assert "/" not in segment_name(ns, 1, 1000)


def test_segment_name_is_the_ops_own():
    # shm.cpp: "%s_%d_%s_%s" (prefix, uid, MASTER_ADDR, MASTER_PORT), then "_%d" (rank); the unlink depends on it.
    assert segment_name("corecpu-x-n0-h", 1, 1000) == "deepspeed_allreduce_buffer_1000_corecpu-x-n0-h_grad_1"


def test_host_layout_is_the_launchers_block_placement():
    assert host_layout(LaunchInfo("torchrun", 3, 4, 1, 2)) == (2, [0, 2])
    assert host_layout(LaunchInfo("torchrun", 0, 2, 0, 2)) == (1, [0])
    assert host_layout(LaunchInfo("intel-mpi", 1, 2, 0, 1)) == (2, [0, 1])
    with pytest.raises(CoreCPUError, match=r"^5 ranks do not split into hosts of 2; the shared-memory all-reduce "
                                           r"needs the same number of ranks on every host$"):
        host_layout(LaunchInfo("torchrun", 0, 5, 0, 2))


def test_wire_dtype_needs_the_kernels_for_it():
    check_wire("fp32", KERNEL_LEVEL_FP32)
    check_wire("bf16", KERNEL_LEVEL_BF16)
    with pytest.raises(CoreCPUError, match=r"^the shared-memory op sums bf16 with AVX-512 only, which this CPU "
                                           r"lacks; use --allreduce-dtype fp32$"):
        check_wire("bf16", KERNEL_LEVEL_FP32)
    with pytest.raises(CoreCPUError, match=r"needs AVX2\); use --allreduce gloo$"):
        check_wire("fp32", 0)


def test_a_build_is_loaded_directly_only_while_it_is_the_one_stamped(tmp_path, monkeypatch):
    # The fast path (no `import deepspeed`) takes the .so only if the last load through DeepSpeed stamped this
    # very file; a build being rewritten, or one never loaded, goes through DeepSpeed (which may rebuild it).
    import importlib.util as util

    from corecpu.distributed import shm_allreduce as shm
    folder = tmp_path / shm.OP_NAME
    folder.mkdir()
    so = folder / f"{shm.OP_NAME}.so"
    so.write_bytes(b"\0" * 100)
    imported = []
    monkeypatch.setattr(util, "spec_from_file_location", lambda *a, **k: imported.append(a) or None)
    assert shm._load_built(folder) is None and imported == []  # never stamped
    shm._stamp_built(folder, SimpleNamespace(__file__=str(tmp_path / "elsewhere.so")))
    assert not (folder / shm._STAMP).exists()  # a module from elsewhere is not this build
    shm._stamp_built(folder, SimpleNamespace(__file__=str(so)))
    assert shm._load_built(folder) is None and imported == [(shm.OP_NAME, so)]  # stamped: imported from the file
    so.write_bytes(b"\0" * 101)  # rebuilt (or half-written) since
    imported.clear()
    assert shm._load_built(folder) is None and imported == []
    (folder / shm._STAMP).write_text("{not json")
    assert shm._load_built(folder) is None and imported == []


def test_loading_the_op_without_deepspeed_is_one_line_naming_the_extra(monkeypatch):
    # Found by benchmarks/allreduce.py on a machine without the extra: the build folder's name read DeepSpeed's
    # version first, so the first thing anyone saw was importlib's PackageNotFoundError, not corecpu's line.
    from importlib import metadata

    from corecpu.distributed import shm_allreduce as shm

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(shm.metadata, "version", missing)
    with pytest.raises(CoreCPUError, match=r"needs deepspeed, which is not installed; .*shm.*--allreduce gloo"):
        shm.load_op()
