"""Causal-LM training of a small GPT-style model on a text file, with packed sequences and perplexity.

    ./launch.sh 2 examples/causal_lm.py --text my_corpus.txt --steps 200
    ./launch.sh 2 examples/causal_lm.py                 # the built-in corpus (corecpu's generated reviews)
    python examples/causal_lm.py --steps 20

No hub is reachable from the machines this targets, so the model is a tiny GPT-2 built from a
config here, and the tokenizer is byte-level (UTF-8 bytes + an end-of-document token): nothing
to download. Documents are joined with that token and packed into fixed-length blocks, so no
position is padding. Perplexity is exp(mean token loss) on a held-out 10% of the documents,
summed over all ranks (each block is counted once).
"""

import argparse
import json
import math
from pathlib import Path

import torch
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

import corecpu

p = argparse.ArgumentParser()
p.add_argument("--text", help="UTF-8 text file, one document per line (default: built-in reviews)")
p.add_argument("--block", type=int, default=64, help="tokens per packed training sequence")
p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
p.add_argument("--steps", type=int, default=60)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--out", default="runs/causal_lm")
p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
args = p.parse_args()

EOD = 256  # end-of-document token after the 256 byte values


def load_documents(path: str | None) -> list[str]:
    if path is None:
        from corecpu.data.sources import load_data

        return load_data("builtin", split="train").texts
    try:
        docs = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"causal_lm.py: error: cannot read --text {path}: {exc}; pass a UTF-8 text file")
    if len(docs) < 10:
        raise SystemExit(f"causal_lm.py: error: --text {path} has {len(docs)} non-empty lines; need at least 10")
    return docs


def pack(docs: list[str], block: int) -> torch.Tensor:
    """All documents as one token stream, cut into (n, block) rows; the ragged tail is dropped."""
    stream = [t for d in docs for t in (*d.encode("utf-8"), EOD)]
    n = len(stream) // block
    return torch.tensor(stream[: n * block]).view(n, block)


docs = load_documents(args.text)
held_out = len(docs) // 10  # documents, not blocks, are held out: no text is in both splits
train_blocks, eval_blocks = pack(docs[held_out:], args.block), pack(docs[:held_out], args.block)

with corecpu.setup(precision=args.precision) as run:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=EOD + 1, n_positions=args.block, n_embd=128, n_layer=4, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # no dropout: runs comparable
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    loader = run.loader(TensorDataset(train_blocks), batch_size=args.batch_size, seed=0)
    ckpt = corecpu.Checkpoints(args.out, resume="")  # saved once, at the last step
    model, optimizer = run.wrap(model, optimizer, loader=loader, checkpoint=ckpt)  # its forward autocasts
    run.print0(run.banner()[0])
    run.print0(f"{len(docs)} documents: {len(train_blocks)} train / {len(eval_blocks)} eval blocks of {args.block} "
               f"tokens; {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")

    def perplexity() -> float:
        # Every rank scores its strided share of the held-out blocks; sums, not means, are reduced.
        loss_sum = tokens = 0.0
        with run.evaluating(model):
            for i in range(run.rank, len(eval_blocks), run.world_size):
                ids = eval_blocks[i: i + 1]
                loss = corecpu.unwrap(model)(input_ids=ids, labels=ids).loss.float()
                loss_sum, tokens = loss_sum + loss.item() * (args.block - 1), tokens + args.block - 1
        total_loss, total_tokens = run.all_reduce_sum([loss_sum, tokens])
        return math.exp(total_loss / max(total_tokens, 1))

    run.print0(json.dumps({"step": 0, "eval_perplexity": round(perplexity(), 3)}))
    steps = run.steps(loader, max_steps=args.steps)
    for step in steps:
        for (ids,) in step.micro_batches():
            loss = model(input_ids=ids, labels=ids).loss
            step.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.print0(json.dumps({"step": step.number,
                               "loss": round(run.all_reduce_sum([loss.item()])[0] / run.world_size, 6)}))
        if step.is_last:
            ppl = perplexity()
            run.print0(json.dumps({"step": step.number, "eval_perplexity": round(ppl, 3)}))
        ckpt.save(step)
    run.print0(f"done: {steps.completed} steps, held-out perplexity {ppl:.2f} (a uniform guess over bytes: {EOD + 1})")
