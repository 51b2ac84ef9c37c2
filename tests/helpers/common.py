"""Where things are, a free TCP port, and a fresh corecpu cache directory."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
WORKERS = Path(__file__).resolve().parent / "workers"  # scripts that spawned ranks run
# Cache entries that are builds, the same for every run that uses them, rather than measurements or data:
# DeepSpeed's shared-memory op (corecpu.distributed.shm_allreduce.op_cache_dir), a minute or more of compiling.
BUILDS = ("shm",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_cache(path: Path, builds_from: Path | None = None) -> Path:
    """`path` as a corecpu cache directory with nothing measured or tokenized in it, whose BUILDS are those of
    `builds_from` (default: this test run's cache, $CORECPU_CACHE_DIR), linked, so no test compiles them again.
    A build folder that cannot be created is left out (then it is built under `path`)."""
    path.mkdir(parents=True, exist_ok=True)
    source = builds_from or Path(os.environ["CORECPU_CACHE_DIR"])
    for name in BUILDS:
        try:
            shared = (source / name).resolve()
            shared.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        (path / name).symlink_to(shared, target_is_directory=True)
    return path
