"""`--background-load N`: N busy processes for the whole comparison, as a neighbour's job on a shared node.

Each is `python -c 'while True: pass'`, unpinned, at normal priority: the scheduler places it as it
would place anyone else's work. They are started before the first run and killed after the last,
so every variant and every repeat runs under the same load.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

SPIN = "while True: pass"


@contextlib.contextmanager
def background_load(n: int) -> Iterator[list[subprocess.Popen]]:
    if n < 0:
        raise ValueError(f"--background-load {n} is negative; use 0 (none) or more")
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
