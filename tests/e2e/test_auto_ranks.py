"""`./launch.sh auto` end to end: the first run measures each candidate rank count with a short trial of the
same job, launches the fastest with the global batch held, and records why; the next run reads it back."""

from __future__ import annotations

import json
import statistics

from corecpu.cpu.topology import read_topology
from corecpu.launching import auto_ranks
from corecpu.launching.launch import usable_cores
from corecpu.reporting import rank_history
from helpers.launching import TINY, launch


def test_auto_measures_once_launches_the_fastest_and_reads_it_back(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "cache"))  # this job has no history yet
    # The load state at start is part of the history's key, and under `pytest -n 2` the other worker makes it
    # differ from launch to launch (then a re-measure is right). Hold it equal, as on a node of one's own:
    # with the binding already decided the launcher takes no load sample, and every run counts as idle.
    monkeypatch.setenv("CORECPU_BINDING", "core")
    monkeypatch.setenv("CORECPU_BINDING_REASON", "the test holds the start-up conditions equal")
    monkeypatch.delenv("CORECPU_CPUS_BUSY", raising=False)
    # Likewise during the runs: the other worker takes the ranks' CPUs at times, and a run whose CPUs were taken goes
    # to the busy starts' records. The test reads the idle ones.
    monkeypatch.setenv("CORECPU_WATCH_CPUS", "0")
    args = [*TINY, "--data", "builtin", "--max-steps", "25"]
    expected = auto_ranks.candidates(usable_cores(read_topology(allowed_from_cpuset=True)), 32, 1)
    first = launch("auto", *args, "--output-dir", str(tmp_path / "a"))
    assert f"auto: measuring {', '.join(map(str, expected))} rank(s) per node" in first.stderr, first.stderr
    history = json.loads((tmp_path / "cache" / rank_history.CACHE_FILE).read_text())["entries"]
    (entry,) = history.values()
    medians = {int(n): statistics.median(r["samples_per_s"] for r in runs) for n, runs in entry.items()}
    assert set(medians) == set(expected)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    chosen = config["resolved"]["world_size"]
    # The job's own run (25 steps) joined the history after the choice was made: choose from the trials alone.
    trial_rates = {int(n): runs[0]["samples_per_s"] for n, runs in entry.items()}
    assert chosen == auto_ranks.pick(trial_rates)
    assert config["batch_size"] * chosen == 32  # the global batch held
    assert config["decisions"]["ranks"].startswith(f"{chosen} per node (auto: {chosen} rank(s) per node, "
                                                   f"--batch-size {32 // chosen} (global batch 32)")
    second = launch("auto", *args, "--output-dir", str(tmp_path / "b"))
    assert "auto: measuring" not in second.stderr
    assert "(earlier runs of this job on this machine)" in second.stderr, second.stderr
    again = json.loads((tmp_path / "b" / "config.json").read_text())["resolved"]["world_size"]
    assert again == auto_ranks.pick(medians)
