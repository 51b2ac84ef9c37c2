"""Busy threads against a rank's CPUs: where the comm thread goes, and when MPI waits must sleep."""

from __future__ import annotations

from corecpu.cpu.busy_threads import describe, free_cpus_for, plan_comm_thread


def test_one_core_per_rank_and_nothing_free_turns_on_wait_mode() -> None:
    plan = plan_comm_thread(1, [0], [], {})
    assert (plan.wait_mode, plan.cpu) == ("1", None)
    assert "2 busy threads (1 compute + 1 comm) on 1 CPU(s)" in plan.reason and "no CPU free" in plan.reason


def test_a_free_cpu_takes_the_comm_thread_and_it_keeps_spinning() -> None:
    plan = plan_comm_thread(4, [0, 1, 2, 3], [8, 9], {})
    assert (plan.wait_mode, plan.cpu) == (None, 8)
    assert describe(plan).startswith("comm thread on CPU 8: 5 busy threads")


def test_threads_that_fit_change_nothing_and_the_users_setting_wins() -> None:
    assert plan_comm_thread(3, [0, 1, 2, 3], [], {}) .wait_mode is None
    kept = plan_comm_thread(1, [0], [], {"I_MPI_WAIT_MODE": "0"})
    assert kept.wait_mode is None and "I_MPI_WAIT_MODE=0 set by the user" in kept.reason


def test_free_cpus_are_dealt_out_so_ranks_never_share_one() -> None:
    ranks = [[0, 1], [2, 3]]
    node = [0, 1, 2, 3, 8, 9, 10, 11]  # 8-11: hyperthread siblings no rank computes on
    assert free_cpus_for(0, ranks, node) == (8, 10) and free_cpus_for(1, ranks, node) == (9, 11)
    assert free_cpus_for(0, ranks, [0, 1, 2, 3]) == ()
    assert free_cpus_for(2, [[0], [1], [2]], [0, 1, 2, 3]) == ()  # one spare for three ranks: the first takes it


def test_for_rank_finds_the_siblings_of_its_own_node(tmp_path) -> None:
    from corecpu.cpu.busy_threads import for_rank
    from corecpu.cpu.placement import PlanRequest, make_plan
    from corecpu.cpu.topology import detect_topology
    from helpers.sysfs_fixtures import make_machine

    topos = {name: detect_topology(make_machine(tmp_path / name, name), library_dirs=[], numactl=None)
             for name in ("two_socket", "single_core")}
    plan = make_plan(topos["two_socket"], PlanRequest(nproc=2))  # one rank per socket, siblings left idle
    node_of = {c: n for n, cpus in topos["two_socket"].nodes for c in cpus}
    for rank in plan.ranks:
        choice = for_rank(plan.topology, plan.ranks, rank, rank.omp_num_threads, {})
        assert choice.wait_mode is None and choice.cpu not in rank.cpus
        assert node_of[choice.cpu] == rank.numa_nodes[0]
    packed = make_plan(topos["single_core"], PlanRequest(nproc=1))
    assert for_rank(packed.topology, packed.ranks, packed.ranks[0], 1, {}).wait_mode == "1"
