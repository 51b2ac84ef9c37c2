"""A run's atomic writes, as the chaos test of them (tests/chaos/test_atomic_writes.py) performs them,
and the kill it injects inside one (kill_inside: in a forked child, so nothing is imported again).

write(WRITE, OUT, TAG) makes the write a run makes, of content TAG ("old" or "new"): config.json and
summary.json through Reporter._write, "metrics" the resume rewrite of metrics.jsonl (new: keeping
steps 1-5 of the old 8),
"stopped" Checkpoints.mark_stopped, "final" export_final with a model whose save_pretrained writes
FINAL_FILES. arm(WHEN, OUT) makes this process SIGKILL itself: "mid" (half of a file being written
under OUT), "rename" (before a rename or swap), "after" (after the new copy is in place, before the
old one is deleted) or "aside" (no directory swap on this system: after the old directory is renamed
aside, before the new one goes in).
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import json
import signal
from pathlib import Path
from types import SimpleNamespace

from corecpu import atomic
from corecpu.reporting.metrics_log import MetricsLog
from corecpu.reporting.reporter import Reporter, export_final
from corecpu.training.checkpointer import Checkpoints

FINAL_FILES = ("config.json", "model.safetensors")
STOPPED_AT = {"old": 4, "new": 8}


class FakeModel:
    """save_pretrained's shape: a few files in a directory, the tag repeated so that half of one is visible."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def save_pretrained(self, directory: Path, safe_serialization: bool = True) -> None:
        for name in FINAL_FILES:
            with open(Path(directory) / name, "w") as f:
                f.write(self.tag * 20_000)


def write(what: str, out: Path, tag: str) -> None:
    if what in ("config.json", "summary.json"):
        Reporter._write(SimpleNamespace(out=out), what, {"tag": tag, "pad": tag * 20_000})
    elif what == "metrics" and tag == "old":  # the history of an interrupted run, 8 steps
        lines = [json.dumps({"step": s, "pad": "x" * 5000}) + "\n" for s in range(1, 9)]
        (out / "metrics.jsonl").write_text("".join(lines))
    elif what == "metrics":
        MetricsLog(out / "metrics.jsonl", resume_step=5).close()  # the resume from step 5 keeps steps 1-5
    elif what == "stopped":
        Checkpoints(out).mark_stopped("SIGTERM", STOPPED_AT[tag], None)
    elif what == "final":
        export_final(out / "final", FakeModel(tag), None, {})
    else:
        raise SystemExit(f"unknown write {what}")


def on_disk(what: str, out: Path) -> str:
    """"old" or "new" when the target holds one complete copy; otherwise what is wrong with it."""
    if what == "final":
        final = out / "final"
        if not final.is_dir():
            return "missing"
        names = sorted(p.name for p in final.iterdir())
        for tag in ("old", "new"):
            if names == sorted(FINAL_FILES) and all((final / n).read_text() == tag * 20_000 for n in names):
                return tag
        return f"torn ({names})"
    name = {"metrics": "metrics.jsonl", "stopped": "stopped.json"}.get(what, what)
    try:
        text = (out / name).read_text()
    except FileNotFoundError:
        return "missing"
    try:
        if what == "metrics":
            steps = [json.loads(line)["step"] for line in text.splitlines()]
            whole = steps == list(range(1, len(steps) + 1))
            return {8: "old", 5: "new"}.get(len(steps), "torn") if whole else f"torn (steps {steps})"
        record = json.loads(text)
    except ValueError:
        return f"torn ({len(text)} characters)"
    if what == "stopped":
        return {v: k for k, v in STOPPED_AT.items()}.get(record["step"], "torn")
    return record["tag"] if record["pad"] == record["tag"] * 20_000 else "torn"


def hidden(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(when: str, out: Path) -> None:
    watched = str(out)
    if when == "mid":
        real_open = io.open

        class Half:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                self.f.write(data[: max(1, len(data) // 2)])
                self.f.flush()
                die()

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

            def __getattr__(self, name):
                return getattr(self.f, name)

        def hooked(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            return Half(f) if any(c in mode for c in "wax") and os.fspath(file).startswith(watched) else f

        builtins.open = io.open = hooked
        return
    real_rename, real_replace, real_exchange, real_rmtree = os.rename, os.replace, atomic._exchange, shutil.rmtree
    moved = []

    def renaming(real):
        def hooked(src, dst, *args, **kwargs):
            if when == "rename" or (when == "aside" and moved):
                die()
            result = real(src, dst, *args, **kwargs)
            moved.append(dst)
            return result
        return hooked

    def rmtree(path, *args, **kwargs):
        if when == "after" and moved:
            die()
        return real_rmtree(path, *args, **kwargs)

    os.rename, os.replace, shutil.rmtree = renaming(real_rename), renaming(real_replace), rmtree
    atomic._exchange = (lambda a, b: False) if when == "aside" else renaming(real_exchange)


def kill_inside(when: str, what: str, out: Path) -> int:
    """Fork a child that arms `when` and makes the "new" write; its exit status (os.waitpid's)."""
    pid = os.fork()
    if pid == 0:
        try:
            arm(when, out)
            write(what, out, "new")
        finally:
            os._exit(3)  # the write completed (or failed) without meeting its kill
    return os.waitpid(pid, 0)[1]
