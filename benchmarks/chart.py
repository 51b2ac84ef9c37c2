"""Bar chart of a throughput result: median samples/s per variant, min-max whiskers, eval accuracy on each bar."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from stats import flags_text  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def bar_chart(result: dict[str, Any], path: Path) -> Path:
    med, cfg, mach = result["medians"], result["config"], result["machine"]
    names = list(med)
    values = [med[v]["samples_per_s"] for v in names]
    low = [med[v]["samples_per_s"] - med[v]["samples_per_s_min"] for v in names]
    high = [med[v]["samples_per_s_max"] - med[v]["samples_per_s"] for v in names]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(names)), 4.5))
    colors = ["tab:blue" if v.startswith("corecpu") else "tab:gray" for v in names]
    bars = ax.bar(names, values, yerr=[low, high], capsize=4, color=colors)
    for bar, v in zip(bars, names):
        acc = med[v]["eval_accuracy"]
        ratio = result["ratios"].get(v, {}).get("throughput")
        label = f"{med[v]['samples_per_s']:.1f}" + (f" ({ratio:.2f}x)" if ratio else "")
        label += "\nacc " + ("-" if acc is None or math.isnan(acc) else f"{acc:.3f}")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 14),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("training samples/s (median, min-max)")
    ax.set_ylim(0, max(values) * 1.35)
    length = f"{cfg['max_steps']} steps" if cfg.get("max_steps") else f"{cfg['epochs']} epoch(s)"
    ax.set_title(f"{cfg['model']} on {cfg['data']}, {cfg['precision']}, global batch {cfg['global_batch']}, "
                 f"{length}, median of {cfg['repeats']}\n{mach['cpu_model']}, {mach['usable_cpus']} CPUs "
                 f"({flags_text(mach['cpu_flags'])})", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
