"""Chaos: a SIGKILL inside each of a run's atomic writes (config.json, summary.json, the metrics.jsonl rewrite
on resume, stopped.json, final/) leaves the old copy or the new one, never a torn or missing one.

A forked child makes the write through the code a run uses and kills itself at one moment in it
(helpers.atomic_writes.arm): half-way through writing a file, or just before the rename; for final/ also
after the swap (before the old copy is deleted) and, where directories cannot be swapped, between
renaming the old one aside and the new one in. At worst hidden temporaries of the dead writer are left,
and the next write removes them.
"""

from __future__ import annotations

import os
import signal

import pytest

from corecpu import atomic
from corecpu.training import outputs
from helpers.atomic_writes import hidden, kill_inside, on_disk, write

WRITES = ("config.json", "summary.json", "metrics", "stopped", "final")
SURVIVES = {"mid": "old", "rename": "old", "after": "new", "aside": "old"}


@pytest.mark.parametrize("what, when", [(w, t) for w in WRITES for t in ("mid", "rename")]
                         + [("final", "after"), ("final", "aside")])
def test_a_kill_inside_the_write_leaves_the_old_or_the_new_copy(tmp_path, what, when):
    write(what, tmp_path, "old")
    status = kill_inside(when, what, tmp_path)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"the write was not killed ({status})"
    if when == "aside":  # the one moment the target is missing: the next run opening the directory puts it back
        assert on_disk(what, tmp_path) == "missing"
        outputs.set_aside_earlier_run(tmp_path, resuming=True)
    assert on_disk(what, tmp_path) == SURVIVES[when]
    assert all(atomic.parse_temp_name(name) for name in hidden(tmp_path)), hidden(tmp_path)  # the dead writer's
    write(what, tmp_path, "new")  # the next write
    assert on_disk(what, tmp_path) == "new"
    assert hidden(tmp_path) == []
