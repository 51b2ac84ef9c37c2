"""Which ops of a one-rank training step do not speed up with more threads: the serial part a many-core rank waits on.

    python benchmarks/op_scaling.py                               # BERT-base-shaped, batch 16, 1 and 2 threads
    python benchmarks/op_scaling.py --model minilm --threads 1,4,16 --batch-size 32

For each thread count T it runs benchmarks/phases.py with one rank on CPUs 0..T-1 (taskset: corecpu gives the rank
every CPU it is allowed) and `--op-profile`, so the step is train.py's through the front door (corecpu's dropout,
embedding gradient, clipping, fused AdamW, autocast). It then lists each op's self CPU time per step at every T and
its speed-up from the fewest threads to the most. Ops that barely speed up are what Amdahl's law charges a
16-thread rank for; their sum at the most threads is printed. torch.profiler's own cost per op is in every figure
(it inflates small ops), so read the ratios, not the absolute times.

A flagged op is serial code or memory-bound work that one core already saturates (on the 2-vCPU Zen 5, torch's
fused AdamW, parallel in torch's source, gains nothing from a second thread). Check a flagged op alone against
one with the same memory traffic: torch's norm of a 23M-value gradient took 2.8 ms on one thread and 2.6 on two,
where a dot product over it went from 2.7 to 1.7 ms. That is how the serial norm in gradient clipping was found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import bert_base_random  # noqa: E402

SERIAL_BELOW = 1.25  # an op this much faster or less from the fewest threads to the most is flagged


def profile(threads: int, model: str, args: argparse.Namespace, out: Path) -> dict:
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    cmd = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, str(ROOT / "benchmarks" / "phases.py"),
           "--ranks", "1", "--model", model, "--data", args.data, "--batch-size", str(args.batch_size),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", args.precision,
           "--out", str(out / f"phases-t{threads}.json"), "--op-profile", str(out / f"ops-t{threads}.json")]
    print(f"threads {threads}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads((out / f"ops-t{threads}.json").read_text())


def table(profiles: dict[int, dict], top: int) -> tuple[list[str], float, float]:
    """Markdown rows for the `top` ops by time at the most threads, and the serial and total ms at the most."""
    low, high = min(profiles), max(profiles)
    ops_low, ops_high = profiles[low]["ops_ms_per_step"], profiles[high]["ops_ms_per_step"]
    rows = [f"| op | " + " | ".join(f"{t} thr ms" for t in sorted(profiles)) + f" | speed-up {low}->{high} |",
            "|---|" + "---:|" * (len(profiles) + 1)]
    serial = 0.0
    for name, ms in sorted(ops_high.items(), key=lambda kv: -kv[1]):
        speedup = ops_low.get(name, 0.0) / ms if ms else 0.0
        if speedup < SERIAL_BELOW:
            serial += ms
        if len(rows) < top + 2:
            cells = " | ".join(f"{profiles[t]['ops_ms_per_step'].get(name, 0.0):.2f}" for t in sorted(profiles))
            rows.append(f"| {name} | {cells} | {speedup:.2f}x{' (flagged)' if speedup < SERIAL_BELOW else ''} |")
    return rows, serial, sum(ops_high.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="bert-base", help="bert-base (random init, built here), minilm, tiny or a dir")
    p.add_argument("--vocab", type=Path, default=None, metavar="DIR",
                   help="--model bert-base's tokenizer (default: MiniLM's 30,522-token one)")
    p.add_argument("--data", default="paraphrase")
    p.add_argument("--threads", default="1,2", help="comma list; each needs that many allowed CPUs")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="bf16")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path, default=None, help="JSON of every profile and the table")
    args = p.parse_args()
    threads = sorted({int(t) for t in args.threads.split(",")})
    if threads[-1] > len(os.sched_getaffinity(0)) or len(threads) < 2:
        p.error(f"--threads needs two or more counts, each at most the {len(os.sched_getaffinity(0))} allowed CPUs")
    with tempfile.TemporaryDirectory(prefix="corecpu-op-scaling-") as tmp:
        work = Path(tmp)
        model = str(bert_base_random(work, args.vocab)) if args.model == "bert-base" else args.model
        profiles = {t: profile(t, model, args, work) for t in threads}
        phases = {t: json.loads((work / f"phases-t{t}.json").read_text()) for t in threads}
    rows, serial, total = table(profiles, args.top)
    print("\n" + "\n".join(rows))
    print(f"\nat {threads[-1]} threads: {serial:.1f} of {total:.1f} ms a step (self CPU, profiled) is in ops that "
          f"sped up less than {SERIAL_BELOW}x from {threads[0]} thread(s) (serial, or bandwidth-bound already)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": args.model, "batch_size": args.batch_size, "threads": threads,
                                        "profiles": profiles, "phases": phases, "serial_ms": serial,
                                        "serial_below": SERIAL_BELOW,
                                        "total_ms": total, "table": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
