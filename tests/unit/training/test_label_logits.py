"""Logits only where a label is (corecpu.training.label_logits): the same loss and gradients as the model's own
forward, for every architecture it patches, packed or padded, with LoRA or without."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config)

from corecpu.training import label_logits

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SMALL),
    "mistral": lambda: MistralConfig(**SMALL),
    "qwen2": lambda: Qwen2Config(**SMALL),
    "qwen3": lambda: Qwen3Config(**SMALL, head_dim=8),
    "gpt2": lambda: GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64),
}


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind]())
    model.config.use_cache = False
    return model


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 12), generator=g)
    labels = ids.clone()
    labels[:, :7] = -100  # the prompt
    labels[1, 10:] = -100
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0  # padding
    labels[2, 9:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def loss_and_grads(model: torch.nn.Module, inputs: dict[str, torch.Tensor], own: bool) -> tuple[float, dict]:
    model.zero_grad()
    torch.manual_seed(5)  # GPT-2's dropout draws the same masks in both
    forward = type(model).forward if own else model.forward
    out = forward(model, **inputs) if own else forward(**inputs)
    out.loss.backward()
    return float(out.loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def same_grads(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7, msg=name)


def test_every_listed_architecture_has_a_config_here():
    assert set(CONFIGS) == set(label_logits.PLAIN_HEADS)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_loss_and_gradients_equal_the_models_own(kind):
    model = build(kind)
    assert label_logits.compute_logits_where_labelled(model)
    want, want_grads = loss_and_grads(model, batch(), own=True)
    got, grads = loss_and_grads(model, batch(), own=False)
    assert got == pytest.approx(want, rel=1e-6)
    same_grads(grads, want_grads)
    labelled = int((batch()["labels"][:, 1:] != -100).sum())
    assert model(**batch()).logits.shape == (labelled, 97)  # only the labelled rows were computed


def test_a_packed_batch_with_its_block_mask_and_positions():
    model = build("llama")
    label_logits.compute_logits_where_labelled(model)
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(2))
    docs = torch.tensor([0] * 4 + [1] * 6)
    causal = torch.tril(torch.ones(10, 10, dtype=torch.bool)) & (docs[:, None] == docs[None, :])
    mask = torch.where(causal, 0.0, torch.finfo(torch.float32).min)[None, None]
    labels = ids.clone()
    labels[0, [0, 1, 4, 5, 6]] = -100
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]]),
              "labels": labels}
    want, want_grads = loss_and_grads(model, inputs, own=True)
    got, grads = loss_and_grads(model, inputs, own=False)
    assert got == pytest.approx(want, rel=1e-6)
    same_grads(grads, want_grads)


def test_with_lora_on_top_the_adapters_get_the_same_gradients():
    peft = pytest.importorskip("peft")
    plain, patched = build("llama"), build("llama")
    label_logits.compute_logits_where_labelled(patched)
    config = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    results = []
    for model in (plain, patched):
        torch.manual_seed(3)
        wrapped = peft.get_peft_model(model, peft.LoraConfig(**config))
        wrapped.zero_grad()
        loss = wrapped(**batch()).loss
        loss.backward()
        results.append((float(loss), {n: p.grad.clone() for n, p in wrapped.named_parameters() if p.grad is not None}))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-6)
    same_grads(results[1][1], results[0][1])


def test_without_labels_and_in_a_deep_copy_the_forward_is_the_models_own():
    model = build("llama")
    label_logits.compute_logits_where_labelled(model)
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    with torch.no_grad():
        full = model(**inputs).logits
        assert full.shape == (3, 12, 97)
        torch.testing.assert_close(full, type(model).forward(model, **inputs).logits)
        twin = copy.deepcopy(model)
        twin.get_output_embeddings().weight.zero_()  # a copy that computes its own logits, not the original's
        assert float(twin(**inputs).logits.abs().sum()) == 0.0
        assert float(twin(**batch()).logits.abs().sum()) == 0.0


def test_no_label_in_the_batch_is_a_zero_loss_that_reaches_every_parameter():
    model = build("llama")
    label_logits.compute_logits_where_labelled(model)
    inputs = batch()
    inputs["labels"][:] = -100
    out = model(**inputs)
    out.loss.backward()
    assert float(out.loss) == 0.0 and out.logits.shape == (0, 97)
    assert model.get_output_embeddings().weight.grad is not None


def test_other_architectures_keep_their_own_forward():
    model = build("llama")
    model.config.model_type = "gemma2"  # soft-capped logits: not a plain head
    assert not label_logits.compute_logits_where_labelled(model)
    assert "forward" not in vars(model)
