"""The output directory: checked before any work, and never a mix of two runs.

    outputs.check(out, need_bytes=outputs.estimate_run_bytes(weights_bytes, keep))   # every rank, at start
    note = outputs.set_aside_earlier_run(out, resuming=bool(cfg.resume))              # rank 0, after set-up

A fresh run into a directory that holds an earlier run's outputs moves them into
OUTPUT_DIR/previous-<UTC time>/ rather than refusing. A cluster job that is requeued
re-runs the same command line; refusing would fail every requeue until someone edits it,
while moving aside loses nothing, leaves no mix (old final/ beside a new config.json),
and the one-line note names the checkpoint to resume from. With resume the directory is
left as it is, so `--resume auto` keeps finding the run's own checkpoints.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from corecpu import atomic
from corecpu.errors import CoreCPUError
from corecpu.training.checkpoint_disk import list_checkpoints

# What a run writes; anything else in the directory (a user's notes, data) is left alone.
RUN_OUTPUTS = ("final", "checkpoints", "summary.json", "metrics.jsonl", "config.json", "topology.json", "tensorboard",
               "mlruns", "predictions.json", "null_odds.json")
SET_ASIDE_PREFIX = "previous-"


def estimate_run_bytes(weights_bytes: int, keep: int) -> int:
    """Disk a run needs at least: the final model plus keep+1 checkpoints (the newest is written before
    the oldest is pruned), each about three times the weights (fp32 weights and AdamW's two moments)."""
    return weights_bytes * (1 + 3 * (keep + 1))


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_write(directory: Path) -> OSError | None:
    """Create and remove a file: the only test that sees read-only mounts, ACLs and quotas (and root)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".corecpu-probe-", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return exc
    return None


def check(output_dir: str | Path, *, need_bytes: int = 0,
          disk_usage: Callable[[Path], Any] = shutil.disk_usage,
          probe: Callable[[Path], OSError | None] = _probe_write) -> None:
    """One CoreCPUError line if the output directory cannot take this run's outputs; creates nothing."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise CoreCPUError(f"output directory {out} is a file, not a directory; choose another output directory "
                           "or move the file away")
    base = _existing_ancestor(out)
    if not base.is_dir():
        raise CoreCPUError(f"output directory {out} cannot be created: {base} is a file; choose another output directory")
    error = probe(base)
    if error is not None:
        why = {errno.EROFS: "is on a read-only filesystem", errno.EACCES: "is not writable by this user",
               errno.EPERM: "is not writable by this user", errno.ENOSPC: "has no space left",
               errno.EDQUOT: "is over its disk quota"}.get(error.errno, f"cannot be written ({error.strerror})")
        raise CoreCPUError(f"output directory {out} {why} (tried {base}); choose another output directory")
    free = disk_usage(base).free
    if need_bytes and free < need_bytes:
        raise CoreCPUError(f"no space left on {base}: this run needs about {need_bytes / 1e6:.0f} MB (final model and "
                           f"checkpoints), {free / 1e6:.0f} MB free; free some space or choose another output directory")


def earlier_outputs(output_dir: str | Path) -> list[Path]:
    out = Path(output_dir)
    found = []
    for name in RUN_OUTPUTS:
        p = out / name
        if p.is_file() or (p.is_dir() and any(p.iterdir())):
            found.append(p)
    return found


def set_aside_earlier_run(output_dir: str | Path, *, resuming: bool,
                          now: Callable[[], float] = time.time) -> str | None:
    """Move an earlier run's outputs into previous-<time>/ before a fresh run writes; a one-line note, or None.

    Rank 0 only. Nothing moves when resuming: those outputs are the run being continued. First, an output
    that a killed write set aside (corecpu.atomic: final/ where the system cannot swap directories) is put back.
    """
    atomic.recover_all(output_dir)
    if resuming:
        return None
    found = earlier_outputs(output_dir)
    if not found:
        return None
    out = Path(output_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now()))
    dest = out / f"{SET_ASIDE_PREFIX}{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = out / f"{SET_ASIDE_PREFIX}{stamp}-{n}"
    dest.mkdir()
    for p in found:
        os.replace(p, dest / p.name)  # same filesystem: a rename, instant for any size
    saved = list_checkpoints(dest)
    hint = f"; to continue that run instead, resume from {saved[-1]}" if saved else ""
    return f"{out} held an earlier run's outputs ({', '.join(p.name for p in found)}): moved them to {dest}{hint}"
