"""benchmarks/scale_model.py's all-reduce model and benchmarks/cluster.py's planning: pure functions."""

from __future__ import annotations

import sys

import pytest

from benchmarks import harness

sys.path.insert(0, str(harness.BENCH))  # cluster.py imports its siblings as a script does
try:
    from benchmarks import cluster, scale_model
    from benchmarks.scale_model import BUCKET, FIRST_BUCKET, Job, Link, buckets, hosts_per_core, ring_s, step
finally:
    sys.path.remove(str(harness.BENCH))

MB = 2**20


def test_buckets_are_torchs_assignment_in_backward_order():
    import torch
    import torch.distributed as dist

    # parameters in model order: a 30 MB embedding first, then layers of 4 and 2 MB (values of 4 bytes)
    sizes = (30 * MB // 4,) + (MB, MB // 2) * 4
    got = buckets(Job(compute_s=1.0, param_sizes=sizes), hosts=2)
    reverse = [torch.empty(n) for n in reversed(sizes)]
    index, _ = dist._compute_bucket_assignment_by_size(reverse, [FIRST_BUCKET, BUCKET], [False] * len(reverse))
    assert [b for b, _ in got] == [sum(4 * reverse[i].numel() for i in bucket) for bucket in index]
    assert got[-1] == (30 * MB + 22 * MB, 1.0)  # the last layers ride with the embedding, ready at the end
    assert all(a[1] < b[1] for a, b in zip(got, got[1:]))  # ready one after another


def test_sparse_embedding_is_sent_last_and_holds_the_union_of_rows():
    sizes = (1000 * 16, 64, 64)
    dense = buckets(Job(compute_s=1.0, param_sizes=sizes), hosts=2)
    sparse = buckets(Job(compute_s=1.0, param_sizes=sizes, embedding_rows=(100, 16)), hosts=4)
    assert sum(b for b, _ in dense) == 4 * sum(sizes)
    assert sparse[-1] == (400 * 16 * 4, 1.0)  # 4 hosts x 100 rows, disjoint: the pessimistic case
    capped = buckets(Job(compute_s=1.0, param_sizes=sizes, embedding_rows=(600, 16)), hosts=4)
    assert capped[-1][0] == 1000 * 16 * 4  # never more than the vocabulary


def test_ring_time_is_latency_plus_bytes_over_bandwidth():
    link = Link(gbit_s=8.0, alpha_s=1e-4)  # 1 GB/s
    assert ring_s(1e9, 1, link) == 0.0
    assert ring_s(1e9, 2, link) == pytest.approx(2 * (1e-4 + 0.5))
    assert ring_s(1e9, 4, link) == pytest.approx(6 * (1e-4 + 0.25))


def test_a_slower_link_never_raises_efficiency_and_a_huge_one_approaches_one():
    job = Job(compute_s=1.0, param_sizes=(3 * MB, *(MB,) * 20))
    effs = [step(job, 4, Link(gbit_s=g, alpha_s=5e-5))["efficiency"] for g in (0.5, 1, 10, 100, 1e6)]
    assert effs == sorted(effs) and effs[-1] > 0.99 and effs[0] < 0.5


def test_exposed_time_is_at_least_the_last_bucket():
    job = Job(compute_s=1.0, param_sizes=(40 * MB // 4, *(MB // 4,) * 4))
    link = Link(gbit_s=1.0, alpha_s=0.0)
    got = step(job, 2, link)
    assert got["exposed_s"] >= ring_s(40 * MB, 2, link) - 1e-9
    assert got["step_s"] == pytest.approx(1.0 + got["exposed_s"])


def test_host_cpus_wrap_round_when_hosts_outnumber_cores():
    assert cluster.host_cpus(2, [0, 1], 1) == ["0", "1"]
    assert cluster.host_cpus(4, [0, 1], 1) == ["0", "1", "0", "1"]
    assert cluster.host_cpus(2, [0, 1, 2, 3], 2) == ["0,1", "2,3"]
    with pytest.raises(ValueError):
        cluster.host_cpus(2, [0, 1], 3)


def test_efficiency_and_summary_pair_each_run_with_its_compute_only_reference():
    raw = [{"hosts": 2, "variant": "v", "noop": True, "gbit": None, "ms_per_step": 100.0, "allreduce": "x",
            "link": None},
           *({"hosts": 2, "variant": "v", "noop": False, "gbit": 1.0, "ms_per_step": ms, "allreduce": "gloo",
              "link": {"gbit_s": 0.9, "rtt_us": 80.0}} for ms in (180.0, 200.0, 220.0))]
    (row,) = cluster.summarize(raw)
    assert row["compute_ms"] == 100.0 and row["step_ms"] == 200.0  # medians
    assert row["efficiency"] == pytest.approx(0.5) and row["exposed_comm_ms"] == pytest.approx(100.0)
    assert "| 2 | 1 Gb/s (0.90 measured, RTT 80 us) | v (gloo) | 100 | 200 | 100 | 50% |" in cluster.markdown([row])


def test_the_node_table_assumptions_are_stated_in_the_module():
    assert scale_model.NODE_CORES > scale_model.MEASURED_CORES
    assert set(scale_model.MEASURED_RATE) == {"minilm", "bert-base"}
    assert BUCKET == 25 * MB and FIRST_BUCKET == MB


def test_corecpu_variants_name_a_path_or_the_flags_given():
    extra = {"bf16wire": "--allreduce gloo --allreduce-dtype bf16"}
    assert cluster.variant_flags("corecpu", extra) == []
    assert cluster.variant_flags("corecpu:mpi", extra) == ["--allreduce", "mpi"]
    assert cluster.variant_flags("corecpu:bf16wire", extra) == ["--allreduce", "gloo", "--allreduce-dtype", "bf16"]


def test_the_network_stack_cost_adds_every_byte_sent_and_received_to_the_step():
    job = Job(compute_s=1.0, param_sizes=(MB // 4,) * 10)  # 10 MiB of gradient, all hidden behind backward
    fast = Link(gbit_s=1e6, alpha_s=0.0)
    free, charged = step(job, 2, fast), step(job, 2, Link(gbit_s=1e6, alpha_s=0.0, cpu_s_per_byte=1e-9))
    # a 2-host ring sends half of each bucket twice and receives as much: 2 x 10 MiB through the stack
    assert charged["stack_cpu_s"] == pytest.approx(2 * 10 * MB * 1e-9)
    assert charged["step_s"] == pytest.approx(free["step_s"] + charged["stack_cpu_s"])


def test_hosts_sharing_a_core_pay_its_stack_work_together():
    job = Job(compute_s=1.0, param_sizes=(MB // 4,) * 10)
    one = step(job, 4, Link(gbit_s=1e6, alpha_s=0.0, cpu_s_per_byte=1e-9))
    two = step(job, 4, Link(gbit_s=1e6, alpha_s=0.0, cpu_s_per_byte=1e-9, hosts_per_core=2))
    assert two["stack_cpu_s"] == pytest.approx(2 * one["stack_cpu_s"])
    result = {"raw": [{"hosts": 2, "cpus": ["0", "1"]}, {"hosts": 4, "cpus": ["0", "1", "0", "1"]}]}
    assert (hosts_per_core(result, 2), hosts_per_core(result, 4), hosts_per_core({}, 4)) == (1, 2, 1)


def test_buckets_are_ready_as_the_work_behind_them_is_done_not_their_size():
    # A lookup table first in the model (its gradient comes last in backward and costs next to nothing) and 4 layers.
    sizes = (40 * MB // 4, *(MB // 4,) * 4)
    by_size = buckets(Job(compute_s=1.0, param_sizes=sizes), hosts=2)
    by_work = buckets(Job(compute_s=1.0, param_sizes=sizes, param_work=(0.0, *(1.0,) * 4)), hosts=2)
    assert [b for b, _ in by_work] == [b for b, _ in by_size]  # the same buckets...
    assert by_size[0][1] == pytest.approx(1 / 44) and by_work[0][1] == pytest.approx(1 / 4)  # ...ready later
    assert scale_model.model_work("tiny")[0] == 0.0 and scale_model.model_work("tiny")[-1] > 0  # word embedding: 0


def test_pooled_efficiency_pairs_each_repeat_with_its_own_compute_only_run():
    def run(variant, repeat, ms, gbit=None):
        return {"hosts": 2, "variant": variant, "repeat": repeat, "ms_per_step": ms, "noop": gbit is None, "gbit": gbit}
    first = [run("corecpu", 1, 100), run("corecpu", 1, 125, 10.0), run("corecpu", 2, 80), run("corecpu", 2, 100, 10.0)]
    second = [run("corecpu", 1, 90), run("corecpu", 1, 100, 10.0)]
    (row,) = cluster.paired([first, second])
    assert row["efficiencies"] == pytest.approx([0.8, 0.8, 0.9]) and row["median"] == pytest.approx(0.8)
