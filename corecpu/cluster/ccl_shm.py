"""oneCCL's shared-memory regions in /dev/shm, and who removes them (torch-free: the launcher and the rank
supervisor use it too).

oneCCL's libfabric shm provider makes one 64 MB region per process, named `<pid>:<n>:<m>`, and never unlinks
it, even when a job ends normally: every rank of every ccl job left one behind (445 files, 11 GB of RAM, on a
development machine). Three owners, from the closest to the furthest:

- the rank itself, once its process group is destroyed (process_group.teardown);
- its supervisor (corecpu.bind, under `corecpu launch`'s mpirun), when the rank was killed or crashed;
- `corecpu launch`, for its ranks when the job ends, and at start for regions of processes that no longer
  exist (a job killed outright: SIGKILL of the whole process group leaves nobody to clean up).

Once the group is gone no collective needs the name, and a mapping outlives its name.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable

from corecpu.atomic import pid_alive

SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"(\d+):\d+:\d+")
# A region of a process this host cannot see (another PID namespace sharing /dev/shm, as containers started
# with --ipc=host do) would look orphaned; one that old has long been mapped by every peer that needs it.
STALE_AFTER_S = 600.0


def remove_regions(pid: int | None = None, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove `pid`'s (default: this process's) oneCCL regions that this user owns. The names removed."""
    pid = os.getpid() if pid is None else pid
    removed = []
    for path in shm_dir.glob(f"{pid}:*"):
        if _NAME.fullmatch(path.name) and _unlink_own_file(path):
            removed.append(path.name)
    return removed


def remove_stale_regions(shm_dir: Path = SHM_DIR, now: float | None = None,
                         alive: Callable[[int], bool] | None = None,
                         mapped: Callable[[], set[str]] | None = None,
                         stale_after_s: float = STALE_AFTER_S) -> list[str]:
    """Remove the oneCCL regions this user owns whose process is gone, no process maps, and that are older
    than `stale_after_s`. The names removed."""
    now = time.time() if now is None else now
    alive = alive or pid_alive
    candidates = []
    for path in _regions(shm_dir):
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid == os.getuid() and now - st.st_mtime > stale_after_s and not alive(int(_pid_of(path))):
            candidates.append(path)
    if not candidates:
        return []
    in_use = (mapped or mapped_shm_names)()
    return [p.name for p in candidates if p.name not in in_use and _unlink_own_file(p)]


def wait_gone(pids: list[int], timeout_s: float, alive: Callable[[int], bool] | None = None,
              poll_s: float = 0.02) -> list[int]:
    """Wait up to `timeout_s` for `pids` to end; the ones that did. A rank killed with its supervisor
    (PDEATHSIG) is still tearing down its memory when the launcher's own wait returns; a zombie counts as
    ended (its region can no longer be in use by it)."""
    alive = alive or _running
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(poll_s)
        left = [p for p in left if alive(p)]
    return [p for p in pids if p not in left]


def _running(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # another user's, or no /proc: trust kill(0)
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def mapped_shm_names(proc: Path = Path("/proc")) -> set[str]:
    """The /dev/shm names some visible process has mapped (from /proc/*/maps)."""
    names: set[str] = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            at = line.find("/dev/shm/")
            if at >= 0:
                names.add(line[at + 9:].removesuffix(" (deleted)"))
    return names


def _regions(shm_dir: Path) -> list[Path]:
    try:
        return [p for p in shm_dir.iterdir() if _NAME.fullmatch(p.name)]
    except OSError:
        return []


def _pid_of(path: Path) -> str:
    return path.name.split(":", 1)[0]


def _unlink_own_file(path: Path) -> bool:
    try:
        if path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid():
            path.unlink()
            return True
    except OSError:
        pass
    return False
