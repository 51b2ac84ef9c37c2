"""A neighbour on one rank's CPU while the job trains: the run measures what it took and says so at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers.launching import TINY, launch, records


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a CPU for each of two ranks")
def test_a_busy_loop_on_a_ranks_cpu_is_measured_and_named(tmp_path) -> None:
    cpu = max(os.sched_getaffinity(0))
    # The controlled load: a busy loop at normal priority, pinned to one CPU, for the whole run.
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(loop.pid, {cpu})
        out = tmp_path / "run"
        proc = launch(2, *TINY, "--max-steps", "60", "--log-every", "5", "--output-dir", str(out))
    finally:
        loop.kill()
        loop.wait()
    ranks = json.loads((out / "topology.json").read_text())["ranks"]
    loaded = [r for r, b in enumerate(ranks) if cpu in b["cpus"]]
    if len(loaded) != 1 or len(ranks[loaded[0]]["cpus"]) != 1:
        pytest.skip(f"the ranks did not get one CPU each ({[b['cpus'] for b in ranks]})")
    (rank,) = loaded
    summary = json.loads((out / "summary.json").read_text())
    taken = summary["rank_cpu_taken_after_warmup"]
    # The loop and the rank shared the CPU about half and half; other work on this machine only adds to it.
    assert taken[rank]["others"] >= 0.3, taken
    train, _ = records(out)
    told = [r for r in train if "rank_cpu_others" in r]  # a record tells once enough CPU time was counted
    assert told and all(len(r["rank_cpu_others"]) == 2 for r in told)
    # One line names the rank and what took its CPU: the straggler's, or, where the other rank was held back too
    # (under `pytest -n 2`, by the other worker), the line for every rank whose CPUs were taken.
    text = " ".join((proc.stdout + proc.stderr).split())
    assert re.search(rf"rank {rank} \(CPUs {cpu}\)[^.]*other processes", text), text[-3000:]
