"""One rank of the ccl DDP stress run (tests/ccl/test_ccl_runs.py): the default model (all-MiniLM-L6-v2) under
DDP on a ccl process group with 1 MB buckets, so every backward queues 25 async all-reduces (counted through
torch's own allreduce_hook): the traffic that hung the unpatched bindings' test_broadcast_stress (a lock held
while waiting on a oneCCL event).

    python ccl_ddp_stress.py REPORT STEPS     # one rank; REPORT.<rank> gets the result

Short sequences keep compute small against the collectives. Every 100 steps the ranks compare a parameter
checksum, so a desynchronised step is caught where it happens, not only at the end.
"""

import json
import sys
import time

import corecpu  # noqa: I001  (first: records the launcher's CPUs)
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from corecpu.training.modeling import load_model

report_path, steps = sys.argv[1], int(sys.argv[2])
with corecpu.setup(backend="ccl", dist_timeout=60) as run:
    model, _ = load_model("default", ["a", "b"], seed=0)
    ddp = DDP(model, bucket_cap_mb=1)
    launched = [0]

    def counted(state, bucket):  # torch's own all-reduce hook (async all_reduce on the group), counted
        launched[0] += 1
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counted)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(run.rank)
    buckets, mismatches, t0 = 0, [], time.monotonic()
    for step in range(1, steps + 1):
        ids = torch.randint(1000, 20000, (4, 16), generator=gen)
        loss = ddp(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.randint(0, 2, (4,), generator=gen)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 1:
            before = launched[0]
        if step == 2:  # DDP re-buckets by gradient order after its first step
            buckets = launched[0] - before
        if step % 100 == 0 or step == steps:
            checksum = torch.tensor([sum(float(p.double().sum()) for p in model.parameters())], dtype=torch.float64)
            both = [torch.zeros_like(checksum) for _ in range(run.world_size)]
            dist.all_gather(both, checksum)
            if len({float(c) for c in both}) != 1:
                mismatches.append(step)
    with open(f"{report_path}.{run.rank}", "w") as f:
        json.dump({"rank": run.rank, "backend": run.backend, "steps": steps, "buckets": buckets,
                   "mismatches": mismatches, "seconds": time.monotonic() - t0}, f)
