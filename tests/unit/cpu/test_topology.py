"""Detection from fake sysfs/cgroup trees, CPU list helpers, library search, and the `corecpu plan` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corecpu.cli import main as cli_main
from corecpu.errors import CoreCPUError
from corecpu.cpu.topology import (
    detect_topology,
    find_libraries,
    format_cpu_list,
    parse_cpu_list,
    read_cpu_quota,
    read_cpuset,
    read_sysfs,
)

from helpers.common import ROOT as REPO
from helpers.sysfs_fixtures import MACHINES, make_cgroup, make_machine, make_sysfs


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sysfs")
    return {name: make_machine(base / name, name) for name in MACHINES}


def detect(root: Path, **kw):
    kw.setdefault("library_dirs", [])
    kw.setdefault("numactl", None)
    kw.setdefault("proc_cpuinfo", None)
    return detect_topology(root, **kw)


# ---------------------------------------------------------------- CPU lists


@pytest.mark.parametrize(
    "text, cpus",
    [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("3,1,2\n", (1, 2, 3)), ("0-1,1-2", (0, 1, 2))],
)
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("cpus, text", [((0, 1, 2, 3, 8, 10, 11), "0-3,8,10-11"), ((7,), "7"), ((), ""), ((2, 0, 1), "0-2")])
def test_format_cpu_list(cpus, text):
    assert format_cpu_list(cpus) == text


@pytest.mark.parametrize(
    "text, message",
    [
        ("0-x", "bad CPU list '0-x': '0-x' is not a CPU number or range; expected e.g. 0-3,8"),
        ("3-1", "bad CPU list '3-1': range '3-1' runs backwards; expected e.g. 0-3,8"),
        ("", "bad CPU list '': it is empty; expected e.g. 0-3,8"),
        ("1,,2", "bad CPU list '1,,2': '' is not a CPU number or range; expected e.g. 0-3,8"),
        ("-1", "bad CPU list '-1': '-1' is not a CPU number or range; expected e.g. 0-3,8"),
    ],
)
def test_bad_cpu_list_messages(text, message):
    with pytest.raises(CoreCPUError) as err:
        parse_cpu_list(text)
    assert str(err.value) == message


def test_empty_list_allowed_for_sysfs():
    assert parse_cpu_list("\n", allow_empty=True) == ()


# ---------------------------------------------------------------- sysfs


def test_two_socket_hyperthreads_after_physical(machines):
    topo = detect(machines["two_socket"])
    assert topo.online == tuple(range(16))
    assert topo.nodes == ((0, (0, 1, 2, 3, 8, 9, 10, 11)), (1, (4, 5, 6, 7, 12, 13, 14, 15)))
    assert [c.cpus for c in topo.cores] == [(0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)]
    assert topo.packages == (0, 1)
    assert topo.l3_domains == ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15))
    assert topo.allowed == topo.online  # fake tree: the real affinity says nothing about it
    assert topo.cpu_quota is None


def test_alternate_numbering_groups_by_node_not_index(machines):
    topo = detect(machines["alternate"])
    assert topo.nodes[0] == (0, (0, 2, 4, 6, 8, 10, 12, 14))
    assert topo.nodes[1] == (1, (1, 3, 5, 7, 9, 11, 13, 15))
    node0 = [c for c in topo.cores if c.node == 0]
    assert [c.cpus for c in node0] == [(0, 8), (2, 10), (4, 12), (6, 14)]
    assert {c.package for c in node0} == {0}
    assert [c.core_id for c in node0] == [0, 2, 4, 6]  # sparse core ids, as real Xeons have


def test_sub_numa_clustering(machines):
    topo = detect(machines["snc"])
    assert topo.node_ids == (0, 1, 2, 3)
    assert topo.nodes[1] == (1, (2, 3, 10, 11))
    assert {c.package for c in topo.cores if c.node in (2, 3)} == {1}
    assert len(topo.l3_domains) == 4


def test_single_core(machines):
    topo = detect(machines["single_core"])
    assert topo.online == (0,) and len(topo.cores) == 1 and topo.l3_domains == ()


def test_core_id_repeats_across_packages_are_distinct_cores(machines):
    # core_id 0 exists on both sockets; they must not be merged.
    topo = detect(machines["two_socket"])
    assert len([c for c in topo.cores if c.core_id == 0]) == 2


def test_offline_cpus_are_skipped(tmp_path):
    root = make_sysfs(tmp_path, offline=(3, 11))
    topo = detect(root)
    assert 3 not in topo.online and 11 not in topo.online
    assert len(topo.cores) == 7


def test_missing_node_and_topology_dirs_fall_back(tmp_path):
    cpu = tmp_path / "devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-3\n")
    online, cores, nodes, l3, notes = read_sysfs(tmp_path)
    assert nodes == ((0, (0, 1, 2, 3)),)
    assert [c.cpus for c in cores] == [(0,), (1,), (2,), (3,)]
    assert any("no NUMA information" in n for n in notes)
    assert any("no topology info" in n for n in notes)


def test_no_cpus_is_an_error(tmp_path):
    with pytest.raises(CoreCPUError, match="no CPUs found under"):
        read_sysfs(tmp_path)


def test_allowed_cpus_override_and_offline_error(machines):
    topo = detect(machines["two_socket"], allowed_cpus="0-2,8-10")
    assert topo.allowed == (0, 1, 2, 8, 9, 10)
    with pytest.raises(CoreCPUError) as err:
        detect(machines["two_socket"], allowed_cpus="0,16-17")
    assert str(err.value) == (
        "allowed CPUs 16-17 are not online on this machine (online: 0-15); pick CPUs from the online list"
    )


def test_real_machine_uses_affinity():
    topo = detect_topology(library_dirs=[], numactl=None, proc_cpuinfo=None)
    assert set(topo.allowed) == set(os.sched_getaffinity(0)) & set(topo.online)


def test_isa_flags_from_cpuinfo_file(machines):
    topo = detect(machines["two_socket"], proc_cpuinfo=machines["two_socket"] / "cpuinfo")
    assert topo.isa_known and "amx_bf16" in topo.isa_flags
    assert topo.model_name.startswith("Intel(R) Xeon(R) Platinum 8480+")
    single = detect(machines["single_core"], proc_cpuinfo=machines["single_core"] / "cpuinfo")
    assert single.isa_flags == ()


# ---------------------------------------------------------------- cgroups


@pytest.mark.parametrize("version", [1, 2])
def test_cpu_quota(tmp_path, version):
    root, proc = make_cgroup(tmp_path, 2.5, version=version)
    assert read_cpu_quota(root, proc) == pytest.approx(2.5)
    topo = detect(make_machine(tmp_path / "m", "two_socket"), cgroup_root=root, proc_self_cgroup=proc)
    assert topo.cpu_quota == pytest.approx(2.5) and topo.quota_threads == 2


@pytest.mark.parametrize("version", [1, 2])
def test_no_quota(tmp_path, version):
    root, proc = make_cgroup(tmp_path, None, version=version)
    assert read_cpu_quota(root, proc) is None


def test_nested_cgroup_tightest_ancestor_wins(tmp_path):
    root, proc = make_cgroup(tmp_path, 4)
    inner = root / "job/step"
    inner.mkdir(parents=True)
    (inner / "cpu.max").write_text("max 100000\n")
    (root / "job/cpu.max").write_text("150000 100000\n")
    proc.write_text("0::/job/step\n")
    assert read_cpu_quota(root, proc) == pytest.approx(1.5)


def test_cgroup_path_missing_under_mount_uses_root(tmp_path):
    root, proc = make_cgroup(tmp_path, 3)
    proc.write_text("0::/docker/abc123\n")  # no cgroup namespace: path not under the mount
    assert read_cpu_quota(root, proc) == pytest.approx(3)


def test_cpuset(tmp_path):
    root, proc = make_cgroup(tmp_path, None)
    (root / "cpuset.cpus.effective").write_text("2-5\n")
    assert read_cpuset(root, proc) == (2, 3, 4, 5)
    v1, proc1 = make_cgroup(tmp_path / "v1", None, version=1)
    (v1 / "cpuset").mkdir()
    (v1 / "cpuset/cpuset.effective_cpus").write_text("0,2\n")
    assert read_cpuset(v1, proc1) == (0, 2)


# ---------------------------------------------------------------- libraries


def test_find_libraries_prefers_tcmalloc_and_versioned_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "libjemalloc.so.2").write_text("")
    (b / "libtcmalloc_minimal.so.4").write_text("")
    (b / "libtcmalloc.so.4").write_text("")
    (b / "libiomp5.so").write_text("")
    (a / "libiomp5.so.dangling").symlink_to(tmp_path / "nowhere")
    libs = find_libraries([a, b])
    assert libs.tcmalloc == str(b / "libtcmalloc.so.4")
    assert libs.jemalloc == str(a / "libjemalloc.so.2")
    assert libs.iomp5 == str(b / "libiomp5.so")


def test_dangling_symlink_is_not_found(tmp_path):
    (tmp_path / "libtcmalloc.so").symlink_to(tmp_path / "missing.so.4")
    assert find_libraries([tmp_path]).tcmalloc is None


def test_library_search_roots_include_venv_and_multiarch(tmp_path):
    from corecpu.cpu.topology import default_library_dirs

    dirs = default_library_dirs({"VIRTUAL_ENV": "/venv", "CONDA_PREFIX": "/conda"})
    assert dirs[0] == os.path.join(sys.prefix, "lib")
    for d in ("/venv/lib", "/conda/lib", "/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
        assert d in dirs


def test_numactl_from_path(tmp_path, machines):
    exe = tmp_path / "numactl"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    topo = detect_topology(machines["single_core"], library_dirs=[], proc_cpuinfo=None, env={"PATH": str(tmp_path)})
    assert topo.numactl == str(exe)


# ---------------------------------------------------------------- CLI


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_cli_plan_json(machines, capsys):
    root = machines["two_socket"]
    code, out, _ = run_cli(["plan", "--sysfs", str(root), "--cpuinfo", str(root / "cpuinfo"), "--json",
                            "--binding", "core"], capsys)
    assert code == 0
    data = json.loads(out)
    assert {"machine", "ranks", "env", "notes"} <= set(data)
    assert [r["cpus"] for r in data["ranks"]] == ["0-3", "4-7"]
    for r in data["ranks"]:
        assert {"rank", "cpus", "numa_node", "omp_num_threads", "ccl_worker_cpus"} <= set(r)
    assert data["machine"]["sockets"] == 2 and data["machine"]["isa"]["amx_bf16"] is True
    assert data["env"]["I_MPI_PIN_DOMAIN"] == "[0xf,0xf0]"


def test_cli_plan_export_is_valid_sh(machines, capsys, tmp_path):
    root = machines["alternate"]
    code, out, _ = run_cli(["plan", "--sysfs", str(root), "--cpuinfo", str(root / "cpuinfo"), "--export",
                            "--backend", "ccl", "--binding", "core"], capsys)
    assert code == 0
    script = tmp_path / "plan.sh"
    script.write_text(out)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    shown = subprocess.run(["sh", "-c", f'. "{script}"; printf "%s|%s" "$I_MPI_PIN_DOMAIN" "$CCL_WORKER_AFFINITY"'],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "[0x15,0x2a]|6,7"
    assert "# rank 0: " in out and "OMP_NUM_THREADS=3" in out


def test_cli_plan_tables(machines, capsys):
    root = machines["two_socket"]
    code, out, _ = run_cli(["plan", "--sysfs", str(root), "--cpuinfo", str(root / "cpuinfo"), "--nproc", "4",
                            "--binding", "core"], capsys)
    assert code == 0
    for text in ("Machine", "Ranks", "Environment", "[0x3,0xc,0x30,0xc0]", "8480+", "left idle", "binding: core"):
        assert text in out


def test_cli_plan_binding_auto_without_evidence_is_per_core_and_says_why(machines, capsys):
    # A --sysfs tree is another machine: its load is not sampled, and it shows no sign either way.
    root = machines["two_socket"]
    code, out, _ = run_cli(["plan", "--sysfs", str(root), "--cpuinfo", str(root / "cpuinfo"), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["request"]["binding"] == "core" and data["binding_reason"].startswith("no sign")
    code, out, _ = run_cli(["plan", "--sysfs", str(root), "--cpuinfo", str(root / "cpuinfo"), "--json", "--nproc", "4",
                            "--binding", "numa"], capsys)
    data = json.loads(out)
    assert data["env"]["I_MPI_PIN_DOMAIN"] == "numa" and data["ranks"][0]["affinity"] == "0-3"


def test_cli_errors_are_one_line(machines, capsys):
    code, _, err = run_cli(["plan", "--sysfs", str(machines["two_socket"]), "--allowed-cpus", "0-x"], capsys)
    assert code == 2
    assert err == "corecpu: error: bad CPU list '0-x': '0-x' is not a CPU number or range; expected e.g. 0-3,8\n"
    code, _, err = run_cli(["plan", "--sysfs", str(machines["two_socket"]), "--nproc", "two"], capsys)
    assert code == 2 and "--nproc 'two' is not a number" in err


def test_cli_quota_via_cgroup_option(machines, capsys, tmp_path):
    cg, _ = make_cgroup(tmp_path, 2.5)
    code, out, _ = run_cli(["plan", "--sysfs", str(machines["two_socket"]), "--cgroup", str(cg), "--json"], capsys)
    data = json.loads(out)
    assert data["machine"]["cpu_quota"] == 2.5
    assert sum(r["omp_num_threads"] for r in data["ranks"]) <= 2


def test_cli_bad_numa_node_list(machines, capsys):
    code, _, err = run_cli(["plan", "--sysfs", str(machines["two_socket"]), "--numa-nodes", "a"], capsys)
    assert code == 2 and err == "corecpu: error: bad NUMA node list 'a'; expected e.g. 0 or 0-1\n"


def test_read_topology_skips_isa_and_torch(machines):
    from corecpu.cpu.topology import read_topology

    topo = read_topology(sysfs_root=machines["two_socket"], library_dirs=[], numactl=None)
    assert not topo.isa_known and len(topo.cores) == 8
    code = "import sys, corecpu.cpu.topology as t, corecpu.cpu.placement, corecpu.bind; t.read_topology(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------- a Kubernetes pod's CPU limit


def test_pod_cpu_limit_is_the_budget(machines, tmp_path):
    """A pod with `resources.limits.cpu: 4` on a 16-CPU node (CPU manager policy `none`): the
    container sees every CPU, and the kubelet writes the limit to cpu.max as 400000 100000."""
    from corecpu.cluster.launchers import LaunchInfo
    from corecpu.cpu.placement import PlanRequest, make_plan
    from corecpu.cpu.threads import decide_threads, thread_budget

    root, proc = make_cgroup(tmp_path, None)
    (root / "cpu.max").write_text("400000 100000\n")
    topo = detect(machines["two_socket"], cgroup_root=root, proc_self_cgroup=proc)
    assert len(topo.allowed) == 16 and topo.cpu_quota == pytest.approx(4.0) and topo.quota_threads == 4

    one = make_plan(topo, PlanRequest(nproc=1))
    assert one.ranks[0].omp_num_threads == 4  # not the 8 cores (16 CPUs) the pod can see
    two = make_plan(topo, PlanRequest(nproc=2))
    assert [r.omp_num_threads for r in two.ranks] == [2, 2]

    # A rank nobody bound (torchrun without corecpu.bind) gets the limit, not the node's CPUs.
    everything = frozenset(range(16))
    only_rank = LaunchInfo("torchrun", 0, 2, 0, 1)
    budget = thread_budget({}, only_rank, topo.quota_threads)
    decision = decide_threads(0, {}, everything, everything, only_rank, None, budget)
    assert decision.threads == 4 and "cgroup CPU quota" in decision.reason
    assert decide_threads(0, {}, everything, everything, only_rank, None).threads == 16  # what it was without
