"""Gradient clipping for `run.clip_grad_norm_`: torch's clip_grad_norm_ with two passes over memory fewer.

torch.nn.utils.clip_grad_norm_ reads every gradient once for the norm and then reads and writes every gradient
again to scale it. For MiniLM on one core of the development Xeon that was 21 ms of a 320 ms step: 10 ms of norm
and 11 ms of multiplies, half of each on the 30,522 x 384 word embedding whose rows are nearly all zero.

- **The scale goes into the optimizer's step.** torch's fused Adam/AdamW divides each gradient by the optimizer's
  `grad_scale` tensor inside its one pass over parameters, gradients and moments (GradScaler's unscale uses this),
  and writes the divided gradient back. Setting `grad_scale` to 1 / clip coefficient clips for free (measured with
  MiniLM's parameter shapes on one core: norm + clip + step 53.6 ms, norm + step with the scale 44.0 ms, the step
  alone 35.2 ms). A post-step hook removes the attribute, so a later step without clipping is plain. Until that
  step, the gradients are not yet clipped: read them from the optimizer step on, or pass fold=False. A step whose
  norm is under the limit (coefficient 1) is given no scale at all, in either path: torch's multiply by 1 changes
  nothing, and the step then need not write the gradients back.
- **The embedding's norm from its touched rows.** Where sparse_rows reduced the word embedding's gradient by the
  rows some rank touched, every other row is zero on every rank, so the norm of those rows is the norm of the
  tensor (summed in another order: equal up to fp32 rounding). Used only while the gradient is exactly the one
  sparse_rows wrote (same tensor, same version); otherwise the whole tensor is read. In one process the kept
  embedding gradient (corecpu.compute.embedding_grad) vouches for its written rows the same way.

- **The norm on every thread.** torch reads each whole gradient on one thread for its norm; `total_norm` takes a
  large gradient's norm by rows, on all of them, and more exactly (see there). Gradients all smaller than
  BY_ROWS_FROM get torch's norm bit for bit.

Anything else (IPEX's optimizer, a non-fused or other optimizer, gradients the optimizer does not update, a
GradScaler's own `grad_scale`) gets torch's in-place multiply, with the coefficient of that norm.
`grad_clip="torch"` (`--grad-clip torch`) calls torch.nn.utils.clip_grad_norm_ itself: its rounding bit for bit,
where the fused step's g / (1/c), the row-wise norms and the embedding rows' norm differ from it in the last bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch

from corecpu.distributed.row_step import RowSource
from corecpu.errors import CoreCPUError

if TYPE_CHECKING:
    from corecpu.distributed.shared_adamw import SharedAdamW


_EPS = 1e-6  # torch's clip_grad_norm_: max_norm / (total_norm + 1e-6)
# A gradient this large (elements) has its norm taken over rows of _ROW elements on every thread; a smaller one as
# torch takes it, so a model of small tensors gets torch's norm bit for bit.
BY_ROWS_FROM = 1 << 16
_ROW = 4096
GRAD_CLIP_CHOICES = ("fused", "torch")


def folds_into(optimizer: torch.optim.Optimizer | None) -> bool:
    """Whether `optimizer` applies a `grad_scale` inside its step: torch's fused Adam or AdamW."""
    return (isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and bool(optimizer.defaults.get("fused"))
            and not hasattr(optimizer, "grad_scale"))


def _row_norms(t: torch.Tensor) -> torch.Tensor:
    """fp32 norms of `t`'s consecutive runs of _ROW elements (and of its tail): their 2-norm is t's."""
    flat = t.reshape(-1)
    body = flat.numel() - flat.numel() % _ROW
    parts = [torch.linalg.vector_norm(flat[:body].view(-1, _ROW), dim=1, dtype=torch.float32)]
    if body < flat.numel():
        parts.append(torch.linalg.vector_norm(flat[body:], dtype=torch.float32).reshape(1))
    return torch.cat(parts)


def total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all of `tensors` together, as torch.nn.utils.get_total_norm gives it, but with every large
    tensor's norm taken by rows.

    torch's CPU norm of a whole tensor is a reduction to one value, which its kernel splits over outputs: one
    thread reads the whole gradient, summing in one fp32 chain. Over rows, every thread takes rows, and each
    row's short sum is exact to a few ulps. On the 2-vCPU Zen 5, BERT-base's 201 gradients (109.5M values): 16.0 ms
    at two threads against 12.0 by rows (the same at one thread: two cores share the memory bandwidth), relative
    error 3.0e-4 against 5.3e-8 (float64's norm as the truth). A 16-thread rank would otherwise read 440 MB on one
    core each step. Where there is no large tensor this is torch's computation, bit for bit."""
    if not tensors:
        return torch.tensor(0.0)
    large = [t for t in tensors if t.numel() >= BY_ROWS_FROM]
    small = [t for t in tensors if t.numel() < BY_ROWS_FROM]
    # One call for the small ones: torch's CPU foreach norm is vector_norm per tensor, the same bits, less Python.
    norms = list(torch._foreach_norm(small)) if small else []
    if not large:
        return torch.linalg.vector_norm(torch.stack(norms))
    parts = [_row_norms(t) for t in large]
    if norms:
        parts.append(torch.stack(norms).to(torch.float32))
    return torch.linalg.vector_norm(torch.cat(parts))


class GradientClipper:
    """Clips `parameters`' gradients to a global 2-norm, the way torch.nn.utils.clip_grad_norm_ does, folding the
    scale into `optimizer`'s step where it can (see the module docstring). One per wrapped model."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None,
                 rows: Iterable[RowSource] = (), kernel: str = "fused", shared: SharedAdamW | None = None) -> None:
        """`shared`: the optimizer sharded through shared memory; the norm is then its summed gradients'
        (each rank's slice, one scalar all-reduce) and the scale goes into its step, whatever `kernel` says."""
        if kernel not in GRAD_CLIP_CHOICES:
            raise CoreCPUError(f"grad_clip must be one of {', '.join(GRAD_CLIP_CHOICES)}, got {kernel!r}")
        self.parameters = [p for p in parameters if p.requires_grad]
        self.optimizer = optimizer
        self.rows = list(rows)  # the first that vouches for a gradient is used
        self.kernel = kernel
        self.shared = shared
        self._updated = ({id(p) for g in optimizer.param_groups for p in g["params"]}
                         if kernel == "fused" and folds_into(optimizer) and shared is None else set())
        self.folded = False  # whether the last call left its scale to the optimizer's step
        if self._updated:
            optimizer.register_step_post_hook(self._forget_scale)  # type: ignore[union-attr]

    def __call__(self, max_norm: float, fold: bool = True) -> torch.Tensor:
        """The gradients' total 2-norm before clipping (a 0-d tensor); scales them by max_norm / (norm + 1e-6)
        where that is below 1: in the optimizer's next step when `fold` and it can, else now."""
        if self.shared is not None:
            total = self.shared.grad_norm()
            coefficient = torch.clamp(max_norm / (total + _EPS), max=1.0)
            self.shared.coefficient = None if coefficient.item() == 1.0 else coefficient
            self.folded = self.shared.coefficient is not None
            return total
        if self.kernel == "torch":
            return torch.nn.utils.clip_grad_norm_(self.parameters, max_norm)
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        total = total_norm([self._normed(p) for p in self.parameters if p.grad is not None])
        coefficient = torch.clamp(max_norm / (total + _EPS), max=1.0)
        if coefficient.item() == 1.0:  # under the limit: torch multiplies by 1, which changes no bit (NaN is not 1)
            self.folded = False  # and the fused step skips its write-back of the gradients: 0.9 ms for MiniLM
            return total
        self.folded = fold and bool(self._updated) and all(id(p) in self._updated for p in self.parameters
                                                          if p.grad is not None)
        if self.folded:
            self.optimizer.grad_scale = coefficient.reciprocal()  # type: ignore[union-attr]
        else:
            torch._foreach_mul_(grads, coefficient)
        return total

    def describe(self) -> str:
        """config.json's `decisions` entry: where the scale is applied, and why."""
        if self.shared is not None:
            return ("shm (the norm of the ranks' summed gradients from each rank's slice; the scale inside the "
                    "sharded fused step)")
        if self.kernel == "torch":
            return "torch (requested: torch.nn.utils.clip_grad_norm_, its rounding bit for bit)"
        if self._updated:
            return "fused (the scale inside the fused AdamW's step: one pass over the gradients fewer)"
        return "torch (the optimizer is not torch's fused Adam or AdamW: the scale is multiplied in place)"

    def _normed(self, param: torch.nn.Parameter) -> torch.Tensor:
        """What to take `param`'s gradient norm over: the rows a source vouches for (the embedding's), else all."""
        for source in self.rows:
            if param is source.weight and (rows := source.reduced_rows(param.grad)) is not None:  # type: ignore[arg-type]
                return param.grad.index_select(0, rows)  # type: ignore[union-attr]
        return param.grad  # type: ignore[return-value]

    def _forget_scale(self, optimizer: torch.optim.Optimizer, *args: object) -> None:
        if hasattr(optimizer, "grad_scale"):
            del optimizer.grad_scale
        self.folded = False


__all__ = ["GRAD_CLIP_CHOICES", "GradientClipper", "folds_into", "total_norm"]
