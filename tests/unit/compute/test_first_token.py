"""A classifier's last layer at its first token only: the same logits and gradients, less work, or the full layer."""

from __future__ import annotations

import pytest
import torch
from transformers import (BertConfig, BertForQuestionAnswering, BertForSequenceClassification, DistilBertConfig,
                          DistilBertForSequenceClassification, RobertaConfig, RobertaForSequenceClassification)

from corecpu.compute import first_token, flops
from corecpu.errors import CoreCPUError


def _config(cls=BertConfig, dropout: float = 0.0, **kw):
    return cls(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=64, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
               num_labels=3, pad_token_id=1, **kw)


def _distilbert(dropout: float = 0.0) -> DistilBertForSequenceClassification:
    return DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=300, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64, dropout=dropout,
        attention_dropout=dropout, seq_classif_dropout=dropout, num_labels=3, pad_token_id=1))


def _batch(rows: int = 4, length: int = 9) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padded rows: the mask's row for query 0 is what the first token sees
    mask[3, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 1])[:rows]}


def _grads(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_logits_and_every_gradient_match_the_full_layer(kernel: str, family: str):
    torch.manual_seed(0)
    if family == "bert":
        model = BertForSequenceClassification(_config())
    elif family == "roberta":
        model = RobertaForSequenceClassification(_config(RobertaConfig))
    else:
        model = _distilbert()
    model.set_attn_implementation(kernel)
    model.train()  # dropout 0: training mode, deterministic
    batch = _batch()
    full_logits, full = _grads(model, batch)
    keys = list(model.state_dict())

    choice = first_token.apply_first_token(model)
    assert choice.name == "first-token", choice
    assert first_token.is_first_token(first_token.last_layer(model))
    fast_logits, fast = _grads(model, batch)

    torch.testing.assert_close(fast_logits, full_logits, rtol=1e-5, atol=1e-6)
    assert set(fast) == set(full)
    for name, grad in full.items():
        if name.endswith(("attention.self.key.bias", "attention.k_lin.bias")):
            continue  # softmax ignores a shift of every score: its true gradient is 0, both are rounding noise
        torch.testing.assert_close(fast[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert list(model.state_dict()) == keys  # checkpoints and the exported model are the unchanged model's


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_with_dropout_it_trains_and_evaluation_matches_the_full_layer(family: str):
    torch.manual_seed(0)
    model = BertForSequenceClassification(_config(dropout=0.1)) if family == "bert" else _distilbert(dropout=0.1)
    assert first_token.apply_first_token(model).name == "first-token"
    model.train()
    out = model(**_batch())
    out.loss.backward()
    assert out.logits.shape == (4, 3) and torch.isfinite(out.loss)
    assert first_token.logits_difference(model) < 1e-5
    assert model.training  # the check restored the mode


def test_full_is_left_alone_and_a_bad_choice_is_one_error():
    model = BertForSequenceClassification(_config())
    assert first_token.apply_first_token(model, "full") == first_token.LastLayerChoice("full", "requested")
    assert "forward" not in vars(first_token.last_layer(model))
    with pytest.raises(CoreCPUError, match="last_layer must be one of auto, full"):
        first_token.apply_first_token(model, "half")


def test_heads_that_read_other_positions_keep_the_full_layer():
    qa = BertForQuestionAnswering(_config())
    choice = first_token.apply_first_token(qa)
    assert choice.name == "full" and "BertForQuestionAnswering" in choice.reason
    every_layer = BertForSequenceClassification(_config(output_hidden_states=True))
    assert "hidden states" in first_token.apply_first_token(every_layer).reason
    assert first_token.unsupported(torch.nn.Linear(2, 2)) != ""


def test_a_forward_that_does_not_reproduce_the_logits_is_taken_back(monkeypatch):
    # What a transformers release that changed the layer's internals would look like: the check catches it.
    model = BertForSequenceClassification(_config())
    wrong = first_token._first_token_forward

    def off_by_a_bit(self, hidden_states, attention_mask=None, *args, **kwargs):
        return wrong(self, hidden_states, attention_mask) * 1.5
    monkeypatch.setattr(first_token, "_first_token_forward", off_by_a_bit)
    choice = first_token.apply_first_token(model)
    assert choice.name == "full" and "did not reproduce the model's logits" in choice.reason
    assert "forward" not in vars(first_token.last_layer(model))
    assert not first_token.is_first_token(first_token.last_layer(model))

    def raises(self, *args, **kwargs):
        raise TypeError("unexpected keyword argument 'cache'")
    monkeypatch.setattr(first_token, "_first_token_forward", raises)
    choice = first_token.apply_first_token(model)
    assert choice.name == "full" and "TypeError: unexpected keyword argument 'cache'" in choice.reason

    monkeypatch.setattr(first_token, "_distilbert_first_token_forward", raises)  # each family's own forward
    choice = first_token.apply_first_token(_distilbert())
    assert choice.name == "full" and "TypeError" in choice.reason


def test_a_distilbert_layer_of_another_shape_keeps_the_full_layer():
    model = _distilbert()
    del first_token.last_layer(model).attention.q_lin
    assert "not DistilBERT's" in first_token.apply_first_token(model).reason
    assert "forward" not in vars(first_token.last_layer(model))


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_the_flop_count_leaves_out_what_the_last_layer_no_longer_computes(family: str):
    model = BertForSequenceClassification(_config()) if family == "bert" else _distilbert()
    before = flops.count_flops(model)
    first_token.apply_first_token(model)
    after = flops.count_flops(model)
    layer = first_token.last_layer(model)
    a = layer.attention
    keys_values = (a.self.key, a.self.value) if family == "bert" else (a.k_lin, a.v_lin)
    at_one = sum(p.numel() for p in layer.parameters()) - sum(p.numel() for m in keys_values for p in m.parameters())
    assert before.first_token == 0 and after.first_token == 6 * at_one
    tokens, rows, attended = 30, 4, 4 * 7.5 ** 2
    saved = 6 * at_one * (tokens - rows) + 12 * 32 * (attended - tokens)  # one query a row in the last layer
    assert before.batch(tokens, attended, samples=rows) - after.batch(tokens, attended, samples=rows) == \
        pytest.approx(saved)
