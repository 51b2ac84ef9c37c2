"""Frozen Linear weights cast to bf16 once, not in every forward: what a LoRA run's base costs under autocast.

Under bf16 autocast every Linear casts its fp32 weight to bf16 before its matmul, in every forward: a pass over the
weight from memory (4 bytes read, 2 written an element). A trained weight changes every step, so that cast is the
step's (corecpu.distributed.cast_cache makes it once per step on the shared step). A frozen one never changes, yet
autocast casts it again in every micro-step and every evaluation batch; in a LoRA run that is the whole base model.
Here each frozen plain `nn.Linear` keeps a bf16 copy (made at install where the host's ranks share it, else on its
first forward under bf16 autocast), and its forward passes that copy to `F.linear`, which autocast then takes as
it is. The copy is made with the same round-to-nearest conversion autocast makes, so every matmul sees the same
bits: the losses and gradients are those of the plain run (tested). A LoRA step of llama-135m (4 packed rows of 128
tokens, 2 threads, a 2-vCPU Xeon with AMX) took 1,133 ms against 1,265 (7 interleaved steps, medians; the same loss
to the last bit): 1.12x.

The copy is used only while the weight is the one it was made from: its version counter (bumped by any in-place
write through the parameter, `load_state_dict` included), its storage, and for a peft base layer which adapters are
merged into it (peft writes merges through `.data`, unseen by the counter); after a change the next forward casts it
again, once. A write through `.data` elsewhere is not seen, as autograd does not see it either. A weight made
trainable again goes back to autocast's own cast, and so does any forward outside bf16 autocast (fp32 evaluation, a
user's own fp32 call), which uses the fp32 weight as before.

The copies cost 2 bytes a frozen element (the fp32 weights are kept: checkpoints, exports and fp32 calls read
them). With several ranks on a host, the host's first rank casts them once into /dev/shm and every rank of the host
maps that one copy (corecpu.distributed.host_copy), as the ranks already share the fp32 base through the page cache;
a rank that finds a weight changed casts a private copy of it. Where /dev/shm lacks room, each rank makes its own.
The copies are made only where they fit in FIT_SHARE of the memory this host has available (one copy, or every
local rank's; `memory_budget.node_budget`); otherwise autocast casts as before, and config.json says so.
Not under torch.compile (its graph would hold the patched forward) or IPEX (which replaces the modules). A frozen
LM head tied to the input embedding gets a copy too: with Llama 3's vocabulary and a 2,048-wide model that head is
263M elements: 1 GB read and 0.5 GB written by every forward's cast.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from corecpu.decision import Decision

FIT_SHARE = 0.5  # of the memory available: the copies leave the rest for activations and the allocator's slack


class FrozenCastChoice(Decision):
    """config.json's `frozen_casts` decision (name: bf16 | off), and why."""


def candidates(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The plain Linear layers whose fp32 weight is frozen and that are not yet patched. A frozen LM head tied to the
    input embedding is one: the embedding looks rows up in the fp32 weight, the head multiplies by the copy."""
    return [m for m in model.modules()
            if type(m) is torch.nn.Linear and not m.weight.requires_grad and m.weight.dtype == torch.float32
            and "forward" not in vars(m)]


def _merge_owners(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """id(base Linear) -> the peft layer around it. peft merges an adapter into the base weight and takes it out again
    through `weight.data` (merge_adapter, unmerge_adapter, merge_and_unload), which no version counter sees; its
    `merged_adapters` list does."""
    return {id(m.base_layer): m for m in model.modules()
            if isinstance(getattr(m, "base_layer", None), torch.nn.Linear) and hasattr(m, "merged_adapters")}


def fits(copy_bytes: int, local_ranks: int, limit: int | None, available: int | None) -> bool:
    """Pure: whether every local rank's copies fit in FIT_SHARE of the tightest known budget (unknown: yes)."""
    budgets = [b for b in (limit, available) if b is not None]
    return not budgets or local_ranks * copy_bytes <= FIT_SHARE * min(budgets)


def _cached_forward(module: torch.nn.Linear, dtype: torch.dtype, owner: torch.nn.Module | None,
                    preset: torch.Tensor | None = None) -> Callable[[torch.Tensor], Any]:
    """The patched forward; `preset`: a copy already made (shared by the host's ranks) of the weight as it is now."""
    def state(weight: torch.Tensor) -> tuple[int, int, tuple[str, ...]]:
        return weight._version, weight.data_ptr(), tuple(owner.merged_adapters) if owner is not None else ()

    # The copy and the weight state it was made from. A change casts a private copy: a shared one is never written.
    kept: dict[str, Any] = {"copy": preset, "made": state(module.weight) if preset is not None else None}

    def forward(x: torch.Tensor) -> torch.Tensor:
        weight = module.weight  # looked up each call: a tie_weights() or an assignment may put another there
        if (weight.requires_grad or not torch.is_autocast_enabled("cpu")
                or torch.get_autocast_dtype("cpu") != dtype):
            return F.linear(x, weight, module.bias)
        made = state(weight)
        if kept["made"] != made:
            with torch.no_grad():
                kept["copy"] = weight.detach().to(dtype)
            kept["made"] = made
        return F.linear(x, kept["copy"], module.bias)

    return forward


def _slices(buffer: torch.Tensor, layers: list[torch.nn.Linear]) -> list[torch.Tensor]:
    """Each layer's weight-shaped slice of the flat `buffer`, in order."""
    bounds = [0]
    for m in layers:
        bounds.append(bounds[-1] + m.weight.numel())
    return [buffer[lo:hi].view_as(m.weight) for m, lo, hi in zip(layers, bounds, bounds[1:])]


def _fill(buffer: torch.Tensor, layers: list[torch.nn.Linear]) -> None:
    """Cast every layer's weight into its slice of `buffer` (the same round-to-nearest as autocast's)."""
    with torch.no_grad():
        for m, view in zip(layers, _slices(buffer, layers)):
            view.copy_(m.weight)


# share(elements, dtype, fill, ok): collective; a buffer that the host's first rank filled with fill(buffer), shared
# by the host's ranks, or None on every rank (corecpu.distributed.host_copy).
Share = Callable[[int, torch.dtype, Callable[[torch.Tensor], None], bool], "torch.Tensor | None"]


def install(model: torch.nn.Module, dtype: torch.dtype | None, *, compile: bool, use_ipex: bool, local_ranks: int,
            budget: Callable[[int], tuple[int | None, int | None]], share: Share | None = None) -> FrozenCastChoice:
    """Give `model`'s frozen Linear weights kept copies in the autocast `dtype` (None: no autocast) where the module
    docstring says; the decision either way. `budget(local_ranks)`: (cgroup limit, available bytes). `share`: one
    copy for a host's ranks (collective: every rank reaches it alike, as the model is the same on every rank)."""
    if dtype is None:
        return FrozenCastChoice("off", "no autocast: the weights are used as they are")
    if compile:
        return FrozenCastChoice("off", "torch.compile traces the forward")
    if use_ipex:
        return FrozenCastChoice("off", "ipex.optimize replaces the modules")
    chosen = candidates(model)
    if not chosen:
        return FrozenCastChoice("off", "no frozen Linear weights")
    elements = sum(m.weight.numel() for m in chosen)
    size = elements * torch.empty((), dtype=dtype).element_size()
    limit, available = budget(local_ranks)
    shared = (share(elements, dtype, lambda buffer: _fill(buffer, chosen), fits(size, 1, limit, available))
              if share is not None else None)
    if shared is None and not fits(size, local_ranks, limit, available):
        return FrozenCastChoice("off", f"{local_ranks} x {size / 2**20:.0f} MB of copies would take more than "
                                       f"{FIT_SHARE:.0%} of the memory available; autocast casts them each forward")
    owners = _merge_owners(model)
    presets = _slices(shared, chosen) if shared is not None else [None] * len(chosen)
    for m, preset in zip(chosen, presets):
        m.forward = _cached_forward(m, dtype, owners.get(id(m)), preset)  # type: ignore[method-assign]
    held = (f"one copy in /dev/shm for the host's {local_ranks} ranks" if shared is not None
            else "a copy a rank" if local_ranks > 1 else "one copy")
    return FrozenCastChoice(str(dtype).removeprefix("torch.").replace("bfloat16", "bf16"),
                            f"{len(chosen)} frozen Linear weights ({elements / 1e6:.1f}M elements, "
                            f"{size / 2**20:.0f} MB, {held}) cast once, not in every forward")


__all__ = ["FIT_SHARE", "FrozenCastChoice", "candidates", "fits", "install"]
