"""User-facing errors: one line naming the problem and the fix, non-zero exit."""

from __future__ import annotations

import gc
import sys
from typing import Callable, NoReturn

EXIT_USAGE = 2


class CoreCPUError(Exception):
    """A problem the user can fix. The message is one line: what is wrong, then what to do."""


_on_die: list[Callable[[str], None]] = []


def on_die(hook: Callable[[str], None]) -> None:
    """Call `hook(message)` when this process dies of a CoreCPUError, after its line is printed (a rank tells its
    launcher: corecpu.reliability.lifeline). A hook that fails is ignored: the exit must happen."""
    _on_die.append(hook)


def die(message: str) -> NoReturn:
    print(f"corecpu: error: {message}", file=sys.stderr, flush=True)
    for hook in list(_on_die):
        try:
            hook(message)
        except Exception:  # noqa: BLE001
            pass
    raise SystemExit(EXIT_USAGE)


def run_cli(main: Callable[[], int | None]) -> NoReturn:
    """Run `main`, turning CoreCPUError into a one-line message and exit code 2."""
    try:
        code = main()
    except CoreCPUError as exc:
        die(str(exc))
    finally:
        # The interpreter's last garbage collection walks every torch/transformers object: 6 s of a 2-rank
        # tiny run's exit (0.7 s frozen), which a preempted job cannot spare. Nothing needs collecting now.
        gc.freeze()
    raise SystemExit(code or 0)
