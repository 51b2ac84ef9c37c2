"""Bytes the sparse word-embedding all-reduce saves (`--sparse-embedding-allreduce`): counted, not timed.

    python benchmarks/sparse_rows_count.py                    # paraphrase, MiniLM, 2 ranks x 16, one epoch
    python benchmarks/sparse_rows_count.py --ranks 4 --grad-accum 2

Goes through one epoch of each rank's batches as train.py makes them (length-grouped, its collate), and per
optimizer step counts the union of the word-embedding rows the ranks touched (their token ids but padding, whose
row gets no gradient): what corecpu.distributed.sparse_rows all-reduces instead of the whole embedding. Bytes are
fp32 on the wire, what one rank hands the all-reduce (a ring moves about twice that over the link either way),
plus the row ids every rank gathers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corecpu.data.builtin import task_dataset  # noqa: E402
from corecpu.data.sampling import build_loader, set_epoch  # noqa: E402
from corecpu.data.tokenized import TokenizedDataset  # noqa: E402
from corecpu.distributed.sparse_rows import DENSE_ABOVE  # noqa: E402
from corecpu.training.modeling import load_model, load_tokenizer  # noqa: E402

MB = 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="paraphrase")
    p.add_argument("--model", default="default")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    tokenizer = load_tokenizer(args.model)
    model, _ = load_model(args.model, ["a", "b"], args.seed)
    params = sum(x.numel() for x in model.parameters())
    rows, width = model.get_input_embeddings().weight.shape
    ds = TokenizedDataset(task_dataset(args.task, "train", seed=args.seed), tokenizer, args.max_seq_len)
    loaders = [build_loader(ds, args.batch_size, r, args.ranks, seed=args.seed, group_by_length=True)
               for r in range(args.ranks)]
    for loader in loaders:
        set_epoch(loader, 0)
    pad = tokenizer.pad_token_id
    unions, per_rank, ids_sent, step_rows = [], [], [], [set() for _ in range(args.ranks)]
    for i, batches in enumerate(zip(*loaders)):
        for r, batch in enumerate(batches):
            step_rows[r] |= {int(t) for t in batch["input_ids"].flatten()} - {pad}
        if (i + 1) % args.grad_accum == 0:
            unions.append(len(set().union(*step_rows)))
            per_rank.append(sum(len(s) for s in step_rows) / args.ranks)
            ids_sent.append(max(len(s) for s in step_rows) * args.ranks)  # padded ids every rank gathers
            step_rows = [set() for _ in range(args.ranks)]

    mean = sum(unions) / len(unions)
    dense = rows * width * 4
    sparse = mean * width * 4 + sum(ids_sent) / len(ids_sent) * 8 + args.ranks * 8
    print(f"{args.model} on {args.task}: {params / 1e6:.1f}M parameters, word embedding {rows} x {width} "
          f"({dense / MB:.1f} MB fp32, {100 * rows * width / params:.0f}% of the gradient)")
    print(f"{args.ranks} ranks x {args.batch_size} x grad_accum {args.grad_accum}, {len(unions)} steps: "
          f"rows touched per rank {sum(per_rank) / len(per_rank):.0f}, union {mean:.0f} mean "
          f"(min {min(unions)}, max {max(unions)}; dense fallback above {DENSE_ABOVE * rows:.0f})")
    print(f"per step and rank into the all-reduce: dense {dense / MB:.2f} MB, sparse {sparse / MB:.3f} MB "
          f"(rows + ids); saved {(dense - sparse) / MB:.2f} MB = {100 * (dense - sparse) / (params * 4):.0f}% "
          f"of the {params * 4 / MB:.1f} MB gradient")


if __name__ == "__main__":
    main()
