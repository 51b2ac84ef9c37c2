"""Linear weights' bf16 gradients cast straight into DDP's all-reduce buckets, scaled by 1/world on the way.

Under bf16 autocast each nn.Linear casts its fp32 weight to bf16 for the matmul, and backward casts the bf16 weight
gradient back into a new fp32 tensor that autograd makes param.grad. DDP's reducer then reads that tensor again
to write it, times 1/world, into its bucket (reducer::mul_out) before the all-reduce: a second pass over every
weight gradient (about 9 ms of a 2-rank MiniLM step on the development Xeon). Here the cast back writes
fp32(g) x 1/world straight into the weight's view of its bucket and hands that view to autograd, which makes it
param.grad; the reducer sees a gradient already in place and copies nothing. The numbers are DDP's bit for bit:
the same exact bf16 -> fp32 conversion and the same one fp32 multiply (tested against plain DDP).

When it applies, per weight and step: a sync step (not under no_sync), the weight's gradient not yet defined
(zero_grad(set_to_none=True) before; a micro-step accumulating into one is left to autograd), and its bucket view
known (the comm hook reads the views each sync, so the first step and the one after DDP rebuilds its buckets
take the usual path). Every other gradient in the bucket is scaled by the comm hook (`scale_rest`), as the
reducer would have.

A layer called twice in one forward shares one cast, as autocast's cache shares it, so its two gradients are
summed in bf16 and cast once, as without this module. (Two forwards inside one outer autocast region, fed to one
backward, are the exception: autocast would share the cast across both, here each forward casts anew and the
gradients are summed in fp32.) What it cannot see ahead is a weight that gets a gradient from somewhere besides
its layer (a loss that reads the weight): that is found before autograd stores the gradient (a hook on the weight
sees a sum, not the tensor this module handed over); the step's gradient is corrected to the sum DDP would
reduce (equal up to fp32 rounding, since the scaled part was already added in) and the weight is left out from
then on.

Applies with DDP, bf16 autocast and an fp32 gradient on the wire; not under torch.compile (which traces the cast)
or IPEX (which replaces the modules); only to plain nn.Linear modules whose trainable fp32 weight no other module
holds.
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
    The gradient path's comm hook calls `scale_rest(bucket)` on every bucket before reducing it, unscaled."""

    def __init__(self, model: torch.nn.Module, linears: list[torch.nn.Linear], world: int) -> None:
        self.scale = 1.0 / world
        self._scale = torch.tensor([self.scale], dtype=torch.float32)  # 1-d: the multiply runs in fp32, as mul_out's
        self.keys = {id(m.weight) for m in linears}
        self.placed = 0  # gradients written straight into a bucket (tests, counting)
        self.repaired = 0  # steps a weight's gradient had a second contribution and was corrected
        self._ddp: Any = None
        self._views: dict[int, torch.Tensor] = {}  # weight -> its view in its bucket, as the last sync saw it
        self._prescaled: set[int] = set()  # weights whose bucket view already holds grad x 1/world
        self._pending: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}  # handed over, not yet stored
        self._excluded: set[int] = set()  # weights found with another gradient source: the usual path for good
        self._generation = 0  # forwards of the model: a cast is shared inside one, as autocast shares it
        self._casts: dict[int, tuple[int, int, torch.Tensor]] = {}  # weight -> (forward, version, its bf16 cast)
        self._modules = linears
        self._handles = [model.register_forward_pre_hook(self._next_forward)]
        for module in linears:
            module.forward = self._forward_of(module)  # type: ignore[method-assign]
            self._handles.append(module.weight.register_hook(self._checked(id(module.weight))))

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
        """The fp32 gradient of `weight` from the bf16 one: in its bucket, scaled, where it applies; else as
        autocast's cast back gives it."""
        key = id(weight)
        self._casts.pop(key, None)  # its backward has run: the bf16 copy need not outlive it
        view = self._views.get(key)
        if (view is None or key in self._excluded or weight.grad is not None or self._ddp is None
                or not self._ddp.require_backward_grad_sync or view.shape != weight.shape):
            return grad.to(weight.dtype)
        torch.mul(grad, self._scale, out=view)
        handed = view.detach()  # a tensor of its own on the bucket: AccumulateGrad takes it as param.grad
        self._prescaled.add(key)
        self._pending[key] = (handed, handed._version, grad)
        self.placed += 1
        return handed

    def _checked(self, key: int) -> Any:
        def check(total: torch.Tensor) -> torch.Tensor | None:
            entry = self._pending.pop(key, None)
            if entry is None:
                return None
            handed, version, grad = entry
            del entry
            if total is handed and total._version == version:
                return None  # the one contribution: stored as handed over
            # Another contribution was added to the scaled one: make it the unscaled sum the comm hook scales.
            self._excluded.add(key)
            self._prescaled.discard(key)
            self.repaired += 1
            return total + grad.to(torch.float32).mul_(1.0 - self.scale)
        return check

    def scale_rest(self, bucket: Any) -> None:
        """In the comm hook, before the sum: note each weight's bucket view, and scale by 1/world every gradient in
        the bucket not already scaled (what the reducer's mul_out did)."""
        rest = []
        for param, view in zip(bucket.parameters(), bucket.gradients()):
            key = id(param)
            if key in self.keys:
                self._views[key] = view
            if key in self._prescaled:
                self._prescaled.discard(key)
            else:
                rest.append(view)
        if rest:
            torch._foreach_mul_(rest, self.scale)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        for module in self._modules:
            module.__dict__.pop("forward", None)
        self._handles, self._views = [], {}


def install(model: torch.nn.Module, *, world: int, autocast_bf16: bool, wire: str, compile: bool,
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
    owner = BucketCasts(model, linears, world)
    count = sum(m.weight.numel() for m in linears)
    return BucketCastsChoice("on", f"{len(linears)} Linear weights' gradients ({count / 1e6:.1f}M values) cast "
                                   "straight into DDP's buckets, scaled by 1/world on the way"), owner


__all__ = ["BucketCasts", "BucketCastsChoice", "install"]
