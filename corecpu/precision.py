"""Precision: placeholder until the evidence-based rule lands (the flag rule from hardware.py)."""

from __future__ import annotations

from dataclasses import dataclass

from corecpu.hardware import CpuFeatures, choose_precision


@dataclass(frozen=True)
class PrecisionChoice:
    name: str
    reason: str
    warning: str | None = None
    bf16_speedup: float | None = None
    source: str = "flags"

    @property
    def autocast_dtype(self):
        import torch

        return torch.bfloat16 if self.name == "bf16" else None


def resolve_requested(requested: str, features: CpuFeatures) -> PrecisionChoice:
    c = choose_precision(requested, features)
    return PrecisionChoice(c.name, c.reason, c.warning, None, "requested" if requested != "auto" else "flags")


def resolve_for_model(requested: str, features: CpuFeatures, model, threads: int) -> PrecisionChoice:
    return resolve_requested(requested, features)
