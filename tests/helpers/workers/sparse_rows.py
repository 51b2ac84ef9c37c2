"""One rank of the sparse word-embedding all-reduce check (run by tests/multiprocess/test_sparse_rows.py).

    sparse_rows.py OUT.json [gloo|mpi]

Trains a tiny BERT (8192 x 64 word embedding, random init) a few AdamW steps with the embedding's gradient in DDP's
buckets (off) and by its touched rows (on), from the same init and data, for grad_accum 1 and 2, fp32 and bf16 on
the wire, and with the union forced dense; every rank writes its embedding gradients and final parameters' checks.
The ranks touch mostly different rows (rank r's ids from its own range, plus a shared one).
"""

from __future__ import annotations

import json
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from transformers import BertForSequenceClassification

import corecpu
from corecpu.compute.dropout import DropoutChoice
from corecpu.compute.precision import PrecisionChoice
from corecpu.distributed import sparse_rows
from corecpu.distributed.allreduce import MpiGradientAllreduce, ProcessGroupAllreduce
from corecpu.distributed.process_group import gather_objects
from corecpu.training.modeling import tiny_config
from corecpu.training.steps import no_sync
from corecpu.training.wrapping import wrap_model

OUT, PATH = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "gloo"
VOCAB, STEPS, BATCH, SEQ = 8192, 3, 4, 12
FP32 = PrecisionChoice("fp32", "test")
TORCH_DROPOUT = DropoutChoice("torch", "test")  # the comparison is with plain DDP, whose forward is torch's


def batches(rank: int, world: int, accum: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches: ids from a range of its own (some rows only it touches) and a shared one."""
    g = torch.Generator().manual_seed(100 + rank)
    own = VOCAB // (world + 1)
    out = []
    for _ in range(STEPS * accum):
        ids = torch.randint(own * (rank + 1), own * (rank + 2), (BATCH, SEQ), generator=g)
        ids[:, :3] = torch.randint(5, 200, (BATCH, 3), generator=g)  # rows every rank touches
        out.append((ids, torch.randint(0, 2, (BATCH,), generator=g)))
    return out


def train(rank: int, world: int, mode: str, accum: int, wire: str, comm: object, regularise: bool = False) -> dict:
    """`regularise`: the loss also reads a row no batch touches (VOCAB - 1), as a weight penalty would, so the ids
    the lookup saw miss a nonzero row and the reducer must notice and scan."""
    torch.manual_seed(1)
    model = BertForSequenceClassification(tiny_config(VOCAB, 2))
    weight = model.get_input_embeddings().weight
    with torch.no_grad():  # rank 0's embedding must reach every rank, although DDP no longer broadcasts it when on
        weight.add_(rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    wrapped, opt = wrap_model(model, opt, None, precision=FP32, dropout=TORCH_DROPOUT, checkpoint=None,
                              restore=lambda c: None, use_ipex=False, compile=False, ddp_hook=lambda: comm,
                              sparse_embedding=mode, wire=wire)
    ddp = wrapped.model
    grads, unions, norms = [], [], []
    data = batches(rank, world, accum)
    for step in range(STEPS):
        for i in range(accum):
            ids, labels = data[step * accum + i]
            with no_sync(ddp, sync=i == accum - 1):
                loss = ddp(input_ids=ids, labels=labels).loss
                if regularise:
                    loss = loss + 1e-3 * weight[VOCAB - 1].square().sum()
                (loss / accum).backward()
            if wrapped.sparse_rows is not None and i < accum - 1:
                assert wrapped.sparse_rows.last_union == (unions[-1] if unions else None), "reduced on a no_sync step"
        grads.append(weight.grad.clone())
        if wrapped.sparse_rows is not None:
            unions.append(wrapped.sparse_rows.last_union)
            # run.clip_grad_norm_'s norm takes the embedding's over the reduced rows alone: the whole gradient's.
            rows = wrapped.sparse_rows.reduced_rows(weight.grad)
            # float64's norm as the truth: torch's own fp32 norm of a whole large gradient is a few 1e-4 off it.
            full = float(torch.linalg.vector_norm(torch.cat([p.grad.double().reshape(-1) for p in model.parameters()
                                                             if p.grad is not None])))
            norms.append({"rows": None if rows is None else int(rows.numel()), "full": full,
                          "clipped": float(wrapped.clipper(1e9, fold=False))})  # coefficient 1: values unchanged
            weight.grad.mul_(1)  # written since the sync (a version later): the rows no longer vouch for it
            norms[-1]["rows_after_write"] = wrapped.sparse_rows.reduced_rows(weight.grad) is not None
        opt.step()
        opt.zero_grad(set_to_none=True)
    # The rows this rank touched in each step (its ids; row 0, padding, has no gradient and is not among them).
    local = [sorted({int(i) for ids, _ in data[s * accum:(s + 1) * accum] for i in ids.flatten()})
             for s in range(STEPS)]
    return {"grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "sparse": str(wrapped.sparse), "embedding_grad": wrapped.embedding_grad.name, "unions": unions, "local_rows": local, "norms": norms,
            "dense_steps": wrapped.sparse_rows.dense_steps if wrapped.sparse_rows else 0,
            "scanning": wrapped.sparse_rows.scanning if wrapped.sparse_rows else None,
            "ignored": sorted(getattr(ddp, "parameters_to_ignore", ())),
            "in_buckets": any(p is weight for p in ddp._module_parameters)}


class Bf16OnTheWire:
    """torch's bf16_compress_hook under another name: DDP refuses that name without CUDA or XPU (torch 2.13), though
    the hook itself runs on gloo. What the dense bf16 wire does, for the sparse rows to be compared with."""

    def register(self, ddp: torch.nn.Module) -> None:
        ddp.register_comm_hook(None, lambda state, bucket: bf16_compress_hook(state, bucket))


with corecpu.setup(backend="gloo", precision="fp32", ipex="off", dist_timeout=60) as run:
    rank, world = run.rank, run.world_size
    mpi = MpiGradientAllreduce(run.launch) if PATH == "mpi" else None

    def path(wire: str) -> object:
        return mpi if mpi is not None else ProcessGroupAllreduce() if wire == "fp32" else Bf16OnTheWire()

    cases = [("fp32", 1), ("fp32", 2)] + ([("bf16", 2)] if PATH == "gloo" else [])
    report: dict = {"rank": rank, "cases": {}}
    for wire, accum in cases:
        off = train(rank, world, "off", accum, wire, path(wire))
        on = train(rank, world, "on", accum, wire, path(wire))
        report["cases"][f"{wire}-accum{accum}"] = {
            "grads_equal": all(torch.equal(a, b) for a, b in zip(off["grads"], on["grads"])),
            "params_equal": all(torch.equal(off["params"][n], on["params"][n]) for n in off["params"]),
            "grad_max_diff": max(float((a - b).abs().max()) for a, b in zip(off["grads"], on["grads"])),
            "param_max_diff": max(float((off["params"][n] - on["params"][n]).abs().max()) for n in off["params"]),
            "off": {k: off[k] for k in ("sparse", "ignored", "in_buckets", "embedding_grad")},
            "on": {k: on[k] for k in ("sparse", "ignored", "in_buckets", "unions", "local_rows", "dense_steps",
                                      "scanning", "norms", "embedding_grad")},
        }
    off, on = (train(rank, world, m, 2, "fp32", path("fp32"), regularise=True) for m in ("off", "on"))
    report["regularised"] = {"params_equal": all(torch.equal(off["params"][n], on["params"][n]) for n in off["params"]),
                             "grads_equal": all(torch.equal(a, b) for a, b in zip(off["grads"], on["grads"])),
                             "scanning": on["scanning"], "unions": on["unions"]}
    sparse_rows.DENSE_ABOVE = 0.0  # every step takes the dense fallback
    off, dense = train(rank, world, "off", 2, "fp32", path("fp32")), train(rank, world, "on", 2, "fp32", path("fp32"))
    report["dense"] = {"params_equal": all(torch.equal(off["params"][n], dense["params"][n]) for n in off["params"]),
                       "grads_equal": all(torch.equal(a, b) for a, b in zip(off["grads"], dense["grads"])),
                       "dense_steps": dense["dense_steps"], "norms": dense["norms"]}
    if mpi is not None:
        mpi.close()
    reports = gather_objects(report)
    if rank == 0:
        with open(OUT, "w") as f:
            json.dump(reports, f)
