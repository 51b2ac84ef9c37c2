"""`--shard-optimizer auto|shm|off`: on one host, no gradient all-reduce and no AdamW step repeated on every rank.

Ranks on one host can read each other's memory. So autograd accumulates each rank's gradients straight into a
buffer of that rank's in /dev/shm (as DDP's gradient_as_bucket_view does into its buckets; the kept word-embedding
gradient copies only the rows its lookups wrote); after backward every rank sums one slice, 1/N of the elements,
over all N buffers, and runs torch's fused AdamW kernel on that slice alone, on weights and moments that live
once, in /dev/shm, and that every rank's model computes with. DDP all-reduces every gradient byte and every rank
runs the whole optimizer step; here nothing is all-reduced, each rank runs 1/N of the step, and the optimizer's
memory is held once per host. Measured with `benchmarks/phases.py` on a 2-vCPU EPYC (MiniLM, bf16, 2 ranks x 16,
interleaved runs): a step of short single sentences 87.5-98.9 ms against DDP's 108-115, of sentence pairs
189-194 ms against 207-217 (benchmarks/README.md has the whole jobs).

The mathematics is DDP's: the step applies the mean of the ranks' gradients, clipped by the global norm of that
mean (each rank's slice's sum of squares, taken in the summing pass, summed over the ranks in one scalar
all-reduce), through the same fused kernel with the hyper-parameters read from the optimizer's param_groups at
each step (so an LR scheduler works as usual). Sums differ from an all-reduce's only in rounding order.

The user's optimizer stays the object train.py holds: a step pre-hook does the sharded step and hides the
gradients from the optimizer's own step, which then has nothing to do; a post-hook gives them back, and once
every rank is done zeroes the buffers for the next step. Its `state` holds every parameter's moments as views of
the shared buffers, so state_dict() is whole on every rank (a post-hook hands out private copies), and a state
loaded for a resume is taken in when this is made.

The files are made by rank 0 and unlinked once every rank has mapped them: nothing is left in /dev/shm, even
after a crash. Whether a run can use this is `unsupported()`'s one line.
"""

from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from corecpu.errors import CoreCPUError

SHARD_CHOICES = ("auto", "shm", "off")
SHM_DIR = Path("/dev/shm")
_MOMENTS = ("exp_avg", "exp_avg_sq")
_CHUNK = 1 << 18  # floats summed and squared at a time: 1 MiB, about one core's L2 on current x86 server parts


class RowSource(Protocol):
    """Who knows outside which rows a gradient is zero (corecpu.compute.embedding_grad's kept gradient)."""

    weight: torch.nn.Parameter

    def reduced_rows(self, grad: torch.Tensor) -> torch.Tensor | None: ...


@dataclass(frozen=True)
class ShardChoice:
    name: str  # "shm" or "off"
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def shm_bytes(numel: int, world: int) -> int:
    """/dev/shm this needs: weights, two moments, and a gradient buffer per rank, all fp32."""
    return (3 + world) * numel * 4


def unsupported(optimizer: torch.optim.Optimizer | None, model: torch.nn.Module, *, world: int, local_world: int,
                use_ipex: bool, named: str = "", free_bytes: Callable[[], int] | None = None) -> str:
    """Why this run cannot shard its optimizer through shared memory; "" when it can. `named`: the DDP-side
    choice the user made by name (`--backend ccl`, `--grad-clip torch`), which sharding would ignore."""
    if world < 2:
        return "single process"
    if local_world != world:
        return "ranks on more than one host"
    if named:
        return f"{named} was asked for, which works on DDP's gradients"
    if use_ipex:
        return "IPEX brings its own optimizer step"
    if optimizer is None:
        return "no optimizer passed to wrap()"
    if type(optimizer) not in (torch.optim.AdamW, torch.optim.Adam) or not optimizer.defaults.get("fused"):
        return "the optimizer is not torch's fused AdamW or Adam"
    for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
        if any(g.get(flag) for g in optimizer.param_groups):
            return f"the optimizer uses {flag}"
    if any(getattr(m, "track_running_stats", False) for m in model.modules()):
        return "the model has running statistics (batch norm), which DDP keeps in step"
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if any(p.dtype != torch.float32 or p.is_sparse for p in params):
        return "a trained parameter is not a dense fp32 tensor"
    if len({id(p) for p in params}) != len(params):
        return "a parameter is in the optimizer twice"
    need = shm_bytes(sum(p.numel() for p in params), world)
    free = (free_bytes or _shm_free)()
    if free < need * 1.1:
        return (f"{SHM_DIR} has {free / 2**20:,.0f} MiB free and this needs {need / 2**20:,.0f} MiB "
                "(a container: docker run --shm-size, or a memory-backed emptyDir on /dev/shm)")
    return ""


def decide(requested: str, why_not: str) -> ShardChoice:
    """`requested` auto|shm|off against unsupported()'s line. An explicit shm that cannot run is an error."""
    if requested == "off":
        return ShardChoice("off", "requested")
    if why_not:
        if requested == "shm":
            raise CoreCPUError(f"--shard-optimizer shm cannot run here: {why_not}; use --shard-optimizer off")
        return ShardChoice("off", why_not)
    return ShardChoice("shm", "requested" if requested == "shm" else
                       "every rank on one host: gradients summed and AdamW stepped by slices in shared memory")


def _shm_free() -> int:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class SharedAdamW:
    """One rank's side of the shared optimizer step (see the module docstring). Collective to make: every rank
    of the (single-host) group makes it with the same optimizer layout."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, rank: int, world: int, barrier: Callable[[], None],
                 sum_scalar: Callable[[float], float], share_tag: Callable[[str], str],
                 rows: Sequence[RowSource] = (), shm_dir: Path = SHM_DIR) -> None:
        """`barrier()`: every rank waits for the others. `sum_scalar(x)`: x summed over the ranks.
        `share_tag(tag)`: rank 0's `tag`, on every rank (names the files). `rows`: who knows which rows of a
        gradient may be nonzero (the kept word-embedding gradient): only those rows are copied."""
        self.optimizer, self.rank, self.world = optimizer, rank, world
        self._barrier, self._sum_scalar = barrier, sum_scalar
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
        self.lo, self.hi = offset * rank // world, offset * (rank + 1) // world  # this rank's slice
        names = ["weights", *_MOMENTS, *(f"grad{k}" for k in range(world))]
        tag = share_tag(secrets.token_hex(8))
        buffers = _map(shm_dir, f"corecpu-{tag}", names, offset, rank, barrier)
        self.weights, self.exp_avg, self.exp_avg_sq = buffers[0], buffers[1], buffers[2]
        self.grads = buffers[3:]
        self.summed = torch.empty(self.hi - self.lo)  # this rank's slice of the ranks' mean gradient
        self._squares = torch.zeros(max(1, -(-self.summed.numel() // _CHUNK)))  # its sum of squares, by chunk
        self._rows = {id(src.weight): src for src in rows}
        self._copied: dict[int, torch.Tensor | str] = {}  # rows of a parameter's gradient copied last step
        self._mine = self._views(self.grads[self.rank])
        # Every other gradient is accumulated by autograd straight into this rank's shared buffer (as DDP's
        # gradient_as_bucket_view does): no copy, and no new memory to fault in each step.
        self._in_place = [i for i, p in enumerate(self.params) if id(p) not in self._rows]
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

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
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
                m.copy_(s["exp_avg"]) if "exp_avg" in s else m.zero_()
                v.copy_(s["exp_avg_sq"]) if "exp_avg_sq" in s else v.zero_()
        self._barrier()
        for p, w in zip(self.params, self._views(self.weights)):
            p.data = w  # the model trains the shared weights themselves: no copy after each step
        for p, m, v in zip(self.params, self._views(self.exp_avg), self._views(self.exp_avg_sq)):
            step = float(state.get(p, {}).get("step", 0.0))
            state[p] = {"step": torch.tensor(step, dtype=torch.float32), "exp_avg": m, "exp_avg_sq": v}
        if loaded:
            self._barrier()  # nobody steps before rank 0 has written what was loaded

    def attach_grads(self, *args: Any) -> None:
        """Every gradient autograd accumulates in place: its view of the shared buffer, wherever zero_grad(
        set_to_none=True) dropped it (a forward pre-hook of the model calls this). A view is zeroed as it is
        given back unless the step's end zeroed it since: a zero_grad() without a step drops what it held."""
        for i in self._in_place:
            p = self.params[i]
            if p.grad is None:
                if not self._zeroed:
                    self._mine[i].zero_()
                p.grad = self._mine[i]
        self._zeroed = False

    # ------------------------------------------------------------------ the step
    def reduce(self) -> None:
        """Collective, once per step (the clip or the step, whichever comes first): this rank's gradients
        into its shared buffer, then this rank's slice summed over every rank's buffer."""
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
                continue
            # Only the rows the lookups wrote: zero last step's, copy this step's (MiniLM: 47 MB not copied).
            v.zero_() if isinstance(last, str) else v.index_fill_(0, last, 0)
            v.index_copy_(0, rows, p.grad.index_select(0, rows))
            self._copied[i] = rows
        for i in self._in_place:
            grad = self.params[i].grad
            if grad is not None and grad.data_ptr() != views[i].data_ptr():  # replaced by someone: copy it in
                views[i].copy_(grad)
        self._barrier()  # every rank's gradients are in
        # The slice's mean over the ranks and its sum of squares in one pass, a chunk at a time: each chunk is
        # summed, scaled and squared while it is still in cache (the passes over memory are what cost here).
        buffers = [g[self.lo:self.hi] for g in self.grads]
        for i, a in enumerate(range(0, self.summed.numel(), _CHUNK)):
            b = min(a + _CHUNK, self.summed.numel())
            out = self.summed[a:b]
            torch.add(buffers[0][a:b], buffers[1][a:b], out=out)
            for other in buffers[2:]:
                out.add_(other[a:b])
            out.mul_(1.0 / self.world)
            torch.dot(out, out, out=self._squares[i])
        self._reduced = True

    def grad_norm(self) -> torch.Tensor:
        """Collective: the 2-norm of the ranks' mean gradient (the clip's total norm)."""
        self.reduce()
        squares = float(self._squares.sum()) if self.summed.numel() else 0.0
        return torch.tensor(math.sqrt(max(self._sum_scalar(squares), 0.0)))

    def _pre_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        self.reduce()
        # The clip's scale inside the kernel; without one the kernel need not write the gradient back.
        scale = None if self.coefficient is None else self.coefficient.to(torch.float32).reciprocal()
        for group, params_of_group, start, end in self._groups:
            a, b = max(start, self.lo), min(end, self.hi)
            if not params_of_group:
                continue
            steps = [optimizer.state[p]["step"] for p in params_of_group]
            torch._foreach_add_(steps, 1.0)
            if a >= b:
                continue
            beta1, beta2 = group["betas"]
            kernel = (torch._fused_adamw_ if isinstance(optimizer, torch.optim.AdamW)
                      or group.get("decoupled_weight_decay") else torch._fused_adam_)
            for lo, hi, step in self._runs(params_of_group, steps, start, a, b):
                kernel([self.weights[lo:hi]], [self.summed[lo - self.lo:hi - self.lo]], [self.exp_avg[lo:hi]],
                       [self.exp_avg_sq[lo:hi]], [], [step], lr=float(group["lr"]), beta1=float(beta1),
                       beta2=float(beta2), weight_decay=float(group["weight_decay"]), eps=float(group["eps"]),
                       amsgrad=False, maximize=False, grad_scale=scale, found_inf=None)
        # The optimizer's own step finds no gradient and does nothing; _post_step gives them back.
        self._hidden = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    @staticmethod
    def _runs(params: Sequence[torch.nn.Parameter], steps: Sequence[torch.Tensor], start: int, a: int, b: int
              ) -> list[tuple[int, int, torch.Tensor]]:
        """[a, b) of a group starting at `start`, as (lo, hi, step) runs for the kernel: one run where every
        parameter has stepped alike (always, unless a loaded state had some parameter step less), else one per
        parameter, each with its own step for the bias correction."""
        if all(float(s) == float(steps[0]) for s in steps):
            return [(a, b, steps[0])]
        runs, offset = [], start
        for p, step in zip(params, steps):
            lo, hi = max(offset, a), min(offset + p.numel(), b)
            if lo < hi:
                runs.append((lo, hi, step))
            offset += p.numel()
        return runs

    def _post_step(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        for p, g in zip(self.params, self._hidden):
            p.grad = g
        self._hidden = []
        self._barrier()  # every slice is updated, and no rank reads another's gradients any more
        torch._foreach_zero_([self._mine[i] for i in self._in_place])  # the next step accumulates from zero
        self._zeroed = True
        self.coefficient, self._reduced = None, False


def _private_copies(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """state_dict() post-hook: the moments and steps as tensors of their own, not views of a shared buffer
    (torch.save would write the whole buffer with each) that later steps change."""
    # New entries: torch packs the optimizer's own per-parameter dicts, which must keep pointing at the buffers.
    state_dict["state"] = {k: {name: v.clone() if isinstance(v, torch.Tensor) else v for name, v in entry.items()}
                           for k, entry in state_dict["state"].items()}
    return state_dict


def _map(shm_dir: Path, prefix: str, names: Sequence[str], numel: int, rank: int,
         barrier: Callable[[], None]) -> list[torch.Tensor]:
    """Collective: fp32 buffers of `numel` zeros in `shm_dir`, mapped by every rank, their files gone on return."""
    paths = [shm_dir / f"{prefix}-{n}" for n in names]
    try:
        if rank == 0:
            for path in paths:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.ftruncate(fd, max(numel, 1) * 4)
                finally:
                    os.close(fd)
        barrier()
        buffers = [torch.from_file(str(p), shared=True, size=max(numel, 1), dtype=torch.float32)[:numel]
                   for p in paths]
        barrier()
    finally:
        if rank == 0:
            for path in paths:
                path.unlink(missing_ok=True)
    return buffers


__all__ = ["SHARD_CHOICES", "ShardChoice", "SharedAdamW", "decide", "shm_bytes", "unsupported"]
