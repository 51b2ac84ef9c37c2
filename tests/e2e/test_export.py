"""Tier 3: --keep-best and `corecpu export` on a real run. A tiny run evaluates every epoch and keeps the
best evaluation's checkpoint (not the last) beside --keep-checkpoints 1, through a resume; `corecpu export`
then writes that step as a directory from_pretrained loads, with the checkpoint's weights bit for bit."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from corecpu.cli import build_parser
from corecpu.data.builtin import write_task
from helpers.launching import TINY, single


def steps_kept(out) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))


def test_the_best_checkpoint_survives_pruning_and_a_resume_and_exports_bit_equal(tmp_path, capsys):
    train, held, out = tmp_path / "train.tsv", tmp_path / "eval.tsv", tmp_path / "run"
    write_task(train, "builtin", split="train", n=48, seed=0)
    write_task(held, "builtin", split="eval", n=32, seed=0)
    # 6 steps per epoch, an evaluation at each epoch's end; eval_loss:max makes the first evaluation the best
    # while training lowers the loss, so the best is never the newest checkpoint.
    common = [*TINY, "--data", str(train), "--eval-data", str(held), "--batch-size", "8", "--epochs", "4",
              "--lr", "1e-3", "--save-every", "4", "--keep-checkpoints", "1", "--keep-best", "eval_loss:max",
              "--log-every", "6", "--output-dir", str(out)]
    first = single(*common, "--max-steps", "12")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert steps_kept(out) == [6, 12]  # step 6 was not a --save-every step: saved as the best

    resumed = single(*common, "--resume", "auto")  # on to the end of epoch 4 (step 24)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resuming from" in resumed.stdout and "(step 12)" in resumed.stdout
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line]
    assert [e["step"] for e in evals] == [6, 12, 18, 24]
    assert max(evals, key=lambda e: e["eval_loss"])["step"] == 6  # the premise: the best is the first
    assert steps_kept(out) == [6, 24]  # the resumed run still knew step 6 was the best, and kept it
    newest = json.loads((out / "checkpoints" / "step-00000024" / "meta.json").read_text())
    assert newest["extra"]["best"]["checkpoint"] == "step-00000006"

    # `corecpu export` in this process (torch is loaded here already): no process group, no launcher.
    dest = tmp_path / "best-model"
    args = build_parser().parse_args(["export", str(out), str(dest), "--step", "best"])
    assert args.func(args) == 0
    assert f"exported step 6 ({out / 'checkpoints' / 'step-00000006'}) to {dest}" in capsys.readouterr().out
    assert not torch.distributed.is_initialized()
    assert json.loads((dest / "checkpoint.json").read_text())["step"] == 6

    model = AutoModelForSequenceClassification.from_pretrained(dest)
    saved = torch.load(out / "checkpoints" / "step-00000006" / "state.pt", weights_only=True)["model"]
    loaded = model.state_dict()
    assert set(loaded) == set(saved)
    unequal = [k for k in saved if saved[k].dtype != loaded[k].dtype or not torch.equal(saved[k], loaded[k])]
    assert not unequal, unequal
    final = AutoModelForSequenceClassification.from_pretrained(out / "final").state_dict()
    assert not all(torch.equal(final[k], loaded[k]) for k in loaded)  # step 6's weights, not the last step's
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert AutoTokenizer.from_pretrained(dest)("a fine film")["input_ids"][0] == 101  # the run's tokenizer, [CLS]
