"""Tier 2: two ranks through corecpu.setup() with a plain nn.Module stay identical
(one process under each launcher: tests/unit/training/test_run.py)."""

from __future__ import annotations

import json

from helpers.spawn import spawn


def test_two_ranks_through_the_front_door_agree(tmp_path):
    out = tmp_path / "front.json"
    for r in spawn("front_door.py", 2, str(out)):
        assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP replicas stay identical
    assert ranks[0]["batches"] == ranks[1]["batches"] == 3  # 22 examples, 2 ranks, batch 4: padded evenly
    assert result["total"] == [2.0, 1.0]
    assert result["type"] == "DistributedDataParallel"
    assert result["describe"]["backend"].startswith("gloo") and result["resolved"]["world_size"] == 2
    # A plain nn.Module has no word embedding: the sparse all-reduce's auto leaves it all to DDP, and says why.
    assert result["describe"]["sparse_embedding_allreduce"].startswith("off (the model names no input word embedding")
    assert result["resolved"]["sparse_embedding_allreduce"] == "off"


def test_a_process_group_made_before_setup_is_used_and_left_to_its_maker(tmp_path):
    # A Ray Train worker (issue 27 item 10), without Ray: the launcher made the gloo group and set OMP_NUM_THREADS=1.
    out = tmp_path / "existing.json"
    for r in spawn("existing_group.py", 2, str(out)):
        assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["kept"], "run.close() destroyed the process group setup() found"
    ranks = result["ranks"]
    for r in ranks:
        assert r["launcher"] == "ray" and r["total"] == [2.0]
        assert r["describe"]["backend"] == "gloo (made by ray before setup(); used as it is, left open at close)"
        assert r["refused"] == ("backend mpi was asked for, but a gloo process group was made before setup() (under "
                                "ray) and corecpu uses it; ask for backend auto or gloo")
        assert r["launchers_thread_cpus"] == r["cpus"]  # the launcher's own threads moved onto the rank's CPUs too
        assert r["omp"] == str(r["threads"])  # the plan's count replaced the launcher's 1
    assert not set(ranks[0]["cpus"]) & set(ranks[1]["cpus"]), ranks
