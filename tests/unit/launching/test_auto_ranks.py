"""`./launch.sh auto`: which rank counts are measured, which wins, the trials' flags, the history they land in,
and `--global-batch-size`."""

from __future__ import annotations

from pathlib import Path

import pytest

from corecpu.cpu.hardware import read_cpu_features
from corecpu.errors import CoreCPUError
from corecpu.launching import auto_ranks
from corecpu.launching.launch import parse_args, settle_batch
from corecpu.reporting import rank_history
from corecpu.tasks.registry import parse_config

TRAIN = str(Path(__file__).resolve().parents[3] / "train.py")


@pytest.mark.parametrize("cores, batch, accum, expected", [
    (2, 32, 1, [1, 2]),
    (1, 32, 1, [1]),
    (16, 32, 1, [1, 2, 4, 8]),  # not 16: one thread a rank is never measured
    (12, 32, 1, [1, 2, 4]),  # 3 and 6 do not split 32
    (16, 32, 4, [1, 2, 4, 8]),
    (16, 8, 4, [1, 2]),
])
def test_candidates_divide_the_cores_and_the_global_batch(cores, batch, accum, expected) -> None:
    assert auto_ranks.candidates(cores, batch, accum) == expected


def test_the_fastest_wins_unless_fewer_ranks_are_as_fast() -> None:
    assert auto_ranks.pick({1: 106.0, 2: 110.0, 4: 109.0, 8: 86.0}) == 2  # issue 29's 16-core table
    assert auto_ranks.pick({1: 109.0, 2: 110.0}) == 1  # within 2%: one rank (less memory, no all-reduce)
    assert auto_ranks.pick({1: 300.0, 2: 400.0}) == 2


def test_a_trial_is_the_same_job_short_and_silent() -> None:
    args = ["--model", "tiny", "--eval-data", "dev.tsv", "--keep-best", "eval_loss", "--report-to", "tensorboard"]
    cfg = parse_config(auto_ranks.trial_args(args, 8, "/tmp/x"))
    assert (cfg.batch_size, cfg.max_steps, cfg.log_every, cfg.eval_data, cfg.keep_best, cfg.report_to,
            cfg.output_dir, cfg.model) == (8, auto_ranks.TRIAL_STEPS, auto_ranks.TRIAL_LOG_EVERY, "none", "", "none",
                                           "/tmp/x", "tiny")


def test_the_global_batch_is_given_or_twice_the_default_and_never_both_ways() -> None:
    default = parse_config([]).to_dict()
    assert auto_ranks.global_batch(default, 16, None) == 32
    assert auto_ranks.global_batch(default, 16, 64) == 64
    per_rank = parse_config(["--batch-size", "8"]).to_dict()
    with pytest.raises(CoreCPUError, match="give --global-batch-size G instead"):
        auto_ranks.global_batch(per_rank, 16, None)
    with pytest.raises(CoreCPUError, match="both set the batch; give one of them"):
        auto_ranks.global_batch(per_rank, 16, 64, auto=False)


def _recording_trial(rates: dict[int, float], env: dict[str, str], node_cpus: int, calls: list[int]):
    """A trial as the ranks' Reporter records it: the shape from the trial's own flags and environment."""
    def trial(ranks: int, args: list[str], out: Path) -> tuple[float | None, str]:
        calls.append(ranks)
        if rates.get(ranks) is None:
            return None, "RuntimeError: out of memory"
        shape = rank_history.job_shape(parse_config(args).to_dict(), "core", cpu_model=read_cpu_features().model_name,
                                       node_cpus=node_cpus, world_size=ranks, local_world_size=ranks,
                                       busy=bool(env.get("CORECPU_CPUS_BUSY")))
        rank_history.store(shape, rates[ranks], auto_ranks.TRIAL_STEPS, env)
        return rates[ranks], ""
    return trial


def test_trials_land_in_the_history_and_the_next_choice_reads_them(tmp_path: Path) -> None:
    env = {"CORECPU_CACHE_DIR": str(tmp_path)}
    said: list[str] = []
    calls: list[int] = []
    args = ["--model", "tiny", "--data", "builtin", "--lr", "3e-5"]
    first = auto_ranks.choose(args, None, 2, 2, "core", env, _recording_trial({1: 370.0, 2: 279.0}, env, 2, calls),
                              said.append)
    assert first is not None and (first.ranks, first.batch_size, first.global_batch) == (1, 32, 32)
    assert calls == [1, 2] and first.trialled == (1, 2)
    assert said[0].startswith("auto: measuring 1, 2 rank(s) per node (30 steps each, global batch 32)")
    assert first.line() == ("auto: 1 rank(s) per node, --batch-size 32 (global batch 32); samples/s by ranks per "
                            "node 1: 370.0, 2: 279.0 (30-step trials of this job now on this machine)")
    # The same job (another lr and output dir do not change a step's cost): no trial this time.
    again = auto_ranks.choose(["--model", "tiny", "--data", "builtin", "--output-dir", "o"], None, 2, 2, "core", env,
                              _recording_trial({}, env, 2, calls), said.append)
    assert again is not None and again.ranks == 1 and again.trialled == () and calls == [1, 2]
    assert again.line().endswith("(earlier runs of this job on this machine)")
    # Another global batch is another job: measured afresh.
    other = auto_ranks.choose(args, 64, 2, 2, "core", env, _recording_trial({1: 380.0, 2: 400.0}, env, 2, calls),
                              said.append)
    assert other is not None and (other.ranks, other.batch_size) == (2, 32) and calls == [1, 2, 1, 2]


def test_a_choice_made_beside_a_busy_neighbour_is_not_an_idle_starts(tmp_path: Path) -> None:
    idle = {"CORECPU_CACHE_DIR": str(tmp_path), "CORECPU_CPUS_BUSY": ""}
    busy = {**idle, "CORECPU_CPUS_BUSY": "1"}
    calls: list[int] = []
    said: list[str] = []
    loaded = auto_ranks.choose(["--model", "tiny"], None, 2, 2, "core", busy,
                               _recording_trial({1: 100.0, 2: 150.0}, busy, 2, calls), said.append)
    assert loaded is not None and loaded.ranks == 2 and calls == [1, 2]
    assert said[0].endswith("once per job and machine")  # nothing recorded in either state: no "again"
    quiet = auto_ranks.choose(["--model", "tiny"], None, 2, 2, "core", idle,
                              _recording_trial({1: 300.0, 2: 200.0}, idle, 2, calls), said.append)
    assert quiet is not None and quiet.ranks == 1 and calls == [1, 2, 1, 2]  # measured afresh, not read back
    assert said[3].endswith("again now: the CPUs were idle at start, and this job's records were taken beside a "
                            "busy neighbour"), said  # the user is told why a job auto knows is measured again
    said.clear()
    assert auto_ranks.choose(["--model", "tiny"], None, 2, 2, "core", busy, auto_ranks.dry_trial, said.append)
    assert said == [] and calls == [1, 2, 1, 2]  # each state reads its own records back


def test_a_failed_trial_is_named_and_the_others_decide(tmp_path: Path) -> None:
    env = {"CORECPU_CACHE_DIR": str(tmp_path)}
    calls: list[int] = []
    choice = auto_ranks.choose(["--model", "tiny"], None, 2, 2, "core", env,
                               _recording_trial({1: None, 2: 200.0}, env, 2, calls), lambda _: None)
    assert choice is not None and choice.ranks == 2 and choice.failed == {1: "RuntimeError: out of memory"}
    assert choice.line().endswith("; 1 failed (RuntimeError: out of memory)")
    with pytest.raises(CoreCPUError, match="every trial failed .*give the number of ranks"):
        auto_ranks.choose(["--model", "tiny", "--seed", "3", "--max-seq-len", "64"], None, 2, 2, "core", env,
                          _recording_trial({}, env, 2, calls), lambda _: None)


def test_a_dry_run_says_what_it_would_measure(tmp_path: Path) -> None:
    said: list[str] = []
    assert auto_ranks.choose(["--model", "tiny"], 64, 16, 16, "core", {"CORECPU_CACHE_DIR": str(tmp_path)},
                             auto_ranks.dry_trial, said.append) is None
    assert said == ["# auto would measure 1, 2, 4, 8 rank(s) per node (30-step trials, global batch 64; recorded "
                    "samples/s: none), then launch the fastest"]


@pytest.mark.parametrize("argv, fragment", [
    (["auto", "-f", "hosts"], "auto measures on this node only"),
    (["auto", "--resume", "auto"], "resume with the rank count the run started with"),
])
def test_what_auto_cannot_do_is_one_line(argv, fragment, tmp_path) -> None:
    req = parse_args(argv, default_script=TRAIN)
    with pytest.raises(CoreCPUError, match=fragment):
        settle_batch(req, 2, 2, {"CORECPU_CACHE_DIR": str(tmp_path)})


def test_auto_parses_and_refuses_what_contradicts_it(tmp_path: Path) -> None:
    req = parse_args(["auto", "--model", "tiny"], default_script=TRAIN)
    assert req.auto and req.nranks is None and req.script_args == ["--model", "tiny"]
    assert parse_args(["-n", "auto", "train", "--model", "tiny"]).auto
    with pytest.raises(CoreCPUError, match="auto chooses the ranks per node; drop --nproc-per-node"):
        parse_args(["auto", "--nproc-per-node", "2"], default_script=TRAIN)
    script = tmp_path / "mine.py"
    script.write_text("")
    with pytest.raises(CoreCPUError, match="with your own script give the number of ranks"):
        parse_args(["-n", "auto", str(script)])
    with pytest.raises(CoreCPUError, match="N must be a whole number of ranks or auto"):
        parse_args(["some"], default_script=TRAIN)


def test_a_global_batch_with_a_fixed_rank_count_sets_the_per_rank_batch(tmp_path: Path) -> None:
    req = parse_args(["4", "--global-batch-size", "32", "--grad-accum", "2"], default_script=TRAIN)
    assert settle_batch(req, 8, 8, {}) == "" and req.script_args[-2:] == ["--batch-size", "4"]
    with pytest.raises(CoreCPUError, match="does not split over 4 ranks x --grad-accum 1; give a multiple of 4"):
        settle_batch(parse_args(["4", "--global-batch-size", "30"], default_script=TRAIN), 8, 8, {})
    with pytest.raises(CoreCPUError, match="give one of them"):
        settle_batch(parse_args(["2", "--global-batch-size", "32", "--batch-size", "8"], default_script=TRAIN),
                     8, 8, {})
    untouched = parse_args(["2", "--model", "tiny"], default_script=TRAIN)
    assert settle_batch(untouched, 8, 8, {}) == "" and untouched.script_args == ["--model", "tiny"]


def test_a_command_line_auto_has_seen_is_not_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"CORECPU_CACHE_DIR": str(tmp_path)}
    args = ["--model", "tiny", "--output-dir", "runs/a"]
    first = auto_ranks.job_config(args, None, env)
    assert first[:2] == (32, 1) and first[2]["model"] == "tiny" and first[2]["max_seq_len"] == 128

    def no_parse(*_a, **_k):
        raise AssertionError("parsed again")
    import corecpu.tasks.registry as registry
    monkeypatch.setattr(registry, "parse_config", no_parse)
    assert auto_ranks.job_config(["--model", "tiny", "--output-dir=runs/b"], None, env) == first  # another output dir
    with pytest.raises(AssertionError, match="parsed again"):
        auto_ranks.job_config(["--model", "tiny", "--max-seq-len", "64"], None, env)
    with pytest.raises(AssertionError, match="parsed again"):
        auto_ranks.job_config(args, 64, env)  # another global batch


def test_a_config_files_content_is_part_of_the_command_line(tmp_path: Path) -> None:
    flags = tmp_path / "run.yaml"
    flags.write_text("max_seq_len: 64\n")
    before = auto_ranks.parsed_key(["--config", str(flags)], None)
    flags.write_text("max_seq_len: 96\n")
    assert auto_ranks.parsed_key(["--config", str(flags)], None) != before
    assert auto_ranks.parsed_key(["--config", str(tmp_path / "missing.yaml")], None) is None
    assert auto_ranks.parsed_key(["--model", "m", "--output-dir", "a"], None) == \
        auto_ranks.parsed_key(["--model", "m", "--output-dir", "b"], None)
