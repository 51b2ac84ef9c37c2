"""Loading a causal language model for fine-tuning: a local directory, or a built-in one made at first use."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.utils import logging as hf_logging

from corecpu.errors import CoreCPUError
from corecpu.training.modeling import OFFLINE, resolve_model_dir


def load_causal_lm(spec: str, seed: int) -> tuple[Any, str]:
    """The model of `spec` (fp32 weights: precision is chosen later, by measurement) and a one-line description.
    One line, naming the fix, for a directory that holds no causal LM (e.g. a BERT encoder)."""
    torch.manual_seed(seed)
    path = resolve_model_dir(spec)
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False, **OFFLINE)
    except Exception as exc:  # noqa: BLE001 - any unreadable config is the same user error
        raise CoreCPUError(f"cannot read the model config in '{path}' ({str(exc).splitlines()[0]}); pass --model "
                           "with a Hugging Face model directory") from None
    # BERT-like encoders also have a causal head class, usable only as a decoder: refuse them unless so configured.
    encoder = type(config) in AutoModelForMaskedLM._model_mapping and not getattr(config, "is_decoder", False)
    if type(config) not in AutoModelForCausalLM._model_mapping or encoder:
        raise CoreCPUError(f"'{path}' holds a {config.model_type} model, which is not a causal language model; pass "
                           "--model with a causal LM directory (Llama, Qwen2, Mistral, GPT-2...), or use --task "
                           "classification")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, trust_remote_code=False,
                                                     **OFFLINE)
    except Exception as exc:  # noqa: BLE001
        raise CoreCPUError(f"cannot load a causal LM from '{path}' ({str(exc).splitlines()[0]}); pass --model with "
                           "a Hugging Face model directory") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    n = sum(p.numel() for p in model.parameters())
    size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    name = spec if spec != str(path) and "/" not in spec else str(path)
    return model, f"{name} ({config.model_type}, {size} parameters)"
