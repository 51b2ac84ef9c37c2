"""Where a corecpu training step's time goes: data, forward, backward, all-reduce wait, clipping, optimizer.

    python benchmarks/phases.py                                    # MiniLM, --data paraphrase, 2 ranks
    python benchmarks/phases.py --model tiny --data builtin --steps 20 --warmup 4

Starts N ranks the way launch.sh does (Intel MPI mpirun, each rank bound by
`corecpu.bind`), builds corecpu's own loader, model, fused AdamW and DDP, and times
each phase of a step with perf_counter (CPU ops are synchronous, so no sync is needed).
Steps alternate between a micro-step under `ddp.no_sync()` (forward, backward without
the gradient all-reduce) and a full step (forward, backward with it, clip, optimizer):
  all-reduce wait = median backward with sync - median backward without,
the part of the all-reduce that DDP could not hide behind the backward pass, including
waiting for a slower rank; a barrier after each no-sync backward measures that wait
alone ("wait for slowest rank": uneven padding between the ranks' batches). A bare
all-reduce of one gradient-sized fp32 buffer is timed too, for scale. Medians per rank
over the steps after --warmup; implied samples/s = global batch / sum of the phases.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("data", "forward", "backward_nosync", "skew", "backward_sync", "clip", "optimizer")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="default", help="default (all-MiniLM-L6-v2), tiny, or a model directory")
    p.add_argument("--data", default="paraphrase", help="a built-in name or a .tsv/.csv/.jsonl file")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=40, help="micro-steps in all (half of them full optimizer steps)")
    p.add_argument("--warmup", type=int, default=6, help="first micro-steps not timed")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--out", type=Path, default=None, help="JSON of the per-rank medians")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args: argparse.Namespace) -> int:
    """Start the ranks as launch.sh does: mpirun, corecpu.bind per rank, Intel MPI's own pinning off."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_AFFINITY")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env.update(I_MPI_PIN="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    worker = [a for a in sys.argv[1:]] + ["--worker"]
    cmd = ["mpirun", "-n", str(args.ranks), sys.executable, "-m", "corecpu.bind", "--",
           sys.executable, "-u", str(Path(__file__).resolve()), *worker]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def worker(args: argparse.Namespace) -> None:
    from corecpu.threads import CPUS_AT_START, configure_threads  # before torch: see corecpu/threads.py
    from corecpu.launchers import detect_launcher

    threads = configure_threads(detect_launcher(os.environ), 0, CPUS_AT_START)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import get_linear_schedule_with_warmup

    from corecpu.data import TokenizedDataset, build_loader, load_data, set_epoch
    from corecpu.dist import distributed, gather_objects
    from corecpu.hardware import choose_precision, read_cpu_features
    from corecpu.modeling import load_model, load_tokenizer, optimizer_groups

    args.model = {"minilm": "default"}.get(args.model, args.model)
    with distributed("auto", 120) as ctx:
        rank, world = ctx.rank, ctx.world_size
        precision = choose_precision(args.precision, read_cpu_features())
        tokenizer = load_tokenizer(args.model)
        data = load_data(args.data, split="train")
        loader = build_loader(TokenizedDataset(data, tokenizer, args.max_seq_len), args.batch_size, rank, world)
        model, desc = load_model(args.model, data.label_names, 0)
        optimizer = torch.optim.AdamW(optimizer_groups(model, 0.01), lr=1e-4, fused=True)
        scheduler = get_linear_schedule_with_warmup(optimizer, 0, args.steps)
        ddp = DDP(model) if world > 1 else model
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision.name == "bf16" \
            else contextlib.nullcontext

        times: dict[str, list[float]] = {p: [] for p in PHASES}
        epoch, it = 0, None
        ddp.train()
        for micro in range(args.steps):
            sync = micro % 2 == 1 or world == 1
            t0 = time.perf_counter()
            batch = next(it, None) if it is not None else None
            if batch is None:  # start (or restart) an epoch
                set_epoch(loader, epoch)
                epoch, it = epoch + 1, iter(loader)
                batch = next(it)
            batch.pop("num_tokens")
            batch.pop("valid")
            t1 = time.perf_counter()
            with contextlib.nullcontext() if sync else ddp.no_sync():
                with autocast():
                    loss = ddp(**batch).loss
                t2 = time.perf_counter()
                loss.backward()
            t3 = time.perf_counter()
            record = {"data": t1 - t0, "forward": t2 - t1, "backward_sync" if sync else "backward_nosync": t3 - t2}
            if not sync:
                # How long this rank waits for the slowest one at this point: uneven batches (padding)
                # show up here, and in a full step they would count as all-reduce wait.
                dist.barrier()
                t3 = time.perf_counter()
                record["skew"] = t3 - t2 - record["backward_nosync"]
            if sync:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
                t4 = time.perf_counter()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                record.update(clip=t4 - t3, optimizer=time.perf_counter() - t4)
            if micro >= args.warmup:
                for k, v in record.items():
                    times[k].append(v)

        numel = sum(p.numel() for p in model.parameters())
        bare = []
        if world > 1:
            buf = torch.zeros(numel, dtype=torch.float32)
            for i in range(12):
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(buf)
                if i >= 2:
                    bare.append(time.perf_counter() - t)
        mine = {p: statistics.median(v) * 1000 if v else None for p, v in times.items()}
        mine["bare_allreduce"] = statistics.median(bare) * 1000 if bare else None
        mine["threads"] = threads
        everyone = gather_objects(mine)
        if ctx.is_main:
            report(args, everyone, precision.name, desc, numel, world)


def report(args: argparse.Namespace, ranks: list[dict[str, Any]], precision: str, desc: str, numel: int,
           world: int) -> None:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    rows = []
    for r in ranks:
        wait = r["backward_sync"] - r["backward_nosync"] if r["backward_nosync"] is not None else None
        step = r["data"] + r["forward"] + r["backward_sync"] + r["clip"] + r["optimizer"]
        rows.append({**r, "allreduce_wait": wait, "step": step, "samples_per_s": args.batch_size * world / step * 1000})
    cols = [("data + collate", "data"), ("forward", "forward"), ("backward, no sync", "backward_nosync"),
            ("wait for slowest rank", "skew"), ("all-reduce wait", "allreduce_wait"), ("backward with sync", "backward_sync"), ("clip", "clip"),
            ("optimizer", "optimizer"), ("step", "step"), ("bare all-reduce", "bare_allreduce")]
    print(f"\n{desc}, {precision}, {world} rank(s) x batch {args.batch_size}, data {args.data}; median ms per phase over micro-steps {args.warmup + 1}..{args.steps}\n")
    print("| rank | threads | " + " | ".join(c for c, _ in cols) + " | implied samples/s |")
    print("|---:|---:|" + "---:|" * (len(cols) + 1))
    for i, r in enumerate(rows):
        print(f"| {i} | {r['threads']} | " + " | ".join(ms(r[k]) for _, k in cols) + f" | {r['samples_per_s']:.1f} |")
    print("\nstep = data + forward + backward with sync + clip + optimizer; all-reduce wait = backward with sync "
          "- backward without (what DDP did not overlap, incl. waiting for the slowest rank); wait for slowest rank = "
          "a barrier after a no-sync backward; bare all-reduce = one gradient-sized fp32 buffer, alone.")
    out = args.out or ROOT / "benchmarks" / "results" / f"phases-{Path(args.data).stem}-{precision}-n{world}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": desc, "precision": precision, "data": args.data, "world": world,
                               "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
                               "ranks": rows}, indent=1) + "\n")
    print(f"written to {out}")


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
    else:
        raise SystemExit(launch(args))


if __name__ == "__main__":
    main()
