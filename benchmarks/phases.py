"""Where a corecpu training step's time goes: data, forward, backward, all-reduce wait, clipping, optimizer.

    python benchmarks/phases.py                                    # MiniLM, --data paraphrase, 2 ranks
    python benchmarks/phases.py --model tiny --data builtin --steps 20 --warmup 4

Starts N ranks as `./launch.sh N benchmarks/phases.py` would (mpirun, each rank bound by
corecpu) and builds the step as train.py does, through the front door: `corecpu.setup()`,
`run.loader` (length-grouped like train.py's default), fused AdamW, `run.wrap` (DDP with
corecpu's gradient all-reduce path and settled precision), `run.autocast()`. Each phase
is timed with perf_counter (CPU ops are synchronous; DDP's backward returns only after
its all-reduce futures complete). Micro-steps alternate between `run.no_sync` (forward,
backward without the gradient all-reduce, then the gradients cleared, untimed) and full
steps (forward, backward with it, clip, optimizer), so both kinds of backward start from
cleared gradients, as every step of train.py (grad_accum 1) does:
  all-reduce wait = median backward with sync - median backward without,
the part of the all-reduce that DDP could not hide behind the backward pass, including
waiting for a slower rank; a barrier after each no-sync backward measures that wait
alone ("wait for slowest rank": uneven padding between the ranks' batches). A bare gloo
all-reduce of one gradient-sized fp32 buffer is timed too, for scale. Medians per rank
over the micro-steps after --warmup; implied samples/s = global batch / sum of the phases.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("data", "forward", "backward_nosync", "skew", "backward_sync", "clip", "optimizer", "stop_check")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="default", help="default/minilm (all-MiniLM-L6-v2), tiny, or a model directory")
    p.add_argument("--data", default="paraphrase", help="a built-in name or a .tsv/.csv/.jsonl file")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=True,
                   help="batch similar lengths together, as train.py does by default")
    p.add_argument("--steps", type=int, default=40, help="micro-steps in all (half of them full optimizer steps)")
    p.add_argument("--warmup", type=int, default=6, help="first micro-steps not timed")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--allreduce", choices=("auto", "gloo", "mpi"), default="auto")
    p.add_argument("--shard-optimizer", choices=("auto", "shm", "off"), default="auto",
                   help="auto: train.py's default (the optimizer sharded through shared memory on one host); shm "
                        "forces that, off DDP's all-reduce and a whole optimizer step on every rank")
    p.add_argument("--out", type=Path, default=None, help="JSON of the per-rank medians")
    p.add_argument("--op-profile", type=Path, default=None, metavar="JSON",
                   help="also profile the timed full steps with torch.profiler and write rank 0's self CPU time per "
                        "op (ms a step) here; torch.profiler adds its own cost per op, so the phases are slower")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args: argparse.Namespace) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_AFFINITY")}
    from harness import corecpu_launch  # a sibling, as a script imports it (the ranks do not need it)

    cmd = [*corecpu_launch(), str(args.ranks), str(Path(__file__).resolve()), *sys.argv[1:], "--worker"]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def worker(args: argparse.Namespace) -> None:
    import corecpu  # before torch: it records the CPUs the launcher gave this rank
    import torch
    import torch.distributed as dist
    from transformers import get_linear_schedule_with_warmup

    from corecpu.data.sampling import set_epoch
    from corecpu.data.sources import load_data
    from corecpu.data.tokenized import META_KEYS, TokenizedDataset, make_collate
    from corecpu.training.modeling import load_model, load_tokenizer, optimizer_groups

    model_spec = {"minilm": "default"}.get(args.model, args.model)
    with corecpu.setup(precision=args.precision, allreduce=args.allreduce, shard_optimizer=args.shard_optimizer) as run:
        world = run.world_size
        tokenizer = load_tokenizer(model_spec)
        data = load_data(args.data, split="train")
        train_set = TokenizedDataset(data, tokenizer, args.max_seq_len)
        lengths = [len(ids) for ids in train_set.input_ids] if args.group_by_length else None
        loader = run.loader(train_set, args.batch_size, seed=0, collate_fn=make_collate(tokenizer), lengths=lengths)
        model, desc = load_model(model_spec, data.label_names, 0)
        optimizer = torch.optim.AdamW(optimizer_groups(model, 0.01), lr=1e-4, fused=not run.uses_ipex)
        scheduler = get_linear_schedule_with_warmup(optimizer, 0, args.steps)
        ddp, optimizer = run.wrap(model, optimizer, scheduler)

        times: dict[str, list[float]] = {p: [] for p in PHASES}
        epoch, it = 0, None
        ddp.train()
        profiler = op_profiler(args.op_profile)
        for micro in range(args.steps):
            if micro == args.warmup and profiler is not None:
                profiler.__enter__()
            sync = micro % 2 == 1 or world == 1
            t0 = time.perf_counter()
            batch = next(it, None) if it is not None else None
            if batch is None:  # start (or restart) an epoch
                set_epoch(loader, epoch)
                epoch, it = epoch + 1, iter(loader)
                batch = next(it)
            for key in META_KEYS:  # not model inputs
                batch.pop(key)
            t1 = time.perf_counter()
            with run.no_sync(ddp, sync):
                with run.autocast():
                    loss = ddp(**batch).loss
                t2 = time.perf_counter()
                loss.backward()
            t3 = time.perf_counter()
            record = {"data": t1 - t0, "forward": t2 - t1, "backward_sync" if sync else "backward_nosync": t3 - t2}
            if not sync:
                # How long this rank waits for the slowest one at this point: uneven batches (padding)
                # show up here, and in a full step they would count as all-reduce wait.
                run.barrier()
                t3 = time.perf_counter()
                record["skew"] = t3 - t2 - record["backward_nosync"]
                # Untimed: the next (synced) backward then starts from cleared gradients, as each of train.py's
                # steps does. Left in place, it would add this one into them, and on the first sync DDP would copy
                # them into its buckets: work no train.py step does, which used to count as all-reduce wait.
                optimizer.zero_grad(set_to_none=True)
            if sync:
                run.clip_grad_norm_(1.0)  # train.py's clip (fused into the optimizer's step where it can be)
                t4 = time.perf_counter()
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                t5 = time.perf_counter()
                run.should_stop()  # the collective run.steps() makes between two steps
                record.update(clip=t4 - t3, optimizer=t5 - t4, stop_check=time.perf_counter() - t5)
            if micro >= args.warmup:
                for k, v in record.items():
                    times[k].append(v)

        if profiler is not None:
            profiler.__exit__(None, None, None)
            if run.is_main:
                write_op_profile(args.op_profile, profiler, len(times["optimizer"]) or 1, torch.get_num_threads())
        numel = sum(p.numel() for p in model.parameters())
        bare = []
        if world > 1:
            buf = torch.zeros(numel, dtype=torch.float32)
            for i in range(12):
                run.barrier()
                t = time.perf_counter()
                dist.all_reduce(buf)
                if i >= 2:
                    bare.append(time.perf_counter() - t)
        mine: dict[str, Any] = {p: statistics.median(v) * 1000 if v else None for p, v in times.items()}
        mine["bare_allreduce"] = statistics.median(bare) * 1000 if bare else None
        mine["threads"] = torch.get_num_threads()
        everyone = run.gather(mine)
        if run.is_main:
            report(args, everyone, run.precision.name,
                   f"{desc}; all-reduce {run.allreduce}; optimizer step {run.describe()['shard_optimizer']}", world)


def op_profiler(path: Path | None) -> Any:
    if path is None:
        return None
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU])


def write_op_profile(path: Path, profiler: Any, steps: int, threads: int) -> None:
    """Self CPU time per op name, in ms per full step (a micro-step without sync counts into it too)."""
    ops = {e.key: round(e.self_cpu_time_total / 1000 / steps, 3) for e in profiler.key_averages()
           if e.self_cpu_time_total > 0}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"threads": threads, "steps": steps,
                                "ops_ms_per_step": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}, indent=1) + "\n")


def report(args: argparse.Namespace, ranks: list[dict[str, Any]], precision: str, desc: str, world: int) -> None:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    rows = []
    for r in ranks:
        wait = r["backward_sync"] - r["backward_nosync"] if r["backward_nosync"] is not None else None
        step = sum(r[k] or 0.0 for k in ("data", "forward", "backward_sync", "clip", "optimizer", "stop_check"))
        rows.append({**r, "allreduce_wait": wait, "step": step, "samples_per_s": args.batch_size * world / step * 1000})
    cols = [("data + collate", "data"), ("forward", "forward"), ("backward, no sync", "backward_nosync"),
            ("wait for slowest rank", "skew"), ("all-reduce wait", "allreduce_wait"),
            ("backward with sync", "backward_sync"), ("clip", "clip"), ("optimizer", "optimizer"),
            ("stop check", "stop_check"), ("step", "step"),
            ("bare all-reduce", "bare_allreduce")]
    print(f"\n{desc}, {precision}, {world} rank(s) x batch {args.batch_size}, data {args.data}; "
          f"median ms per phase over micro-steps {args.warmup + 1}..{args.steps}\n")
    print("| rank | threads | " + " | ".join(c for c, _ in cols) + " | implied samples/s |")
    print("|---:|---:|" + "---:|" * (len(cols) + 1))
    for i, r in enumerate(rows):
        print(f"| {i} | {r['threads']} | " + " | ".join(ms(r[k]) for _, k in cols) + f" | {r['samples_per_s']:.1f} |")
    print("\nstep = data + forward + backward with sync + clip + optimizer + stop check (the one-int all-reduce "
          "between steps); all-reduce wait = backward with sync "
          "- backward without (what DDP did not overlap, incl. waiting for the slowest rank); wait for slowest rank = "
          "a barrier after a no-sync backward; bare all-reduce = one gradient-sized fp32 buffer over gloo, alone.")
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
