"""Your own loop on corecpu: a plain PyTorch model (no transformers) on a synthetic regression task.

    ./launch.sh 2 examples/custom_loop.py --steps 60          # 2 ranks, each bound to its own cores
    ./launch.sh 2 examples/custom_loop.py --resume            # continue from the newest checkpoint
    python examples/custom_loop.py                            # one process
"""

import argparse
import json

import corecpu  # first: it records the CPUs the launcher gave this rank
import torch
from torch.utils.data import TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--batch-size", type=int, default=8, help="per rank")
p.add_argument("--out", default="runs/custom_loop")
p.add_argument("--save-every", type=int, default=20)
p.add_argument("--resume", action="store_true")
p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
args = p.parse_args()

# The task: y = sin(x . w) + noise, with x in 16 dimensions. Same data on every rank (seeded).
g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 16, generator=g)
y = torch.sin(x @ torch.randn(16, 1, generator=g)) + 0.05 * torch.randn(4096, 1, generator=g)
dataset = TensorDataset(x, y)

with corecpu.setup(precision=args.precision) as run:
    torch.manual_seed(0)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = run.loader(dataset, batch_size=args.batch_size, seed=0)
    per_epoch = len(loader)  # every rank takes the same number of batches
    start = corecpu.resume_checkpoint(args.out, "auto" if args.resume else "", model=model, optimizer=optimizer)
    step = start.step if start else 0
    epoch, skip = divmod(step, per_epoch)  # one batch per step: the step says where the data stands
    model, optimizer = run.wrap(model, optimizer)  # DDP over gloo or Intel MPI, precision, threads: decided once
    run.print0(run.banner()[0])
    mean_loss = float("nan")

    while step < args.steps:
        loader.sampler.set_epoch(epoch, skip_batches=skip)
        for xb, yb in loader:
            with run.autocast():
                loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            mean_loss = run.all_reduce_sum([loss.item()])[0] / run.world_size  # one collective per step
            run.print0(json.dumps({"step": step, "loss": round(mean_loss, 6)}))
            if step % args.save_every == 0 or step == args.steps:
                corecpu.save_checkpoint(args.out, step=step, model=model, optimizer=optimizer)
            if step == args.steps:
                break
        epoch, skip = epoch + 1, 0
    run.print0(f"done: {step} steps, final loss {mean_loss:.4f}")
