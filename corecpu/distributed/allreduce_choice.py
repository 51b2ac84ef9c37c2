"""`--allreduce auto` by measurement: time each usable gradient path on this job's own ranks, keep the fastest.

Which path is fastest depends on the machine (gloo's TCP loopback, Intel MPI's shared-memory ring,
DeepSpeed's shared-memory op, oneCCL) and on how busy it is, so no CPU flag can say. At start-up
every rank all-reduces one gradient bucket (DDP's default 25 MB of fp32) through each candidate,
interleaved, a few times, each while the rank computes beside it (a block of matrix multiplies, as backward
computes while DDP's buckets travel); the path whose slowest rank's median is lowest wins, so a path that
measured slower is never picked, and gloo is always among the candidates. Timed alone, a path that polls
the network from a comm thread can look fastest and still lose in training where that thread shares the
rank's only core with compute: on two 1-CPU network-namespace hosts at 10 Gb/s, alone shm 38.4, MPI 41.4
and gloo 54.8 ms a bucket, yet MiniLM steps spent 222 ms a step exposed to the shared-memory path and
16 ms to gloo's (benchmarks/cluster.py). The answer is cached per
CPU model, world size, ranks per host, threads, candidate set and load (whether launch.sh found CPUs
busy at start) (in ~/.cache/corecpu/allreduce.json, read by rank 0 and shared), so
only the first run on a kind of machine pays the ~1 s.

`pick` is pure; `measure` runs collectives given one callable per path.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from corecpu import cachefile, envvars, notices
from corecpu.errors import CoreCPUError

if TYPE_CHECKING:
    import torch

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb: what one gradient all-reduce moves
REPEATS = 3
# Compute beside each timed all-reduce: about what backward spends on one bucket's worth of layers (MiniLM on
# one core: ~600 ms of backward for 4 buckets; on 16 threads about a tenth of that).
BESIDE_MS = 50.0
CACHE_FILE = "allreduce.json"
CACHE_VERSION = 3  # 2: timed beside compute; 3: the compute block calibrated on its fastest batch (was half as long)


def pick(timings: Sequence[Mapping[str, float]], order: Sequence[str]) -> tuple[str, str]:
    """Pure. `timings[rank][path]`: that rank's median ms. The lowest worst-rank time wins; a tie keeps `order`."""
    if not order:
        raise CoreCPUError("no gradient all-reduce path to choose from")
    missing = sorted({p for p in order for t in timings if p not in t})
    if missing:
        raise CoreCPUError(f"no timing for {', '.join(missing)} on every rank; the ranks disagree on the candidates")
    worst = {p: max(t[p] for t in timings) for p in order}
    best = min(order, key=lambda p: (worst[p], order.index(p)))
    text = ", ".join(f"{p} {worst[p]:.1f} ms" for p in sorted(order, key=lambda p: worst[p]))
    return best, f"measured one {BUCKET_BYTES >> 20} MB bucket beside compute: {text}"


def compute_block(target_ms: float = BESIDE_MS) -> Callable[[], None]:
    """A callable that keeps this rank's threads busy with matrix multiplies for about `target_ms`."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(4):  # the first calls start OpenMP's threads and pick kernels: slower, and not the rate
        torch.mm(a, b)
    batches = []
    for _ in range(3):  # the fastest of 3 batches: a batch that met a busy moment would make the block short
        start = time.perf_counter()
        for _ in range(8):
            torch.mm(a, b)
        batches.append((time.perf_counter() - start) / 8)
    count = max(1, round(target_ms / 1000 / max(min(batches), 1e-6)))

    def run() -> None:
        for _ in range(count):
            torch.mm(a, b)
    return run


def measure(paths: Mapping[str, Callable[["torch.Tensor"], Any]], barrier: Callable[[], None],
            numel: int = BUCKET_BYTES // 4, repeats: int = REPEATS,
            beside: Callable[[], None] | None = None) -> dict[str, float]:
    """Collective: median ms of one all-reduce per path (`paths[p](buf)` returns something to .wait() on),
    interleaved, after one untimed warm-up each. With `beside`, this thread runs it between starting the
    all-reduce and waiting for it, and the time covers both: a path that slows compute, or that compute
    slows, shows."""
    import torch

    buf = torch.ones(numel, dtype=torch.float32)
    times: dict[str, list[float]] = {p: [] for p in paths}
    for round_ in range(repeats + 1):
        for name, allreduce in paths.items():
            barrier()  # every rank starts together: the time is the collective's, not a late rank's
            start = time.perf_counter()
            work = allreduce(buf)
            if beside is not None:
                beside()
            work.wait()
            if round_:
                times[name].append((time.perf_counter() - start) * 1000)
    return {p: statistics.median(v) for p, v in times.items()}


def cache_key(cpu_model: str, world_size: int, local_size: int, threads: int, candidates: Sequence[str],
              torch_version: str, busy: bool = False, mpi: str = "") -> str:
    """`busy`: launch.sh found some of the job's CPUs busy with other work at start. Such a start gets a
    timing of its own: with a neighbour taking turns on the cores, the paths rank differently (one 25 MB
    bucket on 2 vCPUs with one spinning neighbour: MPI 10.0 -> 21.9 ms, ccl 16.3 -> 16.0 ms). `mpi`: the MPI
    that started the ranks (a launcher name) when mpi is a candidate: Intel MPI's timing says nothing of Open MPI's."""
    return (f"{cpu_model} | world {world_size} | {local_size} per host | {threads} threads | "
            f"{'+'.join(sorted(candidates))} | torch {torch_version}" + (" | CPUs busy at start" if busy else "")
            + (f" | {mpi}" if mpi and "mpi" in candidates else ""))


def cached(key: str) -> dict[str, Any] | None:
    entry = cachefile.read_entries(envvars.cache_dir() / CACHE_FILE, CACHE_VERSION).get(key)
    if entry and isinstance(entry.get("choice"), str) and isinstance(entry.get("timings"), list):
        return entry
    return None


def cached_pick(entry: Mapping[str, Any] | None, order: Sequence[str]) -> tuple[str, str] | None:
    """Pure: `pick` over a cache entry's timings, when they were measured with exactly the candidates `order`."""
    if entry is None or not entry["timings"] or set(entry["timings"][0]) != set(order):
        return None
    return pick(entry["timings"], order)


def remember(key: str, choice: str, timings: Sequence[Mapping[str, float]]) -> None:
    cachefile.store_entry(envvars.cache_dir() / CACHE_FILE, CACHE_VERSION, key,
                          {"choice": choice, "timings": [dict(t) for t in timings]}, what="the all-reduce timing")


def choose_by_measurement(order: Sequence[str], make_paths: Callable[[], Mapping[str, Callable[["torch.Tensor"], Any]]],
                          key: str, rank: int, gather: Callable[[Any], list[Any]],
                          barrier: Callable[[], None]) -> tuple[str, str]:
    """Collective. The candidates `order` (in order of preference on a tie): rank 0's cache entry for `key`
    decides if there is one; else every rank measures the paths `make_paths()` builds (then cached)."""
    known = cached_pick(gather(cached(key) if rank == 0 else None)[0], order)
    if known is not None:
        return known[0], known[1] + " (cached)"
    with notices.phase(f"timing the gradient all-reduce on {', '.join(order)} (once per kind of machine)"):
        timings = gather(measure(make_paths(), barrier, beside=compute_block()))
    choice, why = pick(timings, order)
    if rank == 0:
        remember(key, choice, timings)
    return choice, why


__all__ = ["BUCKET_BYTES", "cache_key", "cached_pick", "choose_by_measurement", "measure", "pick"]
