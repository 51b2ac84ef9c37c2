"""benchmarks/node_suite.py's planning and verdicts, and the wheels it unpacks on a node that fetches nothing."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks import node_suite


def test_parts_put_the_headline_first_and_hold_the_global_batch() -> None:
    plan = node_suite.parts(ranks=4, cores=16, global_batch=32, model="/m")
    assert [p.name for p in plan] == ["minilm-n4", "bert-n4", "bert-n1", "overhead-n4", "minilm-n1", "ops-bert",
                                      "lockstep-n4", "compile-bert", "minilm-n2", "minilm-n8"]
    for part in (p for p in plan if p.tool == "throughput"):
        batch = int(part.args[part.args.index("--batch-size") + 1])
        assert batch * part.ranks == 32, part.name
    head = plan[0]
    assert "corecpu,corecpu_auto,trainer_tuned" in head.args
    assert head.args[head.args.index("--torchrun-threads") + 1] == "4"
    assert all(p.model == ("bert-base" if "bert" in p.name else "/m") for p in plan)
    bert = plan[1]
    assert bert.model == "bert-base" and bert.args[bert.args.index("--bert-vocab") + 1] == "/m"
    # The op profile: one rank's share of the cores and all of them, at the whole global batch, MiniLM's vocabulary.
    ops = plan[5]
    assert ops.tool == "op_scaling" and ops.args[ops.args.index("--threads") + 1] == "4,16"
    assert ops.args[ops.args.index("--batch-size") + 1] == "32" and ops.args[ops.args.index("--vocab") + 1] == "/m"


def test_parts_skip_rank_counts_that_do_not_fit_and_quick_is_short() -> None:
    plan = node_suite.parts(ranks=2, cores=2, global_batch=32, model=None, quick=True)
    assert [p.name for p in plan] == ["minilm-n2", "bert-n2", "bert-n1", "overhead-n2", "minilm-n1", "ops-bert",
                                      "lockstep-n2", "compile-bert"]
    assert all(p.estimate_s == 20 for p in plan)
    assert plan[0].node_estimate_s == 370 and plan[-1].node_estimate_s == 240  # what their caps are taken from
    assert all(p.args[p.args.index("--max-steps") + 1] == "12" for p in plan if p.tool == "throughput")
    # One rank with every core: the profile adds one thread for the scaling it reports.
    ops = plan[-3]
    assert ops.args[ops.args.index("--threads") + 1] == "1,2" and "--vocab" not in ops.args
    assert plan[0].model == "minilm" and "--bert-vocab" not in plan[1].args  # the node's MiniLM package


def _result(variant_rates: dict[str, float], **extra) -> dict:
    medians = {v: {"samples_per_s": r} for v, r in variant_rates.items()}
    return {"medians": medians, **extra}


def test_criteria_say_met_and_not_met_with_their_numbers() -> None:
    results = {
        "matmul": {"fp32_threads16_gflops": 1331.0, "bf16_threads16_gflops": 4318.0, "bf16_threads4_gflops": 1200.0},
        "minilm-n4": _result({"corecpu": 140.0, "trainer_tuned": 118.0}, baseline="trainer_tuned", ratios={"corecpu": {
            "throughput": 140 / 118, "wall_speedup": 1.1, "accuracy_delta": 0.002}}),
        "minilm-n1": _result({"corecpu": 150.0}),
        "bert-n4": {"raw": [{"variant": "corecpu", "mfu": 0.5, "matmul": {"job_flops": 4.0e12}}]},
        "overhead-n4": {"comparisons": {"distribution": {"overhead_median": 0.08}}},
        "lockstep-n4": {"median": {"overhead": 0.12, "co_running": 0.06, "lockstep": 0.03, "code": 0.025,
                                   "alone_ms": 100.0, "together_ms": 106.0, "ranks_ms": 112.0}},
    }
    lines = node_suite.criteria(results, ranks=4)
    assert lines[0].startswith("- corecpu 4 ranks against the tuned Trainer (trainer_tuned)") and "1.19x" in lines[0]
    assert "bar 1.3x: NOT met" in lines[0]
    assert "140.0 samples/s against 1 rank with every core 150.0, same global batch: 0.933x" in lines[1]
    assert "NOT met" in lines[1]
    # 0.5 x 4 TFLOP/s = 2 TFLOP/s of the node's 4.318: 46%.
    assert "2.00 TFLOP/s = 46.3% of the node's 2048^3 bf16 rate (bar 35%: met)" in lines[2]
    assert lines[3].endswith("+8.0% (bar 10%: met)")
    assert lines[4] == ("- that overhead split (lockstep.py): +12.0% = ranks slowing each other +6.0%, waiting for the "
                        "slowest +3.0%, corecpu's distribution code +2.5% (steps: alone 100 ms, 4 at once 106, "
                        "4 ranks 112)")


def test_the_overhead_split_runs_lockstep_with_train_py_s_model_name(tmp_path: Path) -> None:
    suite = node_suite.Suite(tmp_path / "out", budget=60, work=tmp_path / "work")
    try:
        plan = node_suite.parts(ranks=4, cores=16, global_batch=32, model=None)
        part = next(p for p in plan if p.name == "lockstep-n4")
        cmd = node_suite.command(suite, part)
        assert cmd[1].endswith("lockstep.py") and cmd[cmd.index("--model") + 1] == "default"
        assert cmd[cmd.index("--ranks") + 1] == "4" and cmd[cmd.index("--batch-size") + 1] == "8"
        assert cmd[cmd.index("--out") + 1].endswith("lockstep-n4.json")
        packed = next(p for p in node_suite.parts(ranks=4, cores=16, global_batch=32, model="/m")
                      if p.name == "lockstep-n4")
        assert node_suite.command(suite, packed)[3] == "/m"
    finally:
        suite.log.close()


def test_the_op_profile_runs_op_scaling_and_its_table_reaches_the_summary(tmp_path: Path) -> None:
    suite = node_suite.Suite(tmp_path / "out", budget=60, work=tmp_path / "work")
    try:
        ops = next(p for p in node_suite.parts(ranks=4, cores=16, global_batch=32, model=None) if p.name == "ops-bert")
        cmd = node_suite.command(suite, ops)
        assert cmd[1].endswith("op_scaling.py") and cmd[cmd.index("--out") + 1].endswith("ops-bert.json")
        assert "--ranks" not in cmd and "--work-dir" not in cmd  # throughput.py's flags, not op_scaling.py's
    finally:
        suite.log.close()
    result = {"threads": [4, 16], "batch_size": 32, "table": ["| op | 4 thr ms | 16 thr ms | speed-up 4->16 |"],
              "serial_ms": 61.5, "total_ms": 400.0, "serial_below": 1.25}
    lines = node_suite.op_profile(result)
    assert lines[2] == result["table"][0]
    assert "at 16 threads, 61.5 of 400.0 ms a step is in ops that sped up less than 1.25x from 4 threads" in lines
    assert node_suite.op_profile(None) == []


def test_criteria_leave_out_what_did_not_run() -> None:
    assert node_suite.criteria({}, ranks=4) == []


def _wheel(path: Path, module: str) -> None:
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{module}/__init__.py", "VALUE = 1\n")
        whl.writestr(f"{module}-1.0.dist-info/METADATA", "Name: x\n")


def test_only_missing_modules_are_unpacked_onto_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "packed" / "wheels"
    wheels.mkdir(parents=True)
    _wheel(wheels / "corecpu_absent_mod-1.0-py3-none-any.whl", "corecpu_absent_mod")
    _wheel(wheels / "json_shadow-1.0-py3-none-any.whl", "json")
    monkeypatch.setattr(node_suite, "PACKED", tmp_path / "packed")
    monkeypatch.setattr(node_suite, "DEPENDENCIES", {"corecpu_absent_mod": "corecpu_absent_mod", "json": "json_shadow"})
    suite = node_suite.Suite(tmp_path / "out", budget=60, work=tmp_path / "work")
    try:
        assert node_suite.unpack_missing(suite) == ["corecpu_absent_mod"]
    finally:
        suite.log.close()
    site = tmp_path / "work" / "site"
    assert (site / "corecpu_absent_mod" / "__init__.py").exists()
    assert not (site / "json").exists()  # what the node has wins
    assert suite.env["PYTHONPATH"].split(":")[0] == str(site)


def test_a_missing_module_without_its_wheel_is_one_clear_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "packed" / "wheels").mkdir(parents=True)
    monkeypatch.setattr(node_suite, "PACKED", tmp_path / "packed")
    monkeypatch.setattr(node_suite, "DEPENDENCIES", {"corecpu_absent_mod": "corecpu_absent_mod"})
    suite = node_suite.Suite(tmp_path / "out", budget=60, work=tmp_path / "work")
    try:
        with pytest.raises(SystemExit, match=r"lacks corecpu_absent_mod .*node_pack\.py"):
            node_suite.unpack_missing(suite)
    finally:
        suite.log.close()


def test_phases_starts_its_ranks_without_launch_sh(monkeypatch: pytest.MonkeyPatch) -> None:
    """launch.sh's first use creates a virtualenv and installs into it, which the air-gapped node cannot do:
    phases.py (which the suite's op profile runs) starts its ranks with corecpu's launcher and its own Python."""
    from benchmarks import phases

    monkeypatch.syspath_prepend(str(Path(phases.__file__).parent))  # phases.py imports its siblings as a script does
    seen: list[list[str]] = []
    monkeypatch.setattr(phases.subprocess, "run",
                        lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setattr(phases.sys, "argv", ["phases.py", "--ranks", "2", "--model", "tiny"])
    assert phases.launch(phases.parse_args()) == 0
    cmd = seen[0]
    assert cmd[:3] == [phases.sys.executable, "-m", "corecpu.launch"] and not any("launch.sh" in c for c in cmd)
    assert cmd[cmd.index("--default-script") + 2:cmd.index("--default-script") + 4] == ["2", phases.__file__]
    assert cmd[-1] == "--worker"


def test_a_part_far_slower_than_its_estimate_is_stopped_and_the_next_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(node_suite, "PART_SLACK_S", 1.0)
    suite = node_suite.Suite(tmp_path / "out", budget=120, work=tmp_path / "work")
    try:
        started = time.monotonic()
        slow = suite.run("slow", [sys.executable, "-c", "import time; time.sleep(60)"], estimate=0.1)
        assert time.monotonic() - started < 20
        assert slow["status"] == "failed (stopped at 1 s, its cap)"
        assert suite.run("next", [sys.executable, "-c", "pass"], estimate=0.1)["status"] == "ok"
        # A --quick part is estimated short to fit the budget, and capped by the node's estimate.
        started = time.monotonic()
        quick = suite.run("quick", [sys.executable, "-c", "import time; time.sleep(3)"], estimate=0.1, cap_basis=2.0)
        assert quick["status"] == "ok" and time.monotonic() - started >= 3
    finally:
        suite.log.close()
