"""LoRA adapters through peft: the base frozen, only the adapters trained, all-reduced and saved.

DDP registers only parameters that require gradients, so the frozen base costs no all-reduce and
no gradient buffer; the optimizer sees only the adapters (optimizer_groups skips frozen ones).
`final/` then holds the adapter in PEFT's own format (PeftModel.from_pretrained on the base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from corecpu.errors import CoreCPUError, install_extra


@dataclass(frozen=True)
class LoraSettings:
    r: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]  # () = every linear layer of the blocks (not the LM head)

    def describe(self) -> str:
        where = ", ".join(self.target_modules) if self.target_modules else "every linear layer of the blocks"
        return f"LoRA r={self.r} alpha={self.alpha:g} dropout={self.dropout:g} on {where}"


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's nn.Linear modules (q_proj, k_proj, ...): what --lora-target-modules
    may name."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def check_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> None:
    """One line for target modules the model lacks, listing the ones it has."""
    have = linear_names(model)
    missing = [t for t in targets if t not in have]
    if missing:
        raise CoreCPUError(f"--lora-target-modules {','.join(missing)}: this model has no such linear layer; "
                           f"it has {','.join(have)}")


def add_lora(model: torch.nn.Module, settings: LoraSettings, seed: int) -> Any:
    """`model` with LoRA adapters (a peft PeftModel); every other parameter frozen. The adapters' random
    initialisation (peft draws A from the global RNG) depends on `seed` alone, not on whatever drew random
    numbers before: the same on every rank, and reproducible outside corecpu: torch.manual_seed(seed) right
    before get_peft_model with the same LoraConfig gives the same adapters (benchmarks/trl_sft.py does)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise CoreCPUError(f"--lora-r needs peft; {install_extra('lora')}") from None
    if settings.target_modules:
        check_targets(model, settings.target_modules)
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                        target_modules=list(settings.target_modules) or "all-linear", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def trainable_summary(model: torch.nn.Module) -> str:
    """'1.2M of 135M parameters trained (0.9%)'."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return f"{_short(trained)} of {_short(total)} parameters trained ({trained / max(total, 1):.1%})"


def merged_copy(model: Any) -> torch.nn.Module:
    """The base with the adapters merged in, as a plain transformers model. Merges in place: call it last."""
    return model.merge_and_unload()


def _short(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else str(n)
