"""Which rank writes which part of a checkpoint: pure planning, no I/O and no torch.distributed.

Under DDP every rank holds the same model and the same optimizer state, so any rank can write any part of it.
A full fine-tuning checkpoint is mostly optimizer state (AdamW's two moments: twice the model's bytes), and one
writer serialises, digests and syncs it alone while the other ranks wait at the next collective. So the ranks on
rank 0's host (the ones sure to see the same output directory) split the optimizer's per-parameter state between
them, balanced by bytes: rank 0 writes state.pt (the model, the RNG states, the schedule, the optimizer's
parameter groups and its own share of the optimizer state), rank r writes optimizer-r.pt with its share.
Measured on the 2-vCPU EPYC for the 135M-parameter model (1.6 GB): see checkpoint_state.save.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

# Below this many bytes of optimizer state one file is written: the extra collective and file are not worth it
# (a LoRA run's adapters, the tests' tiny models).
SHARD_MIN_BYTES = 64 << 20
SHARD_NAME = "optimizer-{rank}.pt"


def tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in a nested state: what torch.save writes, give or take its headers."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def writer_ranks(hosts: Sequence[str]) -> list[int]:
    """The ranks that write a part: those on rank 0's host, which see its output directory for certain."""
    return [r for r, host in enumerate(hosts) if host == hosts[0]]


def plan(sizes: Mapping[Any, int], writers: int, head_start: int) -> list[list[Any]]:
    """Which optimizer-state keys each of `writers` writes (index 0: rank 0), balanced by bytes.

    `sizes`: bytes per key of the optimizer's "state"; `head_start`: the bytes rank 0 writes anyway (the model).
    Largest first to the least loaded writer; ties go to the lower index, so every rank plans the same."""
    if writers < 1:
        raise ValueError(f"writers must be >= 1, got {writers}")
    loads = [head_start] + [0] * (writers - 1)
    parts: list[list[Any]] = [[] for _ in range(writers)]
    for key in sorted(sizes, key=lambda k: (-sizes[k], str(k))):
        least = min(range(writers), key=lambda i: (loads[i], i))
        parts[least].append(key)
        loads[least] += sizes[key]
    return parts


def split(optimizer_state: dict[str, Any], parts: list[list[Any]]) -> list[dict[str, Any]]:
    """optimizer.state_dict() cut by `plan`: part 0 keeps everything but the other parts' "state" entries
    (param_groups included); part i > 0 is {"state": {its keys}}. No tensor is copied."""
    state = optimizer_state["state"]
    first = {k: v for k, v in optimizer_state.items() if k != "state"}
    first["state"] = {k: state[k] for k in parts[0]}
    return [first] + [{"state": {k: state[k] for k in keys}} for keys in parts[1:]]


def merge(first: dict[str, Any], others: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The optimizer state_dict that split() cut, put back together (key order as the optimizer gave it)."""
    state = dict(first["state"])
    for part in others:
        state.update(part["state"])
    return {**first, "state": dict(sorted(state.items(), key=lambda kv: _order(kv[0])))}


def _order(key: Any) -> tuple[int, Any]:
    return (0, key) if isinstance(key, int) else (1, str(key))
