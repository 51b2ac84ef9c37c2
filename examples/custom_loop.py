"""Your own loop on corecpu: a plain PyTorch model (no transformers) on a synthetic regression task.

    ./launch.sh 2 examples/custom_loop.py --steps 60          # 2 ranks, each bound to its own cores
    ./launch.sh 2 examples/custom_loop.py --resume            # continue from the newest checkpoint
    python examples/custom_loop.py                            # one process
"""

import argparse
import json

import torch
from torch.utils.data import TensorDataset

import corecpu

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
    loader = run.loader(dataset, batch_size=args.batch_size, seed=0)  # every rank the same number of batches
    ckpt = corecpu.Checkpoints(args.out, every=args.save_every, resume="auto" if args.resume else "")
    model, optimizer = run.wrap(model, optimizer, loader=loader, checkpoint=ckpt)  # precision, resume, DDP
    run.print0(run.banner()[0])
    mean_loss = float("nan")

    steps = run.steps(loader, max_steps=args.steps)  # epochs, the resume position, stop signals
    for step in steps:
        for xb, yb in step.micro_batches():
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            step.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean_loss = run.all_reduce_sum([loss.item()])[0] / run.world_size  # one collective per step
        run.print0(json.dumps({"step": step.number, "loss": round(mean_loss, 6)}))
        ckpt.save(step)  # every --save-every steps and the last one
    run.print0(f"done: {steps.completed} steps, final loss {mean_loss:.4f}")
