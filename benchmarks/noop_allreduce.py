"""Run a training script with DDP's gradient all-reduce replaced by nothing: the compute-only reference.

    torchrun ... benchmarks/noop_allreduce.py benchmarks/hf_trainer.py ARGS...
    ./launch.sh N -f hostfile benchmarks/noop_allreduce.py train.py ARGS...

Scaling efficiency needs the step time the same ranks would have if gradients cost nothing to share.
Running each rank alone would not give it: alone, a rank draws other batches (another sampler, another
padding) and, on a shared machine, other CPU time. Here the job is launched exactly as the real one
(same ranks, same hosts, same samplers and so the same batch shapes step by step, same CPU sets), and
every DistributedDataParallel built in the process gets a comm hook that returns the bucket untouched,
before the tool registers its own (which is then ignored: DDP takes one hook). Everything else runs as
usual: DDP's bucketing and hooks, the tools' small collectives (loss sums, stop checks), start-up.
The ranks' weights drift apart, since nothing averages them; the time of a step does not depend on that.
"""

import runpy
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

_init = DistributedDataParallel.__init__


# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
def _unchanged(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _init_without_allreduce(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    DistributedDataParallel.register_comm_hook(self, None, _unchanged)
    self.register_comm_hook = lambda *a, **k: None  # type: ignore[method-assign]  # the tool's own: ignored


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: noop_allreduce.py SCRIPT [ARGS...]")
    DistributedDataParallel.__init__ = _init_without_allreduce  # type: ignore[method-assign]
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
