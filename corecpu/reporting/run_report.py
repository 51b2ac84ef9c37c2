"""`corecpu report`: one run (or several, overlaid) as a PNG and a short text summary.

Reads what train.py writes to --output-dir: metrics.jsonl (required), summary.json,
config.json and topology.json (each optional; a missing one becomes a note).

    run = load_run("runs/default")
    print(summarize(run))
    render([run, load_run("runs/other")], Path("report.png"), x="samples")

The x-axis is optimizer steps, samples seen (comparable across world sizes and batch sizes) or wall
time. Scores are drawn in the unit the logs print: SQuAD's exact match and F1 in percent, accuracy and
F1 of classification as fractions (as percent too when a QA run is on the same axes).
"""

from __future__ import annotations

import bisect
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from corecpu.errors import CoreCPUError, install_extra
from corecpu.cpu.cpulist import format_cpu_list

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
X_AXES = {"steps": "optimizer step", "samples": "samples seen (all ranks)", "time": "wall time in the loop (s)"}


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

    @property
    def fractional_epochs(self) -> bool:
        """Records since issue 27 carry transformers' epoch (1.0 at the first epoch's end; they also carry
        learning_rate); earlier ones the 0-based index of the epoch, evaluated at its end."""
        return any("learning_rate" in r for r in self.train)

    def epoch(self, record: dict[str, Any]) -> float:
        """Epochs done at `record` (an evaluation at the first epoch's end: 1)."""
        value = float(record.get("epoch", 0))
        return value if self.fractional_epochs else value + 1

    def precision(self) -> Any:
        """What ran (config.json's resolved choice), else the flag."""
        return (self.config.get("resolved") or {}).get("precision") or self.config.get("precision")


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
                f"{cfg.get('grad_accum')} accum, lr {cfg.get('lr')}, precision {run.precision()}" if cfg else "")]
    final_loss = run.summary.get("final_loss", run.train[-1]["loss"] if run.train else None)
    lines.append(f"final train loss {_fmt(final_loss)}"
                 + (f" (first logged {run.train[0]['loss']:.4f} at step {run.train[0]['step']})" if run.train else ""))
    if run.evals and _is_qa(run):
        best = max(run.evals, key=lambda r: r.get("eval_f1", float("-inf")))
        last = run.evals[-1]
        lines.append(f"best eval F1 {_fmt(best.get('eval_f1'), '.2f')} at step {best['step']} (epoch "
                     f"{run.epoch(best):.3g}); last eval: exact match {_fmt(last.get('eval_exact_match'), '.2f')}, "
                     f"F1 {_fmt(last.get('eval_f1'), '.2f')} (SQuAD scores, percent)")
    elif run.evals:
        best = max(run.evals, key=lambda r: r.get("eval_accuracy", float("-inf")))
        last = run.evals[-1]
        lines.append(f"best eval accuracy {_fmt(best.get('eval_accuracy'))} at step {best['step']} (epoch "
                     f"{run.epoch(best):.3g}); last eval: loss {_fmt(last.get('eval_loss'))}, accuracy "
                     f"{_fmt(last.get('eval_accuracy'))}, F1 {_fmt(last.get('eval_f1'))}")
    else:
        lines.append("no evaluation records")
    tokens = [r["tokens_per_s"] for r in run.train[1:] if r.get("tokens_per_s")]
    padding = [r["padding"] for r in run.train if r.get("padding") is not None]
    lines.append(f"throughput {_fmt(throughput(run), '.1f')} samples/s after warm-up"
                 + (f", {statistics.median(tokens):.0f} tokens/s (median)" if tokens else "")
                 + (f", padding {statistics.mean(padding):.0%}" if padding else "")
                 + (f"; {run.summary['seconds']:.1f} s in all" if run.summary.get("seconds") else ""))
    if phases := run.summary.get("phases"):
        lines.append("time: " + ", ".join(f"{name[:-2].replace('_', '-')} {value:.1f} s" for name, value in phases.items()
                                          if isinstance(value, (int, float))))
    if (waited := run.summary.get("wait_after_warmup")) is not None:
        lines.append(f"lockstep: the ranks waited {waited:.1%} of the training time for each other (after warm-up)")
    if line := taken_line(run.summary.get("rank_cpu_taken_after_warmup")):
        lines.append(line)
    if run.summary.get("peak_rss_mb") is not None:
        lines.append(f"peak RSS {run.summary['peak_rss_mb']:.0f} MB (the highest rank)")
    lines += binding_lines(run.ranks) or ["binding: no topology.json"]
    lines += [f"note: {n}" for n in run.notes]
    return "\n".join(lines)


def taken_line(taken: Sequence[Mapping[str, float] | None] | None) -> str | None:
    """summary.json's rank_cpu_taken_after_warmup in one line: the most any rank lost to each, and which rank."""
    watched = [(r, t) for r, t in enumerate(taken or []) if t]
    if not watched:
        return None
    parts = []
    for key, what in (("others", "other processes"), ("steal", "the hypervisor (steal)")):
        rank, t = max(watched, key=lambda rt: rt[1].get(key, 0.0))
        parts.append(f"{what} up to {t.get(key, 0.0):.1%}" + (f" (rank {rank})" if len(watched) > 1 else ""))
    return "the ranks' CPU time taken after warm-up: " + ", ".join(parts)


# ---------------------------------------------------------------- figure

def x_values(run: RunRecords, x: str) -> Callable[[int], float]:
    """Where a step sits on the x-axis: the step, the samples seen by then (all ranks), or the seconds in the
    loop (a resumed run's clock continues from where the records before the resume stopped). A step with no
    training record (an evaluation between log steps) sits between its neighbours."""
    if x not in X_AXES:
        raise CoreCPUError(f"x-axis {x!r} is not one of: {', '.join(X_AXES)}")
    if x == "steps":
        return float
    steps: list[float] = []
    values: list[float] = []
    total = offset = last = 0.0
    for r in run.train:
        if x == "samples":
            total += r.get("samples", 0)
            value = total
        else:
            elapsed = float(r.get("elapsed_s", 0.0))
            if elapsed + offset < last:  # a resumed run's loop clock starts again at 0
                offset = last
            value = last = elapsed + offset
        steps.append(float(r["step"]))
        values.append(value)
    return lambda step: float(bisect_interp(steps, values, float(step)))


def bisect_interp(xs: Sequence[float], ys: Sequence[float], at: float) -> float:
    """ys linearly interpolated at `at` over increasing xs; the end values beyond them (0 with none)."""
    if not xs:
        return 0.0
    i = bisect.bisect_left(xs, at)
    if i < len(xs) and xs[i] == at:
        return ys[i]
    if i == 0 or i == len(xs):
        return ys[min(i, len(xs) - 1)]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (at - xs[i - 1]) / (xs[i] - xs[i - 1])


def _series(records: Sequence[dict[str, Any]], key: str, at: Callable[[int], float] = float,
            scale: float = 1.0) -> tuple[list[float], list[float]]:
    pts = [(at(r["step"]), r[key] * scale) for r in records if r.get(key) is not None]
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


def render(runs: Sequence[RunRecords], out: Path, x: str = "steps") -> Path:
    """Write the figure for one run, or several overlaid (blue, orange, green, ...), to `out` (PNG). `x`: steps,
    samples or time (the x-axis of every curve)."""
    try:
        import matplotlib
    except ImportError:
        raise CoreCPUError(f"corecpu report draws with matplotlib; {install_extra('report')}") from None
    matplotlib.use("Agg")  # files only: no display on a cluster node
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    (ax_loss, ax_lr, ax_tp), (ax_eval, ax_bind, ax_last) = axes
    many = len(runs) > 1
    percent = any(_is_qa(run) for run in runs)  # SQuAD's scores are percent; classification's join them there
    for i, (run, color) in enumerate(zip(runs, COLORS * (len(runs) // len(COLORS) + 1))):
        at = x_values(run, x)
        # The first run wide and pale, the others thin on top: identical curves stay visible as both.
        style = {"linewidth": 3.5, "alpha": 0.55} if many and i == 0 else {"linewidth": 1.3}
        ax_loss.plot(*_series(run.train, "loss", at), color=color, label=f"{run.name} loss" if many else "train loss",
                     **style)
        ex, ey = _series(run.evals, "eval_loss", at)
        if ex:
            ax_loss.plot(ex, ey, "o--", color=color, label=f"{run.name} eval loss" if many else "eval loss",
                         markersize=max(9 - 4 * i, 4), **style)
        ax_lr.plot(*_series(run.train, "lr", at), color=color, label=run.name if many else None, **style)
        ax_tp.plot(*_series(run.train, "samples_per_s", at), color=color, label=run.name if many else "logged",
                   **style)
        rate = throughput(run)
        if rate is not None:
            ax_tp.axhline(rate, color=color, linestyle=":", label=f"{run.name}: {rate:.1f} after warm-up")
        for key, marker in (("eval_accuracy", "o"), ("eval_exact_match", "o"), ("eval_f1", "s")):
            scale = 100.0 if percent and not _is_qa(run) else 1.0
            ex, ey = _series(run.evals, key, at, scale)
            if ex:
                ax_eval.plot(ex, ey, marker=marker, color=color, linestyle="--" if key == "eval_f1" else "-",
                             label=f"{run.name} {key[5:]}" if many else key[5:], markersize=max(9 - 4 * i, 4),
                             **style)
        if i == 0:
            for r in run.evals:
                head = r.get("eval_accuracy", r.get("eval_exact_match"))
                if head is not None:
                    ax_eval.annotate(f"epoch {run.epoch(r):.3g}", (at(r["step"]), head * (100.0 if percent and not
                                     _is_qa(run) else 1.0)), fontsize=7, textcoords="offset points", xytext=(4, 4))
    for ax, title, ylabel in ((ax_loss, "loss", "loss"), (ax_lr, "learning rate", "lr"),
                              (ax_tp, "throughput (all ranks)", "samples/s"), (ax_eval, "evaluation",
                              "score (%)" if percent else "score")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(ylabel)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax_eval.set_ylim(*((-2, 102) if percent else (-0.02, 1.02)))
    if not any(run.evals for run in runs):
        ax_eval.text(0.5, 0.5, "no evaluation records", ha="center", va="center", transform=ax_eval.transAxes)
    for ax in (ax_loss, ax_lr, ax_tp, ax_eval):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    _binding_panel(ax_bind, runs[0], COLORS[0])
    if len(runs) == 2:
        _binding_panel(ax_last, runs[1], COLORS[1])
    else:
        ax_last.set_axis_off()
        text = summarize(runs[0]) if not many else "\n".join(_one_line(run) for run in runs)
        ax_last.text(0, 1, _wrap(text), va="top", ha="left", fontsize=8, family="monospace",
                     transform=ax_last.transAxes)
    title = " vs ".join(run.name for run in runs)
    fig.suptitle(f"corecpu run: {title}", fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _one_line(run: RunRecords) -> str:
    """A run in a line, for the figure's comparison of three or more."""
    world = len(run.ranks) or len(run.summary.get("ranks", [])) or "?"
    final = run.summary.get("final_loss", run.train[-1]["loss"] if run.train else None)
    return (f"{run.name}: {world} rank(s), {run.precision()}, {_fmt(throughput(run), '.1f')} samples/s, "
            f"final loss {_fmt(final)}")


def _wrap(text: str, width: int = 62) -> str:
    import textwrap

    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ") for line in text.splitlines())
