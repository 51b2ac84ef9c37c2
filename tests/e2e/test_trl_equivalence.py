"""corecpu's causal-LM training is TRL SFTTrainer's job, step for step: the same prompt/completion file, model,
initialisation (LoRA's adapters included), order, optimizer and schedule give the same per-step losses (fp32,
within 1e-5 relative), for full fine-tuning and for LoRA.

TRL tokenizes the file itself (benchmarks/trl_sft.py, the benchmark's baseline, --form plain); its input ids and
labels must equal corecpu's tokens and loss mask, so the data path is compared too, not handed over. The order is
held equal by giving TRL corecpu's: the indices corecpu's sampler yields for this seed (length-grouped, as
corecpu trains by default). One rank, no packing: TRL's packing flattens a batch into one padding-free row, which
is a different computation of the same loss.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.common import ROOT
from helpers.launching import launch


BATCH, EXAMPLES, SEED = 8, 96, 3


def _write_data(path: Path) -> None:
    from corecpu.data.builtin_sft import builtin_sft
    rows = builtin_sft("train", seed=0)[:EXAMPLES]
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c, *_ in rows))


def _corecpu_order(data: Path, model_dir: Path) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """corecpu's training order for epoch 0, and its tokens and loss mask."""
    from transformers import AutoTokenizer

    from corecpu.data.causal_records import read_causal_data
    from corecpu.data.causal_tokens import tokenize_causal
    from corecpu.data.sampling import train_sampler
    tok = tokenize_causal(read_causal_data(str(data), split="train"), AutoTokenizer.from_pretrained(model_dir), 128)
    sampler = train_sampler(range(len(tok)), BATCH, 0, 1, SEED, True, [len(ids) for ids in tok.input_ids])
    sampler.set_epoch(0)
    return list(sampler), tok.input_ids, tok.loss_mask


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_per_step_losses_equal_trl_sft_trainers(tmp_path, lora):
    from corecpu.training.modeling import resolve_model_dir
    model_dir = resolve_model_dir("llama-tiny")  # built on first use
    data = tmp_path / "train.jsonl"
    _write_data(data)
    lr = "2e-3" if lora else "1e-3"
    adapters = ["--lora-r", "8", "--lora-dropout", "0"] if lora else []
    out = tmp_path / "corecpu"
    launch(1, "--task", "causal-lm", "--model", "llama-tiny", "--data", str(data), "--no-packing",
           "--batch-size", str(BATCH), "--epochs", "1", "--lr", lr, "--weight-decay", "0", "--seed", str(SEED),
           "--precision", "fp32", "--log-every", "1", "--progress", "off", *adapters, "--output-dir", str(out),
           timeout=300)
    ours = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]

    order, ids, mask = _corecpu_order(data, model_dir)
    (tmp_path / "order.json").write_text(json.dumps(order))
    result, tokens = tmp_path / "trl.json", tmp_path / "tokens.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trl_sft.py"), "--model", str(model_dir),
                    "--data", str(data), "--form", "plain", "--order", str(tmp_path / "order.json"),
                    "--batch-size", str(BATCH), "--max-steps", str(EXAMPLES // BATCH), "--lr", lr,
                    "--seed", str(SEED), *(["--lora-r", "8", "--lora-dropout", "0"] if lora else []),
                    "--dump-tokens", str(tokens), "--out-json", str(result)],
                   check=True, timeout=300, env=_trl_env())
    trl_tokens = json.loads(tokens.read_text())
    assert trl_tokens["input_ids"] == ids, "TRL tokenized the file differently"
    assert trl_tokens["labels"] == [[t if m else -100 for t, m in zip(i, k)] for i, k in zip(ids, mask)]
    theirs = json.loads(result.read_text())["losses"]
    assert len(ours) == len(theirs) == EXAMPLES // BATCH
    for step, (a, b) in enumerate(zip(ours, theirs), 1):
        assert math.isclose(a, b, rel_tol=1e-5), (step, a, b)
    assert ours[-1] < ours[0]  # it trained


def _trl_env() -> dict[str, str]:
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    return {**env, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
