"""Causal-LM features: examples packed into bins of at most max_seq_len tokens (or one per item), and the
collation that keeps packed documents apart.

    feats = CausalFeatures(tok, max_seq_len, packing=True)   # a Features (corecpu.tasks.contract)
    collate = make_causal_collate(pad_id, pad_to_multiple_of, max_len)

A batch holds `input_ids`, `labels`, `position_ids` and `attention_mask` for the model, and the META_KEYS
of corecpu.data.tokenized plus `num_label_tokens` for the loop to pop before the forward:
  labels            input_ids where the loss mask is 1, else -100; also -100 at every document's first
                    token, so no document is predicted from the one packed before it (HF's loss shifts:
                    labels[t] is the target predicted at position t-1)
  position_ids      0, 1, ... restarting at every document (padding counts as a document of its own)
  attention_mask    (B, 1, T, T) bool, True where a query may attend a key: same document and key <= query.
                    Without it packed documents attend to each other. HF passes a 4-D mask through as it
                    is: a bool mask suits the sdpa (default) attention; eager attention would add it as numbers.
  num_label_tokens  int, labels[:, 1:] != -100: what HF's loss averages over (pass as num_items_in_batch
                    to sum over a whole accumulation window)
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Dataset

from corecpu.data.causal_tokens import Tokenized
from corecpu.data.tokenized import padded_width
from corecpu.errors import CoreCPUError

IGNORE = -100  # the label HF's cross-entropy skips
META_KEYS = ("num_tokens", "num_padded", "num_attended", "valid", "num_label_tokens")


def pack_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: longest first (ties by index), each into the fullest bin it fits (ties by the
    older bin), else a new bin. Returns the bins in the order they were opened, indices in placement order."""
    too_long = [i for i, n in enumerate(lengths) if n > capacity]
    if too_long:
        raise CoreCPUError(f"example {too_long[0]} has {lengths[too_long[0]]} tokens, more than the bin capacity "
                           f"{capacity}; truncate examples to max_seq_len before packing")
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin number), sorted: the first fit is the best fit
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            bins.append([])
            room, b = capacity, len(bins) - 1
        else:
            room, b = free.pop(at)
        bins[b].append(i)
        bisect.insort(free, (room - lengths[i], b))
    return bins


class CausalFeatures(Dataset):
    """Items of {"input_ids", "loss_mask", "doc_lens"}: one bin of packed examples each, or one example."""

    def __init__(self, tok: Tokenized, max_seq_len: int, packing: bool) -> None:
        lengths = [len(ids) for ids in tok.input_ids]
        self.groups = pack_bins(lengths, max_seq_len) if packing else [[i] for i in range(len(lengths))]
        self.tok = tok
        self.max_seq_len = max_seq_len
        self.lengths = [sum(lengths[i] for i in g) for g in self.groups]  # tokens per item
        # Targets per item once HF shifts the labels: a document's first token is never one.
        self.label_tokens = [sum(sum(tok.loss_mask[i][1:]) for i in g) for g in self.groups]

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, key: int | tuple[int, bool]) -> dict[str, Any]:
        # EvalShardSampler yields (index, valid) so filler items reach collate marked invalid.
        i, valid = key if isinstance(key, tuple) else (key, True)
        group = self.groups[i]
        return {"input_ids": [t for j in group for t in self.tok.input_ids[j]],
                "loss_mask": [m for j in group for m in self.tok.loss_mask[j]],
                "doc_lens": [len(self.tok.input_ids[j]) for j in group], "valid": valid}


def make_causal_collate(pad_id: int, pad_to_multiple_of: int = 0,
                        max_len: int | None = None) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """Right-pad CausalFeatures items to one width (corecpu.data.tokenized.padded_width); see the module
    docstring for the keys."""

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(it["input_ids"]) for it in items]
        width = padded_width(max(lengths), pad_to_multiple_of, max_len)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
        positions = torch.empty((len(items), width), dtype=torch.long)
        segments = torch.empty((len(items), width), dtype=torch.long)
        for row, (it, n) in enumerate(zip(items, lengths)):
            row_ids = torch.tensor(it["input_ids"], dtype=torch.long)
            ids[row, :n] = row_ids
            labels[row, :n] = torch.where(torch.tensor(it["loss_mask"], dtype=torch.bool), row_ids, IGNORE)
            spans = torch.tensor([*it["doc_lens"], width - n], dtype=torch.long)  # padding: one more segment
            starts = torch.cumsum(spans, 0) - spans
            segment = torch.repeat_interleave(torch.arange(len(spans)), spans)
            segments[row] = segment
            positions[row] = torch.arange(width) - starts[segment]
            labels[row, starts[:-1]] = IGNORE  # a document's first token is not predicted from the one before
        causal = torch.ones((width, width), dtype=torch.bool).tril()
        attention = (segments[:, :, None] == segments[:, None, :]) & causal
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "attention_mask": attention[:, None],
                "num_tokens": sum(lengths), "num_padded": width * len(items) - sum(lengths),
                "num_attended": sum(n * n for it in items for n in it["doc_lens"]),  # each document on its own
                "valid": torch.tensor([it.get("valid", True) for it in items], dtype=torch.bool),
                "num_label_tokens": int((labels[:, 1:] != IGNORE).sum())}

    return collate
