"""Where things are, and a free TCP port."""

from __future__ import annotations

import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
WORKERS = Path(__file__).resolve().parent / "workers"  # scripts that spawned ranks run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
