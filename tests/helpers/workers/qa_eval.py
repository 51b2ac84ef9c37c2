"""One rank of the QA evaluation check (tests/multiprocess/test_qa_eval.py): the tiny QA model's
windows evaluated across the ranks, post-processed in shares, scored; rank 0 writes what it got."""

import json
import sys

import corecpu  # noqa: I001  (first: records the launcher's CPUs)
import torch

from corecpu.tasks.qa_features import eval_features
from corecpu.tasks.registry import make_task, parse_config
from corecpu.training.modeling import load_tokenizer

out_dir, result_path, *flags = sys.argv[1:]
# Short windows, so that most contexts span several windows that land on different ranks.
cfg = parse_config(["--task", "qa", "--model", "tiny", "--max-seq-len", "96", "--doc-stride", "32",
                    "--batch-size", "1", "--output-dir", out_dir, *flags])
with corecpu.setup(backend="gloo", precision="fp32", dist_timeout=30) as run:
    task = make_task(cfg)
    data = task.load()
    tokenizer = load_tokenizer("tiny")
    # As few questions as give an odd number of windows: rank 1 then evaluates a padding filler too.
    questions = next(k for k in range(9, 60)
                     if len(eval_features(data.eval.examples[:k], tokenizer, 96, 32)) % 2 == 1)
    data.eval.examples = data.eval.examples[:questions]
    model, _ = task.model(data)
    torch.manual_seed(0)
    with torch.no_grad():  # a random head gives near-ties everywhere; larger weights make answers distinct
        for p in model.qa_outputs.parameters():
            p.mul_(50)
    _, held = task.features(data, tokenizer, run)
    model = run.wrap(model)[0]
    loader = run.eval_loader(held, 1, collate_fn=task.collate(tokenizer))  # batch 1: no padding, same math
    scores = task.evaluate(run, model, loader)
    if run.is_main:
        json.dump({"scores": scores, "features": len(held), "batches": len(loader), "questions": questions},
                  open(result_path, "w"))
