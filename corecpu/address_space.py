"""A virtual-memory limit (`ulimit -v`, RLIMIT_AS) too small for torch: one line naming it, at once.

Under `ulimit -v 800000` a run failed in a dozen ways, none of them saying "memory limit": an ImportError
"failed to map segment from shared object" (torch's or scipy's libraries), a MemoryError while compiling
bytecode, "OpenBLAS error: Memory allocation still failed", "libgomp: Thread creation failed", a Rust
"memory allocation of 16 bytes failed" abort inside the tokenizer, torch's "DefaultCPUAllocator: can't
allocate memory". The address space counts what is reserved, not what is used: torch, transformers and
scipy map about 0.9 GiB before any work (measured), and every thread reserves a stack and a malloc arena.
So a limit below MIN_BYTES is refused where corecpu meets torch (corecpu's import after torch's, its lazy
names, `corecpu launch`), and any memory failure under a limit is named by corecpu.errors.run_cli.
"""

from __future__ import annotations

import resource

GIB = 1 << 30
# Measured: the 2M-parameter tiny model trains on 2 threads under 1.3 GiB and fails below 1.25 GiB;
# a real model, more threads or more ranks' worth of arenas need more. Below this, nothing trains.
MIN_BYTES = 2 * GIB
ADVISED_BYTES = 4 * GIB
# What the failures above say (case-insensitive); only read when a limit is set.
_MEMORY_TEXTS = ("failed to map segment", "cannot allocate memory", "can't allocate memory", "out of memory",
                 "can't start new thread", "thread creation failed", "memory allocation")


def limit() -> int | None:
    """The soft RLIMIT_AS in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def explain(limit_bytes: int) -> str:
    """The one line for a limit that is (or proved) too small."""
    return (f"virtual memory is limited to {limit_bytes / GIB:.2f} GiB (ulimit -v {limit_bytes // 1024}): torch, "
            "transformers and their threads reserve more address space than that; run `ulimit -v unlimited` "
            f"(or at least `ulimit -v {ADVISED_BYTES // 1024}`, {ADVISED_BYTES // GIB} GiB) and start again")


def too_small(minimum: int = MIN_BYTES) -> str | None:
    """explain()'s line when the limit is below `minimum`, else None."""
    current = limit()
    return explain(current) if current is not None and current < minimum else None


def memory_failure(exc: BaseException) -> str | None:
    """explain()'s line when `exc` is what running out of address space under a limit looks like, else None.
    Without a limit a MemoryError is a real shortage of memory, not this."""
    current = limit()
    if current is None:
        return None
    if isinstance(exc, MemoryError):
        return explain(current)
    text = str(exc).lower()
    if isinstance(exc, (ImportError, OSError, RuntimeError)) and any(t in text for t in _MEMORY_TEXTS):
        return explain(current)
    return None
