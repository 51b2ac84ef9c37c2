"""Replace a file or a directory so that a reader, or a kill at any moment, finds the old one or the new
one, never a part of either. Standard library only: the bottom layer, for every module that writes.

    atomic.write_text(out / "stopped.json", text)
    atomic.write_json(out / "summary.json", summary, indent=2)
    with atomic.replacing(path) as tmp:              # any writer that takes a path: torch.save(state, tmp)
        torch.save(state, tmp)
    with atomic.replacing_dir(out / "final") as tmp: # a directory: complete before the old one goes
        model.save_pretrained(tmp)
    atomic.place_dir(built, cache / "model")          # a cache several processes build: the first complete one stays

The new copy is written beside the target under a hidden name, .NAME.tmp-HOST-PID (the same
filesystem, so the rename is atomic; host and PID so that two writers, on one node or on two
nodes sharing a filesystem, never share a temporary: a process writes one target from one thread
at a time), fsynced, renamed over the target, and the directory fsynced so that the rename
survives a power cut. An error removes the temporary.

A directory cannot be renamed over a non-empty one. On Linux (glibc >= 2.28) renameat2's
RENAME_EXCHANGE swaps the two in one step and the old copy is deleted after. Where the C library,
kernel or filesystem (NFS) lacks it, the old copy is renamed aside to .NAME.old-HOST-PID and the
new one renamed in: a kill between those two renames leaves the target missing, so the next writer
and recover_all() (called where a run opens its output directory) rename the old copy back.
Leftovers of writers that are gone (a killed process on this host) are removed by the next write.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import shutil
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

TEMP, ASIDE = "tmp", "old"  # .NAME.tmp-HOST-PID: a copy being written; .NAME.old-HOST-PID: the old one set aside


def write_bytes(path: str | Path, data: bytes) -> None:
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    write_bytes(path, text.encode(encoding))


def write_json(path: str | Path, obj: Any, **dumps: Any) -> None:
    """`obj` as JSON (json.dumps keyword arguments pass through), no trailing newline."""
    write_text(path, json.dumps(obj, **dumps))


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write a file to; renamed over `path` only if the body completes."""
    target = Path(path)
    clean(target)
    tmp = temp_path(target)
    _remove(tmp)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    _fsync(target.parent)


@contextmanager
def replacing_dir(path: str | Path) -> Iterator[Path]:
    """An empty temporary directory beside `path`; it replaces `path` (replace_dir) only if the body completes."""
    target = Path(path)
    clean(target)
    tmp = temp_path(target)
    _remove(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        replace_dir(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def replace_dir(new: str | Path, target: str | Path) -> None:
    """Put the complete directory `new` (on the target's filesystem) at `target`; any old target is deleted
    only once the new one is in place."""
    new, target = Path(new), Path(target)
    recover(target)  # an earlier swap killed half-way: the old copy goes back first, then is replaced
    _fsync_tree(new)
    if not os.path.lexists(target):
        os.rename(new, target)
        old = None
    elif _exchange(new, target):
        old = new  # the swap left the old copy under the temporary name
    else:
        old = temp_path(target, ASIDE)
        _remove(old)
        os.rename(target, old)  # a kill from here to the next rename: recover() puts `old` back
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(old, target)
            raise
    _fsync(target.parent)
    if old is not None:
        _remove(old)


def place_dir(new: str | Path, target: str | Path) -> bool:
    """Rename the complete directory `new` (on the target's filesystem) to `target` unless another writer
    already put one there: then `new` is deleted, the existing copy kept and False returned. For caches that
    several processes may build at once from the same inputs: the first complete copy wins, none is replaced
    under a reader."""
    new, target = Path(new), Path(target)
    _fsync_tree(new)
    try:
        os.rename(new, target)  # fails on a non-empty directory (ENOTEMPTY or EEXIST): never replaces one
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
            raise
        _remove(new)
        return False
    _fsync(target.parent)
    return True


def recover(target: str | Path) -> str | None:
    """If `target` is missing because a writer that is gone set the old copy aside and was killed before
    renaming the new one in, rename the old copy back. A one-line note, or None."""
    target = Path(target)
    if os.path.lexists(target):
        return None
    for aside in _leftovers(target, ASIDE):
        try:
            os.rename(aside, target)
        except OSError:
            continue  # another process recovered it first
        _fsync(target.parent)
        return f"restored {target} from {aside.name}, set aside by a write that was killed"
    return None


def recover_all(directory: str | Path) -> list[str]:
    """recover() for every entry of `directory` that a killed writer set aside; one note per entry restored."""
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    notes = []
    for name in names:
        parsed = parse_temp_name(name)
        if parsed is not None and parsed[1] == ASIDE and (note := recover(directory / parsed[0])):
            notes.append(note)
    return notes


def clean(target: str | Path) -> None:
    """Remove the temporaries of `target` whose writers are gone (restoring a set-aside copy first)."""
    target = Path(target)
    recover(target)
    for kind in (TEMP, ASIDE):
        for p in _leftovers(target, kind):
            _remove(p)


def temp_path(target: str | Path, kind: str = TEMP) -> Path:
    """The hidden sibling of `target` this process writes (TEMP) or sets the old copy aside to (ASIDE)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{kind}-{socket.gethostname()}-{os.getpid()}")


# ---------------------------------------------------------------- leftovers


def parse_temp_name(name: str) -> tuple[str, str, str, int] | None:
    """(target name, kind, host, pid) of a temporary's file name, or None for any other name."""
    if not name.startswith("."):
        return None
    for kind in (TEMP, ASIDE):
        head, sep, tail = name[1:].rpartition(f".{kind}-")
        host, dash, pid = tail.rpartition("-")
        if sep and head and host and dash and pid.isdigit():
            return head, kind, host, int(pid)
    return None


def _leftovers(target: Path, kind: str) -> list[Path]:
    """`target`'s temporaries of `kind` left by a writer on this host that is no longer running. A writer
    on another host cannot be checked from here: its temporary stays (hidden, and ignored)."""
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    host, found = socket.gethostname(), []
    for name in names:
        parsed = parse_temp_name(name)
        if parsed and parsed[:3] == (target.name, kind, host) and parsed[3] != os.getpid() and not pid_alive(parsed[3]):
            found.append(target.parent / name)
    return found


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- system calls


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries (a rename), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for here, _, files in os.walk(root, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(here, name)):
                _fsync(Path(here, name))
        _fsync(Path(here))


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# The kernel (before 3.15), the C library or the filesystem (NFS, some FUSE) cannot exchange.
_CANNOT_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


@functools.cache
def _renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap the entries `a` and `b` in one step; False where this system cannot (the caller falls back)."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _CANNOT_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


__all__ = ["write_bytes", "write_text", "write_json", "replacing", "replacing_dir", "replace_dir", "place_dir", "recover",
           "recover_all", "clean", "temp_path",
           "parse_temp_name"]
