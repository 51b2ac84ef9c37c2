"""`corecpu report`: one run (or two, overlaid) as a PNG and a short text summary.

Reads what train.py writes to --output-dir: metrics.jsonl (required), summary.json,
config.json and topology.json (each optional; a missing one becomes a note).

    run = load_run("runs/default")
    print(summarize(run))
    render([run, load_run("runs/other")], Path("report.png"))
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from corecpu.errors import CoreCPUError, install_extra
from corecpu.cpu.cpulist import format_cpu_list

COLORS = ("tab:blue", "tab:orange")


@dataclass
class RunRecords:
    path: Path
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.resolve().name or str(self.path)


# ---------------------------------------------------------------- reading

def _json(path: Path, notes: list[str]) -> Any:
    if not path.is_file():
        notes.append(f"no {path.name}")
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        notes.append(f"{path.name} is not valid JSON (a run still writing it?); ignored")
        return None


def load_run(path: str | Path) -> RunRecords:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not path.is_dir():
        raise CoreCPUError(f"run directory '{path}' not found; pass the --output-dir of a training run")
    if not metrics.is_file():
        raise CoreCPUError(f"'{path}' has no metrics.jsonl, so it is not a corecpu run directory; pass the "
                           "--output-dir of a training run")
    notes: list[str] = []
    rows, torn = [], 0
    for line in metrics.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            torn += 1  # the last line of a run that is still writing, or one that crashed
    if torn:
        notes.append(f"skipped {torn} unreadable line(s) of metrics.jsonl")
    train = [r for r in rows if "loss" in r and "step" in r]
    evals = [r for r in rows if "step" in r and any(k.startswith("eval_") for k in r)]
    if not train and not evals:
        notes.append("metrics.jsonl has no records yet")
    summary = _json(path / "summary.json", notes) or {}
    if not summary and "no summary.json" in notes:
        notes[notes.index("no summary.json")] = "no summary.json (the run has not finished)"
    config = _json(path / "config.json", notes) or {}
    topology = _json(path / "topology.json", notes) or {}
    return RunRecords(path, train, evals, summary, config, list(topology.get("ranks", [])), notes)


# ---------------------------------------------------------------- text

def _fmt(value: Any, spec: str = ".4f") -> str:
    return "n/a" if value is None else format(value, spec)


def throughput(run: RunRecords) -> float | None:
    """Samples/s after warm-up: the summary's figure, else the median of logged intervals but the first."""
    if run.summary.get("samples_per_s_after_warmup") is not None:
        return float(run.summary["samples_per_s_after_warmup"])
    rates = [r["samples_per_s"] for r in run.train[1:] if "samples_per_s" in r]
    return statistics.median(rates) if rates else None


def binding_lines(ranks: Sequence[dict[str, Any]]) -> list[str]:
    return [f"rank {i} on {r.get('host', '?')}: CPUs {format_cpu_list(r.get('cpus', [])) or '?'}, "
            f"{r.get('torch_threads', '?')} thread(s) ({r.get('binding', 'binding not recorded')})"
            for i, r in enumerate(ranks)]


def _is_qa(run: RunRecords) -> bool:
    """QA runs score exact match and F1 in percent (SQuAD's convention); classification in [0, 1]."""
    return any("eval_exact_match" in r for r in run.evals)


def summarize(run: RunRecords) -> str:
    cfg = run.config
    steps = run.summary.get("steps", run.train[-1]["step"] if run.train else 0)
    world = len(run.ranks) or len(run.summary.get("ranks", [])) or None
    lines = [f"run {run.path}: {steps} steps on {world or '?'} rank(s)"
             + (f"; model {cfg.get('model')}, data {cfg.get('data')}, batch {cfg.get('batch_size')} per rank x "
                f"{cfg.get('grad_accum')} accum, lr {cfg.get('lr')}, precision {cfg.get('precision')}" if cfg else "")]
    final_loss = run.summary.get("final_loss", run.train[-1]["loss"] if run.train else None)
    lines.append(f"final train loss {_fmt(final_loss)}"
                 + (f" (first logged {run.train[0]['loss']:.4f} at step {run.train[0]['step']})" if run.train else ""))
    if run.evals and _is_qa(run):
        best = max(run.evals, key=lambda r: r.get("eval_f1", float("-inf")))
        last = run.evals[-1]
        lines.append(f"best eval F1 {_fmt(best.get('eval_f1'), '.2f')} at step {best['step']} (epoch "
                     f"{best.get('epoch', 0) + 1}); last eval: exact match {_fmt(last.get('eval_exact_match'), '.2f')}, "
                     f"F1 {_fmt(last.get('eval_f1'), '.2f')} (SQuAD scores, percent)")
    elif run.evals:
        best = max(run.evals, key=lambda r: r.get("eval_accuracy", float("-inf")))
        last = run.evals[-1]
        lines.append(f"best eval accuracy {_fmt(best.get('eval_accuracy'))} at step {best['step']} (epoch "
                     f"{best.get('epoch', 0) + 1}); last eval: loss {_fmt(last.get('eval_loss'))}, accuracy "
                     f"{_fmt(last.get('eval_accuracy'))}, F1 {_fmt(last.get('eval_f1'))}")
    else:
        lines.append("no evaluation records")
    lines.append(f"throughput {_fmt(throughput(run), '.1f')} samples/s after warm-up"
                 + (f"; {run.summary['seconds']:.1f} s in all" if run.summary.get("seconds") else ""))
    lines += binding_lines(run.ranks) or ["binding: no topology.json"]
    lines += [f"note: {n}" for n in run.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------- figure

def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _binding_panel(ax: Any, run: RunRecords, color: str) -> None:
    import numpy as np
    from matplotlib.colors import ListedColormap

    ax.set_title(f"CPU binding: {run.name} (filled: CPUs the rank may run on)", fontsize=10)
    ranks = run.ranks
    if not ranks:
        ax.text(0.5, 0.5, "no topology.json", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ncpu = max((max(r.get("cpus") or [0]) for r in ranks), default=0) + 1
    grid = np.zeros((len(ranks), ncpu))
    for i, r in enumerate(ranks):
        grid[i, r.get("cpus", [])] = 1
    ax.imshow(grid, cmap=ListedColormap(["#eeeeee", color]), vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(ranks)), [f"rank {i} @{r.get('host', '?')}\n{r.get('torch_threads', '?')} thr"
                                      for i, r in enumerate(ranks)], fontsize=8)
    step = max(1, ncpu // 16)
    ax.set_xticks(range(0, ncpu, step))
    ax.set_xlabel("CPU id")
    # Cell borders make single-CPU bindings readable on wide machines.
    ax.set_xticks(np.arange(-0.5, ncpu, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(ranks), 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)


def render(runs: Sequence[RunRecords], out: Path) -> Path:
    """Write the figure for one run, or two overlaid (blue, orange), to `out` (PNG)."""
    try:
        import matplotlib
    except ImportError:
        raise CoreCPUError(f"corecpu report draws with matplotlib; {install_extra('report')}") from None
    matplotlib.use("Agg")  # files only: no display on a cluster node
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    (ax_loss, ax_lr, ax_tp), (ax_eval, ax_bind, ax_last) = axes
    for i, (run, color) in enumerate(zip(runs, COLORS)):
        # The first run wide and pale, the second thin on top: identical curves stay visible as both.
        style = {"linewidth": 3.5, "alpha": 0.55} if len(runs) > 1 and i == 0 else {"linewidth": 1.3}
        ax_loss.plot(*_series(run.train, "loss"), color=color, label=f"{run.name} loss" if len(runs) > 1 else "train loss",
                     **style)
        xs, ys = _series(run.evals, "eval_loss")
        if xs:
            ax_loss.plot(xs, ys, "o--", color=color, label=f"{run.name} eval loss" if len(runs) > 1 else "eval loss",
                         markersize=9 - 4 * i, **style)
        ax_lr.plot(*_series(run.train, "lr"), color=color, label=run.name if len(runs) > 1 else None, **style)
        ax_tp.plot(*_series(run.train, "samples_per_s"), color=color, label=run.name if len(runs) > 1 else "logged",
                   **style)
        rate = throughput(run)
        if rate is not None:
            ax_tp.axhline(rate, color=color, linestyle=":", label=f"{run.name}: {rate:.1f} after warm-up")
        epochs = [r.get("epoch", 0) + 1 for r in run.evals]
        scale = 100.0 if _is_qa(run) else 1.0  # one axis for both: QA's percent as fractions
        for key, marker in (("eval_accuracy", "o"), ("eval_exact_match", "o"), ("eval_f1", "s")):
            ys = [None if r.get(key) is None else r[key] / scale for r in run.evals]
            if any(y is not None for y in ys):
                ax_eval.plot(epochs, ys, marker=marker, color=color, linestyle="--" if key == "eval_f1" else "-",
                             label=f"{run.name} {key[5:]}" if len(runs) > 1 else key[5:], markersize=9 - 4 * i,
                             **style)
    for ax, title, ylabel in ((ax_loss, "loss", "loss"), (ax_lr, "learning rate", "lr"),
                              (ax_tp, "throughput (all ranks)", "samples/s")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax_eval.set_title("evaluation per epoch", fontsize=10)
    ax_eval.set_xlabel("epoch")
    ax_eval.set_ylim(-0.02, 1.02)
    if not any(run.evals for run in runs):
        ax_eval.text(0.5, 0.5, "no evaluation records", ha="center", va="center", transform=ax_eval.transAxes)
    else:
        epochs = sorted({r.get("epoch", 0) + 1 for run in runs for r in run.evals})
        ax_eval.set_xticks(epochs)
        ax_eval.set_xlim(epochs[0] - 0.5, epochs[-1] + 0.5)  # one epoch would otherwise get a +-0.04 axis
        for r in runs[0].evals:
            head = r.get("eval_accuracy", r.get("eval_exact_match", 0) / 100)
            ax_eval.annotate(f"step {r['step']}", (r.get("epoch", 0) + 1, head), fontsize=7,
                             textcoords="offset points", xytext=(4, 4))
    for ax in (ax_loss, ax_lr, ax_tp, ax_eval):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    _binding_panel(ax_bind, runs[0], COLORS[0])
    if len(runs) > 1:
        _binding_panel(ax_last, runs[1], COLORS[1])
    else:
        ax_last.set_axis_off()
        ax_last.text(0, 1, _wrap(summarize(runs[0])), va="top", ha="left", fontsize=8, family="monospace",
                     transform=ax_last.transAxes)
    title = " vs ".join(run.name for run in runs)
    fig.suptitle(f"corecpu run: {title}", fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _wrap(text: str, width: int = 62) -> str:
    import textwrap

    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ") for line in text.splitlines())
