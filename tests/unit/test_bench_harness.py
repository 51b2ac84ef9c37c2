"""The benchmark harness's logic: throughput from step timestamps, medians and ratios, tables, commands."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import harness, stats


def steps_from(times: list[float], samples: list[int], losses: list[float] | None = None) -> list[dict]:
    losses = losses or [0.7] * len(times)
    return [{"step": i + 1, "t": t, "samples": s, "loss": x} for i, (t, s, x) in enumerate(zip(times, samples, losses))]


# ---------------------------------------------------------------- throughput window

def test_window_counts_samples_and_skips_warmup() -> None:
    steps = steps_from([10.0, 11.0, 13.0, 14.0, 16.0, 17.0], [32, 32, 32, 16, 32, 32])
    w = stats.timed_window(steps, warmup=2)
    # Steps 3..6: intervals 2 + 1 + 2 + 1 seconds, samples 32 + 16 + 32 + 32 (the short step counted as 16).
    assert w["timed_seconds"] == pytest.approx(6.0)
    assert w["timed_samples"] == 112
    assert w["samples_per_s"] == pytest.approx(112 / 6)
    assert w["ms_per_step"] == pytest.approx(1500.0)


def test_window_leaves_out_intervals_holding_an_evaluation() -> None:
    steps = steps_from([0.0, 1.0, 2.0, 3.0, 13.0, 14.0], [32] * 6)  # evaluation ran after step 4
    w = stats.timed_window(steps, warmup=1, eval_after=[4])
    assert w["timed_steps"] == 4
    assert w["samples_per_s"] == pytest.approx(4 * 32 / 4.0)
    assert stats.timed_window(steps, warmup=1)["samples_per_s"] < w["samples_per_s"]


@pytest.mark.parametrize("steps, warmup", [
    (steps_from([0.0, 1.0, 2.0], [32] * 3)[:1] + steps_from([0.0, 1.0, 2.0], [32] * 3)[2:], 1),  # step 2 missing
    (steps_from([0.0, 1.0, 2.0], [32] * 3), 3),  # nothing left after the warm-up
])
def test_window_rejects_gaps_and_too_long_warmup(steps: list[dict], warmup: int) -> None:
    with pytest.raises(ValueError):
        stats.timed_window(steps, warmup)


def test_run_result_takes_the_last_evaluation_and_flags_nan_loss() -> None:
    steps = steps_from([0.0, 1.0, 2.0, 3.0], [8] * 4, [0.7, 0.6, float("nan"), 0.5])
    evals = [{"step": 2, "eval_accuracy": 0.6, "eval_f1": 0.5, "eval_loss": 0.9},
             {"step": 4, "eval_accuracy": 0.8, "eval_f1": 0.7, "eval_loss": 0.4}]
    r = stats.run_result(steps, evals, warmup=1, wall_s=12.5)
    assert (r["eval_accuracy"], r["eval_step"], r["wall_s"], r["samples_total"]) == (0.8, 4, 12.5, 32)
    assert r["timed_steps"] == 2  # step 3's interval holds the evaluation after step 2
    assert r["loss_ok"] is False


# ---------------------------------------------------------------- medians, ratios, tables

def fake_run(variant: str, sps: float, acc: float, wall: float, repeat: int) -> dict:
    return {"variant": variant, "repeat": repeat, "samples_per_s": sps, "ms_per_step": 32000 / sps, "wall_s": wall,
            "eval_accuracy": acc, "eval_f1": acc - 0.05, "final_loss": 0.3, "loss_ok": True}


def fake_result() -> dict:
    raw = [fake_run("corecpu", s, a, w, i) for i, (s, a, w) in enumerate([(130, 0.81, 50), (150, 0.80, 40),
                                                                         (140, 0.82, 45)])]
    raw += [fake_run("trainer_ddp", s, a, w, i) for i, (s, a, w) in enumerate([(100, 0.80, 60), (90, 0.79, 70),
                                                                             (110, 0.81, 80)])]
    result = {"config": {"model": "minilm", "data": "paraphrase", "precision": "bf16", "global_batch": 32,
                         "ranks": 2, "batch_size": 16, "max_seq_len": 128, "epochs": 1, "max_steps": 0,
                         "warmup": 10, "repeats": 3},
              "machine": {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "usable_cpus": 112,
                          "cpu_flags": {"avx512_bf16": True, "amx_bf16": True}},
              "raw": raw}
    return {**result, **stats.summarize(raw, ["corecpu", "trainer_ddp"])}


def test_summary_takes_medians_min_max_and_ratios_against_trainer_ddp() -> None:
    result = fake_result()
    core, base = result["medians"]["corecpu"], result["medians"]["trainer_ddp"]
    assert (core["samples_per_s"], core["samples_per_s_min"], core["samples_per_s_max"]) == (140, 130, 150)
    assert (base["samples_per_s"], base["wall_s"], base["eval_accuracy"]) == (100, 70, 0.80)
    assert result["ratios"]["corecpu"]["throughput"] == pytest.approx(1.4)
    assert result["ratios"]["corecpu"]["wall_time"] == pytest.approx(45 / 70)
    assert result["ratios"]["corecpu"]["accuracy_delta"] == pytest.approx(0.01)
    assert result["ratios"]["trainer_ddp"]["throughput"] == pytest.approx(1.0)


def test_the_tuned_trainer_is_the_anchor_when_it_ran() -> None:
    raw = [fake_run("corecpu", 130, 0.81, 60, 1), fake_run("trainer_ddp", 100, 0.80, 90, 1),
           fake_run("trainer_tuned", 120, 0.80, 75, 1)]
    summary = stats.summarize(raw, ["corecpu", "trainer_tuned", "trainer_ddp"])
    assert summary["baseline"] == "trainer_tuned"
    assert summary["ratios"]["corecpu"]["wall_speedup"] == pytest.approx(75 / 60)
    assert stats.summarize(raw, ["corecpu", "trainer_ddp"])["baseline"] == "trainer_ddp"


def test_summary_without_the_baseline_has_no_ratios() -> None:
    raw = [fake_run("corecpu", 100, 0.8, 10, 1)]
    summary = stats.summarize(raw, ["corecpu", "trainer_ddp"])
    assert summary["ratios"] == {} and summary["baseline"] is None and list(summary["medians"]) == ["corecpu"]


def test_markdown_table_from_result_json() -> None:
    result = json.loads(json.dumps(fake_result()))  # what --report reads back
    md = stats.markdown(result)
    lines = md.splitlines()
    assert "Intel(R) Xeon(R) Platinum 8480+" in lines[0] and "avx512_bf16 yes, amx_bf16 yes" in lines[0]
    assert lines[2].startswith("| variant | samples/s | min-max | vs trainer_ddp |")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines[4:]}
    assert rows["corecpu"][1:4] == ["140.0", "130.0-150.0", "1.40x"]
    assert rows["corecpu"][6] == f"{70 / 45:.2f}x"  # the baseline's wall time over corecpu's
    assert rows["corecpu"][8] == "+0.0100"
    assert rows["trainer_ddp"][3] == "1.00x"
    assert lines[-1] == ("corecpu vs trainer_ddp: 1.56x in wall time (target >= 1.25x: met), 1.40x samples/s, "
                         "eval accuracy +0.0100 (target within 0.01: met)")


def test_verdict_fails_a_speedup_that_costs_accuracy() -> None:
    result = fake_result()
    result["ratios"]["corecpu"]["accuracy_delta"] = -0.02
    assert "within 0.01: NOT met" in stats.verdict(result)
    assert "1.60x: NOT met" in stats.verdict(result, speedup=1.6)
    result["config"]["background_load"] = 1  # a loaded machine's bar is lower
    assert "target >= 1.10x" in stats.verdict(result)
    assert stats.verdict(result, variant="trainer_ddp") is None


# ---------------------------------------------------------------- planning

def test_corecpu_metrics_become_step_and_eval_records() -> None:
    lines = [json.dumps({"step": 1, "loss": 0.7, "lr": 0.0, "samples": 32, "samples_per_s": 1.0, "elapsed_s": 0.5}),
             json.dumps({"step": 2, "loss": 0.6, "lr": 1e-4, "samples": 17, "samples_per_s": 1.0, "elapsed_s": 0.9}),
             json.dumps({"step": 2, "eval_loss": 0.5, "eval_accuracy": 0.75, "eval_f1": 0.7, "eval_examples": 4})]
    steps, evals = harness.corecpu_records(lines)
    assert [(s["step"], s["t"], s["samples"]) for s in steps] == [(1, 0.5, 32), (2, 0.9, 17)]
    assert evals == [{"step": 2, "eval_accuracy": 0.75, "eval_f1": 0.7, "eval_loss": 0.5, "eval_examples": 4}]
    qa = json.dumps({"step": 2, "epoch": 0, "eval_exact_match": 61.5, "eval_f1": 70.25, "eval_examples": 400})
    assert harness.corecpu_records(lines[:2] + [qa])[1] == [{"step": 2, "eval_exact_match": 61.5, "eval_f1": 70.25,
                                                             "eval_examples": 400}]
    with pytest.raises(ValueError, match="samples"):
        harness.corecpu_records([json.dumps({"step": 1, "loss": 0.7, "elapsed_s": 0.5})])


def test_holdout_split_is_deterministic_disjoint_and_ten_percent() -> None:
    train, held = harness.holdout_split(1000, 0.1, seed=0)
    assert len(held) == 100 and len(train) == 900
    assert set(train).isdisjoint(held) and set(train) | set(held) == set(range(1000))
    assert harness.holdout_split(1000, 0.1, seed=0) == (train, held)
    assert held != list(range(100))  # shuffled, not the file's first lines
    assert len(harness.holdout_split(3, 0.1)[1]) == 1


def test_commands_hold_batch_precision_and_data_equal(tmp_path: Path) -> None:
    cfg = harness.BenchConfig(model="tiny", data="paraphrase", ranks=2, batch_size=16, epochs=1,
                              corecpu_extra={"gloo": "--allreduce gloo"})
    core = harness.command("corecpu", cfg, None, tmp_path)
    assert "--precision" not in core and "--batch-size" not in core  # corecpu's own defaults
    assert core[5] == "2" and core[core.index("--data") + 1] == "paraphrase" and core[-2:] != ["--allreduce", "gloo"]
    assert harness.command("corecpu:gloo", cfg, None, tmp_path)[-2:] == ["--allreduce", "gloo"]
    ddp = harness.command("trainer_ddp", cfg, "bf16", tmp_path)
    one = harness.command("trainer_1proc", cfg, "bf16", tmp_path)
    grouped = harness.command("trainer_ddp_grouped", cfg, "bf16", tmp_path)
    assert ddp[ddp.index("--batch-size") + 1] == "16" and one[one.index("--batch-size") + 1] == "32"
    assert "--no-group-by-length" in ddp and "--group-by-length" in grouped and "torchrun" not in one[0]
    assert all(c[c.index("--precision") + 1] == "bf16" for c in (ddp, one, grouped))
    # The tuned Trainers are length-grouped, at the precision measured faster for them, whatever corecpu chose.
    tuned = harness.command("trainer_tuned", cfg, "fp32", tmp_path)
    assert tuned[tuned.index("--precision") + 1] == "bf16" and "--group-by-length" in tuned and "torchrun" in tuned[0]
    emulated = dataclasses.replace(cfg, tuned_precision="fp32")  # bf16 measured slower for the Trainer
    for variant in ("trainer_tuned", "trainer_1proc_tuned"):
        run = harness.command(variant, emulated, "bf16", tmp_path)
        assert run[run.index("--precision") + 1] == "fp32" and "--group-by-length" in run
    assert harness.command("trainer_ddp", cfg, "fp32", tmp_path)[ddp.index("--precision") + 1] == "fp32"
    bigger = harness.command("corecpu", harness.BenchConfig(batch_size=8), None, tmp_path)
    assert bigger[bigger.index("--batch-size") + 1] == "8"
    with pytest.raises(ValueError):
        harness.command("trainer_ddp", cfg, None, tmp_path)


def test_variant_order_runs_corecpu_first_and_rejects_unknown_names() -> None:
    order = harness.variant_order(["trainer_ddp", "corecpu", "trainer_1proc"], {"nogroup": "--no-group-by-length"})
    assert order == ["corecpu", "corecpu:nogroup", "trainer_ddp", "trainer_1proc"]
    with pytest.raises(ValueError):
        harness.variant_order(["trainer"], {})
    assert harness.parse_corecpu_args(["gloo=--allreduce gloo"]) == {"gloo": "--allreduce gloo"}
    with pytest.raises(ValueError):
        harness.parse_corecpu_args(["--allreduce gloo"])


def test_torchrun_ranks_get_a_thread_share_and_nothing_else_inherits_thread_settings() -> None:
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "7", "KMP_AFFINITY": "compact"}
    assert harness.variant_env("trainer_ddp", env, 28) == {"PATH": "/bin", "OMP_NUM_THREADS": "28"}
    assert harness.variant_env("trainer_tuned", env, 28) == {"PATH": "/bin", "OMP_NUM_THREADS": "28"}
    assert harness.variant_env("corecpu", env, 28) == {"PATH": "/bin", "PYTHONPATH": str(harness.ROOT)}
    assert harness.variant_env("trainer_1proc", env, 28) == {"PATH": "/bin"}
    assert env["OMP_NUM_THREADS"] == "7"  # the caller's mapping is left alone
    cfg = harness.BenchConfig(corecpu_extra={"wait": "I_MPI_WAIT_MODE=1 X=a=b --allreduce mpi"})
    assert harness.variant_env("corecpu:wait", env, 28, cfg) == {"PATH": "/bin", "I_MPI_WAIT_MODE": "1", "X": "a=b",
                                                                 "PYTHONPATH": str(harness.ROOT)}
    assert harness.command("corecpu:wait", cfg, None, Path("/tmp"))[-2:] == ["--allreduce", "mpi"]


def test_a_data_file_is_split_and_rewritten_so_every_variant_reads_the_same_examples(tmp_path: Path) -> None:
    import argparse
    import sys

    sys.path.insert(0, str(harness.BENCH))  # throughput.py imports its siblings as a script does
    try:
        import throughput
    finally:
        sys.path.remove(str(harness.BENCH))
    from corecpu.data.sources import load_data

    src = tmp_path / "pairs.csv"
    src.write_text("q1,q2,dup\n" + "".join(f"question {i},other {i},{'yes' if i % 3 else 'no'}\n" for i in range(50)))
    args = argparse.Namespace(data=str(src), eval_data=None, text_column="q1", text_pair_column="q2",
                              label_column="dup")
    cfg, info = throughput.prepare_data(args, tmp_path)
    assert info["data_label"] == "pairs" and "held-out 10%" in info["eval"]
    train = load_data(cfg["data"], split="train", **cfg["columns"])
    held = load_data(cfg["eval_data"], split="eval", label_names=train.label_names, **cfg["columns"])
    assert (len(train), len(held), train.label_names) == (45, 5, ["no", "yes"])
    rows = {(t, p, train.label_names[y]) for t, p, y in zip(train.texts, train.text_pairs, train.labels)}
    rows |= {(t, p, held.label_names[y]) for t, p, y in zip(held.texts, held.text_pairs, held.labels)}
    assert rows == {(f"question {i}", f"other {i}", "yes" if i % 3 else "no") for i in range(50)}


def test_background_load_runs_busy_processes_only_inside_the_block() -> None:
    from benchmarks.background import background_load

    with background_load(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.returncode is not None for p in procs)
    with pytest.raises(ValueError, match="negative"):
        with background_load(-1):
            pass


def test_qa_seed_table_pairs_runs_by_seed_and_averages_the_differences() -> None:
    import sys

    sys.path.insert(0, str(harness.BENCH))
    try:
        import qa_throughput
    finally:
        sys.path.remove(str(harness.BENCH))

    def run(variant: str, seed: int, em: float, f1: float, recorded: bool = True) -> dict:
        r = {"variant": variant, "repeat": 1, "command": ["x", "--seed", str(seed), "--out"], "eval_exact_match": em,
             "eval_f1": f1, "samples_per_s": 1.0, "ms_per_step": 1.0, "wall_s": 1.0, "final_loss": 0.5}
        return {**r, "seed": seed} if recorded else r  # older results carry the seed only in the command

    raw = [run("corecpu", 0, 60.0, 70.0), run("trainer_runqa", 0, 58.0, 69.0),
           run("corecpu", 3, 50.0, 55.0, recorded=False), run("trainer_runqa", 3, 51.0, 57.0, recorded=False)]
    result = {"raw": raw, **qa_throughput.summarize(raw, ["corecpu", "trainer_runqa"])}
    rows = qa_throughput.seed_rows(result)
    assert rows[1].startswith("| seed | trainer_runqa EM / F1 | corecpu EM / F1 |")
    assert rows[3] == "| 0 | 58.00 / 69.00 | 60.00 / 70.00 | +2.00 / +1.00 |"
    assert rows[4] == "| 3 | 51.00 / 57.00 | 50.00 / 55.00 | -1.00 / -2.00 |"
    assert rows[5] == "| mean | 54.50 / 63.00 | 55.00 / 62.50 | +0.50 / -0.50 |"
    assert qa_throughput.seed_rows({"raw": raw[:2], **qa_throughput.summarize(raw[:2], ["corecpu", "trainer_runqa"])}) == []

    def result_of(runs: list[dict], seeds: list[int]) -> dict:
        cfg = {"model": "m", "data": "qa", "epochs": 3, "variants": ["corecpu", "trainer_runqa"], "repeats": len(seeds),
               "seeds": seeds}
        return {"config": cfg, "machine": {"date_utc": "now"}, "raw": runs,
                **qa_throughput.summarize(runs, cfg["variants"])}

    merged = qa_throughput.append_runs(result_of(raw[:2], [0]), result_of([{**r, "repeat": 1} for r in raw[2:]], [3]))
    assert merged["config"]["seeds"] == [0, 3] and merged["config"]["repeats"] == 2
    assert [r["repeat"] for r in merged["raw"]] == [1, 1, 2, 2]
    with pytest.raises(SystemExit, match="already in the result"):
        qa_throughput.append_runs(merged, result_of(raw[:2], [0]))
    with pytest.raises(SystemExit, match="epochs differ"):
        qa_throughput.append_runs(merged, {**result_of(raw[2:], [3]), "config": {**result_of(raw[2:], [3])["config"], "epochs": 1}})


def test_one_rank_reference_and_earlier_commit_variants() -> None:
    # One rank's share: the first cores // ranks cores, every CPU of each (SMT siblings stay together).
    assert harness.one_rank_cpus([(0, 4), (1, 5), (2, 6), (3, 7)], 2) == "0,4,1,5"
    assert harness.one_rank_cpus([(0,), (1,)], 2) == "0" and harness.one_rank_cpus([(0,)], 2) == "0"
    cfg = harness.BenchConfig(ranks=2, one_rank_cpus="0", reference="c134c55", reference_tree="/ref",
                              reference_cache="/cache")
    one = harness.command(harness.ONE_RANK, cfg, "bf16", Path("/runs"), python="/env/bin/python")
    assert one[:8] == ["taskset", "-c", "0", "/env/bin/python", "-m", "corecpu.launch", "--default-script",
                       str(harness.ROOT / "train.py")] and one[8] == "1"
    mine = harness.command("corecpu", cfg, None, Path("/runs"), python="/env/bin/python")
    assert mine[:6] == ["/env/bin/python", "-m", "corecpu.launch", "--default-script", str(harness.ROOT / "train.py"),
                        "2"]  # launch.sh's own last line, so a preinstalled environment runs it as it is
    assert harness.variant_env("corecpu", {"PYTHONPATH": "/x"}, 1, cfg)["PYTHONPATH"] == f"{harness.ROOT}:/x"
    assert one[one.index("--precision") + 1] == "bf16"  # corecpu's resolved precision, not its own measurement
    assert one[one.index("--output-dir") + 1] == "/runs/corecpu_1rank"
    ref = harness.command("corecpu@c134c55", cfg, None, Path("/runs"), python="/env/bin/python")
    assert ref[:5] == ["/env/bin/python", "-m", "corecpu.launch", "--default-script", "/ref/train.py"]
    assert ref[5] == "2" and "--precision" not in ref
    assert ref[ref.index("--output-dir") + 1] == "/runs/corecpu-at-c134c55"
    env = harness.variant_env("corecpu@c134c55", {"PATH": "/bin", "OMP_NUM_THREADS": "3"}, 1, cfg)
    assert env == {"PATH": "/bin", "PYTHONPATH": "/ref", "CORECPU_CACHE_DIR": "/cache"}
    assert harness.variant_order(["corecpu", "trainer_tuned", harness.ONE_RANK], {}, "c134c55") == [
        "corecpu", "corecpu@c134c55", "trainer_tuned", harness.ONE_RANK]


def test_tokens_come_from_the_records_or_from_an_older_versions_rate() -> None:
    new = [json.dumps({"step": 1, "loss": 0.7, "samples": 32, "tokens": 900, "elapsed_s": 0.5})]
    assert harness.corecpu_records(new)[0][0]["tokens"] == 900
    old = [json.dumps({"step": k, "loss": 0.7, "samples": 32, "tokens_per_s": 1000.0, "elapsed_s": 0.5 * k})
           for k in (1, 2, 3)]
    steps = harness.corecpu_records(old)[0]
    assert [s["tokens"] for s in steps] == [500.0, 500.0, 500.0]
    window = stats.timed_window(steps, 1)
    assert window["tokens_per_s"] == pytest.approx(1000.0) and window["samples_per_s"] == pytest.approx(64.0)
    assert "tokens_per_s" not in stats.timed_window([{k: v for k, v in s.items() if k != "tokens"} for s in steps], 1)


def test_the_tuned_trainer_keeps_the_precision_that_timed_faster_without_a_margin() -> None:
    from benchmarks.tuned_precision import faster

    assert faster(0.09) == "fp32" and faster(1.0) == "fp32"  # emulated bf16; a tie keeps the exact one
    assert faster(1.02) == "bf16" and faster(3.3) == "bf16"  # corecpu's 1.10x margin is not the user's


def test_the_tuned_precision_is_read_from_its_timing_or_ends_the_benchmark_with_the_fix(monkeypatch) -> None:
    import subprocess

    calls = []

    def fake(cmd, **kwargs):
        calls.append(cmd)
        ok = "--model" in cmd and cmd[cmd.index("--model") + 1] == "default"
        out = 'noise\n{"precision": "fp32", "bf16_speedup": 0.09, "threads": 1, "shapes": "s"}\n'
        return subprocess.CompletedProcess(cmd, 0 if ok else 1, out if ok else "", "" if ok else "no such model")

    monkeypatch.setattr(subprocess, "run", fake)
    found = harness.time_tuned_precision("default", 1, 16, {}, 60, seq_len=384)
    assert found == {"precision": "fp32", "bf16_speedup": 0.09, "threads": 1, "shapes": "s", "by": "tuned_precision.py"}
    cmd = calls[0]
    assert cmd[1].endswith("tuned_precision.py") and cmd[cmd.index("--seq-len") + 1] == "384"
    assert cmd[cmd.index("--threads") + 1] == "1" and cmd[cmd.index("--batch-size") + 1] == "16"
    with pytest.raises(SystemExit, match="(?s)no such model.*pass --tuned-precision fp32 or bf16"):
        harness.time_tuned_precision("missing", 1, 16, {}, 60)
