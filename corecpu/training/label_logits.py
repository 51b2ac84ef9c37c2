"""Logits only where a label is: a causal LM's head and loss computed at the positions the loss counts.

Fine-tuning data is mostly prompt. In the built-in instruction set 16% of the tokens are completion tokens, and
chat data with system prompts is no different; yet a causal LM's forward computes the vocabulary-wide logits
(and the loss's softmax over them) at every position, and its backward carries them back, only for the loss to
ignore all but the labelled ones. The head is no small part: 21% of the 135M-parameter model's weights (a
49,152-token vocabulary), 28% of Qwen2.5-0.5B's. Here the model's forward, when given labels, runs the decoder,
then the head and the cross-entropy on the positions whose next token is a label, and nowhere else. The loss is
the same mean over label tokens as transformers' ForCausalLMLoss, and so are the gradients (a unit test checks
both against the model's own forward for every architecture listed).

Only architectures whose head is a plain linear map of the decoder's last hidden state are patched
(PLAIN_HEADS; Gemma 2's soft-capping or Cohere's logit scale would need their own step); any other keeps its
own forward. A call without labels (generation, a user's inference) is the model's own forward, untouched.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import CausalLMOutputWithPast

IGNORE = -100
# model_type -> their *ForCausalLM forward is: hidden = base_model(...).last_hidden_state; logits = lm_head(hidden)
PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3", "gpt2"})
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels", "logits_to_keep")


def applies(model: Any) -> bool:
    config = getattr(model, "config", None)
    return (getattr(config, "model_type", None) in PLAIN_HEADS and model.get_output_embeddings() is not None
            and model.base_model is not model)


def compute_logits_where_labelled(model: Any) -> bool:
    """Patch `model` (a transformers *ForCausalLM, before LoRA, DDP or anything else wraps it) so that a forward
    with labels computes logits only at labelled positions; the returned output's `logits` are then those rows
    ([label tokens, vocabulary]). Returns whether it applied (False: an architecture not in PLAIN_HEADS)."""
    if not applies(model):
        return False
    model.forward = types.MethodType(_forward_where_labelled, model)
    return True


def is_applied(model: torch.nn.Module) -> bool:
    """Whether `model`, or a module inside a wrapper of it (DDP, PEFT), computes logits only where labelled."""
    return any(getattr(getattr(m, "forward", None), "__func__", None) is _forward_where_labelled
               for m in model.modules())


def _forward_where_labelled(self: Any, input_ids: Any = None, labels: torch.Tensor | None = None,
                            **kwargs: Any) -> Any:
    if labels is None or any(kwargs.get(k) is not None for k in _LOSS_KWARGS):
        # The class's forward, not a captured bound method: a deep copy of the model must call its own.
        return type(self).forward(self, input_ids=input_ids, labels=labels, **kwargs)
    kwargs.pop("return_dict", None)
    hidden = self.base_model(input_ids=input_ids, **kwargs).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE
    head = self.get_output_embeddings()
    if not bool(keep.any()):
        # No label here: a zero loss that still reaches the head, as every parameter must for DDP.
        logits = head(hidden[:, :1])
        return CausalLMOutputWithPast(loss=logits.float().sum() * 0.0, logits=logits.new_zeros(0, logits.size(-1)))
    logits = head(hidden[:, :-1][keep])
    loss = F.cross_entropy(logits.float(), targets[keep], reduction="mean")
    return CausalLMOutputWithPast(loss=loss, logits=logits)
