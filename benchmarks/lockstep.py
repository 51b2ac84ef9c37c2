"""What N ranks cost against one, split into what the host charges and what corecpu's own code does.

    python benchmarks/lockstep.py --data train.tsv                 # 2 ranks, 3 interleaved repeats
    python benchmarks/lockstep.py --data train.tsv --ranks 4 --repeats 5 --out results/lockstep.json

issue 29 asks for distribution overhead against the compute-only step at the same per-rank batch: `ranks` x one
rank alone's samples/s over N ranks' (throughput.py's corecpu_1rank). That one figure mixes three things. Each
repeat runs three things, interleaved, all corecpu's train.py with its defaults at the same per-rank batch:

  alone      one rank alone on one rank's share of the cores (what corecpu_1rank runs);
  together   N such one-rank runs at once, each on its own share, with the same data order: N ranks' compute and
             nothing else (no gradient exchanged, no rank waits for another);
  ranks      `launch N`: the run in question.

From the per-step times (metrics.jsonl at --log-every 1, the first --warmup steps left out):

  co-running = together's mean step / alone's - 1: what N busy cores cost each other (memory, caches, the host);
  lockstep   = the mean over steps of the slowest together-run's step / together's mean step - 1: what waiting
               every step for the slowest of N unsynchronised ranks would cost, with no code for it at all
               (jitter between cores, one vCPU slower than another for a while);
  code       = ranks' time per token / that mean slowest step's per token - 1: what corecpu's distribution code
               itself adds (the summing pass, its barriers, the step's scalar collectives; --log-every 1's one
               all-reduce), and how the ranks' share of a global batch pads.

The one-rank runs train on other batches than a rank of `launch N` does (a rank gets a slice of each length-sorted
global batch), so the last comparison is per real token a rank steps over; the others compare identical batches.
On sentence pairs of varied length the difference is 13% of the tokens, on the short single sentences 1%.

overhead = ranks' time per token / alone's - 1 = (1 + co-running)(1 + lockstep)(1 + code) - 1. Medians over
repeats. `--from-runs DIR` recomputes all of it from an earlier run's kept directories.
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
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

PARTS = ("alone", "together", "ranks")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="training file (TSV/CSV/JSONL) or a built-in name")
    p.add_argument("--model", default="default", help="train.py --model (default: MiniLM)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank, as train.py's")
    p.add_argument("--steps", type=int, default=120, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=10, help="first steps left out of every mean")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/corecpu-lockstep"))
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: print only)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--from-runs", type=Path, default=None, metavar="DIR",
                   help="recompute from an earlier --work-dir's repeat*/ directories instead of running")
    return p.parse_args()


def shares(ranks: int) -> list[str]:
    """Each rank's share of the cores as a CPU list, the way corecpu binds N ranks on this host."""
    from throughput import allowed_cores  # the harness process stays free of torch

    cores = allowed_cores()
    if len(cores) < ranks:
        raise SystemExit(f"{ranks} ranks need {ranks} cores, this host allows {len(cores)}; pass --ranks {len(cores)}")
    return harness.rank_shares(cores, ranks)


def train_args(args: argparse.Namespace, out: Path) -> list[str]:
    return ["--model", args.model, "--data", args.data, "--eval-data", "none", "--max-steps", str(args.steps),
            "--batch-size", str(args.batch_size), "--log-every", "1", "--progress", "off", "--output-dir", str(out)]


def step_times(metrics: Path, world: int = 1) -> list[tuple[float, float]]:
    """(seconds, real tokens a rank) of each step, from metrics.jsonl's elapsed_s and tokens (one record a step at
    --log-every 1; `tokens` is the job's, over `world` ranks)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "elapsed_s" in r and "step" in r]
    return [(b["elapsed_s"] - a["elapsed_s"], b.get("tokens", 0) / world) for a, b in zip(steps, steps[1:])]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=harness.ROOT, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))


def finish(procs: Sequence[subprocess.Popen], logs: Sequence[Path], timeout: float) -> None:
    """Wait for every run; on a failure or a timeout, stop the runs still going (no orphan holds a core)."""
    try:
        for proc, log in zip(procs, logs):
            if proc.wait(timeout=timeout) != 0:
                raise SystemExit(f"a run failed (exit {proc.returncode}); its output: {log}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


Steps = dict[str, list[list[tuple[float, float]]]]  # part -> each run's (seconds, tokens a rank) per step


def run_dirs(run_dir: Path, part: str, ranks: int) -> list[Path]:
    return [run_dir / "ranks"] if part == "ranks" else [run_dir / f"{part}{r}"
                                                        for r in range(1 if part == "alone" else ranks)]


def read_repeat(run_dir: Path, ranks: int, warmup: int) -> Steps:
    return {part: [step_times(d / "metrics.jsonl", ranks if part == "ranks" else 1)[warmup:]
                   for d in run_dirs(run_dir, part, ranks)] for part in PARTS}


def one_repeat(args: argparse.Namespace, cpus: list[str], run_dir: Path) -> Steps:
    """Runs the three parts, one after another: per part, each run's steps (together: one list per run)."""
    launch = harness.corecpu_launch()
    for part in PARTS:
        dirs = run_dirs(run_dir, part, args.ranks)
        cmds = ([[*launch, str(args.ranks), *train_args(args, dirs[0])]] if part == "ranks" else
                [["taskset", "-c", cpus[r], *launch, "1", *train_args(args, d)] for r, d in enumerate(dirs)])
        logs = [d.with_suffix(".log") for d in dirs]
        print(f"  {part}: {len(cmds)} run(s); load average before {os.getloadavg()[0]:.2f}", flush=True)
        finish([start(c, log) for c, log in zip(cmds, logs)], logs, args.timeout)
    return read_repeat(run_dir, args.ranks, args.warmup)


def decompose(steps: Steps) -> dict[str, float]:
    """The split of one repeat (see the module docstring)."""
    def mean(values: Any) -> float:
        return statistics.fmean(values)

    alone = mean(t for t, _ in steps["alone"][0])
    runs = steps["together"]
    n = min(len(r) for r in runs)
    together = mean(t for r in runs for t, _ in r[:n])
    slowest = mean(max(r[i][0] for r in runs) for i in range(n))
    ranks = mean(t for t, _ in steps["ranks"][0])
    # Tokens a rank steps over: the same batches for alone and together; other ones for `launch N`.
    one_tokens = mean(k for r in runs for _, k in r[:n])
    rank_tokens = mean(k for _, k in steps["ranks"][0])
    per_token = (ranks / rank_tokens) / (alone / one_tokens) if rank_tokens and one_tokens else ranks / alone
    code = (ranks / rank_tokens) / (slowest / one_tokens) if rank_tokens and one_tokens else ranks / slowest
    return {"alone_ms": 1e3 * alone, "together_ms": 1e3 * together, "slowest_together_ms": 1e3 * slowest,
            "ranks_ms": 1e3 * ranks, "one_rank_tokens": one_tokens, "ranks_tokens": rank_tokens,
            "overhead": per_token - 1, "co_running": together / alone - 1, "lockstep": slowest / together - 1,
            "code": code - 1}


def show(split: dict[str, float]) -> str:
    return ", ".join(f"{key} {v:+.1%}" if key in ("overhead", "co_running", "lockstep", "code") else f"{key} {v:.1f}"
                     for key, v in split.items())


def main() -> None:
    args = parse_args()
    cpus = shares(args.ranks)
    repeats = []
    if args.from_runs:
        found = sorted(args.from_runs.glob("repeat*"), key=lambda d: int(d.name[len("repeat"):] or 0))
        if not found:
            raise SystemExit(f"no repeat*/ directories in {args.from_runs}; pass an earlier run's --work-dir")
        repeats = [decompose(read_repeat(d, args.ranks, args.warmup)) for d in found]
        args.repeats = len(found)
    for k in range(len(repeats), args.repeats):
        print(f"repeat {k + 1}/{args.repeats}", flush=True)
        repeats.append(decompose(one_repeat(args, cpus, args.work_dir / f"repeat{k + 1}")))
        print("  " + show(repeats[-1]), flush=True)
    median = {key: statistics.median(r[key] for r in repeats) for key in repeats[0]}
    from corecpu.cpu.hardware import read_cpu_features

    result = {"cpu": read_cpu_features().model_name, "ranks": args.ranks, "batch_size": args.batch_size,
              "steps": args.steps, "warmup": args.warmup, "data": args.data, "model": args.model,
              "cpus": cpus, "repeats": repeats, "median": median,
              **({"from_runs": str(args.from_runs)} if args.from_runs else {}),
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "method": __doc__.split("\n\n", 2)[2].strip()}
    for k, split in enumerate(repeats):
        print(f"repeat {k + 1}: {show(split)}")
    print(f"median: {show(median)}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
