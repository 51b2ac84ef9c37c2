"""Tokenized examples and the collation that pads them into batches.

Batches from `make_collate` carry non-model keys, listed in META_KEYS, that the
training loop must pop before calling the model:
  num_tokens  int, real (non-pad) tokens in the batch, for tokens/s logging;
  num_padded  int, pad positions in the batch: padding fraction = num_padded / (num_padded + num_tokens);
  num_attended  int, the sum over the batch's sequences of their real length squared: attention's useful
              work (MFU, corecpu.compute.flops); each of a language model's packed documents is a sequence;
  valid       BoolTensor (B,), False for filler items that only exist so every rank
              runs the same number of eval batches. Weight per-example metrics by it.
and, from a language model's collate (corecpu.data.packing), one more:
  num_label_tokens  int, positions whose label counts in the loss (what the model's loss averages over).
`pop_meta(batch)` takes out whichever of them the batch has.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import Dataset

from corecpu.data.types import ClassificationData
from corecpu.errors import CoreCPUError

META_KEYS = ("num_tokens", "num_padded", "num_attended", "valid")
OPTIONAL_META_KEYS = ("num_label_tokens",)


def pop_meta(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's non-model keys, removed from it: what is left goes to model(**batch)."""
    return {k: batch.pop(k) for k in META_KEYS + OPTIONAL_META_KEYS if k in batch}

_SEQUENCES = ("input_ids", "token_type_ids", "valid")  # padded per batch (or, valid, kept as booleans)


class TokenizedDataset(Dataset):
    """Tokenizes everything once (truncating, not padding); items are dicts of int lists."""

    def __init__(self, data: ClassificationData, tokenizer: Any, max_seq_len: int) -> None:
        specials = tokenizer.num_special_tokens_to_add(pair=data.text_pairs is not None)
        if max_seq_len <= specials + 1:
            raise CoreCPUError(f"max sequence length {max_seq_len} leaves no room for text after {specials} "
                               "special tokens; pass a larger --max-seq-len (e.g. 128)")
        enc = tokenizer(data.texts, data.text_pairs, truncation=True, max_length=max_seq_len, padding=False)
        self.input_ids: list[list[int]] = enc["input_ids"]
        self.token_type_ids: list[list[int]] | None = enc.get("token_type_ids")
        self.labels = data.labels
        self.label_names = data.label_names
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        # Upper bound on truncated examples (an untruncated one can be exactly max long).
        self.num_at_max_len = sum(len(ids) >= max_seq_len for ids in self.input_ids)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> list[int]:
        """Tokens per example (after truncation): what length grouping sorts by."""
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, key: int | tuple[int, bool]) -> dict[str, Any]:
        # EvalShardSampler yields (index, valid) so filler items reach collate marked invalid.
        i, valid = key if isinstance(key, tuple) else (key, True)
        item: dict[str, Any] = {"input_ids": self.input_ids[i], "labels": self.labels[i], "valid": valid}
        if self.token_type_ids is not None:
            item["token_type_ids"] = self.token_type_ids[i]
        return item


def padded_width(longest: int, pad_to_multiple_of: int = 0, max_len: int | None = None) -> int:
    """Batch width: the longest item rounded up to a multiple of N, but never past max_len.
    The cap keeps widths within the model's position embeddings (a 512-token model with
    N=48 would otherwise get 528) and costs at most one extra shape: max_len itself."""
    if pad_to_multiple_of <= 1:
        return longest
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    return width if max_len is None else max(longest, min(width, max_len))


def make_collate(tokenizer: Any, pad_to_multiple_of: int = 0,
                 max_len: int | None = None) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """Pad to the longest item in the batch (rounded up by `padded_width`); adds META_KEYS
    (see module docstring). Any other key of the items holds one integer each and becomes a
    (B,) long tensor: `labels`, or QA's `start_positions` / `end_positions`."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    left = getattr(tokenizer, "padding_side", "right") == "left"

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(it["input_ids"]) for it in items]
        width = padded_width(max(lengths), pad_to_multiple_of, max_len)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        types = torch.zeros((len(items), width), dtype=torch.long) if "token_type_ids" in items[0] else None
        for row, (it, n) in enumerate(zip(items, lengths)):
            cols = slice(width - n, width) if left else slice(0, n)
            ids[row, cols] = torch.tensor(it["input_ids"], dtype=torch.long)
            mask[row, cols] = 1
            if types is not None:
                types[row, cols] = torch.tensor(it["token_type_ids"], dtype=torch.long)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            batch["token_type_ids"] = types
        # One integer per item, whatever the task calls it: labels, start/end positions, feature_index.
        for key in items[0]:
            if key not in _SEQUENCES:
                batch[key] = torch.tensor([it[key] for it in items], dtype=torch.long)
        batch["num_tokens"] = sum(lengths)
        batch["num_padded"] = width * len(items) - sum(lengths)
        batch["num_attended"] = sum(n * n for n in lengths)
        batch["valid"] = torch.tensor([it.get("valid", True) for it in items], dtype=torch.bool)
        return batch

    return collate
