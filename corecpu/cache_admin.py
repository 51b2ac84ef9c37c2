"""`corecpu cache`: what corecpu keeps under its cache directory, by kind, with sizes and ages, and pruning.

    corecpu cache                                   # each kind: entries, size, newest use
    corecpu cache list --entries                    # every entry, and which are in use
    corecpu cache prune --older-than 30d --dry-run  # what would go, and how much that frees
    corecpu cache prune --kind ipex                 # the IPEX test tier's environment, whatever its age

The directory is corecpu.envvars.cache_dir() ($CORECPU_CACHE_DIR, else ~/.cache/corecpu). Everything
in it is rebuilt on demand, at a cost: KINDS says what each entry is. An entry's age is the time since
its newest use: the latest access or change of any file in it (access times where the file system
records them; on a noatime mount only changes count). Pruning never removes an entry in use: one a
process on this host has open, mapped or as its working directory (/proc), a built-in model whose
build lock is held, a shared-memory op that torch is building (a recent lock file; an old one with
nothing open is a killed build's, which blocks every later build until the entry goes), or a file a
live process is still writing (corecpu.atomic's temporary names). Each removal renames the entry aside
first, so nothing half-deleted keeps the entry's name. Torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from corecpu import atomic, envvars
from corecpu.errors import CoreCPUError


@dataclass(frozen=True)
class Kind:
    name: str
    what: str  # what it is and what pruning it costs
    patterns: tuple[str, ...]  # globs under the cache root


KINDS = (
    Kind("tokenized", "tokenized training and eval data (tokenized again by the next run)", ("tokenized/*",)),
    Kind("models", "built-in causal LMs, llama-tiny/llama-135m (rebuilt at first use)", ("models/*",)),
    Kind("ccl", "oneCCL bindings wheels and libccl (corecpu build-ccl builds or downloads them again)", ("ccl/*",)),
    Kind("shm", "DeepSpeed's shared-memory all-reduce op (rebuilt in about a minute)", ("shm/*",)),
    Kind("ipex", "the IPEX test tier's environment and its torch wheel (tests/ipex_env.sh, ~5 GB download)",
         ("ipex-*", "wheels/*")),
    Kind("measurements", "precision, matmul and all-reduce timings, CPU flags per boot (measured again), "
         "samples/s per rank count (recorded again by the next runs), auto's parsed command lines",
         ("precision.json", "matmul.json", "allreduce.json", "cpuid-*.json", "rank_history.json",
          "auto_parsed.json")),
)
OTHER = Kind("other", "not written by corecpu (pruned only with --kind other)", ())
KIND_NAMES = tuple(k.name for k in KINDS) + (OTHER.name,)
PRUNING = ".pruning-"  # .NAME.pruning-PID: an entry being deleted (a killed prune leaves it; the next one finishes it)
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
STALE_LOCK_S = 1800.0  # a shared-memory op build takes a minute or two; its lock older than this was left by a kill


@dataclass(frozen=True)
class Entry:
    path: Path
    kind: str
    bytes: int  # disk use (blocks), each inode once
    last_use: float  # newest access or change time of its files
    busy: str | None  # why it must not be removed now, or None


# ---------------------------------------------------------------- what is in use


def open_paths(proc: Path = Path("/proc")) -> dict[str, int]:
    """{path: pid} of every file a process on this host has open, mapped, as its cwd or executable (those
    /proc lets this user read)."""
    found: dict[str, int] = {}
    for pid_dir in proc.iterdir() if proc.is_dir() else []:
        if not pid_dir.name.isdigit():
            continue
        pid = int(pid_dir.name)
        links = [pid_dir / "cwd", pid_dir / "exe"]
        with contextlib.suppress(OSError):
            links += list((pid_dir / "fd").iterdir())
        for link in links:
            with contextlib.suppress(OSError):
                found.setdefault(os.readlink(link), pid)
        with contextlib.suppress(OSError):
            for line in (pid_dir / "maps").read_text().splitlines():
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    found.setdefault(parts[5], pid)
    return found


def lock_held(lock: Path) -> bool:
    """Whether another process holds an flock on `lock` (corecpu.training.builtin_models builds under one)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases ours, if we got it
    return False


def why_busy(path: Path, opened: Mapping[str, int], host: str) -> str | None:
    """Why entry `path` is in use, or None. `opened`: open_paths() with the cache root resolved."""
    temp = atomic.parse_temp_name(path.name)
    if temp and temp[2] == host and atomic.pid_alive(temp[3]):
        return f"being written by process {temp[3]}"
    if PRUNING in path.name:
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and atomic.pid_alive(int(pid)):
            return f"being removed by process {pid}"
    if lock_held(path.with_name(f".{path.name}.lock")):
        return "its build lock is held (a build is running)"
    real = str(path.resolve())
    for name, pid in opened.items():
        if name == real or name.startswith(real + "/"):
            return f"open in process {pid}"  # a build's compiler and ninja run in the build directory
    if path.parent.name == "shm":
        # torch's cpp_extension (FileBaton) builds under a lock file that a killed build leaves behind, and every
        # later build then waits for it forever: a lock older than any build, with nothing open, is such a leftover.
        locks = [f for f in _files(path) if f.name == "lock"]
        if any(time.time() - f.lstat().st_mtime < STALE_LOCK_S for f in locks):
            return "a build is running (torch's lock file is new)"
    return None


# ---------------------------------------------------------------- listing


def _files(path: Path) -> Iterator[Path]:
    if not path.is_dir() or path.is_symlink():
        yield path
        return
    for top, _, names in os.walk(path):
        for name in names:
            yield Path(top) / name


def measure(path: Path) -> tuple[int, float]:
    """(disk bytes, newest use) of an entry. Only files' times: walking a directory updates its own atime."""
    size, newest, seen = 0, 0.0, set()
    for f in _files(path):
        try:
            st = f.lstat()
        except OSError:
            continue
        newest = max(newest, st.st_atime, st.st_mtime)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            size += st.st_blocks * 512
    if newest == 0.0:  # an empty directory
        with contextlib.suppress(OSError):
            newest = path.lstat().st_mtime
    return size, newest


def kind_of(root: Path, path: Path) -> str:
    rel = path.relative_to(root)
    for kind in KINDS:
        if any(rel.match(p) and len(rel.parts) == len(Path(p).parts) for p in kind.patterns):
            return kind.name
    return OTHER.name


def scan(root: Path, *, opened: Mapping[str, int] | None = None) -> list[Entry]:
    """Every entry of the cache: the items of each kind's directories, the top-level files; lock files aside."""
    if not root.is_dir():
        return []
    opened = open_paths() if opened is None else opened
    host, entries = socket.gethostname(), []
    candidates: list[Path] = []
    for item in sorted(root.iterdir()):
        nested = item.is_dir() and not item.is_symlink() and any(
            Path(p).parts[0] == item.name and len(Path(p).parts) == 2 for k in KINDS for p in k.patterns)
        candidates += sorted(item.iterdir()) if nested else [item]
    for path in candidates:
        if path.name.startswith(".") and path.name.endswith(".lock"):
            continue  # a build lock: empty, and how a build and a prune find each other
        size, last = measure(path)
        entries.append(Entry(path, kind_of(root, path), size, last, why_busy(path, opened, host)))
    return entries


# ---------------------------------------------------------------- pruning


def parse_age(text: str) -> float:
    """'30d', '12h', '90m', '2w', '45s', or a number of days; seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise CoreCPUError(f"--older-than {text!r} is not an age; use e.g. 30d, 12h, 2w (s, m, h, d, w; no unit: days)")
    return float(m.group(1)) * UNITS[m.group(2) or "d"]


def select(entries: Sequence[Entry], *, older_than: float | None, kinds: Sequence[str], now: float) -> list[Entry]:
    """The entries a prune removes: of `kinds` (none given: every corecpu kind, not `other`), unused for longer
    than `older_than` seconds (None: any age). Half-removed leftovers of a killed prune always go."""
    wanted = set(kinds) or {k.name for k in KINDS}
    return [e for e in entries if PRUNING in e.path.name
            or (e.kind in wanted and (older_than is None or now - e.last_use > older_than))]


@contextlib.contextmanager
def _holding(lock: Path) -> Iterator[bool]:
    """The entry's build lock, if it has one, held while it is removed: a build waits rather than racing."""
    if not lock.exists():
        yield True
        return
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


def remove(entry: Entry) -> str | None:
    """Remove one entry (renamed aside, then deleted); why it was kept, or None."""
    path = entry.path
    with _holding(path.with_name(f".{path.name}.lock")) as ours:
        if not ours:
            return "its build lock is held (a build is running)"
        doomed = path if PRUNING in path.name else path.with_name(f".{path.name}{PRUNING}{os.getpid()}")
        try:
            if doomed != path:
                os.replace(path, doomed)
            if doomed.is_dir() and not doomed.is_symlink():
                shutil.rmtree(doomed)
            else:
                doomed.unlink()
        except OSError as exc:
            return f"cannot remove it ({exc.strerror or exc})"
    return None


def prune(entries: Sequence[Entry], chosen: Sequence[Entry], *, dry_run: bool,
          say: Callable[[str], None] = print) -> int:
    """Remove `chosen` (not those in use), one line each and a total; the bytes freed (or that would be)."""
    freed = removed = 0
    for e in chosen:
        why = e.busy or (None if dry_run else remove(e))
        if why:
            say(f"kept {e.path} ({_size(e.bytes)}): {why}")
            continue
        freed, removed = freed + e.bytes, removed + 1
        say(f"{'would remove' if dry_run else 'removed'} {e.path} ({e.kind}, {_size(e.bytes)}, "
            f"last used {_ago(time.time() - e.last_use)})")
    kept = len(entries) - removed
    say(f"{'would free' if dry_run else 'freed'} {_size(freed)} ({removed} entr{'y' if removed == 1 else 'ies'}); "
        f"{kept} kept")
    return freed


# ---------------------------------------------------------------- the command


def summary_lines(root: Path, entries: Sequence[Entry], now: float, each: bool) -> list[str]:
    lines = [f"corecpu cache: {root} (set {envvars.CACHE_DIR} to move it)",
             f"{'kind':<13}{'entries':>8}{'size':>11}  {'newest use':<12}{'in use':>7}  what"]
    for kind in KINDS + (OTHER,):
        mine = [e for e in entries if e.kind == kind.name]
        if not mine and kind is OTHER:
            continue
        newest = _ago(now - max(e.last_use for e in mine)) if mine else "-"
        busy = sum(e.busy is not None for e in mine)
        lines.append(f"{kind.name:<13}{len(mine):>8}{_size(sum(e.bytes for e in mine)):>11}  {newest:<12}{busy:>7}  "
                     f"{kind.what}")
        for e in mine if each else []:
            lines.append(f"    {e.path.relative_to(root)}  {_size(e.bytes)}  {_ago(now - e.last_use)}"
                         + (f"  (in use: {e.busy})" if e.busy else ""))
    lines.append(f"{'total':<13}{len(entries):>8}{_size(sum(e.bytes for e in entries)):>11}")
    return lines


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list what corecpu caches (sizes, ages) and prune it by age or kind",
                       description=__doc__.split("\n\n")[0] + f" Kinds: {', '.join(KIND_NAMES)}.")
    p.set_defaults(func=cmd_cache, action="list", json=False, entries=False)
    actions = p.add_subparsers(dest="action", metavar="list|prune")
    ls = actions.add_parser("list", help="each kind's entries, size and newest use (the default)")
    ls.add_argument("--entries", action="store_true", help="also list every entry and whether it is in use")
    ls.add_argument("--json", action="store_true", help="every entry as JSON")
    pr = actions.add_parser("prune", help="remove entries by age and kind; never one in use")
    pr.add_argument("--older-than", metavar="AGE", help="unused for longer than AGE: 30d, 12h, 2w (no unit: days)")
    pr.add_argument("--kind", action="append", default=[], choices=KIND_NAMES,
                    help="only this kind (repeatable; default: every kind but other)")
    pr.add_argument("--dry-run", action="store_true", help="say what would be removed and freed, remove nothing")


def cmd_cache(args: argparse.Namespace) -> int:
    root, now = envvars.cache_dir(), time.time()
    if args.action == "prune" and args.older_than is None and not args.kind:
        raise CoreCPUError("corecpu cache prune needs --older-than AGE and/or --kind KIND (e.g. --older-than 30d); "
                           "add --dry-run to see first")
    entries = scan(root)
    if args.action == "prune":
        age = parse_age(args.older_than) if args.older_than is not None else None
        prune(entries, select(entries, older_than=age, kinds=args.kind, now=now), dry_run=args.dry_run)
    elif args.json:
        print(json.dumps({"root": str(root), "entries": [
            {"path": str(e.path), "kind": e.kind, "bytes": e.bytes, "last_use": e.last_use, "in_use": e.busy}
            for e in entries]}, indent=2))
    else:
        print("\n".join(summary_lines(root, entries, now, args.entries)))
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0)
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.0f} {unit} ago"
    return "just now"
