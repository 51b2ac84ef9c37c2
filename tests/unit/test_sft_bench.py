"""benchmarks/sft_throughput.py's planning: the same job for every variant, and ratios that say corecpu's side."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import sft_throughput as bench


def _args(**kw) -> argparse.Namespace:
    base = dict(model="llama-135m", steps=16, max_seq_len=128)
    return argparse.Namespace(**{**base, **kw})


def _value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_every_variant_runs_the_same_job():
    a, p = _args(), Path("/x")
    cmds = {v: bench.command(v, "lora", a, p, p / "t.jsonl", p / "e.jsonl", p / "o", 23, "fp32")[0]
            for v in bench.VARIANTS}
    for flag in ("--max-steps", "--lr", "--weight-decay", "--seed", "--lora-r", "--lora-alpha", "--lora-dropout",
                 "--max-seq-len"):
        assert len({_value(c, flag) for c in cmds.values()}) == 1, flag
    assert _value(cmds["corecpu"], "--batch-size") == _value(cmds["trl_tuned"], "--batch-size") == "4"
    assert _value(cmds["trl_defaults"], "--batch-size") == "23"  # examples, about 4 packed rows' worth
    assert _value(cmds["trl_defaults"], "--form") == "defaults" and _value(cmds["trl_tuned"], "--form") == "tuned"
    full = bench.command("corecpu", "full", a, p, p, p, p, 23, "fp32")[0]
    assert "--lora-r" not in full and _value(full, "--lr") == "1e-3"


def test_ratios_are_corecpus_speed_up_and_loss_ratio():
    runs = [{"mode": "full", "variant": v, "wall_s": w, "tokens_per_s": t, "eval_loss": e, "peak_rss_mb_node": 1.0}
            for v, w, t, e in (("corecpu", 10.0, 300.0, 2.0), ("corecpu", 30.0, 100.0, 2.0),
                               ("trl_tuned", 40.0, 100.0, 2.2))]
    row = bench.summarize(runs)["full"]
    assert row["corecpu"]["wall_s"] == 20.0 and row["corecpu"]["repeats"] == 2
    assert row["trl_tuned"]["corecpu_wall_speedup"] == 2.0
    assert row["trl_tuned"]["corecpu_tokens_speedup"] == 2.0
    assert abs(row["trl_tuned"]["corecpu_eval_loss_ratio"] - 2.0 / 2.2) < 1e-12


def test_a_run_stopped_at_its_time_limit_is_a_lower_bound_only():
    runs = [{"mode": "full", "variant": "corecpu", "wall_s": 50.0, "tokens_per_s": 1.0, "eval_loss": 2.0,
             "peak_rss_mb_node": 1.0},
            {"mode": "full", "variant": "trl_defaults", "timed_out": True, "wall_s_at_least": 600.0}]
    row = bench.summarize(runs)["full"]["trl_defaults"]
    assert row == {"wall_s_at_least": 600.0, "repeats": 0, "corecpu_wall_speedup_at_least": 12.0}


def test_descendants_finds_grandchildren_in_sessions_of_their_own():
    import subprocess
    import sys
    import time
    # parent -> child (an agent, like torchrun) -> grandchild in a session of its own (a worker)
    agent = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], "
             "start_new_session=True); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {agent!r}])"])
    try:
        deadline = time.monotonic() + 10
        while len(found := bench.descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(found) == 2  # the agent and, in a session of its own, its worker
    finally:
        for pid in bench.descendants(parent.pid):
            subprocess.run(["kill", "-9", str(pid)])
        parent.kill()
        parent.wait()
