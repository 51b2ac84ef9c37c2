"""The input word embedding's gradient in one buffer kept for the run, zeroed only where it was written.

torch's embedding backward allocates a zeroed gradient the size of the whole table every step (MiniLM: 30,522 x
384, 47 MB) and adds the few hundred rows the batch looked up into it. A profile of rank 0 in MiniLM's 2-rank job
on the development Xeon put that zero fill at 9.8 ms a step; zeroing memory kept from the step before still took
7.6 ms there (the two ranks share the memory bandwidth), and zeroing only the rows written last step takes 0.1 ms.
Here the lookup's backward keeps one buffer across steps, zeroes the rows written since it was last zeroed, and
adds this step's rows with index_add_, which sums each row's contributions in the order torch's kernel does: the
same bits (tested).

Which rows may be nonzero: the ids of every lookup since the last zeroing, and the rows another writer names
(`mark_written`: sparse_rows' all-reduce writes every rank's rows). Writers that scale (clipping, the optimizer's
unscaling) leave zeros zero. A writer this object does not know of (a user's own gradient noise) would leave rows
behind, so the first zeroing and every VERIFY_EVERY-th check that the whole buffer is zero afterwards, and a row
found nonzero switches to zeroing all of it for good (as sparse_rows checks its recorded ids).

The buffer is reused only where nothing else can see it: the storage's use count says whether any tensor besides
this object's own alias still holds that memory (the last step's param.grad before zero_grad(set_to_none=True), a
reference the user kept, a gradient being accumulated over micro-steps). Where one does, the backward gives a new
zeroed gradient exactly as torch does, and autograd accumulates into param.grad as usual. The gradient handed to
autograd is a tensor of its own on that memory, so AccumulateGrad takes it as param.grad without a copy.

It applies to a plain nn.Embedding that is the model's input embedding, trainable, untied, dense, with no
max_norm or scale_grad_by_freq; not under torch.compile (which traces the lookup) or IPEX (which replaces the
module).
"""

from __future__ import annotations

from typing import Any

import torch

from corecpu.decision import Decision

_use_count = getattr(torch._C, "_storage_Use_Count", None)  # private; without it, torch's own backward
VERIFY_EVERY = 100  # zeroings between two checks that the written rows were all of them


class EmbeddingGradChoice(Decision):
    """config.json's `embedding_grad` decision (name: recycled | torch), and why."""


def _storage_users(tensor: torch.Tensor) -> int:
    """Tensors (and storage objects) holding `tensor`'s memory, not counting the one this call makes."""
    return int(_use_count(tensor.untyped_storage()._cdata)) - 1  # type: ignore[misc]


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                owner: "RecycledEmbeddingGrad") -> torch.Tensor:
        ctx.owner = owner
        ctx.save_for_backward(ids)
        return torch.nn.functional.embedding(ids, weight, owner.padding_idx)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None]:  # type: ignore[override]
        ids, = ctx.saved_tensors
        return None, ctx.owner.gradient(ids, grad), None


class RecycledEmbeddingGrad:
    """Installed on one nn.Embedding (its instance `forward`); `close()` gives the module its own forward back."""

    def __init__(self, embedding: torch.nn.Embedding) -> None:
        self.embedding = embedding
        self.padding_idx = embedding.padding_idx
        self.rows_only = True  # zero the written rows, not the whole buffer (until a check finds a row left)
        self.recycled = 0  # backward calls that reused the buffer (tests, counting)
        self.fresh = 0  # backward calls that zeroed new memory (the first, and any while the buffer was held)
        self._alias: torch.Tensor | None = None  # this object's own tensor on the kept memory
        self._written: list[torch.Tensor] | None = []  # rows maybe nonzero in it; None: any
        self._written_count = 0
        self._zeroings = 0
        self._handed: tuple[int, int] | None = None  # (address, version) of the kept gradient as the lookup wrote it
        embedding.forward = self._forward  # type: ignore[method-assign]

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        weight = self.embedding.weight
        if not (torch.is_grad_enabled() and weight.requires_grad) or ids.is_floating_point():
            return torch.nn.functional.embedding(ids, weight, self.padding_idx)
        return _Lookup.apply(ids, weight, self)

    def mark_written(self, rows: torch.Tensor | None) -> None:
        """Rows of the gradient another writer may have made nonzero (None: any)."""
        if self._written is None:
            return
        if rows is None or self._written_count + rows.numel() > self.embedding.weight.shape[0]:
            self._written = None  # as many ids as rows: zeroing all of it is as cheap
            return
        self._written.append(rows.reshape(-1).to(torch.int64))
        self._written_count += rows.numel()

    def _zero(self, alias: torch.Tensor) -> None:
        """Zero what may be nonzero: the rows written since the last zeroing, or everything."""
        written, self._written, self._written_count = self._written, [], 0
        if written is None or not self.rows_only:
            alias.zero_()
            return
        if written:
            alias.index_fill_(0, torch.cat(written), 0)
        self._zeroings += 1
        if self._zeroings % VERIFY_EVERY == 1 and bool(torch.count_nonzero(alias)):
            self.rows_only = False  # something this object does not know of writes the gradient
            alias.zero_()

    def _zeroed(self, like: torch.Tensor, rows: int) -> torch.Tensor:
        """A zeroed (rows x dim) gradient: the kept memory where only this object holds it, else new memory (kept
        for next time where none is kept, or the kept memory is free but of another shape)."""
        alias = self._alias
        free = alias is not None and _storage_users(alias) == 1
        if free and alias.dtype == like.dtype and tuple(alias.shape) == (rows, like.shape[-1]):
            self._zero(alias)
            self.recycled += 1
            return alias.detach()  # a tensor of its own: AccumulateGrad can take it without a copy
        self.fresh += 1
        grad = torch.zeros((rows, like.shape[-1]), dtype=like.dtype)
        if alias is None or free:
            self._alias, self._written, self._written_count = grad.detach(), [], 0
        return grad

    def gradient(self, ids: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The weight's gradient for one lookup: torch's embedding_dense_backward, on kept memory. Its rows count
        as written to the kept memory even when new memory is given: autograd may add it into the kept one."""
        out = self._zeroed(grad, self.embedding.weight.shape[0])
        flat = ids.reshape(-1)
        out.index_add_(0, flat, grad.reshape(-1, grad.shape[-1]))
        if self.padding_idx is not None:  # torch's kernel skips the padding id: its row stays zero
            out[self.padding_idx] = 0
        self.mark_written(flat)
        kept = self._alias is not None and out.data_ptr() == self._alias.data_ptr()
        self._handed = (out.data_ptr(), out._version) if kept else None
        return out

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.embedding.weight

    def reduced_rows(self, grad: torch.Tensor) -> torch.Tensor | None:
        """The rows outside which `grad` is zero (every row written since the kept memory was last zeroed), while
        `grad` is that memory as the lookup's backward left it (same address, nothing written since: a version
        counter is shared by every tensor on it); else None. For the clipper's norm in one process."""
        if (self._handed is None or self._written is None or not self.rows_only
                or (grad.data_ptr(), grad._version) != self._handed or not self._written):
            return None
        return torch.unique(torch.cat(self._written))

    def close(self) -> None:
        self.embedding.__dict__.pop("forward", None)
        self._alias = None


def install(model: torch.nn.Module, *, compile: bool, use_ipex: bool) -> tuple[EmbeddingGradChoice,
                                                                               RecycledEmbeddingGrad | None]:
    """Recycle `model`'s input embedding gradient where it applies; the decision either way."""
    if _use_count is None:
        return EmbeddingGradChoice("torch", "this torch has no storage use count to tell a free buffer"), None
    if compile:
        return EmbeddingGradChoice("torch", "torch.compile traces the lookup"), None
    if use_ipex:
        return EmbeddingGradChoice("torch", "ipex.optimize replaces the modules"), None
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except NotImplementedError:
        embedding = None
    if type(embedding) is not torch.nn.Embedding:
        return EmbeddingGradChoice("torch", "the input embedding is not a plain nn.Embedding"), None
    weight = embedding.weight
    if not weight.requires_grad:
        return EmbeddingGradChoice("torch", "the input embedding is frozen"), None
    if embedding.sparse or embedding.max_norm is not None or embedding.scale_grad_by_freq:
        return EmbeddingGradChoice("torch", "the embedding uses sparse, max_norm or scale_grad_by_freq"), None
    if sum(1 for _, p in model.named_parameters(remove_duplicate=False) if p is weight) > 1 or "forward" in vars(embedding):
        return EmbeddingGradChoice("torch", "the input embedding is tied to another weight or already patched"), None
    owner = RecycledEmbeddingGrad(embedding)
    return EmbeddingGradChoice("recycled", f"{weight.shape[0]} x {weight.shape[1]} gradient kept between steps and "
                                           "zeroed where written, not allocated and zeroed whole"), owner


__all__ = ["VERIFY_EVERY", "EmbeddingGradChoice", "RecycledEmbeddingGrad", "install"]
