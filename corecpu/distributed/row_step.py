"""The shared AdamW step over a word embedding's rows: a row that no step's gradient has reached is not stepped.

A MiniLM step of short sentences writes a few hundred of the word embedding's 30,522 rows, and over a fine-tuning
run most rows are never written at all (the task's vocabulary). Such a row's gradient and both moments are zero, so
AdamW's update of it is only the decoupled weight decay, `w *= 1 - lr * wd`, and nothing at all without decay.
The fused kernel still reads and writes its weight, gradient and moments (28 bytes an element: 1.27 ns each inside
the 2-rank job on a 2-vCPU AMX Xeon, 14.9 ms for MiniLM's table), where the decay alone is a multiply (0.55 ns).

So for such a parameter each rank's part of the step is, by rows: the decay multiply over every row (unless the
group's weight decay is 0), then the kernel with weight decay 0 over the blocks of rows that any step has written.
Inside those blocks a never-written row is unchanged by the kernel (zero moments, zero gradient). The two steps give
the kernel's own result bit for bit: torch's CPU kernel decays with that same multiply before its update, which
`decay_split_is_exact()` checks on this machine once (a machine where it does not hold steps every row, as before).

The rows written so far ("touched") are the union, over the steps, of the rows every rank publishes for the summing
pass; a resumed state's rows with a nonzero moment count too. Every rank computes the same union, so every rank
computes the same partition of the step's work (`step_bounds`), which follows the touched rows as they grow.

Measured on a 2-vCPU AMX Xeon (MiniLM, bf16, 2 ranks, the short-sentence TSV of benchmarks/README.md, about 200 rows
written a step): the AdamW phase 12.2-12.4 ms a rank against 15.2-15.3 (`benchmarks/phases.py`, 2 interleaved pairs);
the 1-epoch job 272-280 samples/s against 264-276, whole command 18.9-19.3 s against 19.1-19.9 (4 ABBA pairs), with
the same final loss and accuracy.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, Sequence

import torch

BLOCK_ROWS = 16  # rows stepped as one: a kernel call costs about as much as stepping a few thousand elements
# Relative costs of an element in the partition, as timed inside the 2-rank MiniLM job on the 2-vCPU AMX Xeon
# (2026-12-01), where the table comes from memory: the fused kernel 1.27 ns, the decay multiply 0.55 ns (0.16 and
# 1.17 alone, with the table in the last-level cache).
KERNEL_COST = 1.0
DECAY_COST = 0.45


@functools.cache
def decay_split_is_exact() -> bool:
    """Whether this torch's fused AdamW kernel with weight decay wd equals, bit for bit, `w.mul_(1 - lr * wd)`
    followed by the kernel with weight decay 0 (on moments some of which are zero, with and without a grad scale)."""
    gen = torch.Generator().manual_seed(0)
    n = 4099  # not a multiple of any vector width: the kernel's scalar tail is checked too
    weight = torch.randn(n, generator=gen) * 0.05
    grad, exp_avg = torch.randn(n, generator=gen) * 1e-3, torch.randn(n, generator=gen) * 1e-4
    exp_avg_sq = torch.rand(n, generator=gen) * 1e-6
    for t in (grad, exp_avg, exp_avg_sq):
        t[::3] = 0.0
    for lr, wd, scale in ((5e-5, 0.01, None), (3.7e-4, 0.1, 2.5), (2.96e-7, 0.05, 0.7)):
        def step(decay: float, w: torch.Tensor) -> list[torch.Tensor]:
            out = [w.clone(), grad.clone(), exp_avg.clone(), exp_avg_sq.clone()]
            torch._fused_adamw_([out[0]], [out[1]], [out[2]], [out[3]], [], [torch.tensor(7.0)], lr=lr, beta1=0.9,
                                beta2=0.999, weight_decay=decay, eps=1e-8, amsgrad=False, maximize=False,
                                grad_scale=None if scale is None else torch.tensor(scale), found_inf=None)
            return out
        whole, split = step(wd, weight), step(0.0, weight.clone().mul_(1 - lr * wd))
        if not all(torch.equal(a, b) for a, b in zip(whole, split)):
            return False
    return True


def touched_from_moments(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor) -> torch.Tensor:
    """Rows (of 2-d moments) where either moment is nonzero: rows an earlier step's gradient reached."""
    return (exp_avg != 0).any(dim=1) | (exp_avg_sq != 0).any(dim=1)


def active_blocks(touched: torch.Tensor) -> torch.Tensor:
    """Per block of BLOCK_ROWS rows: whether any of its rows is touched."""
    pad = (-touched.numel()) % BLOCK_ROWS
    return torch.nn.functional.pad(touched, (0, pad)).view(-1, BLOCK_ROWS).any(dim=1)


def row_costs(active: torch.Tensor, rows: int, width: int, decays: bool) -> torch.Tensor:
    """Each row's cost in the step: the kernel where its block is active, the decay multiply everywhere (if any)."""
    per_row = active.repeat_interleave(BLOCK_ROWS)[:rows].to(torch.float64) * (KERNEL_COST * width)
    return per_row + (DECAY_COST * width if decays else 0.0)


def spans(active: torch.Tensor, first: int, end: int) -> list[tuple[int, int]]:
    """Runs of active blocks within rows [first, end), as (first row, end row), clipped to that range."""
    if first >= end:
        return []
    b0, b1 = first // BLOCK_ROWS, -(-end // BLOCK_ROWS)
    flags = active[b0:b1].to(torch.int8)
    edges = torch.diff(torch.nn.functional.pad(flags, (1, 1))).nonzero().flatten().tolist()
    out = []
    for start, stop in zip(edges[::2], edges[1::2]):
        lo, hi = max(first, (b0 + start) * BLOCK_ROWS), min(end, (b0 + stop) * BLOCK_ROWS)
        if lo < hi:
            out.append((lo, hi))
    return out


def step_bounds(sizes: Sequence[int], costs: Sequence[float | torch.Tensor], world: int) -> list[int]:
    """Pure: `world + 1` boundaries over the parameters' flat elements, each rank's [b[r], b[r+1]) about the same
    work. costs[p]: a float, the cost of each of parameter p's elements; or a tensor, the cost of each of its rows
    (a boundary inside such a parameter falls between two rows)."""
    totals = [float(c.sum()) if isinstance(c, torch.Tensor) else n * c for n, c in zip(sizes, costs)]
    whole = sum(totals)
    bounds, start, done, p = [0], 0, 0.0, 0
    for r in range(1, world):
        target = whole * r / world
        while p < len(sizes) and done + totals[p] <= target:
            done, start, p = done + totals[p], start + sizes[p], p + 1
        inside = 0
        if p < len(sizes):
            cost = costs[p]
            if isinstance(cost, torch.Tensor):
                row = int(torch.searchsorted(torch.cumsum(cost, 0), target - done, right=True))
                inside = min(sizes[p], row * (sizes[p] // max(1, cost.numel())))
            elif cost > 0:
                inside = min(sizes[p], round((target - done) / cost))
        bounds.append(max(bounds[-1], start + inside))
    bounds.append(sum(sizes))
    return bounds


class RowSource(Protocol):
    """Who knows which rows of `weight`'s gradient may be nonzero: sparse_rows' reducer, the kept embedding
    gradient. `reduced_rows(grad)`: those rows while `grad` is the tensor it vouches for, unwritten since; else None."""

    weight: torch.nn.Parameter

    def reduced_rows(self, grad: torch.Tensor) -> torch.Tensor | None: ...


def fused_adam_gap(optimizer: torch.optim.Optimizer) -> str:
    """Why `optimizer` is not torch's fused Adam or AdamW without the options a step by slices or rows leaves out
    (the shared step's and this module's); "" when it is."""
    if type(optimizer) not in (torch.optim.AdamW, torch.optim.Adam) or not optimizer.defaults.get("fused"):
        return "the optimizer is not torch's fused AdamW or Adam"
    for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
        if any(g.get(flag) for g in optimizer.param_groups):
            return f"the optimizer uses {flag}"
    return ""


def steppable(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the embedding of a run with `optimizer` can be stepped by rows (OneProcessRowStep)."""
    return not fused_adam_gap(optimizer) and decay_split_is_exact()


class OneProcessRowStep:
    """The same step for one process: torch's fused optimizer steps every parameter but the word embedding, which
    this steps by rows (a step pre-hook hides its gradient from torch's step, a post-hook gives it back). Its state
    is torch's (`step`, `exp_avg`, `exp_avg_sq`), so checkpoints and resumes do not change. A step whose rows the
    source cannot name (gradient accumulation, a writer it does not know), or whose written rows cover most of
    the table, is left to torch whole. On the 2-vCPU AMX Xeon (MiniLM, batch 16 x 17 tokens, about 2,500 rows
    written so far, weight decay 0.01) `optimizer.step()` took 12.9-13.3 ms against torch's 15.4-15.5 on two
    threads, 23.0-23.4 against 27.4-28.1 on one (medians of 30 steps, in-process); in the 1-rank TSV job that is
    inside the run-to-run noise (4 ABBA pairs: 168-185 samples/s either way, the same final loss)."""

    MOST = 0.5  # active blocks above this share: torch's one pass over the table is as cheap

    def __init__(self, optimizer: torch.optim.Optimizer, source: RowSource) -> None:
        self.optimizer, self.source = optimizer, source
        self.weight = source.weight
        self.group = next(g for g in optimizer.param_groups if any(p is self.weight for p in g["params"]))
        self.touched: torch.Tensor | None = None  # rows any step wrote; made at the first step (a resume's too)
        self.steps_by_rows = 0
        self._hidden: torch.Tensor | None = None
        optimizer.register_step_pre_hook(self._pre_step)
        optimizer.register_step_post_hook(self._post_step)

    def _pre_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        w, group = self.weight, self.group
        grad = w.grad
        if grad is None or w.dim() != 2:
            return
        decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))
        decay = float(group["weight_decay"])
        state = optimizer.state[w]
        if self.touched is None:
            self.touched = (touched_from_moments(state["exp_avg"], state["exp_avg_sq"]) if state
                            else torch.zeros(w.shape[0], dtype=torch.bool))
        rows = self.source.reduced_rows(grad)
        if rows is None:
            self.touched.fill_(True)
            return
        self.touched[rows] = True
        active = active_blocks(self.touched)
        if (decay and not decoupled) or float(active.float().mean()) > self.MOST:
            return
        if not state:  # as torch's fused step makes it
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(w, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(w, memory_format=torch.preserve_format)
        state["step"] += 1
        lr = float(group["lr"])
        if decay:
            w.data.mul_(1 - lr * decay)
        beta1, beta2 = group["betas"]
        kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
        width = w.shape[1]
        flat = [t.view(-1) for t in (w.data, grad, state["exp_avg"], state["exp_avg_sq"])]
        for r0, r1 in spans(active, 0, w.shape[0]):
            x, y = r0 * width, r1 * width
            kernel([flat[0][x:y]], [flat[1][x:y]], [flat[2][x:y]], [flat[3][x:y]], [], [state["step"]], lr=lr,
                   beta1=float(beta1), beta2=float(beta2), weight_decay=0.0, eps=float(group["eps"]),
                   amsgrad=False, maximize=False, grad_scale=getattr(optimizer, "grad_scale", None),
                   found_inf=getattr(optimizer, "found_inf", None))
        self.steps_by_rows += 1
        self._hidden, w.grad = grad, None  # torch's step skips a parameter without a gradient

    def _post_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        if self._hidden is not None:
            self.weight.grad, self._hidden = self._hidden, None


__all__ = ["BLOCK_ROWS", "OneProcessRowStep", "RowSource", "active_blocks", "decay_split_is_exact", "fused_adam_gap",
           "row_costs", "spans", "steppable", "step_bounds", "touched_from_moments"]
