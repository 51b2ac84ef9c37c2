"""Can the faster rank be given more of the batch ahead of time? Two ranks' step times, step by step.

    python benchmarks/lockstep_jitter.py                      # 2 ranks, 300 steps, MiniLM, batch 16 x 17 tokens
    python benchmarks/lockstep_jitter.py --steps 500 --out results/lockstep-jitter.json

Synchronous data parallelism waits every step for the slower rank (benchmarks/lockstep.py measures what that
costs). Waiting could only be avoided by splitting each global batch unevenly, more to the rank that will be
faster; that needs the next step's speed ratio to be predictable. Here each rank runs on its own CPU, one thread,
the same forward and backward on the same batch every step (no gradient exchanged), and the ranks meet at a
barrier before each step, so step k of both ranks runs at the same time. From the per-step times:

  lockstep  mean of the slower rank's step over the mean step, minus 1 (what waiting costs);
  autocorr  the lag-k autocorrelation of log(t0 / t1): near 0, the faster rank of one step says nothing of the next;
  ema[a]    what the wait would cost if each step split the work by an exponential average (weight a) of the past
            ratios (work proportional to the share, which favours the split);
  oracle    a split that knew each step's ratio in advance;
  steal     the share of the two CPUs' time the hypervisor gave to other guests meanwhile (/proc/stat): whether
            the jitter is the vCPUs being taken away or their speed while they run.

Only the standard library, torch and transformers; the ranks are forked processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

WARMUP = 10
ALPHAS = (0.1, 0.3, 0.5, 1.0)


def analyse(a: Sequence[float], b: Sequence[float]) -> dict[str, object]:
    """The figures above from two ranks' per-step times (seconds), the warm-up already left out."""
    mean = statistics.fmean([(x + y) / 2 for x, y in zip(a, b)])
    r = [math.log(x / y) for x, y in zip(a, b)]

    def autocorr(lag: int) -> float:
        if len(r) <= lag + 1:
            return float("nan")
        x, y = r[:-lag], r[lag:]
        mx, my = statistics.fmean(x), statistics.fmean(y)
        cov = sum((p - mx) * (q - my) for p, q in zip(x, y))
        var = math.sqrt(sum((p - mx) ** 2 for p in x) * sum((q - my) ** 2 for q in y))
        return cov / var if var else 0.0

    def ema_cost(alpha: float) -> float:
        guess, cost = 0.0, []
        for x, y, ratio in zip(a, b, r):
            share = 1.0 / (1.0 + math.exp(guess))  # rank 0's share when rank 0 is expected exp(guess) x slower
            cost.append(max(2 * share * x, 2 * (1 - share) * y))
            guess = (1 - alpha) * guess + alpha * ratio
        return statistics.fmean(cost) / mean - 1

    return {
        "steps": len(a), "mean_ms": [1e3 * statistics.fmean(a), 1e3 * statistics.fmean(b)],
        "lockstep": statistics.fmean([max(x, y) for x, y in zip(a, b)]) / mean - 1,
        "log_ratio_sd": statistics.pstdev(r),
        "autocorr": {lag: autocorr(lag) for lag in (1, 2, 5, 10)},
        "ema": {alpha: ema_cost(alpha) for alpha in ALPHAS},
        "oracle": statistics.fmean([2 * x * y / (x + y) for x, y in zip(a, b)]) / mean - 1,
    }


def _rank(rank: int, cpu: int, barrier: object, out: object, steps: int, model_dir: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir, num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config).train()
    ids, labels = torch.randint(1000, 20000, (16, 17)), torch.randint(0, 2, (16,))
    times = []
    for _ in range(steps):
        barrier.wait()  # type: ignore[attr-defined]
        start = time.perf_counter()
        model(input_ids=ids, labels=labels).loss.backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=False)
    out[rank] = times  # type: ignore[index]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--cpus", default="0,1", help="the two ranks' CPUs")
    p.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = p.parse_args()
    import multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from corecpu.cpu import contention
    from corecpu.training.modeling import default_model_dir  # the MiniLM that --model default trains

    cpus = [int(c) for c in args.cpus.split(",")]
    ctx = mp.get_context("fork")
    barrier, manager = ctx.Barrier(2), ctx.Manager()
    out = manager.dict()
    procs = [ctx.Process(target=_rank, args=(r, cpus[r], barrier, out, args.steps, str(default_model_dir())))
             for r in range(2)]
    before = contention.sample(cpus)
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    after = contention.sample(cpus)
    # The hypervisor's steal over the run: is the jitter the vCPUs being taken away, or their speed?
    stolen = contention.taken(before, after) if before and after else None
    if any(proc.exitcode for proc in procs):
        sys.exit("lockstep_jitter: a rank failed; see its output above")
    result = {"cpu": _cpu_model(), "cpus": cpus, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              **analyse(out[0][WARMUP:], out[1][WARMUP:]), "steal": stolen.steal if stolen else None,
              "times_s": [out[0], out[1]]}
    print(f"{result['steps']} steps, mean {result['mean_ms'][0]:.1f} / {result['mean_ms'][1]:.1f} ms: lockstep "
          f"{result['lockstep']:+.1%}; log ratio sd {result['log_ratio_sd']:.3f}, autocorrelation "
          + ", ".join(f"lag {k} {v:.2f}" for k, v in result["autocorr"].items()) + "; split by an average of past "
          "ratios " + ", ".join(f"{a}: {v:+.1%}" for a, v in result["ema"].items())
          + f"; knowing each step's ratio {result['oracle']:+.1%}"
          + (f"; the hypervisor's steal {stolen.steal:.2%} of the two CPUs' time" if stolen else ""))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
