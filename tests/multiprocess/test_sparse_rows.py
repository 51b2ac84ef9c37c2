"""Tier 2: the word embedding's gradient all-reduced by the rows some rank touched (corecpu.distributed.sparse_rows)
gives DDP's dense sums bit for bit on 2 gloo ranks, through wrap_model (the pure parts:
tests/unit/distributed/test_sparse_rows.py)."""

from __future__ import annotations

import json

from helpers.spawn import mpirun, needs_mpirun, spawn

EMBEDDING = "bert.embeddings.word_embeddings.weight"


def check(reports: list[dict], cases: set[str]) -> None:
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert set(r["cases"]) == cases
        for name, case in r["cases"].items():
            # Same gradients after every step and the same parameters after AdamW: bit for bit.
            assert case["grads_equal"] and case["params_equal"], (name, case)
            # And the feature really ran: the embedding outside DDP's buckets, its union reduced once per step.
            on, off = case["on"], case["off"]
            assert on["sparse"].startswith("on (") and off["sparse"].startswith("off (")
            assert on["ignored"] == [EMBEDDING] and not on["in_buckets"], on
            assert off["ignored"] == [] and off["in_buckets"], off
            assert on["dense_steps"] == 0
            # Both ran with the embedding's gradient on memory kept between steps (corecpu.compute.embedding_grad).
            assert on["embedding_grad"] == off["embedding_grad"] == "recycled"
            assert on["scanning"] is False  # the rows came from the lookup's ids, which the first sync's scan confirmed
            # The clipper's norm over the union's rows is the whole gradient's norm (float64's, as the truth), up to fp32
            # summation; a missing row would move it by far more. A gradient written after the sync is read whole.
            for norm, union in zip(on["norms"], on["unions"]):
                assert norm["rows"] == union and not norm["rows_after_write"], norm
                assert abs(norm["clipped"] - norm["full"]) <= 1e-5 * norm["full"], norm
        # The union is every rank's rows together: more than any one rank touched.
        for name in cases:
            per_rank = [x["cases"][name]["on"]["local_rows"] for x in reports]
            union = [len(set().union(*(rows[s] for rows in per_rank))) for s in range(len(per_rank[0]))]
            assert r["cases"][name]["on"]["unions"] == union, name
            assert all(u > max(len(rows[s]) for rows in per_rank) for s, u in enumerate(union)), name
        # A loss that also reads an untouched row (a weight penalty): the first sync's scan finds it outside the
        # ids, that rank scans from then on, and the sums are still DDP's.
        reg = r["regularised"]
        assert reg["params_equal"] and reg["grads_equal"] and reg["scanning"] is True, reg
        assert all(u == union + 1 for u, union in zip(reg["unions"], r["cases"]["fp32-accum2"]["on"]["unions"])), reg
        # The dense fallback (union over DENSE_ABOVE of the rows, forced) is the same sums too.
        assert r["dense"]["params_equal"] and r["dense"]["grads_equal"] and r["dense"]["dense_steps"] == 3, r["dense"]
        assert all(n["rows"] is None and abs(n["clipped"] - n["full"]) <= 1e-5 * n["full"] for n in r["dense"]["norms"])


def test_sparse_rows_equal_ddp_dense_on_gloo(tmp_path):
    out = tmp_path / "sparse.json"
    for r in spawn("sparse_rows.py", 2, str(out), "gloo", timeout=300):
        assert r.returncode == 0, r.stderr[-3000:]
    check(json.loads(out.read_text()), {"fp32-accum1", "fp32-accum2", "bf16-accum2"})


@needs_mpirun
def test_sparse_rows_beside_the_mpi_hook(tmp_path):
    # DDP's buckets through Intel MPI on the comm thread, the embedding's rows over a gloo group beside it.
    out = tmp_path / "sparse.json"
    proc = mpirun("sparse_rows.py", str(out), "mpi", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    check(json.loads(out.read_text()), {"fp32-accum1", "fp32-accum2"})
