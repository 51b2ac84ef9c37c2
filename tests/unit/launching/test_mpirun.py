"""Which MPI an `mpirun` is, and the command and environment corecpu launch starts ranks with through it: Intel MPI
and MPICH (hydra) as before, Open MPI with what it needs (root, its host syntax, -x, mpi4py's library)."""

from __future__ import annotations

import signal
import sys

from corecpu.distributed.allreduce import world_mismatch
from corecpu.distributed.allreduce_choice import cache_key
from corecpu.launching import job_watch, mpirun
from corecpu.launching.launch import parse_args, plan_launch

OPEN_MPI_TEXT = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
INTEL_TEXT = "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)\nCopyright 2003-2026\n"
MPICH_TEXT = "HYDRA build details:\n    Version:                                 4.0.2\n    Release Date: ...\n"
OPEN_MPI = mpirun.MpiKind(mpirun.OPEN_MPI, "Open MPI 4.1.4", "/opt/ompi/lib/libmpi.so.40")


def test_the_version_text_names_the_family_and_the_release():
    assert mpirun.parse_version(OPEN_MPI_TEXT) == (mpirun.OPEN_MPI, "Open MPI 4.1.4")
    assert mpirun.parse_version(INTEL_TEXT) == (mpirun.HYDRA, "Intel MPI 2021.18.1")
    assert mpirun.parse_version(MPICH_TEXT) == (mpirun.HYDRA, "MPICH 4.0.2")
    assert mpirun.parse_version("") == (mpirun.HYDRA, "an unknown MPI")  # no answer: hydra, as corecpu installs it


def test_open_mpi_s_library_is_found_where_ompi_info_says_or_above_it():
    info = "path:libdir:/usr/lib/x86_64-linux-gnu/openmpi/lib\n"
    assert mpirun.open_mpi_libmpi(info, exists={"/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40"}.__contains__) \
        == "/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40"
    assert mpirun.open_mpi_libmpi(info, exists={"/usr/lib/x86_64-linux-gnu/libmpi.so.40"}.__contains__) \
        == "/usr/lib/x86_64-linux-gnu/libmpi.so.40"  # Debian: plugins in libdir, the library two up
    assert mpirun.open_mpi_libmpi(info, exists=lambda p: False) == "libmpi.so.40"  # the dynamic linker's search
    assert mpirun.open_mpi_libmpi("") == "libmpi.so.40"  # no ompi_info beside mpirun: the linker's search too


def test_detect_asks_ompi_info_only_for_open_mpi():
    asked: list[list[str]] = []

    def run(argv):
        asked.append(list(argv))
        return OPEN_MPI_TEXT if argv[-1] == "--version" else "path:libdir:/nowhere/lib\n"

    kind = mpirun.detect("/opt/ompi/bin/mpirun", run=run)
    assert (kind.family, kind.label) == (mpirun.OPEN_MPI, "Open MPI 4.1.4")
    assert asked[1][0] == "/opt/ompi/bin/ompi_info"
    assert mpirun.detect("/x/mpirun", run=lambda argv: INTEL_TEXT) == mpirun.MpiKind(mpirun.HYDRA, "Intel MPI 2021.18.1")


def test_hydra_keeps_its_hostfile_and_pinning_off():
    cmd, env, notes = mpirun.command(mpirun.MpiKind(mpirun.HYDRA, "Intel MPI"), 8, 4, "hosts", ["a", "b"],
                                     oversubscribe=False, as_root=True)
    assert cmd == ["mpirun", "-n", "8", "-f", "hosts", "-ppn", "4"] and env == {"I_MPI_PIN": "0"} and notes == []


def test_open_mpi_gets_root_leave_its_own_syntax_and_the_variables_other_hosts_need():
    cmd, env, notes = mpirun.command(OPEN_MPI, 2, 2, None, [], oversubscribe=False, as_root=True)
    assert cmd == ["mpirun", "-n", "2", "--bind-to", "none", "--allow-run-as-root"] and env == {}
    assert notes == ["running as root: passing Open MPI 4.1.4 --allow-run-as-root (it refuses root without it)"]
    cmd, _, notes = mpirun.command(OPEN_MPI, 8, 4, "hosts", ["a", "b", "a"], oversubscribe=True, as_root=False,
                                   forward=["MASTER_ADDR", "PATH"])
    assert notes == [] and "--allow-run-as-root" not in cmd and "--oversubscribe" in cmd
    assert cmd[cmd.index("--host") + 1] == "a:4,b:4" and cmd[cmd.index("--map-by") + 1] == "ppr:4:node"
    assert cmd[-4:] == ["-x", "MASTER_ADDR", "-x", "PATH"] and "-f" not in cmd


def test_what_other_hosts_need_is_the_launch_s_variables_and_the_settings_ranks_read():
    environ = {"PATH": "/bin", "CORECPU_CACHE_DIR": "/c", "OMP_PROC_BIND": "close", "SSH_AUTH_SOCK": "/s", "TERM": "x"}
    assert mpirun.forwarded_names(environ, {"MASTER_ADDR": "a", "MASTER_PORT": "1"}) == [
        "CORECPU_CACHE_DIR", "MASTER_ADDR", "MASTER_PORT", "OMP_PROC_BIND", "PATH"]


def test_mpi4py_is_pointed_at_open_mpi_only_where_it_could_load_another():
    assert mpirun.mpi4py_library(OPEN_MPI, {}, both_abis=True) == {"MPI4PY_LIBMPI": "/opt/ompi/lib/libmpi.so.40"}
    assert mpirun.mpi4py_library(OPEN_MPI, {}, both_abis=False) == {}  # built against one MPI: nothing to choose
    assert mpirun.mpi4py_library(OPEN_MPI, {"MPI4PY_MPIABI": "mpich"}, both_abis=True) == {}  # the user's choice
    assert mpirun.mpi4py_library(mpirun.MpiKind(mpirun.HYDRA, "Intel MPI"), {}, both_abis=True) == {}


def test_this_environment_s_mpi4py_wheel_carries_both_abis():
    # launch.sh's `mpi` extra installs mpi4py's wheel, which picks its MPI at import; a find_spec of nothing: False.
    assert mpirun.mpi4py_has_both_abis()
    assert not mpirun.mpi4py_has_both_abis(find_spec=lambda name: None)


def test_plan_launch_under_open_mpi_as_root():
    req = parse_args(["-n", "2", "train"])
    plan = plan_launch(req, {}, sys.executable, usable_cores=2, which=lambda n: "/opt/ompi/bin/" + n, port=lambda: 1,
                       mpi_kind=lambda path: OPEN_MPI, both_abis=lambda: True, euid=lambda: 0)
    assert plan.mpi_family == mpirun.OPEN_MPI and plan.command[:5] == ["mpirun", "-n", "2", "--bind-to", "none"]
    assert "--allow-run-as-root" in plan.command and "I_MPI_PIN" not in plan.env
    assert plan.env["MPI4PY_LIBMPI"] == "/opt/ompi/lib/libmpi.so.40"
    assert plan.env["CORECPU_MPI"] == "Open MPI 4.1.4"  # the ranks' banner names it
    assert plan.notes and plan.warnings == []
    user = plan_launch(req, {}, sys.executable, usable_cores=2, which=lambda n: "/opt/ompi/bin/" + n,
                       port=lambda: 1, mpi_kind=lambda path: OPEN_MPI, both_abis=lambda: True, euid=lambda: 1000)
    assert "--allow-run-as-root" not in user.command and user.notes == []


def test_a_world_of_one_under_an_mpi_launcher_names_the_library_mpi4py_loaded():
    line = world_mismatch(0, 1, (1, 2), "openmpi", "Intel(R) MPI Library 2021.18.1 for Linux* OS")
    assert "mpi4py loaded Intel(R) MPI Library 2021.18.1" in line and "MPI4PY_LIBMPI" in line and "\n" not in line
    assert "one mpirun" in world_mismatch(0, 4, (0, 2), "intel-mpi", "x")  # another world: ranks from two launches


def test_an_mpi_timing_is_kept_per_mpi():
    key = lambda mpi, paths: cache_key("cpu", 2, 2, 1, paths, "2.13", mpi=mpi)  # noqa: E731
    assert key("openmpi", ["gloo", "mpi"]) != key("intel-mpi", ["gloo", "mpi"])
    assert key("openmpi", ["gloo", "shm"]) == key("intel-mpi", ["gloo", "shm"])  # no MPI timed: no MPI in the key


def test_under_open_mpi_a_stop_that_saved_ends_with_its_line_and_75_whatever_mpirun_exited(tmp_path, monkeypatch):
    # Open MPI prints its report of the ranks' exit 75 after rank 0's stop line, and may exit otherwise when it
    # ended the last rank out: the record of the save decides.
    from corecpu.reliability import preempt
    from corecpu.training.checkpointer import Checkpoints

    monkeypatch.setattr(job_watch, "kill_job", lambda *args, **kwargs: None)
    (tmp_path / "job").mkdir()
    said: list[str] = []
    watch = job_watch.JobWatch(tmp_path / "job", 0, said.append, output_dir=str(tmp_path), restate_stop=True).start()
    assert watch.stop_signal(signal.SIGTERM)
    (tmp_path / "checkpoints" / "step-00000003").mkdir(parents=True)
    Checkpoints(tmp_path).mark_stopped("SIGTERM", 3, tmp_path / "checkpoints" / "step-00000003")
    assert watch.finish(1) == job_watch.EXIT_STOPPED
    assert said == [preempt.stop_line(signal.SIGTERM, 3, "step-00000003")]
    (tmp_path / "job2").mkdir()
    plain = job_watch.JobWatch(tmp_path / "job2", 0, said.append, output_dir=str(tmp_path)).start()
    assert plain.stop_signal(signal.SIGTERM) and plain.finish(job_watch.EXIT_STOPPED) == job_watch.EXIT_STOPPED
    assert len(said) == 1  # hydra's and torchrun's jobs end on the ranks' own line: nothing said twice


def test_the_ranks_name_the_mpi_the_launcher_found_and_nothing_else_does():
    from corecpu.cluster.launchers import detect_launcher

    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert detect_launcher({**ompi, "CORECPU_MPI": "Open MPI 4.1.4"}).label == "openmpi (Open MPI 4.1.4)"
    assert detect_launcher(ompi).label == "openmpi"  # mpirun run by hand: the launcher's name alone
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "2", "CORECPU_MPI": "MPICH 4.0.2"}
    assert detect_launcher(hydra).label == "intel-mpi (MPICH 4.0.2)"  # hydra's variables are MPICH's too
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "CORECPU_MPI": "x"}
    assert detect_launcher(torchrun).label == "torchrun"  # not an MPI world: an inherited value means nothing
