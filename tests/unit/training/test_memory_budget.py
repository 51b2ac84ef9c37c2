"""Tier 1: the memory estimate of a language-model run, and the one-line refusal of a run the node cannot hold."""

from __future__ import annotations

import pytest

from corecpu.errors import CoreCPUError
from corecpu.training.memory_budget import GB, RUNTIME_BYTES, ModelShape, MemoryEstimate, check_fits, estimate

# Llama-3-8B's shapes: 8.03B parameters, 32 layers, width 4096, 8 of 32 heads for keys/values, MLP 14336.
LLAMA_8B = ModelShape(params=8_030_000_000, trainable=8_030_000_000, layers=32, hidden=4096, kv=1024,
                      intermediate=14336, vocab=128256)


def test_full_fine_tuning_holds_weights_gradients_and_two_moments_per_rank():
    est = estimate(LLAMA_8B, batch=1, seq=1024, lora=False, checkpointing=False)
    assert (est.shared, est.weights, est.gradients, est.optimizer) == (0, 4 * 8_030_000_000, 4 * 8_030_000_000,
                                                                       8 * 8_030_000_000)
    per_layer = (6 * 4096 + 2 * 1024 + 4 * 14336) * 4 * 1024
    assert est.activations == 32 * per_layer + 2 * 128256 * 4 * 1024
    assert est.per_node(2) == 2 * est.per_rank() and est.per_rank() > 16 * 8e9


def test_lora_shares_the_frozen_base_once_per_node_and_checkpointing_keeps_layer_inputs():
    lora = ModelShape(**{**LLAMA_8B.__dict__, "params": 8_030_000_000 + 42_000_000, "trainable": 42_000_000})
    plain = estimate(lora, batch=4, seq=2048, lora=True, checkpointing=False)
    saved = estimate(lora, batch=4, seq=2048, lora=True, checkpointing=True)
    assert plain.shared == 4 * 8_030_000_000 and plain.weights == 4 * 42_000_000
    assert plain.per_node(2) == plain.shared + 2 * plain.per_rank()  # one base, however many ranks
    assert saved.activations < plain.activations / 5  # what stays: layer inputs, one layer, the logits


def test_a_run_the_node_cannot_hold_is_refused_naming_what_to_change():
    est = estimate(LLAMA_8B, batch=1, seq=1024, lora=False, checkpointing=False)
    with pytest.raises(CoreCPUError) as err:
        check_fits(est, 2, limit=64 * GB, available=200 * GB, lora=False, checkpointing=False)
    line = str(err.value)
    assert "\n" not in line and "but the cgroup's memory limit is 64.0 GB" in line
    assert line.endswith("use train LoRA adapters (--lora-r 16), a smaller --batch-size or --max-seq-len or fewer "
                         "ranks per node")
    check_fits(est, 1, limit=None, available=None, lora=False, checkpointing=False)  # nothing known: no refusal
    check_fits(est, 1, limit=None, available=est.per_node(1), lora=False, checkpointing=False)  # exactly fits


def test_activations_that_dominate_suggest_gradient_checkpointing():
    est = MemoryEstimate(shared=0, weights=GB, gradients=0, optimizer=0, activations=20 * GB)
    with pytest.raises(CoreCPUError, match="; use --gradient-checkpointing or a smaller --batch-size or --max-seq-len$"):
        check_fits(est, 1, limit=None, available=4 * GB, lora=True, checkpointing=False)
    assert est.per_rank() == 21 * GB + RUNTIME_BYTES
