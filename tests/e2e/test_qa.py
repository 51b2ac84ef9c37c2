"""Tier 3: extractive QA (`--task qa`) through launch.sh, as a user runs it: the built-in set, SQuAD
v1.1 and v2.0 files, rank-count invariance, exact resume, and scores that match SQuAD's own
procedure applied to the predictions.json the run wrote."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from corecpu.data.builtin_qa import builtin_qa_dataset
from corecpu.data.qa import write_squad_json
from helpers.launching import TINY, crash_at_step, launch, one_rank_vs_two, run_train
from helpers.squad_reference import score_v1, score_v2

QA = ["--task", "qa", *TINY]
SHORT = ["--max-seq-len", "128", "--doc-stride", "32"]  # several windows per context, cheap steps


def qa_records(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_f1" in r]


def squad_files(tmp_path, *, v2: bool, train: int = 160, dev: int = 50):
    paths = []
    for split, n in (("train", train), ("eval", dev)):
        examples = builtin_qa_dataset(split, n=n, seed=3, with_impossible=v2).examples
        path = tmp_path / f"{split}-v{'2.0' if v2 else '1.1'}.json"
        write_squad_json(path, examples)
        paths.append(path)
    return paths


def test_builtin_qa_set_two_ranks(tmp_path):
    out = tmp_path / "qa"
    proc = launch(2, *QA, "--data", "qa", "--max-steps", "6", "--log-every", "2", "--output-dir", str(out))
    assert "windows of 384 tokens, stride 128" in proc.stdout
    train, evals = qa_records(out)
    assert [r["step"] for r in train] == [2, 4, 6] and len(evals) == 1
    # Every eval question has exactly one prediction, and the run's scores are SQuAD's on that file.
    gold = tmp_path / "dev.json"
    write_squad_json(gold, builtin_qa_dataset("eval").examples)
    predictions = json.loads((out / "predictions.json").read_text())
    assert len(predictions) == 400 == evals[0]["eval_examples"]
    reference = score_v1(gold, out / "predictions.json")
    assert evals[0]["eval_exact_match"] == pytest.approx(reference["exact_match"], abs=1e-9)
    assert evals[0]["eval_f1"] == pytest.approx(reference["f1"], abs=1e-9)
    assert f"exact match {evals[0]['eval_exact_match']:.2f} | F1 {evals[0]['eval_f1']:.2f}" in proc.stdout
    assert not (out / "null_odds.json").exists()
    # final/ is a plain QA model: the model card's own snippet loads it and reads out an answer, in a
    # process that never imports corecpu.
    card = (out / "final" / "README.md").read_text()
    assert "pipeline_tag: question-answering" in card and "Exact Match" in card and "| `task` | `qa` |" in card
    snippet = card.split("```python\n")[1].split("```")[0].replace("PATH/TO/final", str(out / "final"))
    snippet += "\nimport sys; assert 'corecpu' not in sys.modules; print(type(model).__name__)"
    check = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert check.returncode == 0, check.stderr
    answer, name = check.stdout.strip().splitlines()[-2:]
    assert name == "BertForQuestionAnswering" and answer in "It was written by Ada Lovelace in 1843."


@pytest.mark.parametrize("v2", [False, True], ids=["v1.1", "v2.0"])
def test_squad_files(tmp_path, v2):
    train, dev = squad_files(tmp_path, v2=v2)
    out = tmp_path / "run"
    flags = ["--version-2-with-negative"] if v2 else []
    launch(2, *QA, *SHORT, *flags, "--data", str(train), "--eval-data", str(dev), "--max-steps", "4",
           "--output-dir", str(out))
    _, evals = qa_records(out)
    got = evals[-1]
    if v2:
        reference = score_v2(dev, out / "predictions.json")
        assert got["eval_exact_match"] == pytest.approx(reference["exact"], abs=1e-9)
        assert got["eval_f1"] == pytest.approx(reference["f1"], abs=1e-9)
        for group in ("HasAns", "NoAns"):
            assert got[f"eval_{group}_f1"] == pytest.approx(reference[f"{group}_f1"], abs=1e-9)
            assert got[f"eval_{group}_total"] == reference[f"{group}_total"] > 0
        odds = json.loads((out / "null_odds.json").read_text())
        assert odds.keys() == json.loads((out / "predictions.json").read_text()).keys()
        assert len(set(odds.values())) > 1  # real no-answer scores, not run_qa.py's constant 0.0
    else:
        reference = score_v1(dev, out / "predictions.json")
        assert got["eval_exact_match"] == pytest.approx(reference["exact_match"], abs=1e-9)
        assert got["eval_f1"] == pytest.approx(reference["f1"], abs=1e-9)
    assert got["eval_examples"] == 50


def test_unanswerable_questions_need_the_v2_flag(tmp_path):
    train, _ = squad_files(tmp_path, v2=True, train=40, dev=5)
    _, last = run_train(tmp_path, "--task", "qa", "--data", str(train), "--eval-data", "none")
    assert "has no answer; pass --version-2-with-negative" in last


def test_bad_answer_offset_is_one_line(tmp_path):
    train, _ = squad_files(tmp_path, v2=False, train=20, dev=5)
    doc = json.loads(train.read_text())
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 2
    train.write_text(json.dumps(doc))
    _, last = run_train(tmp_path, "--task", "qa", "--data", str(train), "--eval-data", "none")
    assert "does not point at the answer text" in last and "fix the offset or the text" in last


def test_one_rank_batch_8_equals_two_ranks_batch_4(tmp_path):
    # Every window padded to the same width: a Hugging Face QA head scores pad positions too (its loss is
    # a softmax over the whole padded row), so batches padded to other widths give other losses. corecpu
    # does not change the model's loss; with one width, 1 and 2 ranks must agree.
    common = [*QA, *SHORT, "--pad-to-multiple-of", "128", "--max-steps", "6", "--log-every", "1", "--eval-data", "none"]
    one_rank_vs_two(tmp_path, common, 6, read=lambda out: qa_records(out)[0])


def test_killed_qa_run_resumes_with_identical_losses(tmp_path):
    common = [*QA, *SHORT, "--max-steps", "16", "--log-every", "1", "--save-every", "4", "--batch-size", "4",
              "--eval-data", "none"]
    launch(2, *common, "--output-dir", str(tmp_path / "straight"))
    out = tmp_path / "interrupted"
    saved = crash_at_step(2, common, out, 10)
    assert saved and 8 <= saved[-1] < 16, f"run was not interrupted mid-way: checkpoints {saved}"
    launch(2, *common, "--output-dir", str(out), "--resume", "auto")
    a, _ = qa_records(tmp_path / "straight")
    b, _ = qa_records(out)
    assert [r["step"] for r in b] == list(range(1, 17))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
