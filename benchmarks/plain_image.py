"""The image job as a careful user writes it in plain PyTorch: benchmarks/image_throughput.py's baseline.

    python benchmarks/plain_image.py --image-size 128 --steps 30                      # one process, all cores
    python benchmarks/plain_image.py --channels-last --bf16 --compile                 # the recipe's levers
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 python benchmarks/plain_image.py   # another allocator
    torchrun --standalone --nproc-per-node 2 benchmarks/plain_image.py --numa-split  # DDP (gloo), ranks split

The model, its initialisation, the generated images, SGD and the seed are examples/image_classification.py's
(imported from it), and so are the FLOP count and the matmul rate its MFU divides by. What a user would
do by hand instead of corecpu: DistributedSampler and DistributedDataParallel (gloo) under torchrun, each
lever a flag: channels_last (model and inputs), torch.autocast("cpu", bf16), torch.compile (of the DDP
model, as PyTorch's docs do it). --numa-split pins each rank to one NUMA node's CPUs where there are
several, else to an equal contiguous share of this process's CPUs (numactl -C would do the same), with
as many threads; without it the threads are torch's default (OMP_NUM_THREADS under torchrun).

Rank 0 prints the example's JSON lines: one per step (step, loss averaged over ranks, global samples,
seconds since the loop started; printed after the loop, so no step waits on printing or a collective)
and the summary (samples/s after --warmup steps, eval accuracy, MFU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import image_classification as job  # noqa: E402  (the example: data, model, FLOPs, summary)
from corecpu.cpu.cpulist import parse_cpu_list  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = job.job_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', dtype=torch.bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile")
    p.add_argument("--numa-split", action="store_true", help="pin each rank to its NUMA node (one node: its share)")
    return p.parse_args()


def split_cpus(local_rank: int, local_ranks: int, sysfs: Path = Path("/sys/devices/system/node")) -> list[int]:
    """This rank's CPUs: NUMA node local_rank (mod nodes) where there are several nodes; with one, the
    local_rank-th of local_ranks equal contiguous shares of the CPUs this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    nodes = sorted(sysfs.glob("node[0-9]*"), key=lambda d: int(d.name[4:]))
    if len(nodes) > 1:
        node = parse_cpu_list((nodes[local_rank % len(nodes)] / "cpulist").read_text().strip())
        return [c for c in allowed if c in node] or allowed
    share = max(1, len(allowed) // local_ranks)
    return allowed[local_rank * share: (local_rank + 1) * share] or allowed


def main() -> None:
    args = parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_rank, local_ranks = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.numa_split:  # before torch starts its thread pool: the threads inherit these CPUs
        cpus = split_cpus(local_rank, local_ranks)
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
    if world > 1:
        dist.init_process_group("gloo")
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext

    train = job.SyntheticImages(job.TRAIN_SIZE, args.num_classes, args.image_size, split="train")
    held_out = job.SyntheticImages(args.eval_size, args.num_classes, args.image_size, split="eval")
    torch.manual_seed(0)
    model = job.build_model(args.model, args.num_classes)
    flops = job.flops_per_sample(model, args.image_size)
    model = model.to(memory_format=layout)
    net = DistributedDataParallel(model) if world > 1 else model
    net = torch.compile(net) if args.compile else net
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    def sum_over_ranks(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(t)
        return t.tolist()

    matmul = job.job_matmul_rate("bf16" if args.bf16 else "fp32", torch.get_num_threads(), local_ranks, sum_over_ranks)
    net.train()
    step, epoch, ends, losses, samples = 0, 0, [], [], []
    start = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            with autocast():
                loss = net(pixel_values=x.contiguous(memory_format=layout), labels=y).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            ends.append(time.perf_counter())
            losses.append(loss.item())  # a CPU tensor: no collective, no wait
            samples.append(len(y) * world)  # DistributedSampler gives every rank equal batches
            if step >= args.steps:
                break
        epoch += 1

    model.eval()
    with torch.no_grad(), autocast():
        correct, seen = sum_over_ranks(list(job.count_correct(model, held_out, rank, world, args.batch_size,
                                                              lambda x: x.contiguous(memory_format=layout))))
    mean_losses = sum_over_ranks(losses)
    if rank == 0:
        for i, end in enumerate(ends):
            print(json.dumps({"step": i + 1, "loss": round(mean_losses[i] / world, 6), "samples": samples[i],
                              "elapsed": round(end - start, 4)}))
        print(job.summary(job.samples_per_s(ends, samples, args.warmup), flops, matmul, steps=step,
                          warmup=args.warmup, eval_accuracy=round(correct / max(seen, 1), 4), eval_examples=int(seen),
                          precision="bf16" if args.bf16 else "fp32", channels_last=args.channels_last,
                          compile=args.compile, ranks=world, threads=torch.get_num_threads(),
                          numa_split=args.numa_split, cpus=sorted(os.sched_getaffinity(0))), flush=True)
    # No destroy_process_group() at the end: measured on torch 2.13, a 2-rank run hung there for good after its
    # summary (main thread waiting for a gloo mutex while holding the GIL, a gloo thread waiting for the GIL).
    # The process exits next, which tears the group down anyway.


if __name__ == "__main__":
    main()
