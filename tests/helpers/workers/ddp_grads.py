"""One rank of the DDP-vs-single-process gradient check (run by tests/multiprocess/test_ddp.py)."""

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import corecpu
from corecpu.distributed.allreduce import ProcessGroupAllreduce
from corecpu.training.modeling import tiny_config
from transformers import BertForSequenceClassification

out_path = sys.argv[1]
torch.manual_seed(0)
ids = torch.randint(5, 1000, (8, 12))
mask = torch.ones_like(ids)
mask[1, 9:] = 0  # one padded example, so masks matter
labels = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])


def model_and_grads(ids, mask, labels, wrap):
    torch.manual_seed(1)
    model = BertForSequenceClassification(tiny_config(1000, 2))
    m = wrap(model)
    m(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def on_group(group):
    """DDP whose buckets go over `group` through corecpu's ProcessGroupAllreduce (as when gloo wins the
    timing beside a ccl process group)."""
    def wrap(model):
        ddp = DDP(model)
        ProcessGroupAllreduce("fp32", group).register(ddp)
        return ddp
    return wrap


with corecpu.setup(backend="gloo", dist_timeout=30) as ctx:
    half = slice(4 * ctx.rank, 4 * ctx.rank + 4)
    ddp = model_and_grads(ids[half], mask[half], labels[half], DDP)
    hooked = model_and_grads(ids[half], mask[half], labels[half], on_group(dist.new_group(backend="gloo")))
    if ctx.rank == 0:
        single = model_and_grads(ids, mask, labels, lambda m: m)
        diffs = {n: (ddp[n] - single[n]).abs().max().item() for n in single}
        scale = max(single[n].abs().max().item() for n in single)
        hook_diff = max((hooked[n] - ddp[n]).abs().max().item() for n in ddp)
        json.dump({"max_diff": max(diffs.values()), "scale": scale, "n": len(diffs), "hook_diff": hook_diff},
                  open(out_path, "w"))
