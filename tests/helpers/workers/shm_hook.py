"""One rank of the shared-memory all-reduce tests, under any launcher (torchrun's variables from
tests/multiprocess/test_shm_hook.py, Intel MPI's mpirun across namespace hosts from tests/e2e/test_shm_allreduce.py).

    shm_hook.py OUT.json   train the tiny BERT with gloo's all-reduce, then with the shared-memory hook, from the
                           same seed and data; then the bf16 wire, an error on the comm thread, and /dev/shm
Rank 0 writes every rank's report to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import BertForSequenceClassification

import corecpu
from corecpu.distributed.allreduce import ProcessGroupAllreduce
from corecpu.distributed.process_group import gather_objects
from corecpu.distributed.shm_allreduce import ShmGradientAllreduce, load_op
from corecpu.errors import CoreCPUError
from corecpu.training.modeling import tiny_config
from hook_training import ACCUM, MICRO_SIZES, train  # beside this script, so on its sys.path

BF16_LOST = 1.0 + 2.0 ** -10  # fp32 holds it, bf16 rounds it to 1.0: tells which dtype travelled


def bf16_wire(ctx: corecpu.Run, x: torch.Tensor, want: torch.Tensor) -> str:
    """"summed" when the op summed bf16 as gloo does; "refused" when it said, in its one line, that this CPU's
    kernels cannot (the op sums bf16 with AVX-512 only, and a 1-rank host never loads the op); else what it did."""
    try:
        with ShmGradientAllreduce(ctx.launch, "bf16") as bf16:
            got = bf16.allreduce_async(x).wait()
    except CoreCPUError as exc:
        return "refused" if "use --allreduce-dtype fp32" in str(exc) else f"other error: {exc}"
    # Every rank's value rounded to bf16 before the sum, the sum returned in the fp32 tensor.
    return "summed" if got.dtype == torch.float32 and torch.equal(got, want) else f"wrong sum: {got.tolist()}"


def side_checks(ctx: corecpu.Run, hook: ShmGradientAllreduce, rank: int, world: int) -> dict[str, object]:
    x = torch.tensor([1.5 * (rank + 1), -2.25, BF16_LOST])
    x_again = x.clone()
    want = torch.tensor([1.5 * world * (world + 1) / 2, -2.25 * world, 1.0 * world])
    wire = bf16_wire(ctx, x, want)
    # The fp32 wire keeps what bf16 lost.
    kept = hook.allreduce_async(torch.tensor([BF16_LOST]), 1.0 / world).wait()
    # An error on the comm thread reaches the waiter, and the thread keeps serving.
    try:
        hook.allreduce_async(torch.ones(3, requires_grad=True), 0.5).wait()  # scaled through numpy, which refuses
        error_reached = False
    except RuntimeError as exc:
        error_reached = "requires grad" in str(exc)
    again = hook.allreduce_async(torch.ones(3), 0.5).wait()
    # gloo's path with bf16 on the wire (what --allreduce gloo --allreduce-dtype bf16 times) rounds alike.
    gloo_got = ProcessGroupAllreduce("bf16").allreduce_async(x_again).wait()
    return {"bf16_wire": wire, "gloo_bf16_wire": torch.equal(gloo_got, want),
            "fp32_wire": torch.equal(kept, torch.tensor([BF16_LOST])), "error_reached": error_reached,
            "thread_alive": torch.equal(again, torch.full((3,), 0.5 * world))}


def against_gloo(hook: ShmGradientAllreduce, rank: int, world: int) -> float:
    """Largest difference, relative to the values, between the hook and gloo on random data: below the shm op's
    1 MB threshold (its naive algorithm), above it (its distributed one), and above its 32 MB chunk."""
    import torch.distributed as dist

    worst = 0.0
    for n in (1000, 300_000, 9_000_000):
        x = torch.randn(n, generator=torch.Generator().manual_seed(7 + rank))
        want = x / world
        dist.all_reduce(want)
        got = hook.allreduce_async(x, 1.0 / world).wait()
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    return worst


def main(out_path: str) -> None:
    with corecpu.setup(backend="gloo", allreduce="gloo", precision="fp32", dist_timeout=120) as ctx:
        gloo, _ = train(ctx.rank, None, sgd=True)
        with ShmGradientAllreduce(ctx.launch) as hook:
            shm, calls = train(ctx.rank, hook, sgd=True)
            checks = side_checks(ctx, hook, ctx.rank, ctx.world_size)
            direct = against_gloo(hook, ctx.rank, ctx.world_size)
            namespace, describe = hook.namespace, hook.describe()
        torch.manual_seed(1)
        start = dict(BertForSequenceClassification(tiny_config(1000, 2)).named_parameters())
        report = {
            "rank": ctx.rank, "local_rank": ctx.launch.local_rank, "launcher": ctx.launch.launcher,
            "max_diff": max((gloo[n] - shm[n]).abs().max().item() for n in gloo),
            "identical": all(torch.equal(gloo[n], shm[n]) for n in gloo),
            "n_params": len(gloo),
            "moved": sum(not torch.equal(start[n].detach(), shm[n]) for n in shm),
            "hook_calls": calls, "sync_steps": -(-len(MICRO_SIZES) // ACCUM),
            "checksum": sum(float(p.double().sum()) for p in shm.values()),
            "direct_rel_diff": direct, "namespace": namespace, "describe": describe,
            "kernel_level": load_op().vector_kernel_level() if ctx.launch.local_world_size > 1 else None,
            # The op's segments were unlinked once mapped: a killed job leaves nothing behind.
            "segments_left": [f for f in os.listdir("/dev/shm") if namespace and namespace in f],
            **checks,
        }
        reports = gather_objects(report)
        if ctx.rank == 0:
            with open(out_path, "w") as f:
                json.dump(reports, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
