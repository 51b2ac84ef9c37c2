"""Variant (b) of benchmarks/throughput.py: a plain PyTorch DDP loop, as the CPU tutorials write it.

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --steps 60 --out-json run.json

What a user following PyTorch's / Intel's CPU DDP tutorials gets: gloo,
DistributedSampler, DistributedDataParallel, AdamW, torch.autocast("cpu", bf16)
when bf16, no CPU binding (torchrun's own OMP_NUM_THREADS default applies).
Gradient clipping (1.0) and a linear schedule with 10% warm-up are added so the
per-step work matches corecpu's and the Trainer's defaults.

The model, its initialisation and the data are corecpu's (same seed), so step 1
sees the same weights and the same batch as `train.py`. Rank 0 writes one record
per optimizer step: its wall-clock time (perf_counter, taken after zero_grad),
the loss averaged over ranks and the global number of samples in the step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

from common import parse_baseline_args  # benchmarks/ is on sys.path when run as a script
from corecpu.tasks import builtin_dataset
from corecpu.modeling import load_model, load_tokenizer


def parse_args() -> argparse.Namespace:
    return parse_baseline_args(__doc__.split("\n")[0])


def build_dataset(model: str, max_seq_len: int) -> tuple[list[dict[str, list[int] | int]], object, list[str]]:
    """corecpu's built-in train split, tokenized (truncated, unpadded) with the model's tokenizer."""
    data = builtin_dataset("train")
    tokenizer = load_tokenizer(model)
    enc = tokenizer(data.texts, truncation=True, max_length=max_seq_len)
    items = [{**{k: enc[k][i] for k in enc}, "labels": data.labels[i]} for i in range(len(data))]
    return items, tokenizer, data.label_names


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    items, tokenizer, label_names = build_dataset(args.model, args.max_seq_len)
    model, _ = load_model(args.model, label_names, args.seed)  # seeded: identical init on every rank
    torch.manual_seed(args.seed + rank)
    sampler = DistributedSampler(items, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(items, batch_size=args.batch_size, sampler=sampler,
                        collate_fn=DataCollatorWithPadding(tokenizer), num_workers=0)
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * args.steps), args.steps)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" \
        else contextlib.nullcontext

    times: list[float] = []
    losses: list[float] = []
    sizes: list[int] = []
    step, epoch = 0, 0
    ddp.train()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            with autocast():
                loss = ddp(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            times.append(time.perf_counter())
            losses.append(loss.item())  # CPU tensor: no device sync, no collective
            sizes.append(batch["labels"].shape[0])
            if step >= args.steps:
                break
        epoch += 1

    # After the timed loop: average the per-step losses and sum the batch sizes over ranks.
    stats = torch.tensor([losses, sizes], dtype=torch.float64)
    dist.all_reduce(stats)
    if rank == 0:
        records = [{"step": i + 1, "t": times[i], "loss": stats[0, i].item() / world, "samples": int(stats[1, i])}
                   for i in range(len(times))]
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps({"variant": "plain_ddp", "world_size": world,
                                             "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                                             "torch_threads": torch.get_num_threads(), "steps": records}))
        final = records[-1]["loss"]
        print(f"plain_ddp: {step} steps, final loss {final:.4f}" + ("" if math.isfinite(final) else " (NOT FINITE)"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
