"""One rank of the MPI all-reduce tests; run under `mpirun -n 2` by tests/multiprocess/test_mpi_hook.py.

    mpi_hook.py compare OUT.json   train the tiny BERT with gloo's all-reduce, then with the MPI hook,
                                   from the same seed and data (no_sync accumulation, uneven last batch)
    mpi_hook.py exit|kill          rank 1 dies (os._exit / SIGKILL) inside its 2nd all-reduce
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from transformers import BertForSequenceClassification

from corecpu.distributed.allreduce import MpiGradientAllreduce
import corecpu
from corecpu.distributed.process_group import gather_objects
from corecpu.training.modeling import tiny_config
from hook_training import ACCUM, MICRO_SIZES, train  # beside this script, so on its sys.path

MODE = sys.argv[1]
def side_checks(comm: MpiGradientAllreduce, world: int) -> dict[str, bool]:
    # bf16 buckets travel as fp32 and come back as bf16.
    x = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    got = comm.allreduce_async(x.clone()).wait()
    bf16_ok = got.dtype == torch.bfloat16 and torch.equal(got, (x.float() * world).bfloat16())
    # An error on the comm thread reaches the waiter, and the thread keeps serving.
    try:
        comm.allreduce_async(torch.ones(3, requires_grad=True)).wait()
        error_reached = False
    except RuntimeError as exc:
        error_reached = "requires grad" in str(exc)
    again = comm.allreduce_async(torch.ones(3), 0.5).wait()
    return {"bf16": bf16_ok, "error_reached": error_reached, "thread_alive": torch.equal(again, torch.ones(3) * world * 0.5)}


def compare(out_path: str) -> None:
    with corecpu.setup(backend="gloo", dist_timeout=60) as ctx:
        gloo, _ = train(ctx.rank, None)
        with MpiGradientAllreduce(ctx.launch) as comm:
            mpi, calls = train(ctx.rank, comm)
            checks = side_checks(comm, ctx.world_size)
        torch.manual_seed(1)
        start = dict(BertForSequenceClassification(tiny_config(1000, 2)).named_parameters())
        diffs = {n: (gloo[n] - mpi[n]).abs().max().item() for n in gloo}
        checksums = gather_objects(sum(float(p.double().sum()) for p in mpi.values()))
        report = {
            "rank": ctx.rank,
            "identical": all(torch.equal(gloo[n], mpi[n]) for n in gloo),
            "max_diff": max(diffs.values()),
            "n_params": len(gloo),
            "moved": sum(not torch.equal(start[n].detach(), mpi[n]) for n in mpi),
            "hook_calls": calls,
            "sync_steps": -(-len(MICRO_SIZES) // ACCUM),
            "ranks_agree": len(set(checksums)) == 1,
            **checks,
        }
        reports = gather_objects(report)
        if ctx.rank == 0:
            with open(out_path, "w") as f:
                json.dump(reports, f)


def die(how: str) -> None:
    with corecpu.setup(backend="gloo", dist_timeout=60) as ctx:
        comm = MpiGradientAllreduce(ctx.launch)
        if ctx.rank == 1:
            real, seen = comm._reduce, []

            def dying(tensor, scale):
                seen.append(1)
                if len(seen) == 2:  # rank 0 is inside this all-reduce by now, or soon will be
                    os._exit(3) if how == "exit" else os.kill(os.getpid(), signal.SIGKILL)
                return real(tensor, scale)

            comm._reduce = dying  # type: ignore[method-assign]
        train(ctx.rank, comm)
        print(f"rank {ctx.rank} finished training, which it must not", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    compare(sys.argv[2]) if MODE == "compare" else die(MODE)
