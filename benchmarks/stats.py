"""Pure measurement and reporting for benchmarks/throughput.py: no processes, no files.

Every variant reduces to the same record format, built by the variant's own script:
  steps  [{"step": k, "t": rank-0 wall clock at the end of optimizer step k, "samples": global
          examples in step k (counted), "loss": mean loss over the global batch}, ...] for k = 1..S
  evals  [{"step": k, "eval_accuracy": .., "eval_f1": .., "eval_loss": ..}, ...] (evaluation after step k)
so throughput, medians, ratios and the tables are computed the same way for all.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

# The anchor of every ratio: the tuned Trainer where it ran, else the Trainer as users run it by default.
BASELINES = ("trainer_tuned", "trainer_ddp")
TUNED_BASELINES = ("trainer_tuned", "trainer_1proc_tuned")
SUMMARY_KEYS = ("samples_per_s", "ms_per_step", "wall_s", "eval_accuracy", "eval_f1", "final_loss")


def timed_window(steps: Sequence[dict[str, Any]], warmup: int, eval_after: Sequence[int] = ()) -> dict[str, float]:
    """Global samples per second over steps warmup+1..S from per-step end timestamps.

    The interval of step k is t[k] - t[k-1]. Intervals that contain an evaluation (one ran
    after step k-1) are left out, with their samples, so epoch-end evaluation does not count
    as training time; the same rule applies to every variant.
    """
    numbers = [r["step"] for r in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise ValueError(f"step records must be 1..S without gaps, got {numbers[:5]}... ({len(steps)} records)")
    if not 1 <= warmup < len(steps):
        raise ValueError(f"warm-up of {warmup} steps leaves nothing to time in a run of {len(steps)} steps; "
                         "lower --warmup or train longer")
    skip = set(eval_after)
    kept = [i for i in range(warmup, len(steps)) if steps[i - 1]["step"] not in skip]
    seconds = sum(steps[i]["t"] - steps[i - 1]["t"] for i in kept)
    samples = sum(steps[i]["samples"] for i in kept)
    if not kept or seconds <= 0:
        raise ValueError("no timed interval left after the warm-up and evaluations")
    tokens = ({"tokens_per_s": sum(steps[i]["tokens"] for i in kept) / seconds}
              if all("tokens" in steps[i] for i in kept) else {})  # real (unpadded) tokens, where the tool counts them
    return {"samples_per_s": samples / seconds, "timed_seconds": seconds, "timed_samples": samples,
            "timed_steps": len(kept), "ms_per_step": 1000 * seconds / len(kept), **tokens}


def run_result(steps: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]], warmup: int,
               wall_s: float) -> dict[str, Any]:
    """One run's numbers: throughput window, final evaluation, loss sanity, wall time."""
    losses = [r["loss"] for r in steps]
    head, tail = losses[:10], losses[-10:]
    last_eval = evals[-1] if evals else {}
    return {"wall_s": wall_s, "steps_run": len(steps), "samples_total": sum(r["samples"] for r in steps),
            **timed_window(steps, warmup, [e["step"] for e in evals]),
            "eval_accuracy": last_eval.get("eval_accuracy", math.nan), "eval_f1": last_eval.get("eval_f1", math.nan),
            "eval_loss": last_eval.get("eval_loss", math.nan), "eval_step": last_eval.get("step"),
            "final_loss": losses[-1], "loss_first10": statistics.fmean(head), "loss_last10": statistics.fmean(tail),
            "loss_ok": all(math.isfinite(x) for x in losses)}


def summarize(raw: Sequence[dict[str, Any]], variants: Sequence[str], baseline: str | None = None) -> dict[str, Any]:
    """Per-variant medians (and min-max of throughput) over repeats; ratios against `baseline` (default: the
    first of BASELINES that ran). wall_speedup is the baseline's wall time over the variant's (>1: faster)."""
    medians: dict[str, dict[str, Any]] = {}
    for v in variants:
        runs = [r for r in raw if r["variant"] == v]
        if not runs:
            continue
        m: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in SUMMARY_KEYS}
        m["samples_per_s_min"] = min(r["samples_per_s"] for r in runs)
        m["samples_per_s_max"] = max(r["samples_per_s"] for r in runs)
        m["repeats"] = len(runs)
        m["loss_ok_all"] = all(r["loss_ok"] for r in runs)
        medians[v] = m
    ratios: dict[str, dict[str, float]] = {}
    if baseline is None:  # the faster tuned Trainer (torchrun's ranks or one process) where both ran
        tuned = [b for b in TUNED_BASELINES if b in medians]
        baseline = (max(tuned, key=lambda b: medians[b]["samples_per_s"]) if tuned
                    else next((b for b in BASELINES if b in medians), BASELINES[0]))
    base = medians.get(baseline)
    if base:
        for v, m in medians.items():
            ratios[v] = {"throughput": m["samples_per_s"] / base["samples_per_s"],
                         "wall_time": m["wall_s"] / base["wall_s"],
                         "wall_speedup": base["wall_s"] / m["wall_s"],
                         "accuracy_delta": m["eval_accuracy"] - base["eval_accuracy"]}
    return {"medians": medians, "ratios": ratios, "baseline": baseline if base else None}


def flags_text(cpu_flags: dict[str, bool]) -> str:
    return ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu_flags.items())


def title(result: dict[str, Any]) -> str:
    cfg, mach = result["config"], result["machine"]
    length = f"max {cfg['max_steps']} steps" if cfg.get("max_steps") else f"{cfg['epochs']} epoch(s)"
    return (f"{cfg['model']} on {cfg['data']} | {cfg['precision']} | global batch {cfg['global_batch']} "
            f"({cfg['ranks']} ranks x {cfg['batch_size']}) | seq <= {cfg['max_seq_len']} | {length}, first "
            f"{cfg['warmup']} steps untimed | median of {cfg['repeats']} | "
            f"{cfg.get('background_load') or 'no'} busy background process(es) | CPU: {mach['cpu_model']} "
            f"({mach['usable_cpus']} CPUs; {flags_text(mach['cpu_flags'])})")


def headers(baseline: str | None) -> tuple[str, ...]:
    b = baseline or "baseline"
    return ("variant", "samples/s", "min-max", f"vs {b}", "ms/step", "wall s", f"{b} wall / wall",
            "eval acc", f"acc vs {b}", "eval F1", "final loss")


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for v, m in result["medians"].items():
        r = result["ratios"].get(v)
        rows.append((v, _fmt(m["samples_per_s"], ".1f"),
                     f"{m['samples_per_s_min']:.1f}-{m['samples_per_s_max']:.1f}",
                     f"{r['throughput']:.2f}x" if r else "-", _fmt(m["ms_per_step"], ".0f"), _fmt(m["wall_s"], ".1f"),
                     f"{r['wall_speedup']:.2f}x" if r else "-", _fmt(m["eval_accuracy"], ".4f"),
                     _fmt(r["accuracy_delta"], "+.4f") if r else "-", _fmt(m["eval_f1"], ".4f"),
                     _fmt(m["final_loss"], ".4f") + ("" if m["loss_ok_all"] else " NOT FINITE")))
    return rows


def verdict(result: dict[str, Any], variant: str = "corecpu", speedup: float | None = None,
            accuracy: float = 0.01) -> str | None:
    """The bar for `variant`: whole-command wall time >= speedup x faster than the baseline (default 1.25x
    on a quiet machine, 1.1x under --background-load), eval accuracy within `accuracy`."""
    r = result["ratios"].get(variant)
    if not r or result.get("baseline") is None or variant == result["baseline"]:
        return None
    if speedup is None:
        speedup = 1.1 if result["config"].get("background_load") else 1.25
    wall = r.get("wall_speedup", 1 / r["wall_time"])
    # "within 0.01" includes 0.01 itself, which float subtraction (0.81 - 0.80) overshoots.
    fast, close = wall >= speedup, abs(r["accuracy_delta"]) <= accuracy + 1e-9
    return (f"{variant} vs {result['baseline']}: {wall:.2f}x in wall time (target >= {speedup:.2f}x: "
            f"{'met' if fast else 'NOT met'}), {r['throughput']:.2f}x samples/s, eval accuracy "
            f"{r['accuracy_delta']:+.4f} (target within {accuracy}: {'met' if close else 'NOT met'})")


def markdown(result: dict[str, Any]) -> str:
    """The summary table as Markdown, with the configuration and CPU in a header line."""
    cols = headers(result.get("baseline"))
    lines = [f"**{title(result)}**", "", "| " + " | ".join(cols) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    check = verdict(result)
    return "\n".join(lines + (["", check] if check else [])) + "\n"
