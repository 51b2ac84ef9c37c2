"""The run's phase split in summary.json: pure arithmetic over what the run measured."""

from __future__ import annotations

import os

from corecpu.reporting.reporter import phase_split, seconds_since_launch


def test_steps_are_the_loop_without_its_evaluations_and_checkpoint_writes() -> None:
    split = phase_split(12.5, 100.0, {"eval": 8.0, "checkpoint": 2.5}, 1.25)
    assert split == {"start_up_s": 12.5, "steps_s": 89.5, "eval_s": 8.0, "checkpoint_s": 2.5, "final_save_s": 1.25}
    assert phase_split(None, 10.0, {}, 0.5)["steps_s"] == 10.0


def test_seconds_since_launch_counts_from_the_launchers_start() -> None:
    mine = seconds_since_launch({})
    parent = seconds_since_launch({"CORECPU_LAUNCHER_PID": str(os.getppid())})
    assert mine is not None and parent is not None and 0 <= mine <= parent
