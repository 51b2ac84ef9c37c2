"""Training throughput of corecpu vs a plain PyTorch DDP loop vs Hugging Face Trainer, on CPU.

    .venv/bin/python benchmarks/throughput.py                      # MiniLM, 2 ranks, 60 steps, 3 repeats
    .venv/bin/python benchmarks/throughput.py --model tiny
    .venv/bin/python benchmarks/throughput.py --report benchmarks/results/X.json --markdown   # re-print only

The three variants train the same model (same initialisation) on the same data with
the same per-rank batch, sequence length, precision, seed and number of ranks:
  corecpu     ./launch.sh N train.py ...                    (Intel MPI + per-rank CPU binding)
  plain_ddp   torchrun --nproc-per-node N plain_ddp.py      (the PyTorch/Intel CPU DDP tutorial loop)
  hf_trainer  torchrun --nproc-per-node N hf_trainer.py     (transformers.Trainer, use_cpu, gloo)
Each run records a wall-clock time on rank 0 at the end of every optimizer step;
throughput = global samples in steps W+1..S / (t[S] - t[W]). Whole-process wall
time (start-up and teardown included) is measured here, around the launch command.
The variants run interleaved (a b c, a b c, ...); medians over the repeats are
reported, with ratios against hf_trainer (= 1.0). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
VARIANTS = ("corecpu", "plain_ddp", "hf_trainer")
BASELINE = "hf_trainer"
MODEL_SPECS = {"minilm": "default", "tiny": "tiny"}  # our name -> corecpu's --model value
console = Console(highlight=False)
if not console.is_terminal:
    console.width = 150  # logs and pipes: keep table rows on one line


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=tuple(MODEL_SPECS), default="minilm",
                   help="minilm: the real all-MiniLM-L6-v2 + 2-label head; tiny: corecpu's tiny BERT")
    p.add_argument("--ranks", type=int, default=2, help="processes (DDP ranks), all on this host")
    p.add_argument("--batch-size", type=int, default=16, help="examples per rank per step")
    p.add_argument("--max-seq-len", type=int, default=128, help="truncation length (batches pad dynamically)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per run (S)")
    p.add_argument("--warmup", type=int, default=10, help="steps excluded from the timed window (W)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of all variants (R)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: what corecpu's --precision auto picks on this CPU; passed explicitly to all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset to run")
    p.add_argument("--out", type=Path, default=None,
                   help="result JSON (default: benchmarks/results/throughput-<model>-<precision>-n<N>.json)")
    p.add_argument("--work-dir", type=Path, default=None, help="run outputs and logs (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    p.add_argument("--report", type=Path, default=None, help="print the tables of an existing result JSON; run nothing")
    p.add_argument("--markdown", action="store_true", help="also print the summary as a Markdown table")
    args = p.parse_args()
    if not 1 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [1, --steps): the window starts at the end of step W; "
                f"got {args.warmup} and {args.steps}")
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variant(s) {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def resolve_precision(requested: str) -> str:
    from corecpu.hardware import choose_precision, read_cpu_features

    return choose_precision(requested, read_cpu_features()).name


def commands(args: argparse.Namespace, precision: str, run_dir: Path) -> dict[str, list[str]]:
    spec = MODEL_SPECS[args.model]
    common = ["--model", spec, "--batch-size", str(args.batch_size), "--max-seq-len", str(args.max_seq_len),
              "--precision", precision, "--seed", str(args.seed)]
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", str(args.ranks)]
    return {
        "corecpu": [str(ROOT / "launch.sh"), str(args.ranks), *common, "--data", "builtin", "--eval-data", "none",
                    "--progress", "off", "--log-every", "1", "--max-steps", str(args.steps),
                    "--epochs", "1000", "--output-dir", str(run_dir / "corecpu")],
        "plain_ddp": [*torchrun, str(BENCH / "plain_ddp.py"), *common, "--steps", str(args.steps),
                      "--out-json", str(run_dir / "plain_ddp.json")],
        "hf_trainer": [*torchrun, str(BENCH / "hf_trainer.py"), *common, "--steps", str(args.steps),
                       "--out-json", str(run_dir / "hf_trainer.json")],
    }


def corecpu_records(out_dir: Path, batch_size: int, world: int) -> list[dict[str, Any]]:
    """metrics.jsonl -> the common record format; samples per step follow corecpu's sampler
    (each rank gets ceil(n / world) examples per epoch, the last batch may be short)."""
    from corecpu.sampling import steps_per_epoch
    from corecpu.tasks import builtin_dataset

    n = len(builtin_dataset("train"))
    per_rank, per_epoch = math.ceil(n / world), steps_per_epoch(n, batch_size, world)
    records = []
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "samples_per_s" not in rec:
            continue  # not a training-step record
        k = (rec["step"] - 1) % per_epoch
        records.append({"step": rec["step"], "t": rec["elapsed_s"], "loss": rec["loss"],
                        "samples": min(batch_size, per_rank - k * batch_size) * world})
    return records


def measure(records: list[dict[str, Any]], warmup: int, steps: int) -> dict[str, Any]:
    """Throughput over steps warmup+1..steps, and the loss sanity numbers."""
    if [r["step"] for r in records] != list(range(1, steps + 1)):
        raise RuntimeError(f"expected step records 1..{steps}, got {len(records)} records")
    seconds = records[-1]["t"] - records[warmup - 1]["t"]
    samples = sum(r["samples"] for r in records[warmup:])
    losses = [r["loss"] for r in records]
    head, tail = losses[:10], losses[-10:]
    return {"samples_per_s": samples / seconds, "timed_seconds": seconds, "timed_samples": samples,
            "ms_per_step": 1000 * seconds / (steps - warmup), "final_loss": losses[-1],
            "loss_first10": statistics.fmean(head), "loss_last10": statistics.fmean(tail),
            "loss_ok": all(math.isfinite(x) for x in losses) and statistics.fmean(tail) <= statistics.fmean(head) + 0.05}


def run_once(variant: str, cmd: list[str], run_dir: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    log = run_dir / f"{variant}.log"
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"{variant} exited with {proc.returncode}; last lines of {log}:\n{tail}")
    if variant == "corecpu":
        records = corecpu_records(run_dir / "corecpu", args.batch_size, args.ranks)
    else:
        records = json.loads((run_dir / f"{variant}.json").read_text())["steps"]
    return {"variant": variant, "wall_s": wall, **measure(records, args.warmup, args.steps), "log": str(log),
            "steps": records}


def machine() -> dict[str, Any]:
    from corecpu.hardware import read_cpu_features

    versions = {}
    for dist_name in ("torch", "transformers", "accelerate", "impi-rt", "corecpu"):
        try:
            versions[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            versions[dist_name] = None
    git = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return {"cpu_model": read_cpu_features().model_name, "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(),
            "python": platform.python_version(), "versions": versions, "git": git.stdout.strip() or None,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def summarize(raw: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    medians: dict[str, dict[str, float]] = {}
    for v in variants:
        runs = [r for r in raw if r["variant"] == v]
        medians[v] = {k: statistics.median(r[k] for r in runs)
                      for k in ("samples_per_s", "ms_per_step", "wall_s", "final_loss", "loss_last10")}
        medians[v]["samples_per_s_min"] = min(r["samples_per_s"] for r in runs)
        medians[v]["samples_per_s_max"] = max(r["samples_per_s"] for r in runs)
        medians[v]["loss_ok_all"] = all(r["loss_ok"] for r in runs)
    ratios = {}
    if BASELINE in medians:
        base = medians[BASELINE]
        ratios = {v: {"throughput": m["samples_per_s"] / base["samples_per_s"], "wall_time": m["wall_s"] / base["wall_s"]}
                  for v, m in medians.items()}
    return {"medians": medians, "ratios_vs_hf_trainer": ratios}


def print_tables(result: dict[str, Any], markdown: bool) -> None:
    cfg, med, ratios = result["config"], result["medians"], result["ratios_vs_hf_trainer"]
    raw = Table(title="every run", title_justify="left")
    for col in ("repeat", "variant", "samples/s", "ms/step", "wall s", "loss first10 -> last10", "final loss"):
        raw.add_column(col, justify="left" if col in ("variant", "loss first10 -> last10") else "right")
    for r in result["raw"]:
        raw.add_row(str(r["repeat"]), r["variant"], f"{r['samples_per_s']:.1f}", f"{r['ms_per_step']:.0f}",
                    f"{r['wall_s']:.1f}", f"{r['loss_first10']:.3f} -> {r['loss_last10']:.3f}"
                    + ("" if r["loss_ok"] else " [red]SUSPECT[/]"), f"{r['final_loss']:.4f}")
    console.print(raw)
    title = (f"{cfg['model']} | {cfg['precision']} | {cfg['ranks']} ranks x batch {cfg['batch_size']} | "
             f"seq <= {cfg['max_seq_len']} | steps {cfg['warmup'] + 1}..{cfg['steps']} timed | "
             f"median of {cfg['repeats']}")
    table = Table(title=title, title_justify="left")
    headers = ("variant", "samples/s", "min-max", "vs Trainer", "ms/step", "wall s", "wall vs Trainer", "final loss")
    for col in headers:
        table.add_column(col, justify="left" if col == "variant" else "right")
    rows = []
    for v, m in med.items():
        ratio = ratios.get(v, {})
        rows.append((v, f"{m['samples_per_s']:.1f}", f"{m['samples_per_s_min']:.1f}-{m['samples_per_s_max']:.1f}",
                     f"{ratio['throughput']:.2f}x" if ratio else "-", f"{m['ms_per_step']:.0f}",
                     f"{m['wall_s']:.1f}", f"{ratio['wall_time']:.2f}x" if ratio else "-",
                     f"{m['final_loss']:.4f}" + ("" if m["loss_ok_all"] else " SUSPECT")))
        table.add_row(*rows[-1])
    console.print(table)
    if markdown:
        print(f"\n{title}\n")
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")


def main() -> None:
    args = parse_args()
    if args.report:
        print_tables(json.loads(args.report.read_text()), args.markdown)
        return
    precision = resolve_precision(args.precision)
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    out = args.out or BENCH / "results" / f"throughput-{args.model}-{precision}-n{args.ranks}.json"
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="corecpu-throughput-"))
    # Every variant starts from the same environment, without thread settings of ours:
    # launch.sh binds and sizes corecpu's ranks; torchrun applies its own default.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_AFFINITY")}
    config = {"model": args.model, "ranks": args.ranks, "batch_size": args.batch_size,
              "max_seq_len": args.max_seq_len, "steps": args.steps, "warmup": args.warmup,
              "repeats": args.repeats, "precision": precision, "precision_requested": args.precision,
              "seed": args.seed, "variants": variants, "global_batch": args.batch_size * args.ranks}
    console.print(f"[bold]throughput benchmark[/] {config}\nlogs and run outputs: {work}")
    raw: list[dict[str, Any]] = []
    for rep in range(1, args.repeats + 1):
        run_dir = work / f"repeat{rep}"
        run_dir.mkdir(parents=True, exist_ok=True)
        cmds = commands(args, precision, run_dir)
        for v in variants:
            result = run_once(v, cmds[v], run_dir, args, env)
            raw.append({"repeat": rep, "command": cmds[v], **result})
            console.print(f"repeat {rep}/{args.repeats} {v:<10} {result['samples_per_s']:7.1f} samples/s  "
                          f"{result['ms_per_step']:6.0f} ms/step  wall {result['wall_s']:6.1f}s  "
                          f"final loss {result['final_loss']:.4f}")
    result = {"config": config, "machine": machine(), **summarize(raw, variants), "raw": raw,
              "method": "throughput = global samples in steps W+1..S / (t[S] - t[W]), t = rank 0 wall clock at "
                        "the end of each optimizer step; wall_s = whole launch command incl. start-up"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_tables(result, args.markdown)
    console.print(f"written to {out}")


if __name__ == "__main__":
    main()
