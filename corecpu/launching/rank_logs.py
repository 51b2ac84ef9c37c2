"""`--log-dir DIR`: each rank's stdout and stderr in its own file, DIR/rank-N.log (torchrun's --log-dir),
and, when the job fails, the last lines of the ranks that failed in the launcher's error summary.

corecpu.bind redirects the rank's file descriptors 1 and 2 just before it execs the rank, so
everything the rank writes lands there (Python, C++ and MPI alike) and nothing is buffered in
between. The launcher only reads the files afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

# Lines that mark a rank as the one that failed (its own error, or Python's traceback). A rank
# killed because another failed usually ends without one, so these point at the cause.
FAILURE_MARKS = ("Traceback (most recent call last)", "corecpu: error:", "Error", "error:")


def log_path(log_dir: str | Path, rank: int) -> Path:
    return Path(log_dir) / f"rank-{rank}.log"


def redirect(log_dir: str | Path, rank: int) -> Path:
    """Point this process's stdout and stderr at DIR/rank-N.log (appended: a resumed job keeps the earlier run)."""
    path = log_path(log_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    return path


def tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def failure_summary(log_dir: str | Path, lines: int = 10) -> list[str]:
    """The last `lines` lines of each failed rank's log (every rank's, when none shows a failure)."""
    logs = sorted(Path(log_dir).glob("rank-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    failed = [p for p in logs if any(mark in line for line in tail(p, 200) for mark in FAILURE_MARKS)]
    out: list[str] = []
    for p in failed or logs:
        out.append(f"--- {p.stem.replace('-', ' ')}, last lines of {p}:")
        out += [f"    {line}" for line in tail(p, lines)]
    return out
