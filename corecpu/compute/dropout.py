"""Dropout from 16 random bits an element, drawn on all of the rank's threads: the `fast` kernel of `--dropout`.

A profile of MiniLM's training step on one core spent 38 of about 310 ms in dropout's `bernoulli_`: torch's CPU
dropout draws one 32-bit number from the (serial) mt19937 generator per element, turns it into a double, compares,
then divides the mask by 1-p and multiplies. This kernel keeps an element where 16 random bits clear a threshold,
with the scale folded into the mask. The drop probability is p rounded to a multiple of 1/65536 (0.1 becomes
0.1000061) and the kept values are scaled by the inverse of the rounded keep probability, so the expectation is
exactly the input's. Measured on the development Xeon: 1.7x torch's (one thread, forward and backward, on a
hidden-state tensor and on attention probabilities); a fixed one-core MiniLM step 12-18% shorter; the real 2-rank
job 1.03-1.07x (benchmarks/README.md).

The bits come from corecpu.compute.counter_random: a counter-based hash computed by torch's parallel int32
kernels, keyed by one draw from torch's default generator per call. It replaced 64-bit mt19937 draws, which run on
one thread whatever the rank's thread count: with 2 threads the kernel (forward and backward, a matmul before it so
OpenMP's workers are awake) took 4.2 ms instead of 5.3 for 3.1M values, and at one thread 7.6 instead of 8.0 (Zen 5,
benchmarks/dropout_kernels.py); a 16-thread rank would otherwise wait on one thread for some 0.7 ns an element.

It is a different random stream from torch's, drawn from the same default generator: a seeded run repeats itself
whatever the thread count, a checkpoint's random state resumes it bit for bit, and `--dropout torch` gives torch's
stream back. It is not chosen by timing at start-up: a timing that flipped between runs would change a resumed
run's stream. Where torch draws serially (every CPU but Intel's with MKL, whose `bernoulli_` runs MKL's generator
on every thread) this does less work at any thread count; benchmarks/node_suite.py times both on the 16-core Xeon.

It applies where a model calls `torch.nn.functional.dropout` (every `nn.Dropout`, Hugging Face's eager attention,
peft's LoRA dropout) inside the wrapped forward, on the thread running it (see _dispatching_dropout). torch.compile
lowers dropout to its own generated kernel, so it is not used there; SDPA's math fallback draws its mask in C++ and
keeps it. Gradient checkpointing recomputes a forward in the backward, outside the wrapped forward: a model with it
on keeps torch's kernel, and a forward inside torch.utils.checkpoint (found at each call) does too, so the
recomputed masks match.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, ContextManager, Iterator

import torch

from corecpu.compute.counter_random import random_int16
from corecpu.decision import Decision

_TORCH_DROPOUT = torch.nn.functional.dropout  # torch's own, whatever the name points at later
_LEVELS = 1 << 16  # 16 random bits decide one element
# Use torch's kernel where rounding p to 1/65536 would move it by more than this fraction of p (p < about 0.008).
_MAX_RELATIVE_ROUNDING = 1e-3


class DropoutChoice(Decision):
    """The dropout kernel inside the wrapped forward (name: fast | torch), and why."""


# Config fields Hugging Face models pass to their functional attention dropout (no nn.Dropout module holds them).
_CONFIG_DROPOUTS = ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop", "attention_probs_dropout")


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether training `model` draws any dropout mask: an nn.Dropout with p > 0, or a config's attention dropout."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    return config_attention_dropout(getattr(model, "config", None)) > 0


def config_attention_dropout(config: Any) -> float:
    """The attention dropout probability a Hugging Face config gives its attention functions (0.0 for none)."""
    return max([float(v) for name in _CONFIG_DROPOUTS
                if isinstance(v := getattr(config, name, 0), (int, float)) and not isinstance(v, bool)] + [0.0])


def decide_dropout(requested: str, compile: bool, checkpointing: bool = False, dropout: bool = True) -> DropoutChoice:
    if requested == "torch":
        return DropoutChoice("torch", "requested")
    if not dropout:  # nothing to draw: the wrapped forward stays as it is
        return DropoutChoice("torch", "the model has no dropout")
    if compile:
        return DropoutChoice("torch", "torch.compile generates its own dropout kernel")
    if checkpointing:
        return DropoutChoice("torch", "gradient checkpointing recomputes the forward in the backward, outside "
                                      "the wrapped forward, with torch's kernel")
    return DropoutChoice("fast", "16 random bits an element, drawn on every thread; --dropout torch for torch's "
                                 "random stream")


def uses_gradient_checkpointing(model: torch.nn.Module) -> bool:
    """A Hugging Face model (or layer) with gradient checkpointing turned on."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def _recorded_elsewhere() -> bool:
    """Inside torch.utils.checkpoint's forward: saved-tensor hooks (non-reentrant) or no grad (reentrant). Its
    backward recomputes that forward outside the wrapped forward, with torch's kernel; the masks must match, so
    such a forward keeps torch's kernel too (also under offloading hooks, which recompute nothing: no harm)."""
    if not torch.is_grad_enabled():
        return True
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is not None and top(False) is not None


def drop_threshold(p: float) -> int | None:
    """The number of 16-bit values (of 65536) that drop an element, or None where that would misstate p."""
    dropped = round(p * _LEVELS)
    if not 0 < dropped < _LEVELS or abs(dropped / _LEVELS - p) > _MAX_RELATIVE_ROUNDING * p:
        return None
    return dropped


class _FastDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dropped: int) -> torch.Tensor:  # type: ignore[override]
        # Kept where the value is at least the threshold: clamping to [threshold - 1, threshold] and subtracting
        # gives 0 or 1 in int16. A `>=` to bool and bool's conversion took 2.2x as long (both are slow paths in
        # torch's CPU kernels; 0.35 ms more per 295K elements on a Xeon core, a quarter of the whole forward).
        threshold = dropped - (_LEVELS >> 1)
        keep = random_int16(x.numel()).view(x.shape).clamp_(threshold - 1, threshold).sub_(threshold - 1)
        # The scale folded into the mask: one multiply forward and one backward, as torch's kernel does.
        mask = keep.to(x.dtype).mul_(_LEVELS / (_LEVELS - dropped))
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        mask, = ctx.saved_tensors
        return grad * mask, None


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-mode dropout of `x` with probability p (rounded to 1/65536), or torch's where p does not round."""
    dropped = drop_threshold(p)
    if dropped is None or x.device.type != "cpu" or not x.is_floating_point():
        return _TORCH_DROPOUT(x, p, True)
    return _FastDropout.apply(x, dropped)


# The fast kernel reaches F.dropout's callers through the module attribute they look up at each call
# (`F.dropout` in nn.Dropout, `nn.functional.dropout` in Hugging Face's attention), swapped in while any thread is
# inside a fast-dropout context and gated per thread. A TorchFunctionMode did the same with no global name touched,
# but it sends every torch call of the forward through Python: 8-11 ms of a MiniLM step on one Xeon core (measured).
_inside = threading.local()  # `depth`: this thread's nested fast-dropout contexts
_installed = 0  # contexts open on all threads; the name is swapped while above 0
_lock = threading.Lock()


@functools.wraps(_TORCH_DROPOUT)
def _dispatching_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,  # noqa: A002 (torch's name)
                         inplace: bool = False) -> torch.Tensor:
    """torch's F.dropout, except inside a fast-dropout context on this thread: training-mode, out-of-place calls on a
    plain tensor go to fast_dropout."""
    if (getattr(_inside, "depth", 0) and training and not inplace and type(input) is torch.Tensor
            and not _recorded_elsewhere()):
        return fast_dropout(input, float(p))
    return _TORCH_DROPOUT(input, p, training, inplace)


@contextlib.contextmanager
def _fast_dropout_inside() -> Iterator[None]:
    global _installed
    with _lock:
        _installed += 1
        torch.nn.functional.dropout = _dispatching_dropout
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1
        with _lock:
            _installed -= 1
            if _installed == 0:  # torch's own function back, for code compiled or traced later
                torch.nn.functional.dropout = _TORCH_DROPOUT


def dropout_context(kernel: str) -> ContextManager:
    """The fast kernel in force inside, on this thread (`kernel` "fast"), else nothing."""
    return _fast_dropout_inside() if kernel == "fast" else contextlib.nullcontext()


def with_dropout(forward: Callable[..., Any], choice: DropoutChoice) -> Callable[..., Any]:
    """`forward` with the chosen dropout kernel (the identity for torch's)."""
    if choice.name != "fast":
        return forward

    @functools.wraps(forward)
    def fast_dropout_forward(*args: Any, **kwargs: Any) -> Any:
        with _fast_dropout_inside():
            return forward(*args, **kwargs)
    return fast_dropout_forward
