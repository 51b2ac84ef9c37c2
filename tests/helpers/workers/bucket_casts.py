"""One rank of the bucket-casts check (run by tests/multiprocess/test_bucket_casts.py).

    bucket_casts.py OUT.json [gloo|mpi]

Trains the same models from the same init and data a few AdamW steps under bf16 autocast with Linear weights'
gradients cast straight into DDP's buckets (auto) and without (off): a tiny BERT with grad_accum 1 and 2, a model
that calls one Linear twice in a forward, and one whose loss also reads a Linear weight (a penalty: a second
gradient autograd adds to the one placed in the bucket). Every rank
writes whether the gradients after each step and the parameters after the last are the same, and the counters.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from transformers import BertForSequenceClassification

import corecpu
from corecpu.compute.dropout import DropoutChoice
from corecpu.compute.precision import PrecisionChoice
from corecpu.distributed.allreduce import MpiGradientAllreduce, ProcessGroupAllreduce
from corecpu.distributed.process_group import gather_objects
from corecpu.training.modeling import tiny_config
from corecpu.training.steps import no_sync
from corecpu.training.wrapping import wrap_model

OUT, PATH = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "gloo"
STEPS, BATCH, SEQ, VOCAB = 4, 4, 12, 512
BF16 = PrecisionChoice("bf16", "test")
TORCH_DROPOUT = DropoutChoice("torch", "test")


class Small(torch.nn.Module):
    """`twice`: `a` runs twice in one forward; `penalty`: the loss also reads `b`'s weight."""

    def __init__(self, twice: bool, penalty: bool) -> None:
        super().__init__()
        self.twice, self.penalty = twice, penalty
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.a, self.b, self.head = torch.nn.Linear(32, 32), torch.nn.Linear(32, 48), torch.nn.Linear(48, 2)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.a(self.emb(input_ids)))
        if self.twice:
            x = F.gelu(self.a(x))
        loss = F.cross_entropy(self.head(F.gelu(self.b(x))).float().mean(1), labels)
        return loss + 1e-2 * self.b.weight.float().square().sum() if self.penalty else loss


def batches(rank: int, accum: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randint(1, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, 2, (BATCH,), generator=g))
            for _ in range(STEPS * accum)]


def train(rank: int, model_kind: str, casts: str, accum: int, comm: object) -> dict:
    torch.manual_seed(1)
    if model_kind == "bert":
        model = BertForSequenceClassification(tiny_config(VOCAB, 2))
    else:
        model = Small(twice=model_kind == "twice", penalty=model_kind == "penalty")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    wrapped, opt = wrap_model(model, opt, None, precision=BF16, dropout=TORCH_DROPOUT, checkpoint=None,
                              restore=lambda c: None, use_ipex=False, compile=False, ddp_hook=lambda: comm,
                              sparse_embedding="off", bucket_casts=casts)
    ddp = wrapped.model
    grads = []
    data = batches(rank, accum)
    for step in range(STEPS):
        for i in range(accum):
            ids, labels = data[step * accum + i]
            with no_sync(ddp, sync=i == accum - 1):
                out = ddp(input_ids=ids, labels=labels)
                loss = out.loss if model_kind == "bert" else out
                (loss / accum).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
    casts = wrapped.casts
    return {"grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "choice": str(wrapped.bucket_casts), "placed": casts.placed if casts else 0}


def compare(off: dict, on: dict) -> dict:
    return {"grads_equal": all(a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
                               for a, b in zip(off["grads"], on["grads"])),
            "params_equal": all(torch.equal(off["params"][n], on["params"][n]) for n in off["params"]),
            "on": on["choice"], "off": off["choice"]}


with corecpu.setup(backend="gloo", precision="bf16", ipex="off", dist_timeout=60) as run:
    rank = run.rank
    mpi = MpiGradientAllreduce(run.launch) if PATH == "mpi" else None

    def path() -> object:
        return mpi if mpi is not None else ProcessGroupAllreduce()

    report: dict = {"rank": rank, "cases": {}}
    for kind, accum in (("bert", 1), ("bert", 2), ("twice", 1), ("penalty", 1)):
        off, on = (train(rank, kind, mode, accum, path()) for mode in ("off", "auto"))
        report["cases"][f"{kind}-accum{accum}"] = {**compare(off, on), "placed": on["placed"]}
    if mpi is not None:
        mpi.close()
    reports = gather_objects(report)
    if rank == 0:
        with open(OUT, "w") as f:
            json.dump(reports, f)
