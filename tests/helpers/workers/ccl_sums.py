"""One rank of the ccl sums check (tests/ccl/test_ccl_runs.py): all-reduce, all-gather and broadcast on the
ccl process group from corecpu.setup(), sizes from one element to 32 MB, and async all-reduces queued the
way DDP queues its buckets."""

import json
import os
import sys

import corecpu  # noqa: I001  (first: records the launcher's CPUs)
import torch
import torch.distributed as dist

with corecpu.setup(backend=sys.argv[2], dist_timeout=60) as run:
    n, ok = run.world_size, []
    expect = n * (n + 1) / 2
    for numel in (1, 1000, 262144, 8 << 20):
        t = torch.full((numel,), float(run.rank + 1))
        dist.all_reduce(t)
        ok.append(bool((t == expect).all()))
    works = [(t, dist.all_reduce(t, async_op=True)) for t in (torch.full((4096,), float(run.rank + 1)) for _ in range(200))]
    for t, w in works:
        w.wait()
        ok.append(bool((t == expect).all()))
    gathered = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(gathered, torch.full((3,), float(run.rank)))
    ok.append(all(bool((g == r).all()) for r, g in enumerate(gathered)))
    b = torch.full((5,), float(run.rank))
    dist.broadcast(b, src=n - 1)
    ok.append(bool((b == n - 1).all()))
    report = {"rank": run.rank, "ok": all(ok), "checks": len(ok), "backend": run.backend, "reason": run.backend_reason,
              "launcher": os.environ.get("CCL_PROCESS_LAUNCHER")}
    with open(f"{sys.argv[1]}.{run.rank}", "w") as f:
        json.dump(report, f)
