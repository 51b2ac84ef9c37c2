"""Linear weights' gradients written straight into the shared gradient buffers, so the summing pass need not zero them.

Under bf16 autocast a Linear layer's weight gradient leaves its matmul in bf16, is cast up to a new fp32 tensor and
then added by autograd into the gradient the parameter already holds: on the shared step (corecpu.distributed.
shared_adamw) that is this rank's buffer in /dev/shm, which the summing pass zeroed after reading it, ready for
that add. Here the weight goes through a cast of its own (`_SunkCast`, the same round-to-nearest cast autocast
makes) whose backward writes the bf16 gradient into the buffer itself: a converting copy the first time in a step,
an add after that (a weight used twice, or gradient accumulation). The buffer's old values are overwritten, not
added to, so the summing pass leaves these elements alone: on a 2-vCPU AMX Xeon (MiniLM, bf16, 2 ranks, the
short-sentence TSV of benchmarks/README.md) that zeroing was 4-5.6 ms of a 116-ms step, and the 1-epoch job ran at
273-283 samples/s against 268-270 (4 ABBA pairs, one more pair's 252 taken under a test run's tail load), whole
command 19.0-19.6 s against 19.6-19.8, with the same final loss to the last bit.

A gradient that reaches such a weight any other way (the model run without autocast, the weight used outside its
Linear) goes through autograd's own accumulation; a hook on the weight first zeroes a buffer that still holds the
last step's values. A buffer no backward wrote in a step is zeroed before the sums (`SharedAdamW.reduce`). So every
path adds to zeros, as before, and the sums are bit for bit those of the zeroed buffers.

The cast itself is the owner's when it keeps a current bf16 copy of the weight (the shared step's, corecpu.
distributed.cast_cache), so the forward, training or evaluating, does not cast the weight again.

Only plain `torch.nn.Linear` modules whose weight is trained, appears once in the model, and has its gradient
accumulated in place are changed; not under torch.compile (its graph would hold the custom cast).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F


class Sink(Protocol):
    """The owner of the buffers (SharedAdamW): which parameters' gradients may be written straight in."""

    def sink_index(self, param: torch.nn.Parameter) -> int | None: ...

    def adopt_sunk(self, indices: list[int]) -> None: ...

    def write_grad(self, i: int, grad: torch.Tensor) -> None: ...

    def before_accumulate(self, i: int) -> None: ...

    def cast_weight(self, i: int, dtype: torch.dtype) -> torch.Tensor | None: ...


class _SunkCast(torch.autograd.Function):
    """The weight cast to the autocast dtype (or its copy the owner keeps: `cast`); its gradient written into the
    shared buffer, none returned."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, dtype: torch.dtype, write: Callable[[torch.Tensor], None],
                cast: torch.Tensor | None) -> torch.Tensor:
        ctx.write = write
        return weight.to(dtype) if cast is None else cast.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        ctx.write(grad)
        return None, None, None, None


def _sunk_forward(module: torch.nn.Linear, i: int, sink: Sink) -> Callable[[torch.Tensor], Any]:
    weight = module.weight

    def write(grad: torch.Tensor) -> None:
        sink.write_grad(i, grad)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
            cast = sink.cast_weight(i, dtype)  # autocast takes a tensor already in its dtype as it is
            if torch.is_grad_enabled():
                return F.linear(x, _SunkCast.apply(weight, dtype, write, cast), module.bias)
            if cast is not None:  # evaluation
                return F.linear(x, cast, module.bias)
        return F.linear(x, weight, module.bias)

    return forward


def install(model: torch.nn.Module, sink: Sink) -> int:
    """Route the gradients of `model`'s eligible Linear weights (module docstring) into `sink`; how many."""
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    chosen: list[tuple[torch.nn.Linear, int]] = []
    for module in model.modules():
        if type(module) is not torch.nn.Linear or not module.weight.requires_grad or "forward" in vars(module):
            continue
        i = sink.sink_index(module.weight)
        if i is not None and counts.get(id(module.weight), 0) == 1:
            chosen.append((module, i))
    sink.adopt_sunk([i for _, i in chosen])
    for module, i in chosen:
        module.forward = _sunk_forward(module, i, sink)  # type: ignore[method-assign]
        module.weight.register_hook(lambda g, i=i: sink.before_accumulate(i))
    return len(chosen)


__all__ = ["Sink", "install"]
