"""Checkpoints that can be trusted: save() and resume(), symmetric, for any module and optimizer.

    path = checkpoint.save(out, step=step, model=model, optimizer=opt, scheduler=sched, epoch=e,
                           batches_in_epoch=b, config=cfg, keep=2)          # every rank calls it
    loop = checkpoint.resume(out, "auto", model=model, optimizer=opt, scheduler=sched, config=cfg)
    for note in loop.notes if loop else []: print(note)                    # skipped checkpoints, changes

Layout: OUTPUT_DIR/checkpoints/step-00000120/{state.pt, meta.json}. Rank 0 writes into
.step-00000120.tmp-PID/ (with an owner.json naming host and PID), fsyncs, and renames it into
place, so a step-* directory appears only complete. meta.json is written last and records the
size and BLAKE2b digest of state.pt; resume verifies them and falls back to the newest
checkpoint that verifies, saying which one it skipped and why. Every rank's RNG state is
stored, because dropout draws differ per rank and an exact resume must restore each one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from corecpu.dist import gather_objects
from corecpu.errors import CoreCPUError

PREFIX = "step-"
FORMAT = 2  # 1: no file digests, extra keys at the top level of meta.json
STATE, META, OWNER = "state.pt", "meta.json", "owner.json"
HASH_CHUNK = 1 << 20

# Settings that change the math of the run; anything else (logging, paths) may differ on resume.
RUN_DEFINING = ("model", "data", "eval_data", "batch_size", "grad_accum", "lr", "weight_decay", "warmup_ratio",
                "max_grad_norm", "epochs", "max_steps", "seed", "max_seq_len", "precision", "text_column",
                "text_pair_column", "label_column")
# What "auto" settings resolved to on the host that saved (config["resolved"]); may differ on another host.
RESOLVED = ("precision", "backend", "allreduce", "threads")


@dataclass
class LoopState:
    """Where the loop is, and what resume() has to say about how it got there."""

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the checkpoint this state came from
    notes: list[str] = field(default_factory=list)  # one line each: skipped checkpoints, changed settings


# ---------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # weights_only loading refuses numpy arrays; keep the key as a tensor.
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, cached))


def _tuples(x: Any) -> Any:
    # random.setstate wants tuples; serialisation may hand back lists.
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------- listing and verifying


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


@dataclass
class Candidate:
    path: Path
    order: float  # save time from meta.json, else the directory's mtime
    meta: dict[str, Any] | None
    problem: str | None  # why it cannot be used, or None


def read_meta(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        text = (path / META).read_text()
    except FileNotFoundError:
        return None, f"{META} is missing"
    except OSError as exc:
        return None, f"{META} cannot be read ({exc.strerror})"
    try:
        meta = json.loads(text)
    except ValueError as exc:
        return None, f"{META} is not valid JSON ({exc})" if text.strip() else f"{META} is empty"
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        return None, f"{META} has no step number"
    return meta, None


def file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, meta: dict[str, Any], *, digests: bool = True) -> str | None:
    """Why the files of checkpoint `path` do not match what its meta.json recorded; None if they do."""
    files = meta.get("files")
    if files is None:  # format 1 recorded nothing; a present, non-empty state.pt is all we can check
        files = {STATE: {}}
    for name, want in files.items():
        f = path / name
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size == 0:
            return f"{name} is empty"
        if "bytes" in want and size != want["bytes"]:
            return f"{name} has {size} bytes, {META} records {want['bytes']} ({'truncated' if size < want['bytes'] else 'overwritten'})"
        if digests and "blake2b" in want and file_digest(f) != want["blake2b"]:
            return f"{name} does not match its checksum in {META} (corrupted)"
    return None


def scan(output_dir: str | Path) -> list[Candidate]:
    """Every step-* directory, oldest first by save time, with why each is unusable (sizes only)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if not (p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit() and p.is_dir()):
            continue
        meta, problem = read_meta(p)
        if meta is not None:
            problem = verify(p, meta, digests=False)
        order = meta.get("saved_at", 0.0) if meta else p.stat().st_mtime
        found.append(Candidate(p, float(order), meta, problem))
    return sorted(found, key=lambda c: (c.order, c.path.name))


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoints whose files are all there, oldest first by the time they were saved.

    Not by step: a fresh run into a directory that still holds a longer, older run
    must neither have its new checkpoints pruned nor resume from the stale ones.
    """
    return [c.path for c in scan(output_dir) if c.problem is None]


def choose(candidates: list[Candidate], check: Callable[[Candidate], str | None]) -> tuple[Candidate | None, list[str]]:
    """The newest candidate that passes `check`, and a note for each newer one skipped."""
    notes = []
    for c in reversed(candidates):
        problem = c.problem or check(c)
        if problem is None:
            return c, notes
        notes.append(f"skipped checkpoint {c.path}: {problem}")
    return None, notes


# ---------------------------------------------------------------- stale leftovers


def _process_start(pid: int) -> str | None:
    # Field 22 of /proc/PID/stat: start time since boot; with the PID it names one process, even after reuse.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_gone(owner: dict[str, Any] | None, pid_from_name: int | None, host: str,
                alive: Callable[[int], bool], started: Callable[[int], str | None]) -> bool:
    """Whether the process that made a temporary directory is gone, so the directory may be removed.

    A writer on another host cannot be checked from here: its directory stays.
    """
    pid = owner.get("pid") if owner else pid_from_name
    if not isinstance(pid, int):
        return False
    if owner and owner.get("host") not in (None, host):
        return False
    if not alive(pid):
        return True
    return bool(owner and owner.get("start") and started(pid) != owner["start"])  # the PID was reused


def clean_stale(output_dir: str | Path, *, host: str | None = None,
                alive: Callable[[int], bool] = _pid_alive,
                started: Callable[[int], str | None] = _process_start) -> list[str]:
    """Remove leftovers of killed saves and prunes; one note per removal.

    .step-*.tmp-PID/ and .step-*.old-PID/ go when their writer is gone; a step-* directory
    without meta.json can only be a prune that was interrupted (saves rename in complete ones).
    """
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    host = host or socket.gethostname()
    notes = []
    for p in sorted(root.iterdir()):
        if not p.is_dir():
            continue
        if p.name.startswith("." + PREFIX) and (".tmp-" in p.name or ".old-" in p.name):
            tail = p.name.rsplit("-", 1)[1]
            try:
                owner = json.loads((p / OWNER).read_text())
            except (OSError, ValueError):
                owner = None
            if not writer_gone(owner, int(tail) if tail.isdigit() else None, host, alive, started):
                continue
            why = "left by a save that did not finish"
        elif p.name.startswith(PREFIX) and not (p / META).exists():
            why = "incomplete (no meta.json)"
        else:
            continue
        size = _tree_bytes(p)
        shutil.rmtree(p, ignore_errors=True)
        notes.append(f"removed {p} ({size / 1e6:.1f} MB): {why}")
    return notes


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- save


def state_bytes(obj: Any) -> int:
    """Bytes of all tensors in a nested state: what torch.save will write, give or take its headers."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def space_problem(need_bytes: int, free_bytes: int, where: Path) -> str | None:
    """The one-line disk-full message when `need_bytes` (plus a margin) does not fit in `free_bytes`."""
    return None if need_bytes * 1.05 + (1 << 20) <= free_bytes else no_space(where, need_bytes, free_bytes)


def no_space(where: Path, need_bytes: int, free_bytes: int) -> str:
    return (f"no space left on {where}: checkpoint needs about {_mb(need_bytes)} MB, {_mb(free_bytes)} MB free; "
            "free some space or write checkpoints to another output directory")


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f}" if n >= 1e6 else f"{n / 1e6:.2f}"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state_dict keys do not depend on DDP or torch.compile wrapping."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _disk_full(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        # torch's zip writer turns a short write into "unexpected pos N vs M".
        if "No space left" in str(exc) or "unexpected pos" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(final: Path, state: dict[str, Any], meta: dict[str, Any], host: str) -> None:
    """Write one checkpoint atomically; on failure remove the temporary directory and re-raise."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / OWNER).write_text(json.dumps({"host": host, "pid": os.getpid(), "start": _process_start(os.getpid())}))
        torch.save(state, tmp / STATE)
        _fsync(tmp / STATE)
        # Digest what reached the file (read back from the page cache), not what we meant to write.
        meta["files"] = {STATE: {"bytes": (tmp / STATE).stat().st_size, "blake2b": file_digest(tmp / STATE)}}
        with open(tmp / META, "w") as f:
            f.write(json.dumps(meta, indent=2))
            f.flush()
            os.fsync(f.fileno())
        (tmp / OWNER).unlink()
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():  # the same step saved twice: move the old one aside so a checkpoint always exists
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(output_dir: str | Path, keep: int) -> None:
    """Keep the newest `keep` usable checkpoints; rename before deleting so no half-deleted step-* remains."""
    candidates = scan(output_dir)
    usable = [c for c in candidates if c.problem is None]
    kept = {c.path for c in usable[-keep:]} if keep > 0 else set()
    for c in candidates:
        if c.path in kept:
            continue
        doomed = c.path.with_name(f".{c.path.name}.old-{os.getpid()}")
        try:
            os.replace(c.path, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)


def save(
    output_dir: str | Path,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any = None,
    epoch: int = 0,
    batches_in_epoch: int = 0,
    extra: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path | None:
    """Collective: every rank calls it (every rank's RNG state is gathered); rank 0 writes.

    Returns the checkpoint directory on rank 0, None elsewhere. A failure (disk full) raises
    CoreCPUError on every rank, and the previous checkpoints are left as they were.
    `extra` and `config` must be JSON-serialisable; `config["label_names"]` and
    `config["resolved"]` (precision, backend, allreduce, threads) are compared on resume.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    states = gather_objects(rng_state())
    final = checkpoint_root(output_dir) / f"{PREFIX}{step:08d}"
    error = None
    if rank == 0:
        try:
            error = _save_rank0(output_dir, final, step, model, optimizer, scheduler, epoch, batches_in_epoch,
                                extra, config, keep, states)
        except CoreCPUError as exc:
            error = str(exc)
    # Rank 0's outcome, on every rank: a failed write must stop all of them, not strand them at a barrier.
    error = _broadcast(error)
    if error:
        raise CoreCPUError(error)
    return final if rank == 0 else None


def _save_rank0(output_dir: str | Path, final: Path, step: int, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer | None, scheduler: Any, epoch: int, batches_in_epoch: int,
                extra: dict[str, Any] | None, config: dict[str, Any] | None, keep: int,
                states: list[Any]) -> str | None:
    host = socket.gethostname()
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    clean_stale(output_dir, host=host)
    state = {"model": unwrap(model).state_dict(), "rng": states}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    meta = {"format": FORMAT, "step": step, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
            "world_size": len(states), "saved_at": time.time(), "host": host, "config": config or {},
            "extra": extra or {}}
    try:
        json.dumps(meta)
    except TypeError as exc:
        raise CoreCPUError(f"checkpoint extra/config must be JSON-serialisable ({exc}); pass plain numbers, "
                           "strings, lists and dicts") from None
    need = state_bytes(state)
    problem = space_problem(need, shutil.disk_usage(root).free, root)
    if problem:
        return problem
    try:
        _write(final, state, meta, host)
    except (OSError, RuntimeError) as exc:
        if not _disk_full(exc):
            raise
        return no_space(root, need, shutil.disk_usage(root).free)
    prune(output_dir, keep)
    return None


def _broadcast(obj: Any) -> Any:
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------- resume


def config_changes(saved: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """'name: saved -> now' for each run-defining setting, and each resolved choice, that differs."""
    changes = [f"{k}: {saved[k]!r} -> {config[k]!r}" for k in RUN_DEFINING
               if k in saved and k in config and saved[k] != config[k]]
    was, now = saved.get("resolved") or {}, config.get("resolved") or {}
    changes += [f"{k} resolved to {was[k]!r} when saved, {now[k]!r} here" for k in RESOLVED
                if k in was and k in now and was[k] != now[k]]
    return changes


def label_problem(saved: dict[str, Any], config: dict[str, Any]) -> str | None:
    was, now = saved.get("label_names"), config.get("label_names")
    if was is None or now is None or list(was) == list(now):
        return None
    return f"it was trained with labels {list(was)} and this run has {list(now)}"


def resume(
    output_dir: str | Path,
    which: str = "auto",
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any = None,
    config: dict[str, Any] | None = None,
) -> LoopState | None:
    """Restore model, optimizer, scheduler and this rank's RNG in place; None means a fresh start.

    `which`: "" (fresh start), "auto" (the newest checkpoint under output_dir that verifies; a
    fresh start if there is none yet) or a checkpoint directory. Collective when torch.distributed
    is initialised: rank 0 picks and verifies, every rank loads the same one. The returned
    LoopState's `notes` say which checkpoints were skipped and why, and what changed since.
    """
    if not which:
        return None
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    config = config or {}
    choice: tuple[str | None, list[str], str | None] = (None, [], None)
    if rank == 0:
        try:
            choice = _choose_rank0(output_dir, which, config)
        except CoreCPUError as exc:
            choice = (None, [], str(exc))
    path_s, notes, error = _broadcast(choice)
    if error:
        raise CoreCPUError(error)
    if path_s is None:
        return None
    path = Path(path_s)
    try:
        loop, saved_config = _load(path, model, optimizer, scheduler, rank, world)
        error = None
    except CoreCPUError as exc:
        error = str(exc)
    errors = [e for e in gather_objects(error) if e]  # every rank stops if any one could not load
    if errors:
        raise CoreCPUError(errors[0])
    loop.notes = notes + loop.notes
    changes = config_changes(saved_config, config)
    if changes:
        loop.notes.append(f"resuming with changed settings: {'; '.join(changes)}")
    return loop


def _choose_rank0(output_dir: str | Path, which: str, config: dict[str, Any]) -> tuple[str | None, list[str], None]:
    notes = clean_stale(output_dir)

    def check(c: Candidate) -> str | None:
        assert c.meta is not None
        return verify(c.path, c.meta) or _label_or_none(c.meta, config)

    if which == "auto":
        candidates = scan(output_dir)
        chosen, skipped = choose(candidates, check)
        if chosen is None and candidates:
            raise CoreCPUError(f"no checkpoint in {checkpoint_root(output_dir)} can be resumed ("
                               + "; ".join(n.removeprefix("skipped checkpoint ") for n in skipped)
                               + "); remove them to start fresh, or pass a checkpoint directory to resume from")
        return (str(chosen.path) if chosen else None), notes + skipped, None
    path = Path(which)
    meta, problem = read_meta(path) if path.is_dir() else (None, "not a directory")
    problem = problem or verify(path, meta) or _label_or_none(meta, config)
    if problem:
        raise CoreCPUError(f"cannot resume from {which}: {problem}; pass another checkpoints/step-* directory "
                           "or 'auto' for the newest one that verifies")
    return str(path), notes, None


def _label_or_none(meta: dict[str, Any], config: dict[str, Any]) -> str | None:
    problem = label_problem(meta.get("config") or {}, config)
    if problem is None:
        return None
    raise CoreCPUError(f"checkpoint {meta.get('step')} does not fit this run's labels: {problem}; use the same "
                       "label set (same data and label column), or start fresh in another output directory")


def _load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any,
          rank: int, world: int) -> tuple[LoopState, dict[str, Any]]:
    meta, problem = read_meta(path)
    if meta is None:
        raise CoreCPUError(f"cannot resume from {path}: {problem}")
    try:
        state = torch.load(path / STATE, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file rank 0 verified but this rank cannot read (another filesystem view)
        raise CoreCPUError(f"cannot read {path / STATE} on rank {rank} ({_first_line(exc)}); every rank needs "
                           "the same output directory") from None
    try:
        unwrap(model).load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        was = (meta.get("config") or {}).get("model", "?")
        raise CoreCPUError(f"checkpoint {path} does not fit this model (it was written for model {was}: "
                           f"{_first_line(exc)}); resume with the same model, or start fresh in another output "
                           "directory") from None
    notes = []
    if scheduler is not None:
        if "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        else:
            notes.append(f"checkpoint {path} has no scheduler state: the schedule restarts from its beginning")
    rngs = state["rng"]
    if len(rngs) == world:
        set_rng_state(rngs[rank])
    else:
        notes.append(f"checkpoint was written by {len(rngs)} ranks and this run has {world}: "
                     "data order and RNG streams will differ from an uninterrupted run")
    extra = dict(meta.get("extra") or {}) if meta.get("format", 1) >= 2 else {
        k: v for k, v in meta.items() if k not in ("step", "epoch", "batches_in_epoch", "world_size", "saved_at", "config")}
    loop = LoopState(meta["step"], meta.get("epoch", 0), meta.get("batches_in_epoch", 0), extra, path, notes)
    return loop, meta.get("config") or {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

