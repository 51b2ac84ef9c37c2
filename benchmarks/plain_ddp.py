"""Optional baseline of benchmarks/throughput.py: a plain PyTorch DDP loop, as the CPU tutorials write it.

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --data builtin --out-json run.json

What a user following PyTorch's / Intel's CPU DDP tutorials gets: gloo,
DistributedSampler, DistributedDataParallel, AdamW, torch.autocast("cpu", bf16)
when bf16, no CPU binding (torchrun's own OMP_NUM_THREADS default applies).
Gradient clipping (1.0) and a linear schedule with 10% warm-up are added so the
per-step work matches corecpu's and the Trainer's defaults.

The model, its initialisation and the data are corecpu's (same seed), so step 1
sees the same weights and the same batch as `train.py`. Rank 0 writes one record
per optimizer step: its wall-clock time (perf_counter, taken after zero_grad),
the loss averaged over ranks and the global number of samples in the step; after
each epoch (and the last step) it evaluates, all ranks, with corecpu's formulas.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

from common import load_train_eval, parse_baseline_args, tokenize, total_steps, write_records  # benchmarks/ on sys.path
from corecpu.tasks.classification import eval_counts, scores_from_counts
from corecpu.training.modeling import load_model, load_tokenizer


def parse_args() -> argparse.Namespace:
    return parse_baseline_args(__doc__.split("\n")[0])


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    train, evald = load_train_eval(args)
    tokenizer = load_tokenizer(args.model)
    items = tokenize(train, tokenizer, args.max_seq_len)
    eval_items = tokenize(evald, tokenizer, args.max_seq_len)
    model, _ = load_model(args.model, train.label_names, args.seed)  # seeded: identical init on every rank
    torch.manual_seed(args.seed + rank)
    collate = DataCollatorWithPadding(tokenizer)
    sampler = DistributedSampler(items, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(items, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, num_workers=0)
    # The eval shard is strided without padding, so every example counts once over all ranks.
    eval_loader = DataLoader(eval_items[rank::world], batch_size=args.batch_size, collate_fn=collate)
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps = total_steps(len(items), args.batch_size * world, args.epochs, args.max_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(args.warmup_ratio * steps), steps)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" \
        else contextlib.nullcontext
    num_labels = len(train.label_names)

    def evaluate() -> dict[str, float]:
        ddp.eval()
        counts = torch.zeros(3 + 3 * num_labels, dtype=torch.float64)
        with torch.no_grad():
            for batch in eval_loader:
                with autocast():
                    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
                counts += eval_counts(logits, batch["labels"], torch.ones(len(batch["labels"])), num_labels)
        dist.all_reduce(counts)
        ddp.train()
        return scores_from_counts(counts, num_labels)

    times: list[float] = []
    losses: list[float] = []
    sizes: list[int] = []
    evals: list[dict[str, float]] = []
    step, epoch = 0, 0
    ddp.train()
    while step < steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            with autocast():
                loss = ddp(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            times.append(time.perf_counter())
            losses.append(loss.item())  # CPU tensor: no device sync, no collective
            sizes.append(batch["labels"].shape[0])
            if step >= steps:
                break
        evals.append({"step": step, **evaluate()})
        epoch += 1

    # After the timed loop: average the per-step losses and sum the batch sizes over ranks.
    stats = torch.tensor([losses, sizes], dtype=torch.float64)
    dist.all_reduce(stats)
    if rank == 0:
        records = [{"step": i + 1, "t": times[i], "loss": stats[0, i].item() / world, "samples": int(stats[1, i])}
                   for i in range(len(times))]
        write_records(args.out_json, "plain_ddp", records, evals, world_size=world, precision=args.precision,
                      omp_num_threads=os.environ.get("OMP_NUM_THREADS"), torch_threads=torch.get_num_threads())
        final = records[-1]["loss"]
        print(f"plain_ddp: {step} steps, final loss {final:.4f}" + ("" if math.isfinite(final) else " (NOT FINITE)")
              + f", eval accuracy {evals[-1]['eval_accuracy']:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
