"""What each rank tells `corecpu launch` about itself, through a directory only they share.

`corecpu launch` makes a fresh directory per job and exports it as CORECPU_JOB_DIR; on its host each
rank leaves small one-line files there, `rank-N.KIND`:

- pid:   "PID HOST", written by corecpu.bind for the rank it starts (so the launcher can reach it);
- up:    written once the rank's process group exists (start-up is over);
- error: "STEP|CODE|TEXT", written as the rank starts to exit with an error: an exception nothing caught (TEXT:
         its last line) or a CoreCPUError (TEXT empty: the rank printed its line); STEP empty when unknown.
         Written before the exit, because a rank that has initialised MPI cannot exit (MPI_Finalize waits
         for every rank) until the others do;
- lost:  the same, for a collective that failed because another rank had ended (a consequence, not a cause);
- ended: "exit C" or "signal N", written by corecpu.bind's supervisor when the rank ends badly.

The launcher polls the directory, names the first rank that ended badly and ends the whole job at
once: before this, a rank that died during start-up left the others waiting for their whole timeout.
Ranks on other hosts (whose CORECPU_JOB_DIR does not exist there) and ranks started without
`corecpu launch` write nothing. Every write is best effort: it never fails a rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from corecpu.envvars import JOB_DIR

KINDS = ("pid", "up", "error", "lost", "ended")


def note(env: Mapping[str, str], rank: int, kind: str, text: str = "") -> bool:
    """Leave `text` as DIR/rank-RANK.KIND (atomically: a reader never sees half a line). False when not written."""
    directory = env.get(JOB_DIR, "")
    if not directory or not os.path.isdir(directory):
        return False
    path = Path(directory) / f"rank-{rank}.{kind}"
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


@dataclass
class RankRecord:
    """What one rank left in the job directory (None / "" for what it did not write)."""

    rank: int
    pid: int | None = None
    host: str = ""
    up: bool = False
    error: str = ""  # the uncaught exception's last line
    code: int | None = None  # the exit code its error record announces
    step: int | None = None  # the step it was in, when known
    lost: bool = False  # its collective failed because another rank had ended
    ended: str = ""  # "exit C" or "signal N"


def read(directory: str | Path) -> dict[int, RankRecord]:
    """Every rank's records in `directory`, by rank."""
    out: dict[int, RankRecord] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        stem, _, kind = name.partition(".")
        if not stem.startswith("rank-") or not stem[5:].isdigit() or kind not in KINDS:
            continue
        try:
            text = (Path(directory) / name).read_text().strip()
        except OSError:
            continue
        rec = out.setdefault(int(stem[5:]), RankRecord(int(stem[5:])))
        if kind == "pid":
            pid, _, rec.host = text.partition(" ")
            rec.pid = int(pid) if pid.isdigit() else None
        elif kind == "up":
            rec.up = True
        elif kind in ("error", "lost"):
            step, _, rest = text.partition("|")
            code, _, rec.error = rest.partition("|")
            rec.step = int(step) if step.isdigit() else None
            rec.code = int(code) if code.isdigit() else 1
            rec.lost = kind == "lost"
        else:
            rec.ended = text
    return out


def error_record(step: int | None, code: int, text: str = "") -> str:
    """Pure: the text of an "error" (or "lost") record."""
    return f"{'' if step is None else step}|{code}|{text}"


def failed(rec: RankRecord) -> bool:
    """Pure: whether this rank's records say it failed (is exiting with an error, or ended badly)."""
    return rec.code is not None or (bool(rec.ended) and ended_badly(rec.ended))


def ended_badly(status: str) -> bool:
    """Pure: whether an "ended" record is a failure that must end the job. 0 is done, 75 stopped on request
    (the others are stopping too) and 124 the watchdog's (it ends the job itself, after naming the hung rank)."""
    kind, _, value = status.partition(" ")
    return kind == "signal" or (kind == "exit" and value not in ("0", "75", "124"))


def exit_code(status: str) -> int:
    """Pure: the exit code a shell would show for an "ended" record (128+N for a signal)."""
    kind, _, value = status.partition(" ")
    code = int(value) if value.isdigit() else 1
    return 128 + code if kind == "signal" else code
