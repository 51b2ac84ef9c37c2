"""Linear weights' bf16 gradients cast straight into DDP's all-reduce buckets.

Under bf16 autocast each nn.Linear casts its fp32 weight to bf16 for the matmul, and backward casts the bf16 weight
gradient back into a new fp32 tensor that autograd makes param.grad. DDP's reducer then reads that tensor again to
write it, times 1/world, into its bucket (reducer::mul_out) before the all-reduce: a second pass over every weight
gradient, and a fresh allocation for each. Here the cast back writes fp32(g) straight into the weight's view of its
bucket and hands that view to autograd, which makes it param.grad; the reducer finds the gradient in place and
copies nothing, and the comm hook multiplies the whole bucket by 1/world in one call before the sum. The numbers are
DDP's bit for bit: the same exact bf16 -> fp32 conversion, then the same one fp32 multiply (tested against plain
DDP). Measured on one core: the conversion into memory that exists plus the in-place multiply took 280 us for a
1536 x 384 weight, autocast's cast into new memory plus mul_out about 400.

When it applies, per weight and step: a sync step (not under no_sync), the weight's gradient not yet defined
(zero_grad(set_to_none=True) before; a micro-step accumulating into one is left to autograd), and its bucket view
known (the comm hook notes the views each sync, so the first step, and the one after DDP rebuilds its buckets, take
the usual path). A weight with another gradient besides its layer's (a loss that reads it) stays exact: autograd
adds the other one to the handed tensor as it would have added it to the cast's output.

A layer called twice in one forward shares one cast, as autocast's cache shares it, so its two gradients are summed
in bf16 and cast once, as without this module. (Two forwards inside one outer autocast region fed to one backward
are the exception: autocast would share the cast across both, here each forward casts anew and the gradients are
summed in fp32.) A checkpointed layer's recompute inside backward uses autocast's own cast.

Applies with DDP, bf16 autocast and an fp32 gradient on the wire; not under torch.compile (which traces the cast) or
IPEX (which replaces the modules); only to plain nn.Linear modules whose trainable fp32 weight no other module holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from corecpu.decision import Decision


_in_backward = getattr(torch._C, "_current_autograd_node", lambda: None)  # the node backward is running, or None


class BucketCastsChoice(Decision):
    """config.json's `bucket_casts` decision (name: on | off), and why."""


class _CastWeight(torch.autograd.Function):
    """weight.to(bf16), as autocast casts it; backward gives the owner the bf16 gradient to place."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, owner: "BucketCasts") -> torch.Tensor:  # type: ignore[override]
        ctx.owner, ctx.weight = owner, weight
        return weight.to(torch.bfloat16)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return ctx.owner.weight_grad(ctx.weight, grad), None


class BucketCasts:
    """Installed on a model's Linear modules before DDP wraps it (their instance `forward`); `attach(ddp)` after.
    The gradient path's comm hook calls `note(bucket)` on every bucket and scales the whole bucket by 1/world."""

    def __init__(self, model: torch.nn.Module, linears: list[torch.nn.Linear]) -> None:
        self.keys = {id(m.weight) for m in linears}
        self.placed = 0  # gradients written straight into a bucket (tests, counting)
        self._ddp: Any = None
        self._views: dict[int, torch.Tensor] = {}  # weight -> its view in its bucket, as the last sync saw it
        self._generation = 0  # forwards of the model: a cast is shared inside one, as autocast shares it
        self._casts: dict[int, tuple[int, int, torch.Tensor]] = {}  # weight -> (forward, version, its bf16 cast)
        self._modules = linears
        self._handles = [model.register_forward_pre_hook(self._next_forward)]
        for module in linears:
            module.forward = self._forward_of(module)  # type: ignore[method-assign]

    def attach(self, ddp: torch.nn.Module) -> "BucketCasts":
        """Follow `ddp`'s no_sync (require_backward_grad_sync): only a sync step's gradient goes into a bucket."""
        self._ddp = ddp
        return self

    def _next_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._generation += 1
        self._casts.clear()

    def _forward_of(self, module: torch.nn.Linear) -> Any:
        def forward(input: torch.Tensor) -> torch.Tensor:
            weight = module.weight
            if not (torch.is_grad_enabled() and weight.requires_grad and weight.dtype == torch.float32
                    and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
                    and _in_backward() is None):  # a checkpointed layer's recompute: autocast's own cast
                return F.linear(input, weight, module.bias)
            # A layer called again in the same forward shares the first call's cast, as autocast's cache shares it:
            # its gradients are summed in bf16, then cast once.
            key = id(weight)
            cached = self._casts.get(key)
            if cached is None or cached[0] != self._generation or cached[1] != weight._version:
                cached = (self._generation, weight._version, _CastWeight.apply(weight, self))
                self._casts[key] = cached
            return F.linear(input, cached[2], module.bias)
        return forward

    def weight_grad(self, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The fp32 gradient of `weight` from the bf16 one: in its bucket where that applies, else in new memory
        as autocast's cast back gives it."""
        key = id(weight)
        self._casts.pop(key, None)  # its backward has run: the bf16 copy need not outlive it
        view = self._views.get(key)
        if (view is None or weight.grad is not None or self._ddp is None
                or not self._ddp.require_backward_grad_sync or view.shape != weight.shape):
            return grad.to(weight.dtype)
        self.placed += 1
        return view.copy_(grad).detach()  # a tensor of its own on the bucket: AccumulateGrad takes it as param.grad

    def note(self, bucket: Any) -> None:
        """In the comm hook: each weight's view of this bucket, for the next step's casts."""
        for param, view in zip(bucket.parameters(), bucket.gradients()):
            if id(param) in self.keys:
                self._views[id(param)] = view

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        for module in self._modules:
            module.__dict__.pop("forward", None)
        self._handles, self._views = [], {}


def install(model: torch.nn.Module, *, autocast_bf16: bool, wire: str, compile: bool,
            use_ipex: bool) -> tuple[BucketCastsChoice, BucketCasts | None]:
    """Place `model`'s Linear weight gradients straight into DDP's buckets where that applies; the decision."""
    if not autocast_bf16:
        return BucketCastsChoice("off", "no bf16 autocast: the weights' gradients come out fp32 already"), None
    if wire != "fp32":
        return BucketCastsChoice("off", f"{wire} on the wire: the comm hook rounds the bucket itself"), None
    if compile:
        return BucketCastsChoice("off", "torch.compile traces the casts"), None
    if use_ipex:
        return BucketCastsChoice("off", "ipex.optimize replaces the modules"), None
    holders: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders[id(param)] = holders.get(id(param), 0) + 1
    linears = [m for m in model.modules()
               if type(m) is torch.nn.Linear and m.weight.requires_grad and m.weight.dtype == torch.float32
               and holders.get(id(m.weight)) == 1 and "forward" not in vars(m)]
    if not linears:
        return BucketCastsChoice("off", "no plain nn.Linear with a trainable fp32 weight of its own"), None
    owner = BucketCasts(model, linears)
    count = sum(m.weight.numel() for m in linears)
    return BucketCastsChoice("on", f"{len(linears)} Linear weights' gradients ({count / 1e6:.1f}M values) cast "
                                   "straight into DDP's buckets"), owner


__all__ = ["BucketCasts", "BucketCastsChoice", "install"]
