"""A research loop on corecpu.setup() whose rank 1 raises in step 5 (tests/chaos/test_startup.py).

    ./launch.sh 2 tests/helpers/workers/raise_at_step.py --output-dir OUT
"""

import argparse

import torch
from torch.utils.data import TensorDataset

import corecpu

p = argparse.ArgumentParser()
p.add_argument("--output-dir", required=True)  # unused: the chaos tests' marker on every command line
args = p.parse_args()

g = torch.Generator().manual_seed(0)
dataset = TensorDataset(torch.randn(512, 8, generator=g), torch.randn(512, 1, generator=g))
with corecpu.setup(precision="fp32") as run:
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = run.loader(dataset, batch_size=8, seed=0)
    model, optimizer = run.wrap(model, optimizer, loader=loader)
    for step in run.steps(loader, max_steps=1000):
        if run.rank == 1 and step.number == 5:
            raise RuntimeError("research bug: a NaN check failed on rank 1")
        for xb, yb in step.micro_batches():
            step.backward(torch.nn.functional.mse_loss(model(xb), yb))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
