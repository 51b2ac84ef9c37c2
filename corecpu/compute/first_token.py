"""The last encoder layer computed at the first token only, for a classifier whose head reads nothing else.

A BERT-style sequence classifier (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT...) feeds its head the last layer's
output at position 0 (the pooler's `[:, 0]`, RoBERTa's `features[:, 0, :]`, DistilBERT's `hidden_state[:, 0]`).
Every other position of that layer is computed, then dropped: its query projection, its attention rows, its output
projection, its feed-forward, their dropout and layer norm, and all their backward. Only the layer's keys and
values need every token. So here the last layer projects the query of token 0 alone, attends with it over all keys
and values, and runs the rest of the layer on that one row. The head sees the same values; the gradient of every
weight is the same sum, less the terms that were zero. MiniLM (6 layers) computes 14% fewer matmul FLOPs a step,
BERT-base (12) 7%, DistilBERT (6) 14%.
Two layer families are known: BERT's (encoder.layer, attention.self.query/key/value, attention.output,
feed_forward_chunk) and DistilBERT's (transformer.layer, attention.q_lin/k_lin/v_lin/out_lin, sa_layer_norm, ffn,
output_layer_norm).

It is a change of the layer's forward method on this model instance, so the parameters, their names, the state
dict, checkpoints and the exported model are those of the unchanged model. It applies only where the head is
known to read position 0 and the layer has the shape this forward reproduces, and only after it gave the model's
own logits on a small padded batch (eval mode, fp32): a transformers release that changed the layer's internals
fails that check and keeps the full layer, with the reason recorded.

Caveat: such a model's `last_hidden_state` (and the last of `hidden_states`) has one position, not all of them.
Nothing a classifier returns reads it; `--last-layer full` keeps the whole layer.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch

from corecpu.compute import LAST_LAYER_CHOICES
from corecpu.errors import CoreCPUError

# Heads that read the last layer at position 0 only (checked again by comparing logits before it applies).
# The value names the layer family.
FIRST_TOKEN_HEADS = {
    "BertForSequenceClassification": "bert", "RobertaForSequenceClassification": "bert",
    "XLMRobertaForSequenceClassification": "bert", "CamembertForSequenceClassification": "bert",
    "ElectraForSequenceClassification": "bert", "DistilBertForSequenceClassification": "distilbert",
}
TOLERANCE = 1e-4  # logits of a random-init or trained model agree to ~1e-6 in fp32; a wrong forward is far off
_MARK = "_corecpu_first_token"  # on a layer running at its first token: its family ("bert" | "distilbert")


@dataclass(frozen=True)
class LastLayerChoice:
    """How the last encoder layer runs, and why: config.json's `decisions` entry."""

    name: str  # "first-token" | "full"
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def last_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The last encoder layer of a Hugging Face BERT-style model (encoder.layer; DistilBERT's transformer.layer),
    else None."""
    base = getattr(model, "base_model", None)
    for stack in ("encoder", "transformer"):
        layers = getattr(getattr(base, stack, None), "layer", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return layers[-1]
    return None


def unsupported(model: torch.nn.Module) -> str:
    """Why the last layer cannot run at the first token only ("" if it can). Pure: reads the model's structure."""
    name = type(model).__name__
    if name not in FIRST_TOKEN_HEADS:
        return f"{name}'s head is not one known to read position 0 only"
    layer = last_layer(model)
    if layer is None:
        return "no BERT-style encoder layers found"
    why = _unsupported_bert(layer) if FIRST_TOKEN_HEADS[name] == "bert" else _unsupported_distilbert(layer)
    if why:
        return why
    if getattr(model.config, "output_hidden_states", False):
        return "the model is set to return every layer's hidden states"
    return ""


_ATTENTION_PARTS = ("attention_head_size", "scaling", "config", "dropout")


def _unsupported_bert(layer: torch.nn.Module) -> str:
    attention = getattr(layer, "attention", None)
    self_attention = getattr(attention, "self", None)
    if not all(hasattr(self_attention, a) for a in ("query", "key", "value", *_ATTENTION_PARTS)):
        return "the last layer's attention is not BERT's (query, key, value projections)"
    if not callable(getattr(attention, "output", None)) or not callable(getattr(layer, "feed_forward_chunk", None)):
        return "the last layer has no BERT-style output and feed-forward parts"
    if getattr(layer, "is_decoder", False) or getattr(layer, "add_cross_attention", False):
        return "a decoder layer"
    if getattr(layer, "chunk_size_feed_forward", 0):
        return "the feed-forward runs in chunks (chunk_size_feed_forward)"
    if _eager_attention(self_attention) is None:
        return "the model's module has no eager_attention_forward"
    return ""


def _unsupported_distilbert(layer: torch.nn.Module) -> str:
    attention = getattr(layer, "attention", None)
    if not all(hasattr(attention, a) for a in ("q_lin", "k_lin", "v_lin", "out_lin", *_ATTENTION_PARTS)):
        return "the last layer's attention is not DistilBERT's (q_lin, k_lin, v_lin, out_lin)"
    if not all(callable(getattr(layer, a, None)) for a in ("sa_layer_norm", "ffn", "output_layer_norm")):
        return "the last layer has no DistilBERT-style layer norms and feed-forward"
    if getattr(layer.ffn, "chunk_size_feed_forward", 0):
        return "the feed-forward runs in chunks (chunk_size_feed_forward)"
    if _eager_attention(attention) is None:
        return "the model's module has no eager_attention_forward"
    return ""


def _eager_attention(self_attention: torch.nn.Module) -> Callable[..., Any] | None:
    return getattr(inspect.getmodule(type(self_attention)), "eager_attention_forward", None)


def _attend_first(attention: torch.nn.Module, query: torch.nn.Module, key: torch.nn.Module, value: torch.nn.Module,
                  hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The attention of position 0's query over every key and value, heads merged: [B, L, H] in, [B, 1, H] out.
    `attention` holds the head size, scaling, config and dropout (both families name them alike)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    batch, length = hidden_states.shape[:2]
    heads = (-1, attention.attention_head_size)
    q = query(hidden_states[:, :1]).view(batch, 1, *heads).transpose(1, 2)
    k = key(hidden_states).view(batch, length, *heads).transpose(1, 2)
    v = value(hidden_states).view(batch, length, *heads).transpose(1, 2)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-2] > 1:
        attention_mask = attention_mask[:, :, :1]  # the mask's row for query 0
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(attention.config._attn_implementation, _eager_attention(attention))
    context, _ = attend(attention, q, k, v, attention_mask, dropout=attention.dropout.p if attention.training else 0.0,
                        scaling=attention.scaling)
    return context.reshape(batch, 1, -1).contiguous()


def _first_token_forward(self: torch.nn.Module, hidden_states: torch.Tensor,
                         attention_mask: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> torch.Tensor:
    """BERT's layer forward for the query at position 0 over every key and value: [B, L, H] in, [B, 1, H] out."""
    sa = self.attention.self
    context = _attend_first(sa, sa.query, sa.key, sa.value, hidden_states, attention_mask)
    return self.feed_forward_chunk(self.attention.output(context, hidden_states[:, :1]))


def _distilbert_first_token_forward(self: torch.nn.Module, hidden_states: torch.Tensor,
                                    attention_mask: torch.Tensor | None = None, *args: Any,
                                    **kwargs: Any) -> torch.Tensor:
    """DistilBERT's TransformerBlock forward, the same way (its attention output has no dropout of its own)."""
    sa = self.attention
    context = _attend_first(sa, sa.q_lin, sa.k_lin, sa.v_lin, hidden_states, attention_mask)
    attended = self.sa_layer_norm(sa.out_lin(context) + hidden_states[:, :1])
    return self.output_layer_norm(self.ffn(attended) + attended)


_FORWARDS = {"bert": "_first_token_forward", "distilbert": "_distilbert_first_token_forward"}  # looked up when applied


def apply_first_token(model: torch.nn.Module, requested: str = "auto") -> LastLayerChoice:
    """Make `model`'s last encoder layer compute position 0 only, where supported and checked; else leave it."""
    if requested not in LAST_LAYER_CHOICES:
        raise CoreCPUError(f"last_layer must be one of {', '.join(LAST_LAYER_CHOICES)}, got {requested!r}")
    if requested == "full":
        return LastLayerChoice("full", "requested")
    why = unsupported(model)
    if why:
        return LastLayerChoice("full", why)
    layer = last_layer(model)
    assert layer is not None
    if getattr(layer, _MARK, False):
        return LastLayerChoice("first-token", "applied before")
    family = FIRST_TOKEN_HEADS[type(model).__name__]
    layer.forward = types.MethodType(globals()[_FORWARDS[family]], layer)
    try:
        difference = logits_difference(model)
    except Exception as exc:  # any failure of the new forward: the full layer stays, with the reason
        difference, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        error = ""
    if difference is None or not difference <= TOLERANCE:
        del layer.forward  # back to the class's forward
        return LastLayerChoice("full", f"the first-token forward did not reproduce the model's logits "
                                       f"({error or f'max difference {difference:.2g}'})")
    setattr(layer, _MARK, family)
    return LastLayerChoice("first-token", f"the head reads position 0 only; logits matched within {difference:.1g}")


def is_first_token(layer: torch.nn.Module | None) -> bool:
    return bool(getattr(layer, _MARK, False))


def one_token_params(layer: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of a first-token layer that run at one token a sequence: all but the keys' and values'."""
    every_token = {id(p) for m in _keys_and_values(layer) for p in m.parameters()}
    return [p for p in layer.parameters() if id(p) not in every_token]


def _keys_and_values(layer: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A first-token layer's key and value projections, by the family recorded when it was applied."""
    attention = layer.attention
    if getattr(layer, _MARK) == "distilbert":
        return attention.k_lin, attention.v_lin
    return attention.self.key, attention.self.value


def logits_difference(model: torch.nn.Module) -> float:
    """Largest relative difference between the logits of `model` as it is and with its last layer's class forward,
    on two short sequences (one padded), eval mode, fp32, no gradient. The model's mode is restored."""
    layer = last_layer(model)
    assert layer is not None and "forward" in vars(layer)
    vocab = int(getattr(model.config, "vocab_size", 100))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(min(5, vocab - 1), vocab, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            fast = model(input_ids=ids, attention_mask=mask).logits
            patched = layer.forward
            del layer.forward
            try:
                full = model(input_ids=ids, attention_mask=mask).logits
            finally:
                layer.forward = patched
    finally:
        model.train(was_training)
    scale = float(full.abs().max().clamp_min(1e-6))
    return float((fast - full).abs().max()) / scale


__all__ = ["LAST_LAYER_CHOICES", "LastLayerChoice", "apply_first_token", "is_first_token", "last_layer",
           "logits_difference", "one_token_params", "unsupported"]
