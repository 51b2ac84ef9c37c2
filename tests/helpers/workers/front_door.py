"""One rank of the front-door check (run by tests/multiprocess/test_front_door.py): a plain nn.Module through corecpu.setup()."""

import json
import sys

import corecpu  # noqa: I001  (first: records the launcher's CPUs)
import torch
from torch.utils.data import TensorDataset

out_path = sys.argv[1]
with corecpu.setup(backend="gloo", precision="fp32", dist_timeout=30) as run:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(22, 4), torch.randn(22, 1))  # 22 = uneven over 2 ranks x batch 4
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = run.wrap(model, optimizer)
    loader = run.loader(data, batch_size=4, seed=3)
    steps = 0
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            sync = i % 2 == 1 or i == len(loader) - 1
            with run.no_sync(model, sync):
                with run.autocast():
                    loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
    weights = [p.detach().double().sum().item() for p in corecpu.unwrap(model).parameters()]
    everyone = run.gather({"rank": run.rank, "weights": weights, "batches": len(loader)})
    total = run.all_reduce_sum([1.0, run.rank])
    if run.is_main:
        json.dump({"ranks": everyone, "total": total, "steps": steps, "describe": run.describe(),
                   "resolved": run.resolved(), "type": type(model).__name__}, open(out_path, "w"))
