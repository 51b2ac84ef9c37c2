"""The shared step's Linear weights in bf16, cast once per step by the rank that stepped them, read by every rank.

Under bf16 autocast every forward casts every Linear weight from fp32 to bf16 before its matmul: on each rank, in
each micro-step, a pass that reads 4 bytes and writes 2 for every weight element, from memory (a whole model's
weights do not stay in cache between two uses). On the shared step (corecpu.distributed.shared_adamw) the weights
live once per host and change only in the step, where each rank updates its slice of them. So each rank also casts
its slice, right after its update, into a bf16 copy in /dev/shm that every rank's forward reads (through
corecpu.distributed.grad_sink's cast): 1/N of one cast per step instead of N casts per micro-step. The copy is
made with the same round-to-nearest conversion autocast makes, so the forward sees the same bits.

A copy is used only while the weight is the one it was made from: the weight's own version counter (which any
in-place write through the parameter bumps, `load_state_dict` included) and its storage are recorded when every
rank's slice is cast; a forward that finds either changed casts the weight itself, as autocast would, until the
next step casts it again.
"""

from __future__ import annotations

from typing import Sequence

import torch


class CastCache:
    """bf16 copies of some of the shared weights (by parameter index), in a buffer laid out as the weights are."""

    def __init__(self, buffer: torch.Tensor, weights: torch.Tensor, starts: Sequence[int],
                 params: Sequence[torch.nn.Parameter]) -> None:
        """`buffer`: flat, the cache's dtype, as long as `weights` (flat fp32, the shared weights); `starts`: each
        parameter's first element in them (and the end), `params` the parameters in that order."""
        self.buffer, self.weights, self._starts, self._params = buffer, weights, list(starts), list(params)
        self._spans: list[tuple[int, int]] = []  # the cached parameters' element ranges, in order
        self._views: dict[int, torch.Tensor] = {}
        self._current: dict[int, tuple[int, int]] = {}  # index -> (version, data_ptr) its copy was made from

    def adopt(self, indices: Sequence[int]) -> None:
        """Keep copies of these parameters (not yet made: `refresh` and `mark_current` make them usable)."""
        for i in sorted(set(indices) - set(self._views)):
            a, b = self._starts[i], self._starts[i + 1]
            self._views[i] = self.buffer[a:b].view_as(self._params[i])
        self._spans = sorted((self._starts[i], self._starts[i + 1]) for i in self._views)
        self._current = {}

    def refresh(self, lo: int, hi: int) -> None:
        """Cast the cached elements in [lo, hi) of the shared weights (this rank's slice, just stepped)."""
        for a, b in self._spans:
            x, y = max(a, lo), min(b, hi)
            if x < y:
                self.buffer[x:y].copy_(self.weights[x:y])

    def mark_current(self) -> None:
        """Every rank has refreshed its slice: the copies are the weights' as they are now."""
        self._current = {i: (self._params[i]._version, self._params[i].data_ptr()) for i in self._views}

    def get(self, i: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Parameter i cast to `dtype`, if a current copy is kept; else None (the caller casts)."""
        made = self._current.get(i)
        if made is None or dtype != self.buffer.dtype:
            return None
        p = self._params[i]
        return self._views[i] if made == (p._version, p.data_ptr()) else None


__all__ = ["CastCache"]
