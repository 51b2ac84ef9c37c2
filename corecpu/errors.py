"""User-facing errors: one line naming the problem and the fix, non-zero exit."""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from pathlib import Path
from typing import Callable, NoReturn

from corecpu import address_space

EXIT_USAGE = 2


class CoreCPUError(Exception):
    """A problem the user can fix. The message is one line: what is wrong, then what to do."""


def os_problem(exc: OSError, path: Path) -> str:
    """Why writing `path` failed, in words a user can act on. mkdir and open say "File exists" or "Not a
    directory" when a directory on the way is a regular file; name that file instead."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        for parent in reversed(Path(path).parents):
            if parent.exists() and not parent.is_dir():
                return f"{parent} is a file where a directory is expected; remove or rename it"
    return exc.strerror or str(exc)


def install_extra(extra: str, checkout: Path | None = None, cwd: Path | None = None) -> str:
    """How to add one of corecpu's extras (report, datasets, shm, ...). From a checkout (launch.sh beside the
    package), launch.sh installs the checkout itself into the environment it runs; pip's `corecpu[...]` would
    fetch the released package from the index instead, so it is named as the installed-from-PyPI way."""
    checkout = checkout or Path(__file__).resolve().parents[1]
    from_index = f"pip install 'corecpu[{extra}]'"
    if not (checkout / "launch.sh").is_file():
        return from_index
    here = (cwd or Path.cwd()).resolve()
    launch = "./launch.sh" if here == checkout else str(checkout / "launch.sh")
    return f"{launch} --setup-only {extra} (installed from PyPI: {from_index})"


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


def run_cli(main: Callable[[], int | None], *, fast_exit: bool = False) -> NoReturn:
    """Run `main`, turning CoreCPUError, and running out of a `ulimit -v` (corecpu.address_space), into a
    one-line message and exit code 2. With `fast_exit`, a `main` that returns ends the process without the
    interpreter's teardown (exit_without_teardown)."""
    try:
        code = main()
    except CoreCPUError as exc:
        die(str(exc))
    except (MemoryError, ImportError, OSError, RuntimeError) as exc:
        if (line := address_space.memory_failure(exc)) is None:
            raise
        die(line)
    finally:
        # The interpreter's last garbage collection walks every torch/transformers object: 6 s of a 2-rank
        # tiny run's exit (0.7 s frozen), which a preempted job cannot spare. Nothing needs collecting now.
        gc.freeze()
    if fast_exit:
        exit_without_teardown(code or 0)
    raise SystemExit(code or 0)


def exit_without_teardown(code: int) -> None:
    """End the process as the interpreter would, minus its teardown of every module and of torch's C++ state:
    0.2 s of each rank's exit here (measured), and the stage where the store's threads once aborted with
    "terminate called". atexit handlers run (logging's flush, trackers', multiprocessing's) and stdio is
    flushed. Returns, leaving the ordinary exit to follow, while a non-daemon thread runs: the interpreter
    would wait for it."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()  # what interpreter shutdown runs first (CPython; no public name for it)
    _finalize_mpi()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def _finalize_mpi() -> None:
    """MPI_Finalize where mpi4py initialised MPI: mpi4py calls it from a C exit hook (Py_AtExit), which
    os._exit skips, and Intel MPI's process manager kills the job's other ranks (exit 255, "KILLED BY SIGNAL:
    9") when a rank that initialised MPI ends without it."""
    mpi = sys.modules.get("mpi4py.MPI")
    rc = getattr(sys.modules.get("mpi4py"), "rc", None)
    if mpi is None or getattr(rc, "finalize", None) is False:  # False: the user finalises MPI themselves
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception:  # noqa: BLE001 (the exit must happen; a failing MPI says so itself)
        pass
