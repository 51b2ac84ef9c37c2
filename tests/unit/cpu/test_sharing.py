"""Whether the job's CPUs are its own, and the binding that follows: pure rules and fake trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from corecpu.cpu import sharing
from corecpu.cpu.sharing import SharingEvidence, decide_binding
from corecpu.errors import CoreCPUError
from helpers.sysfs_fixtures import make_cgroup


def test_a_busy_cpu_is_recorded_and_ranks_stay_pinned_per_core() -> None:
    # Measured: under a busy neighbour per-core pinning was no slower than numa (see corecpu.cpu.sharing).
    evidence = SharingEvidence(exclusive=("Kubernetes pod in the Guaranteed QoS class",), busy_cpus=(1,), measured=True)
    binding, why = decide_binding("auto", evidence)
    assert binding == "core" and "CPU(s) 1 busy with other work at start" in why


def test_exclusive_or_measured_idle_cpus_are_pinned_per_core() -> None:
    assert decide_binding("auto", SharingEvidence(exclusive=("exclusive cpuset (cgroup partition root)",))) == (
        "core", "CPUs are the job's alone: exclusive cpuset (cgroup partition root)")
    assert decide_binding("auto", SharingEvidence(measured=True)) == ("core", "every allowed CPU idle at start")


def test_without_evidence_the_reason_says_so() -> None:
    assert decide_binding("auto", SharingEvidence()) == ("core", "no sign of sharing measured (launch.sh measures at "
                                                                 "start)")
    assert decide_binding("numa", SharingEvidence()) == ("numa", "requested")


def test_an_explicit_binding_wins_and_a_bad_one_is_named() -> None:
    assert decide_binding("core", SharingEvidence(busy_cpus=(0,), measured=True)) == ("core", "requested")
    with pytest.raises(CoreCPUError, match="--binding 'tight' is not one of: auto, core, numa"):
        decide_binding("tight", SharingEvidence())


def test_proc_stat_samples_give_the_busy_cpus() -> None:
    before = sharing.parse_proc_stat("cpu  9 9 9 9 9 0 0 0 0 0\n"
                                     "cpu0 100 0 0 900 0 0 0 0 0 0\ncpu1 100 0 0 900 0 0 0 0 0 0\nintr 5\n")
    after = sharing.parse_proc_stat("cpu0 190 0 5 905 0 0 0 0 0 0\ncpu1 101 0 0 999 0 0 0 0 0 0\n")
    assert before[0] == (100, 1000) and after[0] == (195, 1100) and sorted(before) == [0, 1]
    assert sharing.busy_cpus(before, after, [0, 1]) == (0,)  # 95 of 100 jiffies busy vs 1 of 100
    assert sharing.busy_cpus(before, after, [1]) == ()  # only the allowed CPUs count


def test_measure_busy_samples_twice_around_the_pause(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    samples = iter(["cpu0 0 0 0 100 0 0 0 0\ncpu1 0 0 0 100 0 0 0 0\n", "cpu0 80 0 0 120 0 0 0 0\ncpu1 0 0 0 200 0 0 0 0\n"])
    stat.write_text(next(samples))
    assert sharing.measure_busy([0, 1], proc_stat=stat, sleep=lambda s: stat.write_text(next(samples))) == (0,)


def test_slurm_whole_node_and_kubernetes_guaranteed_signs() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_CPUS_PER_NODE": "64(x2)"}
    assert sharing.slurm_whole_node(env, 64) == "Slurm job 42 holds all 64 CPUs of this node"
    assert sharing.slurm_whole_node({**env, "SLURM_JOB_CPUS_PER_NODE": "8"}, 64) is None
    assert sharing.slurm_whole_node({"SLURM_JOB_CPUS_PER_NODE": "64"}, 64) is None  # not inside a job
    guaranteed = "0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-ab.scope\n"
    burstable = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/x.scope\n"
    assert sharing.kubernetes_guaranteed(guaranteed) == "Kubernetes pod in the Guaranteed QoS class"
    assert sharing.kubernetes_guaranteed(burstable) is None
    assert sharing.kubernetes_guaranteed("0::/user.slice/session-1.scope\n") is None


@pytest.mark.parametrize("version", [1, 2])
def test_an_exclusive_cpuset_is_found_in_either_cgroup_version(tmp_path: Path, version: int) -> None:
    root, proc = make_cgroup(tmp_path, None, version=version)
    # The hierarchy's root says exclusive on every machine: it must not count.
    top = root if version == 2 else root / "cpuset"
    top.mkdir(exist_ok=True)
    (top / ("cpuset.cpus.partition" if version == 2 else "cpuset.cpu_exclusive")).write_text(
        "root\n" if version == 2 else "1\n")
    job = top / "job"
    job.mkdir()
    proc.write_text("0::/job\n" if version == 2 else "4:cpu,cpuacct:/\n3:cpuset:/job\n")
    assert sharing.cpuset_exclusive(root, proc) is None
    if version == 2:
        (job / "cpuset.cpus.partition").write_text("member\n")
        assert sharing.cpuset_exclusive(root, proc) is None
        (job / "cpuset.cpus.partition").write_text("root\n")
    else:
        (job / "cpuset.cpu_exclusive").write_text("1\n")
    assert "exclusive cpuset" in sharing.cpuset_exclusive(root, proc)
    evidence = sharing.gather_evidence({}, [0, 1], 2, measure=False, cgroup_root=root, proc_self_cgroup=proc)
    assert decide_binding("auto", evidence)[0] == "core" and not evidence.measured


def test_niced_time_is_no_contention() -> None:
    # cpu0: 95 of 100 jiffies in `nice` (a nice 19 loop); cpu1: 95 in `user`.
    before = sharing.parse_proc_stat("cpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n")
    after = sharing.parse_proc_stat("cpu0 0 95 0 5 0 0 0 0\ncpu1 95 0 0 5 0 0 0 0\n")
    assert sharing.busy_cpus(before, after, [0, 1]) == (1,)


def test_a_nice_19_neighbours_time_lands_in_the_column_that_is_not_counted() -> None:
    # The kernel books a positive-niceness process's CPU time under `nice`, which parse_proc_stat leaves out
    # of busy: checked against the loop's own accounting, so other load on the machine cannot decide it.
    import subprocess
    import sys
    import time

    def nice_jiffies() -> int:
        return sum(int(line.split()[2]) for line in Path("/proc/stat").read_text().splitlines()
                   if line.startswith("cpu") and line[3].isdigit())

    def cpu_jiffies(pid: int) -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    loop = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        nice0, own0 = nice_jiffies(), cpu_jiffies(loop.pid)
        deadline = time.monotonic() + 8
        while cpu_jiffies(loop.pid) - own0 < 50 and time.monotonic() < deadline:  # enough ticks to compare
            time.sleep(0.2)
        nice1, own1 = nice_jiffies(), cpu_jiffies(loop.pid)
    finally:
        loop.kill()
        loop.wait()
    if own1 - own0 < 50:
        pytest.skip(f"the niced loop got {own1 - own0} jiffies in 8 s: the machine is too busy to compare")
    assert nice1 - nice0 >= 0.8 * (own1 - own0), (nice1 - nice0, own1 - own0)
