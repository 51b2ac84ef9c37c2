"""One training step of a causal LM with logits at every position (the model's own forward) against logits at
label tokens only (corecpu.training.label_logits), on the built-in instruction set packed as corecpu packs it.

    python benchmarks/label_logits.py --model ~/.cache/corecpu/models/llama-135m-v1 --threads 2 --repeats 5 \\
        --out benchmarks/results/label-logits-135m.json

Each timed step is forward, backward and a fused AdamW step on the same batch (--batch rows of --max-seq-len),
the two forms interleaved after one untimed step each; medians. The loss of both is printed: it must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corecpu.data.builtin_sft import builtin_sft  # noqa: E402
from corecpu.data.causal_records import CausalData  # noqa: E402
from corecpu.data.causal_tokens import tokenize_causal  # noqa: E402
from corecpu.data.packing import CausalFeatures, make_causal_collate  # noqa: E402
from corecpu.data.tokenized import pop_meta  # noqa: E402
from corecpu.training.label_logits import compute_logits_where_labelled  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    rows = tuple(builtin_sft("train", seed=0)[:200])
    features = CausalFeatures(tokenize_causal(CausalData("prompt_completion", rows, "sft"), tokenizer, a.max_seq_len),
                              a.max_seq_len, True)
    batch = make_causal_collate(tokenizer.pad_token_id, 0, a.max_seq_len)([features[i] for i in range(a.batch)])
    pop_meta(batch)
    labelled = float((batch["labels"][:, 1:] != -100).float().mean())
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.config.use_cache = False
    own = model.forward
    assert compute_logits_where_labelled(model)
    patched = model.forward
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, fused=True)  # lr 0: every step sees the same weights

    def step(forward: types.MethodType) -> tuple[float, float]:
        model.forward = forward
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start, float(loss)

    forms = {"every_position": own, "label_tokens": patched}
    for f in forms.values():
        step(f)
    times: dict[str, list[float]] = {k: [] for k in forms}
    losses: dict[str, float] = {}
    for _ in range(a.repeats):
        for name, f in forms.items():
            seconds, losses[name] = step(f)
            times[name].append(seconds)
    table = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": a.model, "threads": a.threads, "batch": [a.batch, a.max_seq_len], "labelled_share": labelled,
              "step_s": table, "speedup": table["every_position"] / table["label_tokens"], "losses": losses,
              "times": times}
    a.out.write_text(json.dumps(result, indent=1))
    print(f"labelled {labelled:.1%} of positions; step {table['every_position']:.3f} s -> {table['label_tokens']:.3f} s "
          f"({result['speedup']:.2f}x); loss {losses['every_position']:.6f} vs {losses['label_tokens']:.6f}")


if __name__ == "__main__":
    main()
