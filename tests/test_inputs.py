"""Tier 1: bad input found before any work: output directory, tokenizer, sequence length, threads."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from collections import namedtuple

import pytest

from conftest import ROOT
from corecpu.training import checkpoint as ckpt
from corecpu.training import outputs
from corecpu.errors import CoreCPUError
from corecpu.training.modeling import default_model_dir, input_problems, load_tokenizer, read_model_config, weights_bytes
from corecpu.cpu.threads import threads_warning

Usage = namedtuple("Usage", "total used free")
ROOMY = lambda p: Usage(10**12, 0, 10**12)  # noqa: E731


# ---------------------------------------------------------------- output directory


def test_output_dir_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(CoreCPUError, match=r"output directory .*out is a file"):
        outputs.check(tmp_path / "out")
    with pytest.raises(CoreCPUError, match=r"cannot be created: .*out is a file"):
        outputs.check(tmp_path / "out" / "run")


@pytest.mark.parametrize("code, words", [(errno.EROFS, "read-only filesystem"), (errno.EACCES, "not writable"),
                                         (errno.EDQUOT, "disk quota")])
def test_output_dir_not_writable(tmp_path, code, words):
    with pytest.raises(CoreCPUError, match=words) as err:
        outputs.check(tmp_path / "new" / "run", probe=lambda d: OSError(code, "x"), disk_usage=ROOMY)
    assert f"(tried {tmp_path})" in str(err.value)  # the nearest directory that exists
    assert not (tmp_path / "new").exists()


def test_read_only_mount_is_found_by_the_real_probe(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        with pytest.raises(CoreCPUError, match="read-only filesystem"):
            outputs.check(ro / "run")
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_output_dir_without_room(tmp_path):
    with pytest.raises(CoreCPUError, match=r"^no space left on .*: this run needs about 900 MB .* 5 MB free"):
        outputs.check(tmp_path, need_bytes=900_000_000, disk_usage=lambda p: Usage(10**9, 0, 5_000_000))
    outputs.check(tmp_path, need_bytes=900_000_000, disk_usage=ROOMY)
    outputs.check(tmp_path / "a" / "b")  # real probe, no size requirement: fine, and nothing created
    assert not (tmp_path / "a").exists()


def test_run_size_estimate():
    assert outputs.estimate_run_bytes(90_000_000, keep=2) == 90_000_000 * 10
    assert weights_bytes("default") > 80_000_000 and weights_bytes("tiny") == 0


def _earlier_run(out):
    (out / "final").mkdir(parents=True)
    (out / "final" / "model.safetensors").write_bytes(b"w")
    (out / "summary.json").write_text("{}")
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("mine")


def test_fresh_run_moves_an_earlier_run_aside(tmp_path):
    out = tmp_path / "run"
    _earlier_run(out)
    import torch

    model = torch.nn.Linear(2, 2)
    ckpt.save(out, step=7, model=model, optimizer=None)
    note = outputs.set_aside_earlier_run(out, resuming=False, now=lambda: 0.0)
    dest = out / "previous-19700101-000000"
    assert note.startswith(f"{out} held an earlier run's outputs (final, checkpoints, summary.json, metrics.jsonl)")
    assert f"moved them to {dest}; to continue that run instead, resume from {dest / 'checkpoints' / 'step-00000007'}" in note
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "previous-19700101-000000"]
    assert (dest / "final" / "model.safetensors").read_bytes() == b"w"
    _earlier_run(out)  # a second fresh run in the same second gets its own directory
    outputs.set_aside_earlier_run(out, resuming=False, now=lambda: 0.0)
    assert (out / "previous-19700101-000000-2" / "summary.json").exists()


def test_resuming_or_empty_dir_moves_nothing(tmp_path):
    out = tmp_path / "run"
    _earlier_run(out)
    assert outputs.set_aside_earlier_run(out, resuming=True) is None
    assert (out / "final").is_dir()
    assert outputs.set_aside_earlier_run(tmp_path / "nothing", resuming=False) is None
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)  # an empty checkpoints/ is not an earlier run
    assert outputs.set_aside_earlier_run(tmp_path / "empty", resuming=False) is None


# ---------------------------------------------------------------- model inputs


def test_tokenizer_vocabulary_must_fit_the_model():
    ok = dict(vocab_size=30522, max_positions=512, max_seq_len=128)
    assert input_problems("M", tokenizer_len=30522, **ok) is None
    assert input_problems("M", tokenizer_len=50257, **{**ok, "vocab_size": 50304}) is None  # padded embedding
    assert "only 5 tokens for a model with 30522" in input_problems("M", tokenizer_len=5, **ok)
    assert "has 50265 tokens but the model's embedding has 30522" in input_problems("M", tokenizer_len=50265, **ok)


def test_max_seq_len_above_positions():
    line = input_problems("M", vocab_size=30522, max_positions=512, tokenizer_len=30522, max_seq_len=1024)
    assert "max sequence length 1024 is longer than the model in M accepts (512 positions)" in line
    assert "--max-seq-len 512" in line


def test_model_dir_without_tokenizer_files_is_refused(tmp_path):
    shutil.copy(default_model_dir() / "config.json", tmp_path / "config.json")
    from corecpu.training.modeling import check_inputs

    tokenizer = load_tokenizer(str(tmp_path))  # transformers builds a 5-token stand-in here
    with pytest.raises(CoreCPUError, match=rf"tokenizer in {tmp_path} has only \d+ tokens for a model with 30522"):
        check_inputs(str(tmp_path), tokenizer, 128)
    check_inputs("default", load_tokenizer("default"), 128)
    with pytest.raises(CoreCPUError, match="longer than the model"):
        check_inputs("tiny", load_tokenizer("tiny"), 513)


def test_broken_config_json_is_reported_as_such(tmp_path):
    (tmp_path / "config.json").write_text('{"vocab_size": 3,')
    with pytest.raises(CoreCPUError, match=r"config.json is not valid JSON \(.*line 1") as err:
        load_tokenizer(str(tmp_path))
    assert "tokenizer" not in str(err.value)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(CoreCPUError, match="not a JSON object"):
        read_model_config(tmp_path)


def test_threads_above_the_rank_cpus_warn_with_the_count():
    assert threads_warning(2, frozenset({0, 1})) is None
    line = threads_warning(8, frozenset({4, 5}))
    assert line.startswith("8 threads requested but this rank has 2 CPU(s) (4-5)") and "threads=2" in line


# ---------------------------------------------------------------- through train.py


def train(tmp_path, *args):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--model", "tiny", "--progress", "off", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_train_refuses_long_max_seq_len_and_file_output_dir_in_one_line(tmp_path):
    for args, words in ((["--max-seq-len", "1000"], "longer than the model"),
                        (["--output-dir", str(tmp_path / "file")], "is a file")):
        (tmp_path / "file").write_text("x")
        proc = train(tmp_path, "--output-dir", str(tmp_path / "out"), *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert words in proc.stderr.strip().splitlines()[-1]
        assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_train_fresh_run_sets_earlier_outputs_aside(tmp_path):
    out = tmp_path / "out"
    common = ["--max-steps", "2", "--eval-data", "none", "--output-dir", str(out)]
    assert train(tmp_path, *common).returncode == 0
    second = train(tmp_path, *common)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "held an earlier run's outputs" in second.stdout and "resume from" in second.stdout
    previous = [p for p in out.iterdir() if p.name.startswith("previous-")]
    assert len(previous) == 1 and (previous[0] / "final").is_dir() and (previous[0] / "summary.json").is_file()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2 and (out / "final").is_dir()
