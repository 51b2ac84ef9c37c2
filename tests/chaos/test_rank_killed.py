"""Chaos tier: a rank killed outright (SIGKILL, the OOM killer) during evaluation under torchrun.

Before: 69 lines on stderr in the issue (66 measured here, 4.9 s): torchrun's agent log lines, rank 0's
"SIGTERM received: ... saving a checkpoint" (it cannot: a checkpoint needs every rank) and its gloo traceback,
and torchrun's summary wrapped in the agent's own traceback. Now: one line naming the rank, then torchrun's
summary (22 lines, 0.6 s); nothing of the job is left.
"""

from __future__ import annotations

import os
import signal
import time

from helpers.chaoslib import TINY, long_eval_set, rank_pids, start, survivors, wait_for_step

# torchrun's summary: borders, title, sections, and 7 lines for each of the two ranks (the killed one as the root
# cause, the other one killed by the agent right after, which torchrun lists "for bookkeeping").
SUMMARY_LINES = 21


def test_rank_killed_during_evaluation_under_torchrun_is_one_line_then_the_summary(tmp_path):
    big = long_eval_set(tmp_path / "eval.tsv")
    job = start(tmp_path, 2, *TINY[:-2], "--eval-data", str(big), "--max-steps", "3", "--log-every", "1",
                "--launcher", "torchrun", stderr_apart=True)
    wait_for_step(job, 3)  # the last step is logged, then evaluation starts on every rank
    time.sleep(1.0)
    victim = rank_pids(job.marker)[1]
    os.kill(victim, signal.SIGKILL)
    rc, waited = job.wait(timeout=90)
    assert job.err is not None
    err = job.err.read_text(errors="replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1, err  # torchrun's code for a failed rank (README: exit codes)
    named = [line for line in lines if line.startswith("corecpu: error:")]
    assert named == [f"corecpu: error: rank 1 (pid {victim}) on {os.uname().nodename} was killed by SIGKILL; "
                     "torchrun ended the job"], err
    after = lines[lines.index(named[0]) + 1:]  # then torchrun's summary, which names the rank too
    assert after[0].startswith("=====") and after[1].endswith("FAILED") and "rank      : 1 (local_rank: 1)" in err, err
    assert "Traceback" not in err and "SIGTERM" not in err, err  # the others are not asked to save: they cannot
    assert len(lines) <= 1 + SUMMARY_LINES, f"{len(lines)} lines on stderr:\n{err}"
    assert waited < 60
    assert survivors(job.marker, within=10) == {}
