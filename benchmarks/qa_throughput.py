"""Extractive QA: corecpu vs Hugging Face Trainer as run_qa.py runs it (defaults, and tuned), on CPU.

    python benchmarks/qa_throughput.py                          # MiniLM, the built-in QA set, 1 epoch, 2 repeats
    python benchmarks/qa_throughput.py --data train-v1.1.json --eval-data dev-v1.1.json
    python benchmarks/qa_throughput.py --model tiny --max-steps 10 --repeats 1            # smoke test
    python benchmarks/qa_throughput.py --report benchmarks/results/qa-X.json              # re-print only

Variants, all with 2 ranks on this host, the same model and initialisation, data, windows (384
tokens, stride 128), per-rank batch, lr, warm-up, clipping, seed and epochs:
  corecpu         ./launch.sh N train.py --task qa, corecpu's defaults (precision auto)
  trainer_runqa   torchrun + benchmarks/hf_trainer_qa.py: run_qa.py's defaults (every window padded
                  to 384, random sampling, fp32)
  trainer_tuned   the same with dynamic padding, group_by_length and the faster of fp32 and bf16 here
                  (--tuned-precision; auto times both with tuned_precision.py before the runs)
Each trains, then evaluates once (n-best post-processing, SQuAD EM/F1). Throughput = global
samples of steps W+1..S / their time (rank 0's clock at each optimizer step's end); wall = the
whole command, start-up, tokenization, evaluation and saving included. Variants run interleaved
(a b c, a b c, ...); the tables show medians and ratios against trainer_runqa.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import stats
from throughput import machine

VARIANTS = ("corecpu", "trainer_runqa", "trainer_tuned")
BASELINE = "trainer_runqa"
KEYS = ("samples_per_s", "ms_per_step", "wall_s", "eval_exact_match", "eval_f1", "final_loss")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="minilm", help="minilm (all-MiniLM-L6-v2), tiny, or a model directory")
    p.add_argument("--data", default="qa", help="'qa' (built-in) or a SQuAD .json / flat .jsonl file")
    p.add_argument("--eval-data", default="auto", help="auto: the built-in's eval split; else a file")
    p.add_argument("--version-2-with-negative", action="store_true")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--warmup", type=int, default=5, help="first W steps left out of samples/s")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default="", help="comma-separated; repeat i runs at the i-th seed (overrides "
                   "--seed and --repeats), for accuracy compared seed by seed")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tuned-precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="trainer_tuned's precision; auto: the faster of the two for this model, timed before the runs")
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--report", type=Path, default=None, help="print the tables of an existing result JSON")
    p.add_argument("--replace-in", type=Path, default=None, metavar="RESULT.json",
                   help="run only --variants and replace their runs in an existing result (its other runs kept); "
                        "the result records which variants were re-run, and when")
    p.add_argument("--append-to", type=Path, default=None, metavar="RESULT.json",
                   help="add this run's repeats (e.g. more --seeds, same settings) to an existing result")
    return p.parse_args()


def command(variant: str, args: argparse.Namespace, run_dir: Path, seed: int) -> list[str]:
    model = harness.MODEL_SPECS.get(args.model, args.model)
    common = ["--model", model, "--data", args.data, "--eval-data", args.eval_data, "--epochs", str(args.epochs),
              "--batch-size", str(args.batch_size), "--seed", str(seed)]
    common += ["--max-steps", str(args.max_steps)] if args.max_steps else []
    common += ["--version-2-with-negative"] if args.version_2_with_negative else []
    if variant == "corecpu":
        return [str(harness.ROOT / "launch.sh"), str(args.ranks), "--task", "qa", *common, "--log-every", "1",
                "--progress", "off", "--output-dir", str(run_dir / variant)]
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", str(args.ranks)]
    tuned = ["--tuned", "--precision", args.tuned_precision] if variant == "trainer_tuned" else []
    return [*torchrun, str(harness.BENCH / "hf_trainer_qa.py"), *common, *tuned,
            "--out-json", str(run_dir / f"{variant}.json")]


def run_once(variant: str, args: argparse.Namespace, run_dir: Path, env: dict[str, str], seed: int) -> dict[str, Any]:
    cmd = command(variant, args, run_dir, seed)
    log = run_dir / f"{variant}.log"
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=harness.ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"{variant} exited with {proc.returncode}; last lines of {log}:\n{tail}")
    extra: dict[str, Any] = {}
    if variant == "corecpu":
        out = run_dir / variant
        steps, evals = harness.corecpu_records((out / "metrics.jsonl").read_text().splitlines())
        extra["precision"] = json.loads((out / "config.json").read_text())["resolved"]["precision"]
        extra["mean_padded_len"] = None
    else:
        recorded = json.loads((run_dir / f"{variant}.json").read_text())
        steps, evals = recorded["steps"], recorded["evals"]
        extra = {k: recorded[k] for k in ("precision", "padding", "sampling") if k in recorded}
        extra["mean_padded_len"] = statistics.fmean(s["padded_len"] for s in steps)
    window = stats.timed_window(steps, args.warmup, [e["step"] for e in evals][:-1])
    last = evals[-1]
    return {"variant": variant, "seed": seed, "command": cmd, "wall_s": wall, **window, "steps_run": len(steps),
            "eval_exact_match": last["eval_exact_match"], "eval_f1": last["eval_f1"],
            "final_loss": steps[-1]["loss"], "evals": evals, "load_avg_before": load_before, "log": str(log), **extra}


def summarize(raw: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    medians = {v: {k: statistics.median(r[k] for r in raw if r["variant"] == v) for k in KEYS} for v in order}
    base = medians.get(BASELINE)
    ratios = {v: {"throughput": m["samples_per_s"] / base["samples_per_s"], "wall_speedup": base["wall_s"] / m["wall_s"],
                  "em_delta": m["eval_exact_match"] - base["eval_exact_match"],
                  "f1_delta": m["eval_f1"] - base["eval_f1"]} for v, m in medians.items()} if base else {}
    return {"medians": medians, "ratios": ratios}


def run_seed(run: dict[str, Any]) -> int:
    """The seed a run used (results from before seeds were recorded carry it only in the command)."""
    if "seed" in run:
        return run["seed"]
    cmd = run["command"]
    return int(cmd[cmd.index("--seed") + 1])


def seed_rows(result: dict[str, Any]) -> list[str]:
    """EM/F1 seed by seed: a median hides how far the seed alone moves a one-epoch score."""
    seeds = sorted({run_seed(r) for r in result["raw"]})
    others = [v for v in result["medians"] if v != BASELINE]
    if len(seeds) < 2 or BASELINE not in result["medians"]:
        return []
    def score(v: str, seed: int) -> tuple[float, float]:
        run = next(r for r in result["raw"] if r["variant"] == v and run_seed(r) == seed)
        return run["eval_exact_match"], run["eval_f1"]
    rows = ["", "| seed | " + " | ".join(f"{v} EM / F1" for v in [BASELINE, *others]) + " | "
            + " | ".join(f"{v} - run_qa EM / F1" for v in others) + " |",
            "|---|" + "---|" * (1 + 2 * len(others))]
    deltas: dict[str, list[tuple[float, float]]] = {v: [] for v in others}
    for seed in seeds:
        base = score(BASELINE, seed)
        cells = [f"{base[0]:.2f} / {base[1]:.2f}"]
        for v in others:
            em, f1 = score(v, seed)
            cells.append(f"{em:.2f} / {f1:.2f}")
            deltas[v].append((em - base[0], f1 - base[1]))
        rows.append(f"| {seed} | " + " | ".join(cells) + " | "
                    + " | ".join(f"{d[0]:+.2f} / {d[1]:+.2f}" for d in (deltas[v][-1] for v in others)) + " |")
    mean = " | ".join(f"{statistics.fmean(d[0] for d in deltas[v]):+.2f} / {statistics.fmean(d[1] for d in deltas[v]):+.2f}"
                      for v in others)
    means = " | ".join(f"{statistics.fmean(score(v, x)[0] for x in seeds):.2f} / "
                       f"{statistics.fmean(score(v, x)[1] for x in seeds):.2f}" for v in [BASELINE, *others])
    rows.append(f"| mean | {means} | {mean} |")
    return rows


def markdown(result: dict[str, Any]) -> str:
    cfg, mach = result["config"], result["machine"]
    limit = f", at most {cfg['max_steps']} steps" if cfg.get("max_steps") else ""
    seeds = sorted({run_seed(r) for r in result["raw"]})
    over = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    head = (f"**{cfg['model']} on {cfg['data']}, {cfg['ranks']} ranks x batch {cfg['batch_size']}, windows 384 / "
            f"stride 128, {cfg['epochs']} epoch(s){limit}, median of {cfg['repeats']} interleaved repeats ({over}) | CPU: "
            f"{mach['cpu_model']} ({mach['usable_cpus']} CPUs; {stats.flags_text(mach['cpu_flags'])})**")
    rows = ["| variant | precision | padding | samples/s | vs run_qa | wall s | wall speed-up vs run_qa | EM | F1 | "
            "F1 vs run_qa |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for v, m in result["medians"].items():
        r = result["ratios"].get(v, {})
        first = next(x for x in result["raw"] if x["variant"] == v)
        padding = {"max_length": "every window to 384", "dynamic": "dynamic, length-grouped"}.get(
            first.get("padding", ""), "dynamic, length-grouped")
        rows.append(f"| {v} | {first.get('precision', '-')} | {padding} | {m['samples_per_s']:.1f} | "
                    f"{r.get('throughput', float('nan')):.2f}x | {m['wall_s']:.0f} | {r.get('wall_speedup', float('nan')):.2f}x | "
                    f"{m['eval_exact_match']:.2f} | {m['eval_f1']:.2f} | {r.get('f1_delta', float('nan')):+.2f} |")
    rows += seed_rows(result)
    for extra in result.get("appended", []):
        rows.append(f"\nseed(s) {extra['seeds']}: appended later ({extra['machine']['date_utc']})")
    for rerun in result.get("rerun", []):
        rows.append(f"\n{', '.join(rerun['variants'])}: re-run after the others ({rerun['machine']['date_utc']}), "
                    "so not interleaved with them")
    return "\n".join([head, "", *rows]) + "\n"


def append_runs(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` with `new`'s repeats after its own; both must hold the same settings and variants."""
    fixed = ("model", "data", "eval_data", "ranks", "batch_size", "epochs", "max_steps", "variants",
             "version_2_with_negative")
    differ = [k for k in fixed if old["config"].get(k) != new["config"].get(k)]
    if differ:
        raise SystemExit(f"cannot append: {', '.join(differ)} differ from the existing result's; run with its settings")
    again = sorted({run_seed(r) for r in old["raw"]} & {run_seed(r) for r in new["raw"]})
    if again:
        raise SystemExit(f"cannot append: seed(s) {again} are already in the result; pass other --seeds")
    shift = max(r["repeat"] for r in old["raw"])
    raw = old["raw"] + [{**r, "repeat": r["repeat"] + shift} for r in new["raw"]]
    config = {**old["config"], "repeats": old["config"]["repeats"] + new["config"]["repeats"],
              "seeds": sorted({run_seed(r) for r in raw})}
    return {**old, "config": config, "raw": raw, **summarize(raw, config["variants"]),
            "appended": old.get("appended", []) + [{"seeds": new["config"].get("seeds"), "machine": new["machine"]}]}


def main() -> None:
    args = parse_args()
    if args.report:
        print(markdown(json.loads(args.report.read_text())))
        return
    order = [v for v in args.variants.split(",") if v]
    unknown = [v for v in order if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="corecpu-qa-bench-"))
    env = {k: v for k, v in os.environ.items() if k not in harness.THREAD_VARS}
    one_process = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                     env=env, capture_output=True, text=True, check=True).stdout)
    torchrun_env = {**env, "OMP_NUM_THREADS": str(max(1, one_process // args.ranks))}  # as throughput.py does
    # QA features run up to 384 tokens.
    tuned_by = harness.tuned_precision(args.tuned_precision, order, harness.MODEL_SPECS.get(args.model, args.model),
                                       int(torchrun_env["OMP_NUM_THREADS"]), args.batch_size, env, args.timeout,
                                       seq_len=384)
    args.tuned_precision = tuned_by["precision"]
    seeds = [int(x) for x in args.seeds.split(",") if x] or [args.seed] * args.repeats
    args.repeats = len(seeds)
    print(f"QA benchmark: variants {order}, seeds {seeds}; logs in {work}", flush=True)
    raw = []
    for rep, seed in enumerate(seeds, start=1):
        run_dir = work / f"repeat{rep}"
        run_dir.mkdir(parents=True, exist_ok=True)
        for v in order:
            r = run_once(v, args, run_dir, env if v == "corecpu" else torchrun_env, seed)
            raw.append({"repeat": rep, **r})
            print(f"repeat {rep}/{args.repeats} {v:<14} {r['samples_per_s']:6.1f} samples/s  wall {r['wall_s']:6.1f}s"
                  f"  EM {r['eval_exact_match']:.2f}  F1 {r['eval_f1']:.2f}  final loss {r['final_loss']:.4f}  "
                  f"({r.get('precision')}, load {r['load_avg_before']:.1f})", flush=True)
    config = {"model": args.model, "data": args.data, "eval_data": args.eval_data, "ranks": args.ranks,
              "batch_size": args.batch_size, "epochs": args.epochs, "max_steps": args.max_steps,
              "warmup": args.warmup, "repeats": args.repeats, "seeds": seeds, "seed": args.seed, "variants": order,
              "version_2_with_negative": args.version_2_with_negative, "torchrun_omp_num_threads":
              torchrun_env["OMP_NUM_THREADS"], "tuned_precision": tuned_by}
    result = {"config": config, "machine": machine(), **summarize(raw, order), "raw": raw,
              "method": "samples_per_s over steps W+1..S from rank 0's step-end clock; wall_s = whole command"}
    if args.replace_in:  # keep the other variants' runs; these are not interleaved with them
        old = json.loads(args.replace_in.read_text())
        kept = [r for r in old["raw"] if r["variant"] not in order]
        all_order = old["config"]["variants"]
        result = {**old, "raw": kept + raw, **summarize(kept + raw, all_order),
                  "rerun": old.get("rerun", []) + [{"variants": order, "machine": machine()}]}
    if args.append_to:  # more seeds of the same comparison, run later
        result = append_runs(json.loads(args.append_to.read_text()), result)
    label = Path(args.data).stem if args.data != "qa" else "builtin-qa"
    out = args.out or args.replace_in or args.append_to or harness.BENCH / "results" / f"qa-{label}-n{args.ranks}-{args.model if args.model in harness.MODEL_SPECS else Path(args.model).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n" + markdown(result))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
