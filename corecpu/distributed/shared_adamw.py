"""`--shard-optimizer auto|shm|off`: on one host, no gradient all-reduce and no AdamW step repeated on every rank.

Ranks on one host can read each other's memory. So autograd accumulates each rank's gradients straight into a buffer
of that rank's in /dev/shm (as DDP's gradient_as_bucket_view does into its buckets; the kept word-embedding gradient
copies only the rows its lookups wrote). After backward every rank sums its part of the elements over all N buffers,
zeroing what it read while it is in cache (but for Linear weights, whose next gradients are written over their
buffers: corecpu.distributed.grad_sink); a parameter whose nonzero rows are known (the word embedding's: each rank
publishes its rows) is summed over those rows alone. Then every rank runs torch's fused AdamW kernel on 1/N of the
elements, on weights and moments that live once, in /dev/shm, and that every rank's model computes with. The two
phases are balanced apart (the clip's all-reduce lies between them), so the mean gradient passes from one to the
other through a shared buffer. DDP all-reduces every gradient byte and every rank runs the whole optimizer step;
here nothing is all-reduced, each rank runs 1/N of the step, and the optimizer's memory is held once per host. The
word embedding's rows that no step has written are left to the weight decay (corecpu.distributed.row_step): most of
its rows, in a fine-tuning run. Measured with `benchmarks/phases.py` on a 2-vCPU EPYC (MiniLM, bf16, 2 ranks x 16,
interleaved runs): a step of short single sentences 87.5-98.9 ms against DDP's 108-115, of sentence pairs 189-194 ms
against 207-217, before the rows and the two partitions (which took the summing pass and AdamW from 8.4 + 11.7 ms a
rank to about 5 + 9.7 on the short sentences, and the zeroing pass's 2.9 ms away).

The mathematics is DDP's: the step applies the mean of the ranks' gradients, clipped by the global norm of that mean
(each rank's slice's sum of squares, taken in the summing pass, summed over the ranks in one scalar all-reduce),
through the same fused kernel with the hyper-parameters read from the optimizer's param_groups at each step (so an
LR scheduler works as usual). Sums differ from an all-reduce's only in rounding order.

The user's optimizer stays the object train.py holds: a step pre-hook does the sharded step and hides the gradients
from the optimizer's own step, which then has nothing to do; a post-hook gives them back and waits for every rank,
after which the next forward may read the weights and the next backward write the buffers. Its `state` holds every
parameter's moments as views of the shared buffers, so state_dict() is whole on every rank (a post-hook hands out
private copies), and a state loaded for a resume is taken in when this is made.

The files are made by rank 0 and unlinked once every rank has mapped them: nothing is left in /dev/shm, even after a
crash. Whether a run can use this is corecpu.distributed.shard_choice's `unsupported()`.
"""

from __future__ import annotations

import math
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from corecpu.distributed import row_step, shm_sync
from corecpu.distributed.cast_cache import CastCache
from corecpu.distributed.row_step import RowSource
from corecpu.distributed.shard_choice import SHM_DIR
from corecpu.distributed.shm_files import map_shared
from corecpu.distributed.shm_sync import SUM_SLOTS, ShmSync

_MOMENTS = ("exp_avg", "exp_avg_sq")
_NO_ROWS = torch.empty(0, dtype=torch.int64)
_CHUNK = 1 << 18  # floats summed and squared at a time: 1 MiB, about one core's L2 on current x86 server parts
# What summing a row-summed parameter's element costs against a dense one's (for the summing pass's balance): only
# the rows some rank wrote are read, about 2% of the word embedding's in a MiniLM step of short sentences.
_ROW_SUM_COST = 0.1


class SharedAdamW:
    """One rank's side of the shared optimizer step (see the module docstring). Collective to make: every rank
    of the (single-host) group makes it with the same optimizer layout."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, rank: int, world: int, barrier: Callable[[], None],
                 sum_scalar: Callable[[float], float], share_tag: Callable[[str], str],
                 rows: Sequence[RowSource] = (), shm_dir: Path = SHM_DIR, sync_timeout_s: float = 1800.0) -> None:
        """`barrier()`: every rank waits for the others. `sum_scalar(x)`: x summed over the ranks.
        `share_tag(tag)`: rank 0's `tag`, on every rank (names the files). `rows`: who knows which rows of a
        gradient may be nonzero (the kept word-embedding gradient): only those rows are copied."""
        self.optimizer, self.rank, self.world = optimizer, rank, world
        self._barrier = barrier  # the waits while setting up (the buffers to wait through do not exist yet)
        self.params: list[torch.nn.Parameter] = []
        # (param group, its trained parameters, first element, end)
        self._groups: list[tuple[dict[str, Any], list[torch.nn.Parameter], int, int]] = []
        offset = 0
        for group in optimizer.param_groups:
            trained = [p for p in group["params"] if p.requires_grad]
            self.params += trained
            self._groups.append((group, trained, offset, offset + sum(p.numel() for p in trained)))
            offset = self._groups[-1][3]
        self.numel = offset
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._group_of = [group for group, trained, _, _ in self._groups for _ in trained]
        self._rows = {id(src.weight): src for src in rows}
        # A gradient some rows of which are known to be the only nonzero ones is summed by those rows alone.
        row_lengths = [p[0].numel() if id(p) in self._rows and p.dim() > 1 else 0 for p in self.params]
        self._starts = [0]
        for p in self.params:
            self._starts.append(self._starts[-1] + p.numel())
        sizes = [p.numel() for p in self.params]
        # Two partitions: the summing pass's balances the dense elements (a row-summed parameter's are nearly free),
        # AdamW's the elements. The scalar all-reduce of the clip's norm (or a barrier) lies between the two phases,
        # so each must be balanced by itself; the sums go through a shared buffer from the one to the other.
        costs = [torch.full((p.shape[0],), _ROW_SUM_COST * n) if n else 1.0 for p, n in zip(self.params, row_lengths)]
        bounds = row_step.step_bounds(sizes, costs, world)
        self.sum_lo, self.sum_hi = bounds[rank], bounds[rank + 1]  # the elements this rank sums
        bounds = row_step.step_bounds(sizes, [1.0] * len(sizes), world)
        self.lo, self.hi = bounds[rank], bounds[rank + 1]  # the elements this rank steps (when every row is stepped)
        # Parameters summed by rows whose never-written rows the step leaves alone (corecpu.distributed.row_step):
        # index -> the rows any step has written. Filled in by _adopt_state.
        self._touched: dict[int, torch.Tensor] = {}
        self._widths = row_lengths
        self._skip_rows = bool(row_lengths) and row_step.decay_split_is_exact()
        # Each rank's rows, per parameter summed by rows: a count (-1: every row) and the row numbers.
        self._row_slots: dict[int, tuple[int, int]] = {}
        slots = 0
        for i, n in enumerate(row_lengths):
            if n:
                self._row_slots[i] = (slots, self.params[i].shape[0])
                slots += 1 + self.params[i].shape[0]
        names = [("weights", offset, torch.float32), *((m, offset, torch.float32) for m in _MOMENTS),
                 ("summed", offset, torch.float32), ("weights16", offset, torch.bfloat16),
                 *((f"grad{k}", offset, torch.float32) for k in range(world)),
                 ("sync", world, torch.int64), ("values", world, torch.float64), ("pids", world, torch.int64),
                 ("flags", 2 * world, torch.int64), ("sums", 2 * world * SUM_SLOTS, torch.float64),
                 *((f"rows{k}", slots, torch.int64) for k in range(world if slots else 0))]
        tag = share_tag(secrets.token_hex(8))
        buffers = map_shared(shm_dir, f"corecpu-{tag}", names, rank, barrier)
        self.weights, self.exp_avg, self.exp_avg_sq, self.mean_grad = buffers[:4]  # mean_grad: the ranks' mean
        # The sunk Linear weights in bf16 (corecpu.distributed.cast_cache): untouched pages of the rest cost nothing.
        self._cast = CastCache(buffers[4], self.weights, self._starts, self.params)
        self.grads = buffers[5:5 + world]
        counters, values, pids, flags, sums = buffers[5 + world:10 + world]
        self._published = buffers[10 + world:]
        # The waits inside a step go through shared memory where stores are seen in order (shm_sync), else through
        # the process group, as the waits while setting up do.
        self._sync: ShmSync | None = None
        if shm_sync.usable():
            sync = self._sync = ShmSync(counters, values, pids, rank=rank, timeout_s=sync_timeout_s, flags=flags,
                                        sums=sums)
            self._step_barrier, self._step_sum = sync.barrier, sync.sum
        else:
            self._step_barrier, self._step_sum = barrier, sum_scalar
        barrier()  # every rank's process id is in
        self._synced = True  # no rank is summing: every sum may be read
        self._segments = self._plan_segments(row_lengths)
        self._squares = torch.zeros(max(1, len(self._segments)))  # the summed part's sum of squares, by segment
        # The rows of the summed part written last step, and of a parameter's gradient copied last step: none yet
        # (the buffers are new: zeros; "all" once a step wrote every row).
        self._summed_rows: dict[int, torch.Tensor | str] = {i: _NO_ROWS for i in self._row_slots}
        self._copied: dict[int, torch.Tensor | str] = {i: _NO_ROWS for i in self._row_slots}
        self._mine = self._views(self.grads[self.rank])
        # Every other gradient is accumulated by autograd straight into this rank's shared buffer (as DDP's
        # gradient_as_bucket_view does): no copy, and no new memory to fault in each step.
        self._in_place = [i for i, p in enumerate(self.params) if id(p) not in self._rows]
        # Of those, the ones whose gradient a backward writes over the buffer (corecpu.distributed.grad_sink), with
        # whether the buffer still holds the last step's values: the summing pass leaves them unzeroed.
        self._stale: dict[int, bool] = {}
        self._zero_ranges = self._plan_zeroing()
        self._adopt_state()
        self._zeroed = True  # the buffers are new: zeros
        self.attach_grads()
        self.coefficient: torch.Tensor | None = None  # the clip's, for the next step
        self._reduced = False
        self._hidden: list[torch.Tensor | None] = []
        optimizer.register_step_pre_hook(self._pre_step)
        optimizer.register_step_post_hook(self._post_step)
        optimizer.register_state_dict_post_hook(_private_copies)
        optimizer.register_load_state_dict_post_hook(lambda opt: self._adopt_state(loaded=True))

    @property
    def waited_s(self) -> float | None:
        """Seconds this rank has waited inside steps for slower ranks so far; None where the waits go through the
        process group (their time there is not told apart from the transfer's)."""
        return self._sync.waited_s if self._sync is not None else None

    @property
    def agree_max(self) -> Callable[[int], int] | None:
        """The ranks' largest of an int, agreed through shared memory (the loop's stop check between steps); None
        where the waits go through the process group."""
        return self._sync.agree_max if self._sync is not None else None

    @property
    def sum_all(self) -> Callable[[Sequence[float]], list[float]] | None:
        """A few numbers (at most shm_sync.SUM_SLOTS) summed over the ranks through shared memory (the loop's log
        steps, token counts and evaluations); None where the waits go through the process group."""
        return self._sync.sum_all if self._sync is not None else None

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return out

    def _plan_segments(self, row_lengths: Sequence[int]) -> list[tuple[int, int, int]]:
        """The elements this rank sums as (first, end, parameter index) pieces: a chunk of at most _CHUNK densely
        summed elements (index -1), or the rows there of a parameter summed by rows."""
        out: list[tuple[int, int, int]] = []
        run: list[int] = []  # the dense elements since the last parameter summed by rows: [first, end]

        def close_run() -> None:
            if run:
                out.extend((c, min(c + _CHUNK, run[1]), -1) for c in range(run[0], run[1], _CHUNK))
                run.clear()

        for i, n in enumerate(row_lengths):
            a, b = max(self._starts[i], self.sum_lo), min(self._starts[i + 1], self.sum_hi)
            if a >= b:
                continue
            if n:
                close_run()
                out.append((a, b, i))
            elif run:
                run[1] = b
            else:
                run.extend((a, b))
        close_run()
        return out

    def _adopt_state(self, loaded: bool = False) -> None:
        """Collective. Rank 0's weights and moments (a resumed state's, or zeros) into the shared buffers; every
        rank's model and optimizer state then point at them, as DDP's start-up broadcast of rank 0's weights."""
        state = self.optimizer.state
        if self.rank == 0:
            for p, w, m, v in zip(self.params, self._views(self.weights), self._views(self.exp_avg),
                                  self._views(self.exp_avg_sq)):
                w.copy_(p.detach())
                s = state.get(p, {})
                for buffer, key in ((m, "exp_avg"), (v, "exp_avg_sq")):
                    if key in s:
                        buffer.copy_(s[key])
                    elif loaded:  # new buffers are zeros already: zeroing them faulted in 0.1 s of pages at start
                        buffer.zero_()
        self._barrier()
        for p, w in zip(self.params, self._views(self.weights)):
            p.data = w  # the model trains the shared weights themselves: no copy after each step
        for p, m, v in zip(self.params, self._views(self.exp_avg), self._views(self.exp_avg_sq)):
            step = float(state.get(p, {}).get("step", 0.0))
            state[p] = {"step": torch.tensor(step, dtype=torch.float32), "exp_avg": m, "exp_avg_sq": v}
        if loaded:
            self._barrier()  # nobody steps before rank 0 has written what was loaded
            self._recast()
        if self._skip_rows:
            # A resumed state's written rows are those with a moment; a parameter that never stepped has none (its
            # new buffers are not read: that would fault in every page of them).
            m, v = self._views(self.exp_avg), self._views(self.exp_avg_sq)
            for i in self._row_slots:
                stepped = float(state[self.params[i]]["step"]) > 0
                self._touched[i] = (row_step.touched_from_moments(m[i], v[i]) if stepped
                                    else torch.zeros(self.params[i].shape[0], dtype=torch.bool))

    def attach_grads(self, *args: Any) -> None:
        """Every gradient autograd accumulates in place: its view of the shared buffer, wherever zero_grad(
        set_to_none=True) dropped it (a forward pre-hook of the model calls this). A view is zeroed as it is
        given back unless the step's end zeroed it since: a zero_grad() without a step drops what it held."""
        for i in self._in_place:
            p = self.params[i]
            if p.grad is None:
                if i in self._stale:
                    self._stale[i] = True  # overwritten by its next gradient, or zeroed before it
                elif not self._zeroed:
                    self._mine[i].zero_()
                p.grad = self._mine[i]
        self._zeroed = False

    # ------------------------------------------------------------------ gradients written over (grad_sink)
    def sink_index(self, param: torch.nn.Parameter) -> int | None:
        """This parameter's index if its gradient is accumulated in place in this rank's buffer, else None."""
        i = self._index.get(id(param))
        return i if i is not None and id(param) not in self._rows else None

    def adopt_sunk(self, indices: Sequence[int]) -> None:
        """Collective. From now on these parameters' gradients are written over their buffers (or zeroed first): the
        summing pass no longer zeroes them. And their bf16 copies are kept for the forward (cast_weight)."""
        self._stale.update({i: False for i in indices})  # the buffers are zeros now
        self._zero_ranges = self._plan_zeroing()
        self._cast.adopt(indices)
        self._recast()

    def _recast(self) -> None:
        """Collective: every kept bf16 copy made again from the weights (each rank its part)."""
        self._cast.refresh(self.lo, self.hi)
        self._barrier()
        self._cast.mark_current()

    def cast_weight(self, i: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Parameter i in `dtype` for a forward, from the copy the step made, if it is current; else None."""
        return self._cast.get(i, dtype)

    def write_grad(self, i: int, grad: torch.Tensor) -> None:
        """A backward's gradient of parameter i (any float dtype) into this rank's buffer: over the last step's
        values, or added to this step's."""
        if self._stale[i]:
            self._mine[i].copy_(grad)
            self._stale[i] = False
        else:
            self._mine[i].add_(grad)

    def before_accumulate(self, i: int) -> None:
        """Autograd is about to add a gradient to parameter i's buffer: zero it first if it holds the last step's."""
        if self._stale[i]:
            self._mine[i].zero_()
            self._stale[i] = False

    def _plan_zeroing(self) -> list[list[tuple[int, int]]]:
        """Per summing segment, the element ranges the summing pass zeroes after reading: the dense ones but those
        of parameters whose gradients are written over."""
        plan = []
        for a, b, i in self._segments:
            ranges: list[tuple[int, int]] = []
            if i < 0:
                for j in range(len(self.params)):
                    x, y = max(a, self._starts[j]), min(b, self._starts[j + 1])
                    if x >= y or j in self._stale:
                        continue
                    if ranges and ranges[-1][1] == x:
                        ranges[-1] = (ranges[-1][0], y)
                    else:
                        ranges.append((x, y))
            plan.append(ranges)
        return plan

    # ------------------------------------------------------------------ the step
    def reduce(self) -> None:
        """Collective, once per step (the clip or the step, whichever comes first): this rank's gradients
        into its shared buffer, then this rank's slice summed over every rank's buffer. The pass zeroes what it
        has read, so after it every rank's gradients are zero, ready for the next step's backward."""
        if self._reduced:
            return
        views = self._mine
        for i, (v, p) in enumerate(zip(views, self.params)):
            src = self._rows.get(id(p))
            if src is None:
                continue
            rows = src.reduced_rows(p.grad) if p.grad is not None else None
            last = self._copied.get(i, "all")
            if rows is None:  # a gradient nobody vouches for: all of it
                v.copy_(p.grad) if p.grad is not None else v.zero_()
                self._copied[i] = "all"
                self._publish(i, None if p.grad is not None else torch.empty(0, dtype=torch.int64))
                continue
            # Only the rows the lookups wrote: zero last step's, copy this step's (MiniLM: 47 MB not copied).
            v.zero_() if isinstance(last, str) else v.index_fill_(0, last, 0)
            v.index_copy_(0, rows, p.grad.index_select(0, rows))
            self._copied[i] = rows
            self._publish(i, rows)
        for i in self._in_place:
            grad = self.params[i].grad
            if grad is not None and grad.data_ptr() != views[i].data_ptr():  # replaced by someone: copy it in
                views[i].copy_(grad)
            elif self._stale.get(i):  # no gradient came this step: zeros, as a zeroed buffer would hold
                views[i].zero_()
        self._step_barrier()  # every rank's gradients are in
        buffers, scale = self.grads, 1.0 / self.world
        for k, (a, b, i) in enumerate(self._segments):
            out = self.mean_grad[a:b]
            if i >= 0 and self._sum_rows(out, a, b, i, k):
                continue
            # The slice's mean over the ranks and its sum of squares in one pass, a chunk at a time: each chunk is
            # summed, scaled and squared while it is still in cache (the passes over memory are what cost here).
            torch.add(buffers[0][a:b], buffers[1][a:b], out=out)
            for other in buffers[2:]:
                out.add_(other[a:b])
            out.mul_(scale)
            torch.dot(out, out, out=self._squares[k])
            if i < 0:  # read for the last time this step: zeroed while in cache, for the next backward
                for x, y in self._zero_ranges[k]:
                    for buffer in buffers:
                        buffer[x:y].zero_()
            else:
                self._summed_rows[i] = "all"
        self._stale = dict.fromkeys(self._stale, True)  # every buffer was read: the next gradient writes over it
        self._reduced, self._synced = True, False

    def _publish(self, i: int, rows: torch.Tensor | None) -> None:
        """Tell the other ranks which rows of parameter i's gradient are this rank's nonzero ones (None: any)."""
        mine = self._published[self.rank]
        at, _ = self._row_slots[i]
        if rows is None:
            mine[at] = -1
            return
        mine[at] = rows.numel()
        mine[at + 1:at + 1 + rows.numel()] = rows

    def _sum_rows(self, out: torch.Tensor, a: int, b: int, i: int, k: int) -> bool:
        """Parameter i's part [a, b) of the slice, summed over the rows some rank wrote: the others are zero in
        every buffer. False when a rank could not say which rows (then the whole part is summed)."""
        at, _ = self._row_slots[i]
        written = []
        for published in self._published:
            count = int(published[at])
            if count < 0:
                return False
            written.append(published[at + 1:at + 1 + count])
        width = self.params[i][0].numel()
        first, last = (a - self._starts[i]) // width, (b - self._starts[i]) // width
        rows = torch.unique(torch.cat(written))
        rows = rows[(rows >= first) & (rows < last)] - first
        table = out.view(-1, width)
        before = self._summed_rows.get(i, "all")
        table.zero_() if isinstance(before, str) else table.index_fill_(0, before, 0)
        self._summed_rows[i] = rows
        if not rows.numel():
            self._squares[k] = 0.0
            return True
        values = self.grads[0][a:b].view(-1, width).index_select(0, rows)
        for buffer in self.grads[1:]:
            values.add_(buffer[a:b].view(-1, width).index_select(0, rows))
        values.mul_(1.0 / self.world)
        table.index_copy_(0, rows, values)
        flat = values.view(-1)
        torch.dot(flat, flat, out=self._squares[k])
        return True

    def grad_norm(self) -> torch.Tensor:
        """Collective: the 2-norm of the ranks' mean gradient (the clip's total norm)."""
        self.reduce()
        squares = float(self._squares.sum()) if self._segments else 0.0
        total = self._step_sum(squares)  # every rank has summed its part: the sums may be read
        self._synced = True
        return torch.tensor(math.sqrt(max(total, 0.0)))

    def _pre_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        self.reduce()
        if not self._synced:  # no clip's all-reduce since the sums: wait for every rank's
            self._step_barrier()
            self._synced = True
        # The clip's scale inside the kernel; without one the kernel need not write the gradient back.
        scale = None if self.coefficient is None else self.coefficient.to(torch.float32).reciprocal()
        steps = {}
        for group, params_of_group, _, _ in self._groups:
            steps[id(group)] = [optimizer.state[p]["step"] for p in params_of_group]
            if params_of_group:  # a group of frozen parameters only (LoRA's, say) has none
                torch._foreach_add_(steps[id(group)], 1.0)
        lo, hi, by_rows = self._slice(optimizer)  # by_rows: parameter index -> its blocks of written rows
        for group, params_of_group, start, end in self._groups:
            a, b = max(start, lo), min(end, hi)
            if a >= b:
                continue
            beta1, beta2 = group["betas"]
            decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))
            kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
            lr, decay = float(group["lr"]), float(group["weight_decay"])

            def run_kernel(x: int, y: int, step: torch.Tensor, weight_decay: float = decay) -> None:
                kernel([self.weights[x:y]], [self.mean_grad[x:y]], [self.exp_avg[x:y]], [self.exp_avg_sq[x:y]], [],
                       [step], lr=lr, beta1=float(beta1), beta2=float(beta2), weight_decay=weight_decay,
                       eps=float(group["eps"]), amsgrad=False, maximize=False, grad_scale=scale, found_inf=None)

            for x, y, step, i in self._runs(params_of_group, steps[id(group)], start, a, b, by_rows):
                if i < 0:
                    run_kernel(x, y, step)
                    continue
                # By rows: the decay over every row, then the kernel without it where some step wrote a row.
                width, first = self._widths[i], self._starts[i]
                if decay:
                    self.weights[x:y].mul_(1 - lr * decay)
                for r0, r1 in row_step.spans(by_rows[i], (x - first) // width, (y - first) // width):
                    run_kernel(first + r0 * width, first + r1 * width, step, 0.0)
        self._cast.refresh(lo, hi)  # the slice's bf16 copies, for every rank's next forward
        # The optimizer's own step finds no gradient and does nothing; _post_step gives them back.
        self._hidden = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    def _slice(self, optimizer: torch.optim.Optimizer) -> tuple[int, int, dict[int, torch.Tensor]]:
        """This step's [lo, hi) of the elements for this rank to step, and the parameters stepped by rows (their
        never-written rows left to the decay alone) with their blocks of written rows. Every rank computes the same
        partition: the rows written so far are the same union on every rank."""
        for i in self._touched:
            self._mark_written(i)
        decoupled = isinstance(optimizer, torch.optim.AdamW)
        # Adam's L2 decay puts every row in the gradient: such a parameter is stepped whole.
        by_rows = {i: row_step.active_blocks(self._touched[i]) for i in self._touched if decoupled
                   or self._group_of[i].get("decoupled_weight_decay") or not self._group_of[i]["weight_decay"]}
        if not by_rows:
            return self.lo, self.hi, by_rows
        costs: list[float | torch.Tensor] = [row_step.KERNEL_COST] * len(self.params)
        for i, active in by_rows.items():
            costs[i] = row_step.row_costs(active, self.params[i].shape[0], self._widths[i],
                                          bool(self._group_of[i]["weight_decay"]))
        bounds = row_step.step_bounds([q.numel() for q in self.params], costs, self.world)
        return bounds[self.rank], bounds[self.rank + 1], by_rows

    def _mark_written(self, i: int) -> None:
        """Add this step's rows of parameter i, over every rank, to the rows written so far."""
        at, _ = self._row_slots[i]
        written = []
        for published in self._published:
            count = int(published[at])
            if count < 0:
                self._touched[i].fill_(True)
                return
            written.append(published[at + 1:at + 1 + count])
        self._touched[i][torch.cat(written)] = True

    def _runs(self, params: Sequence[torch.nn.Parameter], steps: Sequence[torch.Tensor], start: int, a: int, b: int,
              by_rows: Mapping[int, Any]) -> list[tuple[int, int, torch.Tensor, int]]:
        """[a, b) of a group starting at `start`, as (lo, hi, step, i) runs for the kernel: i the index of a
        parameter stepped by rows (a run of its own), else -1. The other parameters in one run where every
        parameter has stepped alike (always, unless a loaded state had some parameter step less), else one run per
        parameter, each with its own step for the bias correction."""
        alike = all(float(s) == float(steps[0]) for s in steps)
        runs: list[tuple[int, int, torch.Tensor, int]] = []
        offset = start
        for p, step in zip(params, steps):
            lo, hi, i = max(offset, a), min(offset + p.numel(), b), self._index[id(p)]
            offset += p.numel()
            if lo >= hi:
                continue
            if i in by_rows:
                runs.append((lo, hi, step, i))
            elif alike and runs and runs[-1][3] < 0 and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi, runs[-1][2], -1)
            else:
                runs.append((lo, hi, step, -1))
        return runs

    def _post_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        for p, g in zip(self.params, self._hidden):
            p.grad = g
        self._hidden = []
        self._step_barrier()  # every slice is updated: the next forward may read the weights, the next backward write
        self._cast.mark_current()
        self._zeroed = True  # the summing pass zeroed the gradients it read (reduce)
        self.coefficient, self._reduced = None, False


def _private_copies(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """state_dict() post-hook: the moments and steps as tensors of their own, not views of a shared buffer
    (torch.save would write the whole buffer with each) that later steps change."""
    # New entries: torch packs the optimizer's own per-parameter dicts, which must keep pointing at the buffers.
    state_dict["state"] = {k: {name: v.clone() if isinstance(v, torch.Tensor) else v for name, v in entry.items()}
                           for k, entry in state_dict["state"].items()}
    return state_dict


__all__ = ["RowSource", "SharedAdamW"]
