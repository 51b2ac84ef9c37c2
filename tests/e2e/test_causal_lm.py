"""--task causal-lm end to end: the built-in set and model through launch.sh (full and LoRA), prompt/completion
and conversation files under torchrun, 1 rank x 8 = 2 ranks x 4 with packing, and the saved adapter giving the
eval loss the run reported."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.common import ROOT
from helpers.launching import crash_at_step, env_for_launch, launch, one_rank_vs_two, run_train

CAUSAL = ["--task", "causal-lm", "--precision", "fp32", "--progress", "off"]


def _records(out: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_loss" in r]


def test_builtin_set_two_ranks_full_fine_tuning(tmp_path):
    out = tmp_path / "full"
    launch(2, *CAUSAL, "--max-steps", "24", "--log-every", "4", "--eval-generate", "8", "--output-dir", str(out),
           timeout=600)
    steps, evals = _records(out)
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert evals and math.isclose(evals[-1]["eval_perplexity"], math.exp(evals[-1]["eval_loss"]), rel_tol=1e-6)
    assert evals[-1]["eval_generated"] == 8 and 0 <= evals[-1]["eval_exact_match"] <= 1
    generations = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [g["index"] for g in generations] == list(range(8)) and all(g["reference"] for g in generations)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    AutoTokenizer.from_pretrained(out / "final")
    summary = json.loads((out / "summary.json").read_text())
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    assert math.isclose(checksum, summary["ranks"][0]["param_checksum"], rel_tol=1e-9)
    card = (out / "final" / "README.md").read_text()
    assert "full fine-tuning" in card and "unigram guess" in card


def test_lora_adapter_loads_and_gives_the_reported_eval_loss(tmp_path):
    out = tmp_path / "lora"
    launch(2, *CAUSAL, "--lora-r", "8", "--max-steps", "12", "--log-every", "4", "--eval-generate", "0",
           "--merge-lora", "--output-dir", str(out), timeout=600)
    final = out / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    # The two ranks share one copy of the frozen base through the page cache (PSS splits shared pages).
    from corecpu.training.modeling import resolve_model_dir
    one_copy = (resolve_model_dir("llama-tiny") / "model.safetensors").stat().st_size / 2**20
    ranks = json.loads((out / "summary.json").read_text())["ranks"]
    held = sum(r["weights_pss_mb"] for r in ranks)
    assert 0.5 * one_copy < held <= 1.25 * one_copy, (held, one_copy)
    _, evals = _records(out)
    reported = evals[-1]["eval_loss"]

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(resolve_model_dir("llama-tiny"))
    model = PeftModel.from_pretrained(base, final).eval()
    merged = AutoModelForCausalLM.from_pretrained(final / "merged").eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    for m in (model, merged):
        assert math.isclose(_eval_loss(m, tokenizer), reported, rel_tol=1e-4), reported


def _eval_loss(model: torch.nn.Module, tokenizer) -> float:
    """The built-in set's held-out loss, computed here the way the run's evaluation computes it."""
    from corecpu.data.builtin_sft import builtin_sft
    from corecpu.data.causal_records import CausalData
    from corecpu.data.causal_tokens import tokenize_causal
    from corecpu.data.packing import CausalFeatures, make_causal_collate
    from corecpu.data.tokenized import pop_meta

    held = tokenize_causal(CausalData("prompt_completion", tuple(builtin_sft("eval", seed=0)), "sft"), tokenizer, 256)
    features = CausalFeatures(held, 256, True)
    collate = make_causal_collate(tokenizer.pad_token_id, 0, 256)
    loss = tokens = 0.0
    with torch.no_grad():
        for start in range(0, len(features), 16):
            batch = collate([features[i] for i in range(start, min(start + 16, len(features)))])
            meta, labels = pop_meta(batch), batch.pop("labels")
            s, n = _token_loss_sums(model(**batch).logits, labels, meta["valid"])
            loss, tokens = loss + s, tokens + n
    return loss / tokens


def _token_loss_sums(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> tuple[float, float]:
    """(summed cross-entropy, label tokens) from a batch's full logits, the causal shift applied, filler rows
    counting nothing: independent of corecpu's evaluation, which computes logits at label tokens alone."""
    shift_logits, shift_labels = logits[:, :-1].float(), labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                                             ignore_index=-100, reduction="none").view_as(shift_labels)
    counted = (shift_labels != -100) & valid[:, None]
    return float((loss * counted).sum()), float(counted.sum())


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n: int) -> list[tuple[str, str]]:
    return [(f"add {a} and {a + 3}:", str(2 * a + 3)) for a in range(n)]


@pytest.mark.parametrize("kind", ["prompt_completion", "messages"])
def test_files_under_torchrun(tmp_path, kind):
    if kind == "messages":
        rows = [{"messages": [{"role": "system", "content": "You add."}, {"role": "user", "content": p},
                              {"role": "assistant", "content": c}]} for p, c in _rows(40)]
    else:
        rows = [{"prompt": p, "completion": c} for p, c in _rows(40)]
    train = _write_jsonl(tmp_path / "train.jsonl", rows[:32])
    held = _write_jsonl(tmp_path / "eval.jsonl", rows[32:])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(ROOT / "train.py"), *CAUSAL,
           "--data", str(train), "--eval-data", str(held), "--max-steps", "4", "--epochs", "8", "--log-every", "1",
           "--batch-size", "2", "--max-seq-len", "64",
           "--eval-generate", "4", "--max-new-tokens", "4", "--output-dir", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env={**env_for_launch(), "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps, evals = _records(out)
    assert len(steps) == 4 and evals[-1]["eval_generated"] == 4
    generations = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [g["reference"] for g in generations] == [c for _, c in _rows(40)[32:36]]


def test_one_rank_of_8_equals_two_ranks_of_4_with_packing(tmp_path):
    """The loss is a mean over every label token of the global step, so how rows fall to ranks changes nothing."""
    common = [*CAUSAL, "--max-steps", "6", "--log-every", "1", "--eval-data", "none", "--max-seq-len", "64",
              "--no-group-by-length"]
    a, _ = one_rank_vs_two(tmp_path, common, 6, read=lambda out: _records(out)[0])
    assert all(r["padding"] < 0.5 for r in a)


def test_two_lora_ranks_in_bf16_share_one_cast_copy_of_the_frozen_base(tmp_path):
    """corecpu.compute.frozen_casts through corecpu.distributed.host_copy: one bf16 copy in /dev/shm for the host,
    its name gone once mapped."""
    out = tmp_path / "shared"
    before = {p.name for p in Path("/dev/shm").glob("corecpu-*-copy")}
    launch(2, "--task", "causal-lm", "--precision", "bf16", "--progress", "off", "--lora-r", "4", "--max-steps", "3",
           "--eval-data", "none", "--output-dir", str(out), timeout=600)
    decision = json.loads((out / "config.json").read_text())["decisions"]["frozen_casts"]
    assert decision.startswith("bf16") and "one copy in /dev/shm for the host's 2 ranks" in decision, decision
    assert {p.name for p in Path("/dev/shm").glob("corecpu-*-copy")} == before


def test_a_killed_lora_run_resumes_with_identical_losses(tmp_path):
    """Packed rows, LoRA dropout (its random state per rank restored), grad-accum 2 across epoch boundaries."""
    rows = [{"prompt": p, "completion": c} for p, c in _rows(120)]
    data = _write_jsonl(tmp_path / "train.jsonl", rows)
    common = [*CAUSAL, "--data", str(data), "--eval-data", "none", "--lora-r", "4", "--max-seq-len", "64",
              "--batch-size", "2", "--grad-accum", "2", "--max-steps", "14", "--epochs", "20", "--log-every", "1",
              "--save-every", "2"]
    launch(2, *common, "--output-dir", str(tmp_path / "straight"), timeout=600)
    out = tmp_path / "interrupted"
    saved = crash_at_step(2, common, out, 9)
    assert saved and 6 <= saved[-1] < 14, f"run was not interrupted mid-way: checkpoints {saved}"
    launch(2, *common, "--output-dir", str(out), "--resume", "auto", timeout=600)
    a, b = _records(tmp_path / "straight")[0], _records(out)[0]
    assert [r["step"] for r in b] == list(range(1, 15)) and len({r["epoch"] for r in a}) > 2
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


@pytest.mark.parametrize("args, fragment", [
    ([], "holds a bert model, which is not a causal language model; pass --model with a causal LM directory"),
    (["--model", "llama-tiny", "--lora-r", "4", "--lora-target-modules", "query,v_proj"],
     "--lora-target-modules query: this model has no such linear layer; it has down_proj,gate_proj,k_proj"),
    (["--model", "llama-tiny", "--data", "MISSING.jsonl"], "MISSING.jsonl"),
])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, args, fragment):
    """run_train passes --model tiny (a BERT) first; a later --model replaces it."""
    _, last = run_train(tmp_path, "--task", "causal-lm", "--precision", "fp32", *args)
    assert fragment in last, last
