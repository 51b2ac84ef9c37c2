"""corecpu.bind: what each rank pins and exports (via the side-effect-free `prepare`), plus one real exec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corecpu.launching.bind import prepare
from corecpu.cpu.threads import binding_report
from corecpu.errors import CoreCPUError
from helpers.common import ROOT as REPO
from helpers.sysfs_fixtures import make_machine

CMD = ["--", "python", "train.py", "--epochs", "1"]


@pytest.fixture(scope="module")
def two_socket(tmp_path_factory) -> Path:
    return make_machine(tmp_path_factory.mktemp("sysfs") / "two_socket", "two_socket")


@pytest.fixture(scope="module")
def single_core(tmp_path_factory) -> Path:
    return make_machine(tmp_path_factory.mktemp("sysfs") / "single_core", "single_core")


def ompi(local_rank: int, local_size: int, **extra: str) -> dict[str, str]:
    env = {
        "PATH": "/nonexistent",  # no numactl
        "OMPI_COMM_WORLD_RANK": str(local_rank),
        "OMPI_COMM_WORLD_SIZE": str(local_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        # As launch.sh says it for train.py: otherwise "auto" would plan for ccl wherever the bindings are built.
        "CORECPU_BACKEND": "gloo",
        # As launch.sh says it on an idle machine (a fake tree shows no sign of exclusivity: it would be numa).
        "CORECPU_BINDING": "core",
    }
    env.update(extra)
    return env


def test_each_local_rank_gets_its_slice(two_socket):
    for local_rank, cpus in enumerate([(0, 1, 2, 3), (4, 5, 6, 7)]):
        cmd, env, pinned, messages = prepare(["--sysfs", str(two_socket), *CMD], ompi(local_rank, 2))
        assert pinned == cpus
        assert cmd == ["python", "train.py", "--epochs", "1"]
        assert env["OMP_NUM_THREADS"] == "4"
        assert env["CORECPU_BOUND_CPUS"] == f"{cpus[0]}-{cpus[-1]}"
        assert env["I_MPI_PIN_DOMAIN"] == "[0xf,0xf0]"
        assert messages == []


def test_a_numa_binding_lets_a_rank_move_within_its_node(two_socket):
    env = ompi(0, 4)
    del env["CORECPU_BINDING"]
    _, out, pinned, _ = prepare(["--sysfs", str(two_socket), "--binding", "numa", *CMD], env)
    assert pinned == (0, 1, 2, 3) and out["OMP_NUM_THREADS"] == "2"  # node 0's cores; its own share of threads
    assert out["CORECPU_BINDING"] == "numa" and out["CORECPU_BINDING_REASON"] == "requested"
    assert out["OMP_PROC_BIND"] == "false"
    _, core, pinned, _ = prepare(["--sysfs", str(two_socket), *CMD], env)  # auto, no evidence: per core
    assert pinned == (0, 1) and core["CORECPU_BINDING"] == "core" and core["CORECPU_BINDING_REASON"].startswith("no sign")
    _, told, _, _ = prepare(["--sysfs", str(two_socket), *CMD], {**env, "CORECPU_BINDING": "numa",
                                                                   "CORECPU_BINDING_REASON": "launch.sh said so"})
    assert told["CORECPU_BINDING_REASON"] == "launch.sh said so"  # the launcher's decision and its reason carry on


def test_plan_options_pass_through(two_socket):
    _, env, pinned, _ = prepare(["--sysfs", str(two_socket), "--backend", "ccl", *CMD], ompi(1, 2))
    assert pinned == (4, 5, 6)
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["CCL_WORKER_AFFINITY"] == "3,7" and env["CCL_WORKER_COUNT"] == "1"


def test_a_single_process_keeps_every_core_for_compute_under_ccl(two_socket):
    # One process runs no collective, so no core idles as a CCL worker (half of 2 cores before the fix).
    _, ccl, ccl_pinned, _ = prepare(["--sysfs", str(two_socket), "--backend", "ccl", *CMD], ompi(0, 1))
    _, gloo, gloo_pinned, _ = prepare(["--sysfs", str(two_socket), "--backend", "gloo", *CMD], ompi(0, 1))
    assert ccl_pinned == gloo_pinned and ccl["OMP_NUM_THREADS"] == gloo["OMP_NUM_THREADS"]
    assert "CCL_WORKER_AFFINITY" not in ccl
    _, two, _, _ = prepare(["--sysfs", str(two_socket), "--backend", "ccl", *CMD], ompi(0, 2))
    assert "CCL_WORKER_AFFINITY" in two  # two ranks do talk: the worker stays


def test_users_oneccl_exports_win_over_the_plan(two_socket):
    _, env, _, _ = prepare(["--sysfs", str(two_socket), "--backend", "ccl", *CMD],
                           {**ompi(1, 2), "CCL_ATL_TRANSPORT": "mpi", "CCL_WORKER_AFFINITY": "2,6"})
    assert env["CCL_ATL_TRANSPORT"] == "mpi" and env["CCL_WORKER_AFFINITY"] == "2,6"
    assert env["CCL_ATL_SHM"] == "1" and env["CCL_WORKER_COUNT"] == "1"  # the rest of the plan stays


def test_nproc_must_match_launcher(two_socket):
    with pytest.raises(CoreCPUError) as err:
        prepare(["--sysfs", str(two_socket), "--nproc", "4", *CMD], ompi(0, 2))
    assert str(err.value) == (
        "--nproc 4 but openmpi started 2 rank(s) on this node; drop --nproc or start the same number of ranks"
    )


def test_oversubscribed_warns_once_from_local_rank_zero(single_core):
    results = [prepare(["--sysfs", str(single_core), *CMD], ompi(r, 3)) for r in range(3)]
    assert [pinned for _, _, pinned, _ in results] == [(0,), (0,), (0,)]
    assert all(env["OMP_NUM_THREADS"] == "1" for _, env, _, _ in results)
    assert len(results[0][3]) == 1 and results[0][3][0].startswith("corecpu.bind: warning: oversubscribed: 3 ranks")
    assert results[1][3] == [] and results[2][3] == []
    assert "oversubscribed" in results[1][1]["CORECPU_PLAN_NOTE"]
    # Intel MPI reads it at MPI_Init, after this exec: ranks sharing a CPU must not busy-poll.
    assert all(env["I_MPI_WAIT_MODE"] == "1" for _, env, _, _ in results)


def test_ranks_that_fit_keep_mpi_polling(two_socket):
    assert "I_MPI_WAIT_MODE" not in prepare(["--sysfs", str(two_socket), *CMD], ompi(0, 2))[1]


def prepared_with_tcmalloc(two_socket: Path, tmp_path: Path, **environ: str) -> dict[str, str]:
    """prepare()'s environment for rank 0 of 2, with a tcmalloc in the active venv's lib/."""
    lib = tmp_path / "venv/lib"
    lib.mkdir(parents=True)
    (lib / "libtcmalloc.so.4").write_text("")
    return prepare(["--sysfs", str(two_socket), *CMD], ompi(0, 2, VIRTUAL_ENV=str(tmp_path / "venv"), **environ))[1]


def test_ld_preload_keeps_users_entries(two_socket, tmp_path):
    env = prepared_with_tcmalloc(two_socket, tmp_path, LD_PRELOAD="/opt/mine.so")
    parts = env["LD_PRELOAD"].split(":")
    assert "tcmalloc" in parts[0] and parts[-1] == "/opt/mine.so"


def test_corecpu_allocator_system_preloads_nothing_of_ours(two_socket, tmp_path):
    env = prepared_with_tcmalloc(two_socket, tmp_path, CORECPU_ALLOCATOR="system")
    assert "LD_PRELOAD" not in env


def fake_numactl(bin_dir: Path, works: bool) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "numactl"
    body = 'shift; exec "$@"' if works else "exit 1"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)


def test_membind_through_numactl(two_socket, tmp_path):
    fake_numactl(tmp_path / "bin", works=True)
    cmd, _, _, messages = prepare(["--sysfs", str(two_socket), *CMD], ompi(1, 2, PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin"))
    assert cmd[:2] == ["numactl", "--membind=1"] and cmd[2:] == ["python", "train.py", "--epochs", "1"]
    assert messages == []
    cmd, _, _, _ = prepare(["--sysfs", str(two_socket), "--no-membind", *CMD], ompi(1, 2, PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin"))
    assert cmd[0] == "python"


def test_membind_dropped_when_numactl_is_refused(two_socket, tmp_path):
    fake_numactl(tmp_path / "bin", works=False)
    cmd, _, _, messages = prepare(["--sysfs", str(two_socket), *CMD], ompi(0, 2, PATH=str(tmp_path / "bin")))
    assert cmd[0] == "python"
    assert messages == ["corecpu.bind: numactl cannot set a memory policy here (no CAP_SYS_NICE?); memory not bound"]


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "2"], "no command to run; put it after --, e.g. python -m corecpu.bind -- python train.py"),
    (["--"], "no command after --; e.g. python -m corecpu.bind -- python train.py"),
])
def test_command_errors(argv, message):
    with pytest.raises(CoreCPUError) as err:
        prepare(argv, {})
    assert str(err.value) == message


def test_binding_report_describes_this_process():
    import torch

    report = binding_report(os.environ)
    assert report["pid"] == os.getpid()
    assert report["cpus"] == sorted(os.sched_getaffinity(0))
    assert report["torch_threads"] == torch.get_num_threads()


def run_bound(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    probe = ("import os, json; print(json.dumps([sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
             "os.environ['CORECPU_BOUND_CPUS']]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_", "MPI_"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "corecpu.bind", *args, "--", sys.executable, "-c", probe],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_exec_pins_the_real_process():
    result = run_bound(["--allowed-cpus", "0", "--no-membind"], {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[[0], "1", "0"]'


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_exec_second_local_rank_gets_second_cpu():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CORECPU_BINDING": "core"}
    result = run_bound(["--allowed-cpus", f"{cpus[0]},{cpus[1]}", "--no-membind"], torchrun)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f'[[{cpus[1]}], "1", "{cpus[1]}"]'


def test_exec_unknown_command_is_one_line_error():
    result = subprocess.run([sys.executable, "-m", "corecpu.bind", "--", "no-such-command-xyz"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == "corecpu: error: command not found: no-such-command-xyz; check the command after --\n"


def test_nproc_without_launcher(two_socket):
    with pytest.raises(CoreCPUError) as err:
        prepare(["--sysfs", str(two_socket), "--nproc", "2", *CMD], {"PATH": "/nonexistent"})
    assert str(err.value) == (
        "--nproc 2 but no launcher started this process, so it is 1 rank; run it under mpirun, srun or torchrun, "
        "or drop --nproc"
    )
