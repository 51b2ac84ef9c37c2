"""The one comm thread that gradient all-reduce hooks share: DDP hands each bucket over, a daemon thread
runs the blocking collective, a torch Future gives the result back to autograd.

Why a thread and not the hook itself: a hook that blocks in a collective blocks the autograd thread and
loses DDP's overlap of communication with the rest of backward (measured 1.7x slower steps with MPI).
Why ONE thread: every rank then runs its collectives in the order DDP fired the buckets, which DDP keeps
equal across ranks, so no two ranks ever wait in different collectives.

Subclasses (the MPI path in corecpu.distributed.allreduce, the shared-memory path in
corecpu.distributed.shm_allreduce) implement `_reduce(tensor, scale)` only.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import TYPE_CHECKING, Mapping

from corecpu import envvars
from corecpu.errors import CoreCPUError

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel


def comm_cpu_of(env: Mapping[str, str]) -> int | None:
    """The CPU the node plan set aside for this rank's comm thread (corecpu.cpu.busy_threads), as corecpu.bind or
    corecpu.setup() put it in the rank's environment; None when there is none."""
    cpu = env.get(envvars.COMM_CPU, "")
    return int(cpu) if cpu.isdigit() else None


class ThreadedGradientAllreduce:
    """Averages DDP gradient buckets on one dedicated daemon thread; `_reduce` does the collective.

    The result is what DDP computes without a hook: each bucket is scaled by 1/world (the multiply DDP's
    reducer applies before summing) and summed over the ranks.
    """

    label = "gradient all-reduce"  # in errors: "the <label> thread has stopped"

    def __init__(self, world_size: int, thread_name: str, comm_cpu: int | None = None) -> None:
        """`comm_cpu`: a CPU nobody computes on for the comm thread (comm_cpu_of(env)); None: the rank's CPUs."""
        self.world_size = world_size
        self._comm_cpu = comm_cpu
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)
        self._thread.start()

    def allreduce_async(self, tensor: torch.Tensor, scale: float | None = None) -> torch.futures.Future:
        """Sum `tensor` in place over all ranks (after multiplying by `scale`); the Future yields it.

        Every rank must call this in the same order with tensors of the same size and dtype.
        """
        import torch

        if not self._thread.is_alive():
            raise CoreCPUError(f"the {self.label} thread has stopped (close() was called or it failed); "
                               f"create a new {type(self).__name__}")
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((tensor, scale, fut))
        return fut

    def register(self, ddp: DistributedDataParallel) -> None:
        """Install the communication hook: DDP hands each gradient bucket to the comm thread."""
        scale = 1.0 / self.world_size

        # No annotations: DDP compares them with the real classes, and this module's are strings.
        def threaded_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
            return self.allreduce_async(bucket.buffer(), scale)

        ddp.register_comm_hook(None, threaded_allreduce_hook)

    def close(self) -> None:
        """Stop the comm thread after the queued all-reduces."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> "ThreadedGradientAllreduce":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        # The plan may have found this rank's comm thread a CPU nobody computes on (corecpu.cpu.busy_threads):
        # it polls there instead of on a core the backward pass needs. Only this thread moves.
        if self._comm_cpu is not None:
            try:
                os.sched_setaffinity(0, {self._comm_cpu})
            except OSError:
                pass  # the CPU left this process's set since planning: stay on the rank's CPUs
        while True:
            item = self._queue.get()
            if item is None:
                return
            tensor, scale, fut = item
            try:
                result = self._reduce(tensor, scale)
            except BaseException as exc:  # the waiting backward must see it, whatever it is
                fut.set_exception(exc)
                continue
            fut.set_result(result)

    def _reduce(self, tensor: torch.Tensor, scale: float | None) -> torch.Tensor:
        raise NotImplementedError


__all__ = ["ThreadedGradientAllreduce", "comm_cpu_of"]
