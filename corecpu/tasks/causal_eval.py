"""What one evaluation of a causal LM computes: held-out loss and perplexity over every label token of every
rank, and greedy completions of held-out prompts (written to generations.jsonl, scored by exact match).

Both are collectives with every rank's share: the loss sums and token counts are all-reduced, and each rank
generates a slice of the prompts, gathered on every rank, so that no rank idles at a barrier while one
generates them all (which, on a slow CPU, could outlast the process group's timeout).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.utils.data import DataLoader

from corecpu import atomic
from corecpu.data.builtin_sft import exact_match
from corecpu.data.tokenized import pop_meta
from corecpu.training.run import Run

GENERATE_BATCH = 16  # prompts per generate() call: left-padded together


def eval_loss(run: Run, model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
    """Token-weighted held-out loss and perplexity over the whole eval set (every rank its shard)."""
    sums = [0.0, 0.0, 0.0]  # loss, label tokens, rows
    for batch in loader:
        meta = pop_meta(batch)
        labels = batch.pop("labels").masked_fill(~meta["valid"][:, None], -100)  # filler rows count nothing
        tokens = float((labels[:, 1:] != -100).sum())
        if tokens:
            # The model's own mean over its label tokens (corecpu.training.label_logits: computed at those alone);
            # the wrapped forward autocasts where bf16 was chosen.
            sums[0] += float(model(**batch, labels=labels).loss) * tokens
        sums = [sums[0], sums[1] + tokens, sums[2] + float(meta["valid"].sum())]
    loss_sum, tokens, rows = run.all_reduce_sum(sums)
    loss = loss_sum / max(tokens, 1.0)
    return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)), "eval_tokens": int(tokens),
            "eval_examples": int(rows)}


def generate_share(run: Run, model: Any, tokenizer: Any, prompts: Sequence[tuple[list[int], list[int]]],
                   max_new_tokens: int) -> list[dict[str, Any]]:
    """Greedy completions of every (prompt ids, reference ids), each rank its slice, gathered on every rank in
    prompt order, with exact match. Token ids in, so the prompt is exactly what preceded the completion in
    training (its BOS, its chat template's turn markers)."""
    mine = list(range(run.rank, len(prompts), run.world_size))
    rows: list[dict[str, Any]] = []
    for start in range(0, len(mine), GENERATE_BATCH):
        idx = mine[start:start + GENERATE_BATCH]
        with run.autocast():  # generate() runs the unwrapped model
            texts = complete(model, tokenizer, [prompts[i][0] for i in idx], max_new_tokens)
        for i, text in zip(idx, texts):
            reference = tokenizer.decode(prompts[i][1], skip_special_tokens=True).strip()
            rows.append({"index": i, "prompt": tokenizer.decode(prompts[i][0], skip_special_tokens=True),
                         "completion": text, "reference": reference, "exact_match": exact_match(text, reference)})
    every = [row for share in run.gather(rows) for row in share]
    return sorted(every, key=lambda r: r["index"])


def complete(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy continuations of `prompts` (token ids, left-padded into one batch), decoded up to EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, use_cache=True)
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]


def write_generations(output_dir: Path, step: int, rows: list[dict[str, Any]]) -> None:
    """generations.jsonl: the last evaluation's completions (rank 0), replaced whole each time."""
    atomic.write_text(output_dir / "generations.jsonl", "".join(json.dumps({"step": step, **r}) + "\n" for r in rows))
