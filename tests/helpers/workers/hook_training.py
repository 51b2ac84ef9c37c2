"""The training both comm-hook workers run (mpi_hook.py, shm_hook.py beside this file): the tiny BERT from one
seed, each rank its own data, no_sync accumulation and an uneven last micro-batch, so a hook must be exactly
DDP's all-reduce to land on gloo's weights."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import BertForSequenceClassification

from corecpu.training.modeling import tiny_config

ACCUM = 2
MICRO_SIZES = [4] * 9 + [3]  # the last micro-batch is short, and shorter on rank 1 (below)


def batches(rank: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data, as a sampler shard would be
    sizes = MICRO_SIZES[:-1] + [max(1, MICRO_SIZES[-1] - 2 * rank)]  # rank 0: 3 samples last, the others 1
    out = []
    for n in sizes:
        length = int(torch.randint(6, 14, (1,), generator=g))
        ids = torch.randint(5, 1000, (n, length), generator=g)
        mask = torch.ones_like(ids)
        mask[0, length // 2:] = 0  # padding, so masks matter
        out.append({"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 2, (n,), generator=g)})
    return out


def train(rank: int, comm: Any, sgd: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """`sgd`: plain SGD, whose step is linear in the gradient, so a sum in another order (more than 2 ranks) stays
    within fp32 rounding of gloo's weights; AdamW divides by sqrt(v) and magnifies it in near-zero gradients."""
    torch.manual_seed(1)
    model = BertForSequenceClassification(tiny_config(1000, 2))
    # A small bucket cap gives several buckets per step, so their order across ranks is exercised.
    ddp = DDP(model, bucket_cap_mb=0.05)
    calls = 0
    if comm is not None:
        comm.register(ddp)
        real = comm.allreduce_async

        def counting(tensor, scale=None):
            nonlocal calls
            calls += 1
            return real(tensor, scale)

        comm.allreduce_async = counting  # type: ignore[method-assign]
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.05) if sgd
                 else torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True))
    data = batches(rank)
    for i, batch in enumerate(data):
        sync = (i + 1) % ACCUM == 0 or i + 1 == len(data)
        with contextlib.nullcontext() if sync else ddp.no_sync():
            (ddp(**batch).loss / ACCUM).backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if comm is not None:
        del comm.allreduce_async
    return {n: p.detach().clone() for n, p in model.named_parameters()}, calls
