"""--keep-best METRIC: which evaluation score ranks checkpoints, and which way is better.

    best = BestMetric.parse("f1")            # eval_f1, higher is better
    best = BestMetric.parse("eval_loss")     # lower is better: "loss" is in MINIMIZED
    best = BestMetric.parse("eval_loss:max") # the direction said explicitly wins over the table

Names are the keys of the eval records in metrics.jsonl (eval_loss, eval_accuracy, eval_f1,
eval_exact_match, eval_perplexity, ...); the "eval_" prefix may be left out. Pure: no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from corecpu.errors import CoreCPUError

# Last words of metric names where lower is better; every other metric is maximised.
MINIMIZED = ("loss", "perplexity", "mse", "mae", "rmse", "error", "wer", "cer")
DIRECTIONS = ("min", "max")
PREFIX = "eval_"


@dataclass(frozen=True)
class BestMetric:
    name: str  # as in the eval records: eval_f1
    mode: str  # "min" or "max"

    @classmethod
    def parse(cls, spec: str) -> BestMetric:
        """`METRIC` or `METRIC:min|max`; one CoreCPUError line naming the fix for anything else."""
        metric, _, mode = spec.strip().partition(":")
        if mode and mode not in DIRECTIONS:
            raise CoreCPUError(f"--keep-best {spec}: the direction after ':' must be min or max (e.g. eval_loss:min)")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", metric):
            raise CoreCPUError(f"--keep-best {spec!r} is not a metric name; pass an eval metric such as eval_loss, "
                               "eval_accuracy or eval_f1 (optionally :min or :max)")
        name = metric if metric.startswith(PREFIX) else PREFIX + metric
        return cls(name, mode or default_mode(name))

    def better(self, new: float, old: float | None) -> bool:
        """Whether `new` beats `old` (None: nothing yet); a tie keeps the earlier one, NaN never wins."""
        if not math.isfinite(new):
            return False
        return old is None or (new < old if self.mode == "min" else new > old)

    def describe(self) -> str:
        return f"{self.name} ({'lowest' if self.mode == 'min' else 'highest'} is best)"


def default_mode(name: str) -> str:
    """min for a loss-like name (its last word in MINIMIZED), else max."""
    return "min" if name.rsplit("_", 1)[-1].lower() in MINIMIZED else "max"


def check_known(metric: BestMetric, known: tuple[str, ...], task: str) -> None:
    """One line when the task declares its metrics (TaskOptions.eval_metrics) and `metric` is not one."""
    if known and metric.name not in known:
        raise CoreCPUError(f"--keep-best {metric.name}: --task {task} reports no such metric; use one of "
                           f"{', '.join(known)}")
