"""Tier 1: bad input found before any work: output directory, tokenizer, sequence length, threads.
The same through train.py: tests/e2e/test_train_inputs.py."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
from collections import namedtuple

import pytest

from corecpu.training import checkpoint_state as ckpt
from corecpu.training import outputs
from corecpu.errors import CoreCPUError
from corecpu.training.modeling import (default_model_dir, input_problems, load_model, load_tokenizer, read_model_config,
                                       weights_bytes)
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


def test_a_model_directory_that_brings_its_own_code_is_refused(tmp_path):
    # transformers would ask "Do you wish to run the custom code? [y/N]" on a terminal, and run it on "y".
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (default_model_dir() / name).exists():
            shutil.copy(default_model_dir() / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "modeling_evil.EvilModel"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_evil.py").write_text("raise SystemExit('ran the directory code')\n")
    for load in (lambda: load_tokenizer(str(tmp_path)), lambda: load_model(str(tmp_path), ["a", "b"], 0)):
        with pytest.raises(CoreCPUError, match=r"maps the model to Python code in its directory \(auto_map\), and "
                                               "corecpu never runs a model directory's own code"):
            load()
