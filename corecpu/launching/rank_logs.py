"""`--log-dir DIR`: each rank's stdout and stderr in its own file, DIR/rank-N.log, with torchrun's
`--redirects`/`--tee` (which streams of which local rank go to the file only, or to the file and the
console) and `--local-ranks-filter` (whose output the console shows); and, when the job fails, the
last lines of the ranks that failed in the launcher's error summary.

corecpu.bind points the rank's file descriptors 1 and 2 at their targets just before it execs
the rank, so everything the rank writes lands there (Python, C++ and MPI alike). A stream that goes
to the file only is the file itself; one teed goes through a pipe to a small copier process, which
passes the bytes to the console as they come and writes the file a line at a time without terminal
escape codes. The launcher only reads the files afterwards.
"""

from __future__ import annotations

import os
import re
import select
import signal
from pathlib import Path
from typing import Mapping

from corecpu.errors import CoreCPUError

OUT, ERR = 1, 2  # torchrun's Std bits: 1 stdout, 2 stderr, 3 both
# --log-dir without --redirects or --tee: every rank's streams in its file, local rank 0's on the console too.
DEFAULT_REDIRECTS, DEFAULT_TEE = "3", "0:3"
_ESCAPE = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def parse_std_spec(text: str, flag: str = "--redirects") -> dict[int, int] | int:
    """torchrun's spec: "3" (every local rank) or "0:3,1:2" (per local rank) -> 3 or {0: 3, 1: 2}."""
    bad = CoreCPUError(f"{flag} {text!r}: use 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for every local rank "
                       f"or per local rank as 0:3,1:2")
    text = text.replace(" ", "")
    if text.isdigit():
        if int(text) > 3:
            raise bad
        return int(text)
    out: dict[int, int] = {}
    for part in text.split(","):
        rank, _, std = part.partition(":")
        if not (rank.isdigit() and std.isdigit() and int(std) <= 3):
            raise bad
        out[int(rank)] = int(std)
    return out


def parse_ranks(text: str, flag: str = "--local-ranks-filter") -> set[int]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise CoreCPUError(f"{flag} {text!r}: give local ranks separated by commas, e.g. 0 or 0,1")
    return {int(p) for p in parts}


def _bits(spec: str | None, local_rank: int) -> int:
    if not spec:
        return 0
    parsed = parse_std_spec(spec)
    return parsed if isinstance(parsed, int) else parsed.get(local_rank, 0)


def stream_targets(local_rank: int, log_dir: str | None, redirects: str | None, tee: str | None,
                   ranks_filter: str | None) -> dict[int, tuple[bool, bool]]:
    """Pure: for fd 1 and 2, (to the rank's file, to the console), as torchrun decides it: a stream redirected
    goes to the file only, one teed to both, the others to the console; the filter hides other local ranks
    from the console, not from their files."""
    if log_dir and redirects is None and tee is None:
        redirects, tee = DEFAULT_REDIRECTS, DEFAULT_TEE
    red, teed = (_bits(redirects, local_rank), _bits(tee, local_rank)) if log_dir else (0, 0)
    shown = ranks_filter is None or local_rank in parse_ranks(ranks_filter)
    return {fd: (bool((red | teed) & bit), shown and (bool(teed & bit) or not red & bit))
            for fd, bit in ((1, OUT), (2, ERR))}


def file_line(line: bytes) -> bytes:
    """Pure: a line as a log file should hold it: no escape codes, and of a line redrawn with carriage
    returns (a progress bar), only what a terminal would show last."""
    line = _ESCAPE.sub(b"", line)
    end = b"\n" if line.endswith(b"\n") else b""
    body = line[:-1] if end else line
    if b"\r" in body:
        body = next((seg for seg in reversed(body.split(b"\r")) if seg), b"")
    return body + end


def route(targets: Mapping[int, tuple[bool, bool]], path: Path) -> None:
    """Point fds 1 and 2 at their targets; teed ones through a copier process (forked here, it outlives the
    exec of the rank and ends when the rank's last copy of the pipe closes)."""
    file_fd = -1
    if any(to_file for to_file, _ in targets.values()):
        path.parent.mkdir(parents=True, exist_ok=True)
        file_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pipes: dict[int, tuple[int, int]] = {}  # fd -> (read end, the console it had)
    for fd, (to_file, to_console) in targets.items():
        if to_file and to_console:
            r, w = os.pipe()
            pipes[fd] = (r, os.dup(fd))
            os.dup2(w, fd)
            os.close(w)
        elif to_file:
            os.dup2(file_fd, fd)
        elif not to_console:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
    if pipes and os.fork() == 0:
        try:
            for fd in targets:
                os.close(fd)  # the copier must not hold the pipes' write ends open
            _copy(pipes, file_fd)
        finally:
            os._exit(0)
    for r, console in pipes.values():
        os.close(r)
        os.close(console)
    if file_fd >= 0:
        os.close(file_fd)


def _copy(pipes: dict[int, tuple[int, int]], file_fd: int) -> None:
    # A stop signal to the job reaches the process group: keep copying until the rank's last lines are out.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    consoles = {r: console for r, console in pipes.values()}
    partial = {r: b"" for r in consoles}
    while consoles:
        ready, _, _ = select.select(list(consoles), [], [])
        for r in ready:
            data = os.read(r, 65536)
            if not data:
                if partial[r]:
                    os.write(file_fd, file_line(partial[r] + b"\n"))
                del consoles[r]
                continue
            try:
                os.write(consoles[r], data)
            except OSError:  # the console went away: the file still gets everything
                pass
            *lines, partial[r] = (partial[r] + data).split(b"\n")
            if lines:
                os.write(file_fd, b"".join(file_line(line + b"\n") for line in lines))

# Lines that mark a rank as the one that failed (its own error, or Python's traceback). A rank
# killed because another failed usually ends without one, so these point at the cause.
FAILURE_MARKS = ("Traceback (most recent call last)", "corecpu: error:", "Error", "error:")


def log_path(log_dir: str | Path, rank: int) -> Path:
    return Path(log_dir) / f"rank-{rank}.log"


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
