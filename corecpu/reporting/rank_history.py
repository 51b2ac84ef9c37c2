"""Which rank count trained this job fastest on this machine: recorded at each run's end, said at the next start.

corecpu does not pick the number of ranks (the launcher's N does), and more ranks are not always faster: on
issue 29's 16-core Xeon, 8 ranks trained at 86 samples/s where 2 did 110. Every run that trained long enough
records its samples/s under its job's shape (machine, task, model, data, sequence length, global batch,
precision, binding, and whether the launcher found the CPUs busy at start); a run whose rank count measured
slower than another of the same shape says so, with both numbers and the command that keeps the global batch.
A run that started beside a busy neighbour is recorded apart from one that had the node alone, so a timing
taken under load never advises (or decides `auto` for) an idle start, nor the other way round.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from corecpu import cachefile, envvars

CACHE_FILE = "rank_history.json"
CACHE_VERSION = 1
KEEP = 3  # the last few rates per rank count: their median, so one disturbed run does not decide
MIN_STEPS = 20  # a run timed over fewer steps is too noisy to advise anyone
MARGIN = 0.05  # another rank count must be this much faster before a run is told so (repeats differ by 1-3%)
# The flags that change a step's cost; the rest (lr, seed, output dir, logging) do not.
# The precision asked for, not the one resolved: the launcher's `auto` looks a job up before any rank resolves it
# (on one machine `auto` resolves alike, from the cached calibration).
SHAPE_FLAGS = ("task", "model", "data", "max_seq_len", "group_by_length", "pad_to_multiple_of", "lora_r",
               "precision", "compile", "attention", "allreduce", "allreduce_dtype", "backend", "shard_optimizer")


@dataclass(frozen=True)
class JobShape:
    key: str  # the cache key: the machine and a digest of the job's shape
    global_batch: int
    nodes: int
    ranks_per_node: int


def job_shape(config: Mapping[str, Any], binding: str | None, *, cpu_model: str, node_cpus: int,
              world_size: int, local_world_size: int, busy: bool = False,
              torch_version: str | None = None) -> JobShape:
    """The job's shape: what its samples/s can be compared across rank counts by. `node_cpus`: the CPUs the
    node gives the job (its cpuset), as the launcher and the ranks both read it; `binding`: core or numa;
    `busy`: whether the launcher found some of those CPUs busy at start (CORECPU_CPUS_BUSY)."""
    nodes = max(1, world_size // max(1, local_world_size))
    global_batch = int(config.get("batch_size") or 0) * world_size * int(config.get("grad_accum") or 1)
    shape = {**{k: config.get(k) for k in SHAPE_FLAGS}, "global_batch": global_batch, "nodes": nodes,
             "binding": binding, "busy": busy, "torch": torch_version or installed_torch()}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return JobShape(f"{cpu_model}|cpus={node_cpus}|{digest}", global_batch, nodes, local_world_size)


def advice(entry: Mapping[str, Any], shape: JobShape, rate: float | None = None) -> str | None:
    """One line when another rank count per node trained this shape more than MARGIN faster than this run
    (`rate`) or, before it has one, than this rank count's own record; None otherwise. Pure."""
    mine = rate if rate is not None else median(entry.get(str(shape.ranks_per_node)))
    if mine is None:
        return None
    best_n, best = None, mine * (1 + MARGIN)
    for n, runs in entry.items():
        if n.isdigit() and int(n) != shape.ranks_per_node and (m := median(runs)) is not None and m > best:
            best_n, best = int(n), m
    if best_n is None:
        return None
    per_rank, rest = divmod(shape.global_batch, best_n * shape.nodes)
    keep = (f" (--batch-size {per_rank} keeps the global batch of {shape.global_batch})" if not rest
            else f" (the global batch of {shape.global_batch} does not split over {best_n} ranks per node)")
    tense = "trains" if rate is not None else "trained"
    return (f"{shape.ranks_per_node} rank(s) per node {tense} this job at {mine:.1f} samples/s on this machine; "
            f"{best_n} per node trained it at {best:.1f} ({best / mine:.2f}x): run {best_n} per node{keep}")


def installed_torch() -> str:
    """torch's version from its metadata: the launcher reads it without importing torch."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def median(runs: Any) -> float | None:
    """The median samples/s of an entry's runs of one rank count; None without any."""
    rates = [r["samples_per_s"] for r in runs or () if isinstance(r, dict) and r.get("samples_per_s")]
    return statistics.median(rates) if rates else None


def recorded(entry: Mapping[str, Any], shape: JobShape, rate: float, steps: int) -> dict[str, Any]:
    """`entry` with this run's rate added under its rank count (the last KEEP kept). Pure."""
    runs = [*(entry.get(str(shape.ranks_per_node)) or ()), {"samples_per_s": round(rate, 2), "steps": steps,
                                                           "at": time.strftime("%Y-%m-%d", time.gmtime())}]
    return {**entry, str(shape.ranks_per_node): runs[-KEEP:]}


def cache_path(env: Mapping[str, str]) -> Path:
    return envvars.cache_dir(env) / CACHE_FILE


def read(shape: JobShape, env: Mapping[str, str]) -> dict[str, Any]:
    return cachefile.read_entries(cache_path(env), CACHE_VERSION).get(shape.key, {})


def store(shape: JobShape, rate: float | None, steps: int, env: Mapping[str, str]) -> dict[str, Any] | None:
    """Record this run (rank 0, at its end) when it timed enough steps; returns the entry as it now stands."""
    if rate is None or rate <= 0 or steps < MIN_STEPS:
        return None
    entry = recorded(read(shape, env), shape, rate, steps)
    cachefile.store_entry(cache_path(env), CACHE_VERSION, shape.key, entry, "this job's samples/s per rank count")
    return entry


__all__ = ["JobShape", "advice", "installed_torch", "job_shape", "median", "read", "recorded", "store"]
