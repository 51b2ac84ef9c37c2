"""Where rank 0's lines go: a rich console, and a progress bar only where a person watches."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from corecpu import envvars


def on_terminal() -> bool:
    # Under mpirun rank 0 writes into a pipe; launch.sh says whether that pipe ends at a terminal.
    return sys.stdout.isatty() or os.environ.get(envvars.TTY) == "1"


def make_console() -> Console:
    return Console(highlight=False, soft_wrap=True, force_terminal=True if on_terminal() else None)


def make_progress(mode: str, console: Console) -> Progress | None:
    """A rich progress bar, or None where it would only clutter a log file."""
    if mode == "off" or (mode == "auto" and not on_terminal()):
        return None
    return Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    )
