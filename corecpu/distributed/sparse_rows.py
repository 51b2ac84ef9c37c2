"""All-reduce only the word-embedding rows some rank touched (`sparse_embedding_allreduce`).

A BERT-sized model's largest gradient is its input word embedding (MiniLM: 30,522 x 384 of its 22.7M
parameters, 47 MB in fp32), and in a step almost all of its rows are zero on every rank: a batch of
16 x ~50 tokens touches a few hundred distinct ids. DDP all-reduces the whole tensor anyway, and since
that gradient is the last one backward computes, its bucket's all-reduce is never hidden behind compute.
Here the weight is taken out of DDP's buckets, and when DDP syncs, the union of the rows any rank touched
is all-reduced instead:

    rows with any nonzero -> every rank's count, then its padded row ids (two small all_gathers)
    -> the union (sorted, unique) -> all-reduce grad[union], divided by the world size as DDP does
    -> written back

Rows outside the union are zero on every rank, so their sum is zero: the result is the dense all-reduce's.
For 2 ranks it is the same bits (a/2 + b/2 either way); for more, each element's sum may be added in
another order than in DDP's bucket (where it sits in the tensor decides that), so equal up to fp32 rounding.

It applies where the input embedding (`get_input_embeddings()`) is trainable and not tied to another
weight (a tied output layer makes every row's gradient nonzero), and under `auto` only where it is large
(MIN_ROWS). Importing this module starts nothing; `SparseRows` does its work inside backward.

Which rows a rank touched is read from the ids the embedding was called with since the last sync, not from
the gradient: scanning 30,522 x 384 floats for nonzeros cost 25 ms a step on one core of a Xeon (as much as
the dense all-reduce it saves). The ids are a superset of the nonzero rows as long as the weight is used only
by that lookup; a loss that also reads the weight directly (a regulariser) would break that, so the first sync
and every VERIFY_EVERY-th also scan, and a row found outside the ids switches this rank to scanning for good.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from corecpu.decision import Decision
from corecpu.distributed import ALLREDUCE_DTYPES, SPARSE_EMBEDDING_CHOICES
from corecpu.errors import CoreCPUError

MIN_ROWS = 4096  # auto: a vocabulary smaller than this is a small share of the bytes; DDP keeps it
# Above this share of the rows a step all-reduces the whole gradient instead. The sparse path moves the union's
# rows once on the wire and twice through memory (index_select, index_copy_); on a link as fast as memory (shared
# memory inside a host) the three cost alike, so it saves only while the union is under a third of the rows.
DENSE_ABOVE = 1 / 3
VERIFY_EVERY = 100  # syncs between two checks that the recorded ids cover every nonzero row


class SparseChoice(Decision):
    """Whether the embedding's rows are reduced sparsely (name: on | off), and why: config.json's `decisions`."""


def embedding_weight(model: torch.nn.Module) -> tuple[torch.nn.Parameter | None, str]:
    """The input word embedding's weight where the sparse reduction can apply, else None; and why, either way."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except NotImplementedError:
        embedding = None
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 2:
        return None, "the model names no input word embedding (get_input_embeddings())"
    if not weight.requires_grad:
        return None, "the input embedding is frozen: no gradient to reduce"
    if getattr(embedding, "sparse", False):
        return None, "the embedding makes sparse gradients itself (sparse=True)"
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    if len(names) > 1:
        return None, f"the input embedding is tied to {names[1]} (its gradient is dense)"
    if not any(p.requires_grad and p is not weight for p in model.parameters()):
        return None, "the input embedding is the only trainable weight"
    return weight, f"word embedding {weight.shape[0]} x {weight.shape[1]}"


def decide(requested: str, model: torch.nn.Module) -> tuple[SparseChoice, torch.nn.Parameter | None]:
    """The choice for `model` (the user's module, unwrapped, about to be wrapped in DDP) and the weight to reduce
    when on. `on` where it cannot apply is a CoreCPUError naming why; `auto` skips it there and below MIN_ROWS rows."""
    if requested not in SPARSE_EMBEDDING_CHOICES:
        raise CoreCPUError(f"sparse_embedding_allreduce must be one of {', '.join(SPARSE_EMBEDDING_CHOICES)}, "
                           f"got {requested!r}")
    if requested == "off":
        return SparseChoice("off", "requested"), None
    weight, why = embedding_weight(model)
    if weight is None:
        if requested == "on":
            raise CoreCPUError(f"sparse_embedding_allreduce is on but {why}; use auto or off")
        return SparseChoice("off", why), None
    if requested == "auto" and weight.shape[0] < MIN_ROWS:
        return SparseChoice("off", f"{why}: under {MIN_ROWS} rows, a small share of the bytes"), None
    return SparseChoice("on", f"{why}: only the rows some rank touched are all-reduced"
                        + (" (requested)" if requested == "on" else "")), weight


def touched_rows(grad: torch.Tensor) -> torch.Tensor:
    """The ids (int64, sorted) of the rows of `grad` with any nonzero; NaN counts as nonzero."""
    return grad.ne(0).any(dim=1).nonzero().flatten()


def union_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """The sorted, unique union of every rank's row ids."""
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    return torch.unique(torch.cat([p.to(torch.int64) for p in parts]), sorted=True)


class SparseRows:
    """Reduces `weight`'s gradient by its touched rows when DDP syncs. Collective: every rank makes one, at
    the same point, after its model is wrapped in DDP (`attach(ddp)`).

    The all-reduces go over a gloo group of their own: the index gathers and rows are small (MiniLM: under
    1 MB a step), so the MPI and shared-memory paths' comm thread is not needed for them, and a group of their
    own never interleaves them with DDP's bucket all-reduces, whatever order ranks reach them in."""

    def __init__(self, weight: torch.nn.Parameter, wire: str = "fp32", group: Any = None,
                 embedding: torch.nn.Module | None = None,
                 written: Callable[[torch.Tensor], None] | None = None) -> None:
        """`embedding`: the module whose lookups are the weight's only use, watched for the ids it is called with;
        None (a compiled model, whose hooks run inside the graph) finds the rows by scanning the gradient.
        `written(rows)` hears of the rows each sync wrote (every rank's), for a gradient kept between steps
        (corecpu.compute.embedding_grad)."""
        if wire not in ALLREDUCE_DTYPES:
            raise CoreCPUError(f"all-reduce dtype {wire!r} is not one of: {', '.join(ALLREDUCE_DTYPES)}")
        self.weight = weight
        self.wire = torch.bfloat16 if wire == "bf16" else None  # None: the gradient's own dtype, as DDP sends it
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.world = dist.get_world_size(self.group)
        self.last_union: int | None = None  # rows all-reduced at the last sync (tests, counting)
        self.dense_steps = 0  # syncs whose union was over DENSE_ABOVE of the rows
        self.syncs = 0
        self.scanning = embedding is None  # rows from a scan of the gradient, not from the recorded ids
        self._ids: list[torch.Tensor] = []  # what the embedding was called with since the last sync
        self._id_count = 0
        self._sync_armed = False
        # (the gradient, weakly: zero_grad(set_to_none) must free it; its version; the union): for reduced_rows()
        self._reduced: tuple[weakref.ref, int, torch.Tensor] | None = None
        self._written = written
        with torch.no_grad():  # DDP broadcasts rank 0's weights at start-up, but not an ignored one's
            dist.broadcast(weight.detach(), src=dist.get_global_rank(self.group, 0), group=self.group)
        self._hooks = [weight.register_post_accumulate_grad_hook(self._reduce)]
        if embedding is not None:
            self._hooks.append(embedding.register_forward_pre_hook(self._record))

    def attach(self, ddp: torch.nn.Module) -> "SparseRows":
        """Follow `ddp`'s no_sync: DDP decides at forward whether the coming backward syncs, and so does this.
        On a no_sync micro-step the gradient just accumulates; the sync step reduces every micro-step's rows."""
        def arm(module: torch.nn.Module, args: Any) -> None:
            self._sync_armed = torch.is_grad_enabled() and bool(getattr(module, "require_backward_grad_sync", True))

        self._hooks.append(ddp.register_forward_pre_hook(arm))
        return self

    def _record(self, module: torch.nn.Module, args: Any) -> None:
        """Before each lookup with autograd on: keep its ids (compacted once they outnumber the rows)."""
        if self.scanning or not torch.is_grad_enabled():
            return
        ids = args[0] if args else None
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
            self.scanning = True  # called some other way: nothing to read the rows from
            return
        self._ids.append(ids.detach().flatten())
        self._id_count += ids.numel()
        if self._id_count > self.weight.shape[0]:
            self._ids = [torch.unique(torch.cat(self._ids))]
            self._id_count = self._ids[0].numel()

    def _local_rows(self, grad: torch.Tensor) -> torch.Tensor:
        """The rows of this rank's gradient that may be nonzero, sorted: the recorded ids, checked against a scan on
        the first sync and every VERIFY_EVERY-th; a scan's rows for good once the ids missed one."""
        ids = torch.unique(torch.cat(self._ids)).to(torch.int64) if self._ids else torch.empty(0, dtype=torch.int64)
        self._ids, self._id_count = [], 0
        if self.scanning or self.syncs % VERIFY_EVERY == 0:
            scanned = touched_rows(grad)
            if not self.scanning and not bool(torch.isin(scanned, ids).all()):
                self.scanning = True  # the weight has another use than the lookup: ids are not enough
            if self.scanning:
                return scanned
        return ids

    def _reduce(self, param: torch.Tensor) -> None:
        """After backward accumulated the gradient (inside backward): on a sync step, all-reduce its touched rows."""
        if not self._sync_armed or param.grad is None:
            return
        self._sync_armed = False
        grad = param.grad
        union = self._union(self._local_rows(grad))
        if self._written is not None:  # the dense average below writes no other rows either: the rest sum to zero
            self._written(union)
        self.syncs += 1
        self.last_union = int(union.numel())
        if union.numel() > DENSE_ABOVE * grad.shape[0]:
            self.dense_steps += 1
            self._average(grad)
            self._reduced = None
        else:
            if union.numel():
                rows = grad.index_select(0, union)
                grad.index_copy_(0, union, self._average(rows))
            self._reduced = (weakref.ref(grad), grad._version, union)

    def reduced_rows(self, grad: torch.Tensor) -> torch.Tensor | None:
        """The rows outside which `grad` is zero on every rank (the union the last sync reduced) while `grad` is the
        very tensor that sync wrote and nothing has written it since; else None."""
        if self._reduced is None:
            return None
        written, version, union = self._reduced
        return union if grad is written() and grad._version == version else None

    def _union(self, rows: torch.Tensor) -> torch.Tensor:
        """Collective: every rank's touched rows, as one sorted union (counts first, then padded ids)."""
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(counts, torch.tensor([rows.numel()], dtype=torch.int64), group=self.group)
        width = max(int(c) for c in counts)
        if width == 0:
            return rows
        padded = torch.full((width,), -1, dtype=torch.int64)
        padded[:rows.numel()] = rows
        gathered = [torch.empty(width, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(gathered, padded, group=self.group)
        return union_rows([g[:int(c)] for g, c in zip(gathered, counts)])

    def _average(self, tensor: torch.Tensor) -> torch.Tensor:
        """Collective: the mean over ranks, in place, computed as DDP's own path computes it: fp32 scales each
        rank's values by 1/world before summing (DDP's reducer); bf16 rounds to bf16, divides, sums and copies
        back (torch's bf16_compress_hook)."""
        if self.wire is None:
            dist.all_reduce(tensor.mul_(1.0 / self.world), group=self.group)
            return tensor
        wire = tensor.to(self.wire).div_(self.world)
        dist.all_reduce(wire, group=self.group)
        return tensor.copy_(wire)

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


__all__ = ["DENSE_ABOVE", "MIN_ROWS", "VERIFY_EVERY", "SparseChoice", "SparseRows", "decide", "embedding_weight",
           "touched_rows", "union_rows"]
