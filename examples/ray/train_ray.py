"""train.py's loop in Ray Train workers (TorchTrainer), each worker bound to its own cores by corecpu.

    python examples/ray/train_ray.py --workers 2 --model tiny --max-steps 20      # a local Ray cluster, 2 workers
    python examples/ray/train_ray.py --address auto --workers 8 --cpus-per-worker 16 --data train.tsv

Our flags are below (--help); every other flag is train.py's (python train.py --help), parsed here first, so a
wrong one fails before Ray starts. Ray's torch backend makes each worker's gloo process group before the loop
runs; in the worker, corecpu.setup() recognises a Ray Train worker, plans this node's cores among the job's
workers on it (as for any launcher), binds the worker to its share in-process and sets its threads (Ray binds
nothing and sets OMP_NUM_THREADS to the worker's CPU resource), and uses Ray's process group as it is.
Rank 0's lines reach this terminal through Ray. Every node needs `pip install "corecpu[ray]"`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from corecpu.errors import CoreCPUError, run_cli
from corecpu.tasks.registry import parse_config
from corecpu.training.train_config import TrainConfig


def train_worker(config: dict) -> None:
    """One Ray Train worker: train.py's own loop through the front door."""
    import corecpu
    from corecpu.train import train

    cfg: TrainConfig = config["cfg"]
    # No graceful_stop: Ray runs this function outside the worker's main thread, where no signal handler can be set.
    with corecpu.setup(cfg.run) as run:
        train(cfg, run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--address", default=None,
                   help="a running Ray cluster ('auto', 'ray://head:10001'); default: start a local one")
    p.add_argument("--workers", type=int, default=2, help="Ray Train workers, one corecpu rank each")
    p.add_argument("--cpus-per-worker", type=float, default=1,
                   help="Ray's CPU resource per worker: what Ray schedules by; corecpu binds each worker to its "
                        "share of the node's cores, so ask for that share to keep Ray's other tasks off them")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local cluster (default: all)")
    p.add_argument("--storage-path", default=None, help="Ray Train's run state (default: Ray's, ~/ray_results)")
    args, train_argv = p.parse_known_args()
    cfg = parse_config(train_argv)
    # The workers' working directory is Ray's, not this one: give them absolute paths.
    cfg = dataclasses.replace(cfg, output_dir=os.path.abspath(cfg.output_dir))
    if args.workers < 1:
        raise CoreCPUError(f"--workers must be at least 1, got {args.workers}")

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray would otherwise report usage over the network
    # Ray Train's print patch writes each print() of a worker twice (to its logger and to the stream); Ray passes
    # this on to the workers, and their stdout still reaches this terminal.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    try:
        trainer = TorchTrainer(
            train_worker, train_loop_config={"cfg": cfg},
            scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False,
                                         resources_per_worker={"CPU": args.cpus_per_worker}),
            run_config=RunConfig(storage_path=args.storage_path and os.path.abspath(args.storage_path)))
        try:
            trainer.fit()
        except Exception as exc:  # Ray's TrainingFailedError wraps the worker's; the worker already printed it
            raise CoreCPUError(f"Ray Train stopped: {str(exc).strip().splitlines()[0]}; the worker's own error "
                               "is above") from None
    finally:
        ray.shutdown()
    print(f"done: outputs in {cfg.output_dir}", flush=True)


if __name__ == "__main__":
    run_cli(main)
