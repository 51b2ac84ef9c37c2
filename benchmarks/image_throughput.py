"""The image job (ResNet-50, generated images): each recipe lever on and off, the allocators, corecpu vs plain.

    python benchmarks/image_throughput.py --image-size 128 --steps 20 --repeats 3      # the default matrix
    python benchmarks/image_throughput.py --variants plain,plain+cl+split+jemalloc,corecpu+split   # a best plain
    python benchmarks/image_throughput.py --model tiny --image-size 32 --steps 4 --repeats 1        # smoke test
    python benchmarks/image_throughput.py --report benchmarks/results/image-X.json                  # re-print only

A variant is BASE[+LEVER...]. BASE `plain` is benchmarks/plain_image.py, one process on all cores; `corecpu`
is ./launch.sh 1 examples/image_classification.py with its defaults (channels_last on, precision auto,
eager, the allocator its plan finds and preloads; +jemalloc, +tcmalloc, +system set CORECPU_ALLOCATOR). Levers:
  cl        channels_last (corecpu: --channels-last on, its default)    nocl  corecpu: --channels-last off
  bf16      bf16 autocast (corecpu: --precision bf16)                   fp32  corecpu: --precision fp32
  compile   torch.compile
  jemalloc, tcmalloc  plain: LD_PRELOAD of the library corecpu's plan finds (libjemalloc.so.2,
            libtcmalloc_minimal.so.4 from the system's packages); the variant is skipped, with the
            reason printed, where it is absent. corecpu: CORECPU_ALLOCATOR=jemalloc|tcmalloc.
  system    corecpu: CORECPU_ALLOCATOR=system (glibc's malloc, nothing preloaded)
  split     --split-ranks ranks (default: one per NUMA node where there are several, else 2 ranks of
            half the CPUs each): plain under torchrun --numa-split, corecpu as ./launch.sh N (its plan binds)
Held equal: model and initialisation, images, global batch (--batch-size, split over the ranks), SGD, lr,
steps, warm-up. The baseline is `plain` (fp32, NCHW, eager, glibc malloc, one process). Variants run
interleaved (a b c, a b c, ...); the table shows medians, min-max, ratios against the baseline, eval
accuracy and MFU (samples/s x FLOPs per trained image / the job's matmul rate in the run's precision).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness
import stats
from throughput import machine, run_logged

BASELINE = "plain"
DEFAULT_VARIANTS = ("plain", "plain+cl", "plain+bf16", "plain+compile", "plain+jemalloc", "plain+tcmalloc",
                    "plain+split", "corecpu", "corecpu+split")
LEVERS = {"plain": ("cl", "bf16", "compile", "jemalloc", "tcmalloc", "split"),
          "corecpu": ("cl", "nocl", "bf16", "fp32", "compile", "split", "jemalloc", "tcmalloc", "system")}
PLAIN_FLAGS = {"cl": "--channels-last", "bf16": "--bf16", "compile": "--compile"}
CORECPU_FLAGS = {"cl": ["--channels-last", "on"], "nocl": ["--channels-last", "off"], "bf16": ["--precision", "bf16"],
                 "fp32": ["--precision", "fp32"], "compile": ["--compile"]}
PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}  # Debian's, for a missing allocator
EXAMPLE = harness.ROOT / "examples" / "image_classification.py"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=("resnet50", "tiny"))
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32, help="global images per step, split over a variant's ranks")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of samples/s")
    p.add_argument("--eval-size", type=int, default=200, help="held-out images (after training, not timed)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of all variants")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma list of BASE[+LEVER...]")
    p.add_argument("--split-ranks", type=int, default=0, help="ranks of +split (0: NUMA nodes if several, else 2)")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: benchmarks/results/image-...json)")
    p.add_argument("--work-dir", type=Path, default=None, help="run logs and outputs (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    p.add_argument("--report", type=Path, default=None, help="print the table of an existing result JSON; run nothing")
    args = p.parse_args()
    args.order = [v for v in args.variants.split(",") if v]
    for v in args.order:
        base, *levers = v.split("+")
        bad = [x for x in levers if x not in LEVERS.get(base, ())]
        if base not in LEVERS or bad:
            p.error(f"variant {v!r}: BASE is plain or corecpu, levers of plain: {', '.join(LEVERS['plain'])}; "
                    f"of corecpu: {', '.join(LEVERS['corecpu'])}")
    return args


def numa_nodes() -> int:
    return max(1, len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))))


def split_note(ranks: int, nodes: int) -> str:
    if nodes > 1:
        return f"+split: {ranks} ranks, one per NUMA node ({nodes} nodes)"
    return f"+split: {ranks} ranks x 1/{ranks} of the CPUs each (this machine has one NUMA node: nothing to split by)"


def allocators() -> dict[str, str | None]:
    """The libraries corecpu's plan would preload, found the same way."""
    from corecpu.cpu.topology import default_library_dirs, find_libraries

    libs = find_libraries(default_library_dirs())
    return {"jemalloc": libs.jemalloc, "tcmalloc": libs.tcmalloc}


def command(variant: str, args: argparse.Namespace, run_dir: Path, libs: dict[str, str | None],
            env: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """(command, environment) of one run, or why it cannot run here."""
    base, *levers = variant.split("+")
    ranks = args.split_ranks if "split" in levers else 1
    if args.batch_size % ranks:
        return f"--batch-size {args.batch_size} does not split over {ranks} ranks"
    common = ["--model", args.model, "--image-size", str(args.image_size),
              "--batch-size", str(args.batch_size // ranks), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--eval-size", str(args.eval_size)]
    missing = [x for x in levers if x in libs and libs[x] is None]
    if missing:
        return f"no lib{missing[0]} found (apt-get install {PACKAGES[missing[0]]})"
    if base == "corecpu":
        flags = [w for x in levers for w in CORECPU_FLAGS.get(x, [])]
        out = run_dir / variant.replace("+", "-")
        # corecpu's plan preloads the allocator itself: CORECPU_ALLOCATOR says which (auto: the one it finds)
        allocator = next((x for x in levers if x in ("jemalloc", "tcmalloc", "system")), None)
        run_env = {**env, "CORECPU_ALLOCATOR": allocator} if allocator else env
        return [str(harness.ROOT / "launch.sh"), str(ranks), str(EXAMPLE), *common, *flags, "--out", str(out)], run_env
    preload = [libs[x] for x in levers if x in libs]
    run_env = {**env, "LD_PRELOAD": ":".join(preload)} if preload else env
    script = [str(harness.BENCH / "plain_image.py"), *common, *(PLAIN_FLAGS[x] for x in levers if x in PLAIN_FLAGS)]
    if ranks == 1:
        return [sys.executable, *script], run_env
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", str(ranks)]
    return [*torchrun, *script, "--numa-split"], run_env


def read_log(text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A run's JSON lines -> (step records as stats.py reads them, the summary)."""
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}")]
    steps = [{"step": r["step"], "t": r["elapsed"], "samples": r["samples"], "loss": r["loss"]}
             for r in rows if "elapsed" in r]
    found = [r for r in rows if r.get("summary")]
    if not found or not steps:
        raise RuntimeError("the run printed no step records or no summary line")
    return steps, found[-1]


def run_once(variant: str, cmd: list[str], env: dict[str, str], run_dir: Path,
             args: argparse.Namespace) -> dict[str, Any]:
    log = run_dir / f"{variant.replace('+', '-')}.log"
    wall, load_before = run_logged(variant, cmd, log, env, args.timeout)
    steps, summary = read_log(log.read_text())
    result = stats.run_result(steps, [{"step": steps[-1]["step"], "eval_accuracy": summary["eval_accuracy"]}],
                              args.warmup, wall)
    mfu = result["samples_per_s"] * summary["flops_per_sample"] / summary["matmul_flops"]
    facts = {k: summary.get(k) for k in ("precision", "channels_last", "compile", "ranks", "threads", "ld_preload",
                                         "flops_per_sample", "matmul_flops")}
    return {"variant": variant, **result, "mfu": mfu, **facts, "load_avg_before": load_before, "log": str(log)}


def summarize(raw: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    """stats.summarize's medians and ratios, plus MFU: against the run's own precision's matmul rate (corecpu's
    definition) and, for bf16 runs, against the fp32 rate of the same ranks x threads: on a CPU without bf16
    instructions the bf16 matmul is far slower than fp32's, and a share of it flatters the run."""
    result = stats.summarize(raw, order, baseline=BASELINE)
    fp32 = {(r["ranks"], r["threads"]): r["matmul_flops"] for r in raw if r["precision"] == "fp32"}
    for v, m in result["medians"].items():
        runs = [r for r in raw if r["variant"] == v]
        m["mfu"] = statistics.median(r["mfu"] for r in runs)
        rate = fp32.get((runs[0]["ranks"], runs[0]["threads"]))
        m["mfu_fp32"] = m["samples_per_s"] * runs[0]["flops_per_sample"] / rate if rate else None
        m.update({k: runs[0][k] for k in ("precision", "channels_last", "compile", "ranks", "threads", "ld_preload")})
    return result


def markdown(result: dict[str, Any]) -> str:
    cfg, mach = result["config"], result["machine"]
    lines = [f"**{cfg['model']}, {cfg['image_size']} px, global batch {cfg['batch_size']}, {cfg['steps']} steps (first "
             f"{cfg['warmup']} untimed), median of {cfg['repeats']} interleaved repeats | CPU: {mach['cpu_model']} "
             f"({mach['usable_cpus']} CPUs, {cfg['numa_nodes']} NUMA node(s); {stats.flags_text(mach['cpu_flags'])})**",
             "", "| variant | precision | channels_last | compile | ranks x threads | allocator | samples/s | "
             "min-max | vs plain | final loss | eval acc | MFU | MFU of fp32's rate |",
             "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for v, m in result["medians"].items():
        r = result["ratios"].get(v)
        alloc = Path(m["ld_preload"].split(":")[0]).name if m.get("ld_preload") else "glibc"
        ratio = f"{r['throughput']:.2f}x" if r else "-"
        of_fp32 = f"{100 * m['mfu_fp32']:.1f}%" if m.get("mfu_fp32") else "-"
        lines.append(f"| {v} | {m['precision']} | {'on' if m['channels_last'] else 'off'} | "
                     f"{'on' if m['compile'] else 'off'} | {m['ranks']} x {m['threads']} | {alloc} | "
                     f"{m['samples_per_s']:.2f} | {m['samples_per_s_min']:.2f}-{m['samples_per_s_max']:.2f} | "
                     f"{ratio} | "
                     f"{m['final_loss']:.3f}{'' if m['loss_ok_all'] else ' NOT FINITE'} | "
                     f"{m['eval_accuracy']:.3f} | {100 * m['mfu']:.1f}% | {of_fp32} |")
    notes = [cfg["split_note"], *(f"{v}: skipped, {why}" for v, why in result.get("skipped", {}).items())]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


def main() -> None:
    args = parse_args()
    if args.report:
        print(markdown(json.loads(args.report.read_text())))
        return
    nodes = numa_nodes()
    args.split_ranks = args.split_ranks or (nodes if nodes > 1 else 2)
    libs = allocators()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="corecpu-image-bench-"))
    env = {k: v for k, v in os.environ.items() if k not in harness.THREAD_VARS}
    planned = {v: command(v, args, work, libs, env) for v in args.order}
    skipped = {v: why for v, why in planned.items() if isinstance(why, str)}
    order = [v for v in args.order if v not in skipped]
    for v, why in skipped.items():
        print(f"skipping {v}: {why}", flush=True)
    print(f"image benchmark: variants {order}; {split_note(args.split_ranks, nodes)}; logs in {work}", flush=True)
    raw = []
    for rep in range(1, args.repeats + 1):
        run_dir = work / f"repeat{rep}"
        run_dir.mkdir(parents=True, exist_ok=True)
        for v in order:
            cmd, run_env = command(v, args, run_dir, libs, env)  # type: ignore[misc]
            r = run_once(v, cmd, run_env, run_dir, args)
            raw.append({"repeat": rep, "command": cmd, **r})
            print(f"repeat {rep}/{args.repeats} {v:<24} {r['samples_per_s']:8.2f} samples/s  wall {r['wall_s']:6.1f}s  "
                  f"eval acc {r['eval_accuracy']:.3f}  MFU {100 * r['mfu']:.1f}%  ({r['precision']}, "
                  f"load {r['load_avg_before']:.1f})", flush=True)
    config = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size, "steps": args.steps,
              "warmup": args.warmup, "eval_size": args.eval_size, "repeats": args.repeats, "variants": order,
              "split_ranks": args.split_ranks, "numa_nodes": nodes, "split_note": split_note(args.split_ranks, nodes),
              "allocators_found": libs}
    result = {"config": config, "machine": machine(), **summarize(raw, order), "skipped": skipped, "raw": raw,
              "method": "samples_per_s = global samples of steps W+1..S / their time (rank 0's clock at each step's "
                        "end); wall_s = the whole command; MFU = samples_per_s x FLOPs per trained image "
                        "(FlopCounterMode) / the job's matmul rate in the run's precision (corecpu.compute.flops)"}
    out = args.out or harness.BENCH / "results" / f"image-{args.model}-{args.image_size}px-b{args.batch_size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{markdown(result)}\nwritten to {out}")


if __name__ == "__main__":
    main()
