"""Where rank 0's lines go: a rich console, and a progress bar only where a person watches."""

from __future__ import annotations

import sys
from typing import Mapping

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from corecpu import envvars


def on_terminal(env: Mapping[str, str]) -> bool:
    # Under mpirun rank 0 writes into a pipe; launch.sh says whether that pipe ends at a terminal.
    return sys.stdout.isatty() or env.get(envvars.TTY) == "1"


def make_console(env: Mapping[str, str]) -> Console:
    return Console(highlight=False, soft_wrap=True, force_terminal=True if on_terminal(env) else None)


def make_progress(mode: str, console: Console, env: Mapping[str, str]) -> Progress | None:
    """A rich progress bar, or None where it would only clutter a log file."""
    if mode == "off" or (mode == "auto" and not on_terminal(env)):
        return None
    return Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
    )
