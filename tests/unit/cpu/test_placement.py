"""make_plan: the pinning rules as properties over fake machines, exact env strings, and every error message."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from corecpu.errors import CoreCPUError
from corecpu.cpu.placement import Plan, PlanRequest, make_plan
from corecpu.cpu.cpulist import parse_cpu_list
from corecpu.cpu.topology import Libraries, Topology, detect_topology

from helpers.sysfs_fixtures import MACHINES, make_cgroup, make_machine


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sysfs")
    return {name: make_machine(base / name, name) for name in MACHINES}


@pytest.fixture(scope="module")
def topos(roots) -> dict[str, Topology]:
    return {name: topo(root) for name, root in roots.items()}


def topo(root: Path, **kw) -> Topology:
    kw.setdefault("library_dirs", [])
    kw.setdefault("numactl", None)
    return detect_topology(root, proc_cpuinfo=None, **kw)


def idle_cpus_in_notes(plan: Plan) -> set[int]:
    cpus: set[int] = set()
    for note in plan.notes:
        m = re.match(r"CPUs ([\d,\-]+) left idle: ", note)
        if m:
            cpus |= set(parse_cpu_list(m.group(1)))
    return cpus


def check_invariants(t: Topology, plan: Plan) -> None:
    """The rules every non-oversubscribed plan must keep."""
    allowed = set(t.allowed)
    core_of = {cpu: i for i, core in enumerate(t.cores) for cpu in core.cpus}
    owner: dict[int, int] = {}
    per_thread = any("ranks get single hyperthreads" in n for n in plan.notes)
    used: set[int] = set()
    for r in plan.ranks:
        cpus = set(r.cpus) | set(r.ccl_worker_cpus)
        assert cpus <= allowed, "a rank got a CPU the process may not run on"
        assert not set(r.cpus) & set(r.ccl_worker_cpus), "CCL worker CPUs must leave the compute set"
        assert r.omp_num_threads == len(r.cpus) >= 1
        assert {t.node_of(c) for c in cpus} == set(r.numa_nodes)
        assert not cpus & used, "two ranks share a CPU"
        used |= cpus
        if not per_thread:
            for c in cpus:
                assert owner.setdefault(core_of[c], r.local_rank) == r.local_rank, "two ranks share a physical core"
    for core in t.cores:  # siblings stay with their core's rank (or idle), never with another rank
        ranks = {owner.get(core_of[c]) for c in core.cpus if c in used}
        assert len(ranks) <= 1 or per_thread
    assert idle_cpus_in_notes(plan) == allowed - used, "an allowed CPU is idle without a note saying why"
    n_nodes = len({n for n, cpus in t.nodes if allowed.intersection(cpus)})
    if len(plan.ranks) >= n_nodes:
        assert all(len(r.numa_nodes) == 1 for r in plan.ranks), "a rank spans nodes although the numbers allow"
    if t.quota_threads is not None:
        assert sum(r.omp_num_threads + len(r.ccl_worker_cpus) for r in plan.ranks) <= t.quota_threads
    mask = plan.env["I_MPI_PIN_DOMAIN"]
    assert mask == "[" + ",".join(hex(sum(1 << c for c in r.cpus)) for r in plan.ranks) + "]"


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("nproc", ["auto", 1, 2, 3, 4, 8])
@pytest.mark.parametrize("logical", [False, True])
@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("quota", [None, 2.5, 5.0])
def test_invariants_hold_everywhere(topos, machine, nproc, logical, workers, quota):
    t = replace(topos[machine], cpu_quota=quota)
    request = PlanRequest(nproc=nproc, use_logical_cores=logical, ccl_workers=workers)
    try:
        plan = make_plan(t, request)
    except CoreCPUError as err:
        # Only the documented refusals: too many ranks, no core left for compute, quota too small.
        assert re.match(r"\d+ ranks need \d+ (physical cores|CPUs)|--ccl-workers \d+ leaves no compute core"
                        r"|the cgroup CPU quota sustains", str(err))
        return
    check_invariants(t, plan)
    if nproc != "auto":
        assert len(plan.ranks) == nproc


# ---------------------------------------------------------------- exact layouts and env strings


def test_two_socket_two_ranks_with_ccl_exact_env(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=2, backend="ccl"))
    assert [r.cpus for r in plan.ranks] == [(0, 1, 2), (4, 5, 6)]
    assert [r.ccl_worker_cpus for r in plan.ranks] == [(3,), (7,)]
    assert [r.omp_num_threads for r in plan.ranks] == [3, 3]
    assert plan.env["I_MPI_PIN_DOMAIN"] == "[0x7,0x70]"
    assert plan.env["CCL_WORKER_COUNT"] == "1"
    assert plan.env["CCL_WORKER_AFFINITY"] == "3,7"
    assert plan.env["OMP_PROC_BIND"] == "close" and plan.env["OMP_PLACES"] == "cores"
    assert "OMP_NUM_THREADS" not in plan.env  # per rank, not shared
    assert "LD_PRELOAD" not in plan.env and "KMP_AFFINITY" not in plan.env


def test_alternate_numbering_exact_env(topos):
    plan = make_plan(topos["alternate"], PlanRequest(nproc="auto", backend="ccl"))
    assert [r.cpus for r in plan.ranks] == [(0, 2, 4), (1, 3, 5)]
    assert [r.numa_node for r in plan.ranks] == [0, 1]
    assert plan.env["I_MPI_PIN_DOMAIN"] == "[0x15,0x2a]"
    assert plan.env["CCL_WORKER_AFFINITY"] == "6,7"


def test_alternate_numbering_four_ranks_stay_in_their_socket(topos):
    plan = make_plan(topos["alternate"], PlanRequest(nproc=4))
    assert [r.cpus for r in plan.ranks] == [(0, 2), (4, 6), (1, 3), (5, 7)]
    assert plan.env["I_MPI_PIN_DOMAIN"] == "[0x5,0x50,0xa,0xa0]"


def test_two_ccl_workers_listed_rank_by_rank(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=2, ccl_workers=2))
    assert plan.env["CCL_WORKER_AFFINITY"] == "2,3,6,7"
    assert plan.env["CCL_WORKER_COUNT"] == "2"


def test_hyperthreads_idle_by_default_and_noted(topos):
    plan = make_plan(topos["two_socket"], PlanRequest())
    assert any(n.startswith("CPUs 8-15 left idle: hyperthread siblings") for n in plan.notes)


def test_logical_cores_keep_siblings_with_their_core(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(use_logical_cores=True, backend="ccl"))
    assert plan.ranks[0].cpus == (0, 1, 2, 8, 9, 10)
    assert plan.ranks[0].ccl_worker_cpus == (3,)
    assert plan.ranks[0].omp_num_threads == 6
    assert plan.env["OMP_PLACES"] == "threads"
    assert any(n.startswith("CPUs 11,15 left idle: hyperthread siblings of CCL worker cores") for n in plan.notes)


def test_one_rank_on_two_nodes_says_it_spans(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=1))
    assert plan.ranks[0].numa_nodes == (0, 1) and plan.ranks[0].numa_node == [0, 1]
    assert plan.ranks[0].cpus == tuple(range(8))
    assert any(n.startswith("rank 0 spans NUMA nodes 0,1") for n in plan.notes)


def test_snc_two_ranks_span_nodes_of_one_socket(topos):
    plan = make_plan(topos["snc"], PlanRequest(nproc=2))
    assert [r.numa_nodes for r in plan.ranks] == [(0, 1), (2, 3)]
    assert [r.cpus for r in plan.ranks] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_snc_auto_one_rank_per_node(topos):
    plan = make_plan(topos["snc"], PlanRequest())
    assert [r.numa_node for r in plan.ranks] == [0, 1, 2, 3]
    assert plan.env["I_MPI_PIN_DOMAIN"] == "[0x3,0xc,0x30,0xc0]"


def test_uneven_split_gets_per_rank_threads(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=3))
    assert [r.omp_num_threads for r in plan.ranks] == [2, 2, 4]
    assert all(len(r.numa_nodes) == 1 for r in plan.ranks)
    assert any(n.startswith("uneven split: ranks get 2,2,4 threads") for n in plan.notes)


def test_single_core_machine(topos):
    plan = make_plan(topos["single_core"], PlanRequest())
    assert [(r.cpus, r.omp_num_threads, r.membind) for r in plan.ranks] == [((0,), 1, ())]
    assert plan.env["I_MPI_PIN_DOMAIN"] == "[0x1]"


# ---------------------------------------------------------------- containers


def test_container_cpu_subset(roots):
    t = topo(roots["two_socket"], allowed_cpus="0-2,8-10")
    plan = make_plan(t, PlanRequest())
    assert [(r.cpus, r.numa_node) for r in plan.ranks] == [((0, 1, 2), 0)]
    check_invariants(t, plan)
    two = make_plan(t, PlanRequest(nproc=2))
    assert [r.cpus for r in two.ranks] == [(0, 1), (2,)]
    check_invariants(t, two)


def test_container_given_only_hyperthreads(roots):
    t = topo(roots["two_socket"], allowed_cpus="8-11")
    plan = make_plan(t, PlanRequest())
    assert plan.ranks[0].cpus == (8, 9, 10, 11)
    check_invariants(t, plan)


def test_container_cpu_quota(roots, tmp_path):
    cg, proc = make_cgroup(tmp_path, 2.5)
    t = topo(roots["two_socket"], cgroup_root=cg, proc_self_cgroup=proc)
    plan = make_plan(t, PlanRequest())
    assert [r.omp_num_threads for r in plan.ranks] == [1, 1]
    assert "CPUs 1-3,5-7,9-11,13-15 left idle: the cgroup CPU quota (2.5 CPUs) sustains only 2 busy thread(s)" in plan.notes
    assert any(n.startswith("CPUs 8,12 left idle: hyperthread siblings") for n in plan.notes)
    check_invariants(t, plan)
    one = make_plan(t, PlanRequest(nproc=1))
    assert one.ranks[0].omp_num_threads == 2
    check_invariants(t, one)


def test_quota_with_ccl_workers_reduces_auto_ranks(roots, tmp_path):
    cg, proc = make_cgroup(tmp_path, 2.5)
    t = topo(roots["two_socket"], cgroup_root=cg, proc_self_cgroup=proc)
    plan = make_plan(t, PlanRequest(backend="ccl"))
    assert len(plan.ranks) == 1
    assert plan.ranks[0].omp_num_threads + len(plan.ranks[0].ccl_worker_cpus) == 2
    assert any("--nproc auto: the CPU quota sustains 2 busy thread(s), so 1 rank(s)" in n for n in plan.notes)


def test_quota_and_subset_together(roots, tmp_path):
    cg, proc = make_cgroup(tmp_path, 2.5, version=1)
    t = topo(roots["alternate"], allowed_cpus="0,2,1", cgroup_root=cg, proc_self_cgroup=proc)
    plan = make_plan(t, PlanRequest())
    assert [r.cpus for r in plan.ranks] == [(0,), (1,)]
    check_invariants(t, plan)


# ---------------------------------------------------------------- software-dependent env


def test_intel_openmp_and_allocator_env(topos):
    t = replace(topos["two_socket"], libraries=Libraries("/l/libtcmalloc.so.4", "/l/libjemalloc.so.2", "/l/libiomp5.so"))
    env = make_plan(t, PlanRequest()).env
    assert env["LD_PRELOAD"] == "/l/libtcmalloc.so.4:/l/libiomp5.so"
    assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and env["KMP_BLOCKTIME"] == "1"
    assert "OMP_PROC_BIND" not in env and "OMP_PLACES" not in env


def test_jemalloc_only_when_asked_for(topos):
    # auto leaves it out: it measured 0.70x glibc's malloc training ResNet-50 here (benchmarks/README.md)
    t = replace(topos["two_socket"], libraries=Libraries(None, "/l/libjemalloc.so.2", None))
    env = make_plan(t, PlanRequest()).env
    assert "LD_PRELOAD" not in env and env["OMP_PROC_BIND"] == "close"
    assert make_plan(t, PlanRequest(allocator="jemalloc")).env["LD_PRELOAD"] == "/l/libjemalloc.so.2"


def test_allocator_asked_for_by_name_or_none(topos):
    both = replace(topos["two_socket"], libraries=Libraries("/l/libtcmalloc.so.4", "/l/libjemalloc.so.2", None))
    assert make_plan(both, PlanRequest(allocator="jemalloc")).env["LD_PRELOAD"] == "/l/libjemalloc.so.2"
    assert "LD_PRELOAD" not in make_plan(both, PlanRequest(allocator="system")).env
    only_je = replace(topos["two_socket"], libraries=Libraries(None, "/l/libjemalloc.so.2", None))
    with pytest.raises(CoreCPUError, match=r"CORECPU_ALLOCATOR=tcmalloc but no libtcmalloc was found; install "
                                           r"libtcmalloc-minimal4"):
        make_plan(only_je, PlanRequest(allocator="tcmalloc"))
    with pytest.raises(CoreCPUError, match=r"CORECPU_ALLOCATOR='mimalloc' is not one of auto, tcmalloc"):
        make_plan(only_je, PlanRequest(allocator="mimalloc"))


def test_membind_only_within_one_node_and_with_numactl(topos):
    t = replace(topos["two_socket"], numactl="/usr/bin/numactl")
    plan = make_plan(t, PlanRequest())
    assert [r.membind for r in plan.ranks] == [("numactl", "--membind=0"), ("numactl", "--membind=1")]
    assert make_plan(t, PlanRequest(nproc=1)).ranks[0].membind == ()  # spans nodes
    assert make_plan(topos["two_socket"], PlanRequest()).ranks[0].membind == ()  # no numactl
    single = replace(topos["single_core"], numactl="/usr/bin/numactl")
    assert make_plan(single, PlanRequest()).ranks[0].membind == ()  # one node: nothing to bind


def test_plan_is_pure(topos):
    t = topos["two_socket"]
    assert make_plan(t, PlanRequest(nproc=3, backend="ccl")) == make_plan(t, PlanRequest(nproc=3, backend="ccl"))


def test_to_json_shape(topos):
    data = make_plan(topos["snc"], PlanRequest(nproc=2, backend="ccl")).to_json()
    assert {"machine", "ranks", "env", "notes", "warnings", "request"} <= set(data)
    r0 = data["ranks"][0]
    assert r0 == {"rank": 0, "cpus": "0-2", "cpu_ids": [0, 1, 2], "numa_node": [0, 1], "omp_num_threads": 3,
                  "ccl_worker_cpus": [3], "cores": 4, "membind": "", "affinity": "0-2", "comm_cpu": 8}
    assert data["machine"]["numa_nodes"] == {"0": "0-1,8-9", "1": "2-3,10-11", "2": "4-5,12-13", "3": "6-7,14-15"}


def test_numa_binding_widens_each_rank_to_its_node_with_the_same_threads(topos):
    t = topos["two_socket"]
    tight, loose = make_plan(t, PlanRequest(nproc=4)), make_plan(t, PlanRequest(nproc=4, binding="numa"))
    assert [r.cpus for r in loose.ranks] == [r.cpus for r in tight.ranks]
    assert [r.omp_num_threads for r in loose.ranks] == [r.omp_num_threads for r in tight.ranks]
    node_of = {c: n for n, cpus in t.nodes for c in cpus}
    primaries = {core.cpus[0] for core in t.cores}
    for r in loose.ranks:
        assert set(r.cpus) < set(r.pin_cpus)  # wider than its own cores, never across nodes or onto siblings
        assert {node_of[c] for c in r.pin_cpus} == set(r.numa_nodes) and set(r.pin_cpus) <= primaries
    assert [r.pin_cpus for r in tight.ranks] == [r.cpus for r in tight.ranks]
    # OpenMP must not re-pin each thread to a place, and Intel MPI's domains must not overlap.
    assert loose.env["OMP_PROC_BIND"] == "false" and "OMP_PLACES" not in loose.env
    assert loose.env["I_MPI_PIN_DOMAIN"] == "numa" and tight.env["OMP_PROC_BIND"] == "close"
    assert any("numa binding" in n for n in loose.notes)
    assert loose.to_json()["request"]["binding"] == "numa"
    with pytest.raises(CoreCPUError, match="binding 'loose' is not one of: core, numa"):
        make_plan(t, PlanRequest(binding="loose"))


# ---------------------------------------------------------------- validation messages


def expect_error(t: Topology, request: PlanRequest, message: str) -> None:
    with pytest.raises(CoreCPUError) as err:
        make_plan(t, request)
    assert str(err.value) == message


def test_more_ranks_than_cores(topos):
    expect_error(topos["two_socket"], PlanRequest(nproc=9),
                 "9 ranks need 9 physical cores but this process may use only 8 (CPUs 0-15); "
                 "use --nproc 8 or fewer or --use-logical-cores, or --oversubscribe to let ranks share them "
                 "(1 thread each; slow, for testing)")
    expect_error(topos["single_core"], PlanRequest(nproc=2),
                 "2 ranks need 2 physical cores but this process may use only 1 (CPUs 0); use --nproc 1 or fewer"
                 ", or --oversubscribe to let ranks share them "
                 "(1 thread each; slow, for testing)")
    expect_error(topos["two_socket"], PlanRequest(nproc=17, use_logical_cores=True),
                 "17 ranks need 17 CPUs but this process may use only 16 (0-15); use --nproc 16 or fewer"
                 ", or --oversubscribe to let ranks share them "
                 "(1 thread each; slow, for testing)")


def test_logical_cores_let_more_ranks_run(topos):
    t = topos["two_socket"]
    plan = make_plan(t, PlanRequest(nproc=12, use_logical_cores=True))
    assert len(plan.ranks) == 12 and all(len(r.numa_nodes) == 1 for r in plan.ranks)
    check_invariants(t, plan)


def test_empty_numa_node_requested(roots, topos):
    t = topo(roots["two_socket"], allowed_cpus="0-3")
    expect_error(t, PlanRequest(numa_nodes=(1,)),
                 "NUMA node 1 has no CPUs this process may use (allowed: 0-3); pick from nodes 0")
    expect_error(topos["two_socket"], PlanRequest(numa_nodes=(5,)),
                 "NUMA node 5 does not exist; this machine has nodes 0,1")


def test_numa_node_selection_notes_unused_nodes(topos):
    t = topos["two_socket"]
    plan = make_plan(t, PlanRequest(numa_nodes=(1,)))
    assert [r.cpus for r in plan.ranks] == [(4, 5, 6, 7)]
    assert any(n.startswith("CPUs 0-3,8-11 left idle: their NUMA nodes are not in --numa-nodes") for n in plan.notes)
    check_invariants(t, plan)


def test_ccl_workers_must_leave_a_compute_core(topos):
    expect_error(topos["two_socket"], PlanRequest(nproc=4, ccl_workers=2),
                 "--ccl-workers 2 leaves no compute core: the smallest rank gets 2 core(s) (8 cores for 4 ranks); "
                 "use --ccl-workers 1 or --nproc 2")
    expect_error(topos["single_core"], PlanRequest(backend="ccl", ccl_workers=1),
                 "--ccl-workers 1 leaves no compute core: the smallest rank gets 1 core(s) (1 cores for 1 ranks); "
                 "use --ccl-workers 0 or --nproc 1")


def test_ccl_default_worker_gives_way_where_no_core_can_be_spared(topos):
    # One core per rank: the default reservation would leave no compute core, so collectives run in the
    # rank's own thread, and oneCCL's idle worker stays on the rank's CPU.
    plan = make_plan(topos["single_core"], PlanRequest(backend="ccl"))
    assert plan.ranks[0].ccl_worker_cpus == () and plan.ranks[0].omp_num_threads == 1
    assert plan.env["CCL_WORKER_OFFLOAD"] == "0" and plan.env["CCL_WORKER_COUNT"] == "1"
    assert plan.env["CCL_WORKER_AFFINITY"] == str(plan.ranks[0].cpus[0])
    assert any("CCL_WORKER_OFFLOAD=0" in n for n in plan.notes)


def test_ccl_with_a_core_to_spare_reserves_a_worker_and_keeps_offload(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=2, backend="ccl"))
    assert "CCL_WORKER_OFFLOAD" not in plan.env
    assert plan.env["CCL_WORKER_AFFINITY"] == ",".join(str(c) for r in plan.ranks for c in r.ccl_worker_cpus)
    assert plan.env["CCL_ATL_TRANSPORT"] == "ofi" and plan.env["CCL_ATL_SHM"] == "1"
    assert "CCL_ATL_TRANSPORT" not in make_plan(topos["two_socket"], PlanRequest(nproc=2)).env  # gloo: no oneCCL


def test_oversubscribed_ccl_ranks_run_collectives_in_their_own_thread(topos):
    plan = make_plan(topos["single_core"], PlanRequest(nproc=2, backend="ccl", allow_oversubscribe=True))
    assert plan.oversubscribed and plan.env["CCL_WORKER_OFFLOAD"] == "0"
    assert all(r.ccl_worker_cpus == () for r in plan.ranks)


def test_bad_request_values(topos):
    expect_error(topos["two_socket"], PlanRequest(ccl_workers=-1), "--ccl-workers -1 is negative; use 0 or more")
    expect_error(topos["two_socket"], PlanRequest(nproc=0),
                 "--nproc 0 is not a positive number; use e.g. --nproc 2 or --nproc auto")


def test_quota_too_small_for_ranks(roots, tmp_path):
    cg, proc = make_cgroup(tmp_path, 2.5)
    t = topo(roots["two_socket"], cgroup_root=cg, proc_self_cgroup=proc)
    expect_error(t, PlanRequest(nproc=2, backend="ccl"),
                 "the cgroup CPU quota sustains 2 busy thread(s) but 2 rank(s) need 4 (1 compute + 1 CCL worker each); "
                 "use --nproc 1 or raise the quota")


def test_bad_cpu_list_request(roots):
    with pytest.raises(CoreCPUError, match=r"^bad CPU list '0-x': "):
        topo(roots["two_socket"], allowed_cpus="0-x")


# ---------------------------------------------------------------- oversubscription


def test_oversubscribe_round_robin_with_warning(topos):
    t = topos["two_socket"]
    plan = make_plan(t, PlanRequest(nproc=10, allow_oversubscribe=True))
    assert plan.oversubscribed
    assert all(r.omp_num_threads == 1 for r in plan.ranks)
    # Physical cores first, then their siblings, before any CPU is shared twice.
    assert [r.cpus[0] for r in plan.ranks] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert plan.warnings[0].startswith("oversubscribed: 10 ranks for 8 physical core(s); each rank gets 1 thread")
    assert plan.warnings[0].endswith("use --nproc 8 or fewer")
    assert "I_MPI_PIN_DOMAIN" not in plan.env


def test_oversubscribe_single_core(topos):
    plan = make_plan(topos["single_core"], PlanRequest(nproc=3, allow_oversubscribe=True, backend="ccl"))
    assert [r.cpus for r in plan.ranks] == [(0,), (0,), (0,)]
    assert plan.warnings == ("oversubscribed: 3 ranks for 1 physical core(s); each rank gets 1 thread and ranks share CPUs "
                             "round-robin, so expect slow steps; use --nproc 1 or fewer",)
    assert plan.env["CCL_WORKER_AFFINITY"] == "0,0,0"


def test_oversubscribe_not_used_when_it_fits(topos):
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=2, allow_oversubscribe=True))
    assert not plan.oversubscribed and not plan.warnings


# ---------------------------------------------------------------- MPI wait mode (I_MPI_WAIT_MODE)


def test_oversubscribed_plan_turns_off_mpi_busy_polling(topos):
    plan = make_plan(topos["single_core"], PlanRequest(nproc=2, allow_oversubscribe=True))
    assert plan.oversubscribed and plan.env["I_MPI_WAIT_MODE"] == "1"


def test_quota_below_rank_count_turns_off_mpi_busy_polling(roots, tmp_path):
    cg, proc = make_cgroup(tmp_path, 2.5)
    t = topo(roots["two_socket"], cgroup_root=cg, proc_self_cgroup=proc)
    throttled = make_plan(t, PlanRequest(nproc=3, allow_oversubscribe=True))
    assert not throttled.oversubscribed and throttled.env["I_MPI_WAIT_MODE"] == "1"
    # 2 ranks x 1 core + 2 comm threads: 4 busy threads against a quota of 2.5 CPUs.
    comm = make_plan(t, PlanRequest(nproc=2))
    assert comm.env["I_MPI_WAIT_MODE"] == "1" and all(r.comm_cpu is None for r in comm.ranks)
    roomy_cg, roomy_proc = make_cgroup(tmp_path / "roomy", 16)
    roomy = make_plan(topo(roots["two_socket"], cgroup_root=roomy_cg, proc_self_cgroup=roomy_proc), PlanRequest(nproc=2))
    assert "I_MPI_WAIT_MODE" not in roomy.env


def test_a_free_cpu_for_the_comm_thread_keeps_mpi_polling(topos):
    # Hyperthread siblings nobody computes on: each rank's comm thread spins on one of its own node.
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=2))
    assert "I_MPI_WAIT_MODE" not in plan.env
    assert [r.comm_cpu for r in plan.ranks] == [8, 12] and any("rank 1 -> 12" in n for n in plan.notes)


def test_a_comm_thread_without_a_cpu_of_its_own_makes_mpi_waits_sleep(topos):
    # One core per rank and nothing spare (no siblings): compute and a spinning comm thread would share it.
    plan = make_plan(topos["single_core"], PlanRequest(nproc=1))
    assert plan.env["I_MPI_WAIT_MODE"] == "1" and plan.ranks[0].comm_cpu is None
    assert any("2 busy threads (1 compute + 1 comm) on 1 CPU(s)" in n for n in plan.notes)
