"""The model card (final/README.md): what was trained, on what, how, and how well.

Hugging Face conventions: YAML front matter (library_name, pipeline_tag, tags,
base_model, metrics, a model-index with the final eval results) written through
huggingface_hub's ModelCardData, then a Markdown body.

    write_model_card(out / "final", cfg.to_dict(), summary, label_names, data_desc)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what --model default ships
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SETTINGS = ("model", "data", "eval_data", "max_seq_len", "batch_size", "grad_accum", "lr", "weight_decay",
            "warmup_ratio", "max_grad_norm", "epochs", "max_steps", "seed", "precision", "backend")


def base_model_id(model_spec: str) -> str | None:
    """The Hub id of the model fine-tuned, where known: the default model, or a local copy that records one."""
    if model_spec == "default":
        return DEFAULT_BASE_MODEL
    config = Path(model_spec) / "config.json"
    try:
        name = json.loads(config.read_text()).get("_name_or_path", "")
    except (OSError, ValueError):
        return None
    return name if isinstance(name, str) and HUB_ID.match(name) and not Path(name).exists() else None


def model_card(config: Mapping[str, Any], summary: Mapping[str, Any], label_names: Sequence[str],
               data_desc: str, model_name: str = "corecpu-finetuned") -> str:
    """The README.md text. `summary` is what train.py writes to summary.json."""
    from huggingface_hub import EvalResult, ModelCardData

    last_eval = summary.get("last_eval") or {}
    eval_data = str(config.get("eval_data", ""))
    results = [EvalResult(task_type="text-classification", task_name="Text Classification",
                          dataset_type=eval_data or "local", dataset_name=eval_data or "evaluation data",
                          metric_type=kind, metric_name=kind.capitalize() if kind != "f1" else "F1",
                          metric_value=round(float(last_eval[f"eval_{kind}"]), 6))
               for kind in ("accuracy", "f1") if last_eval.get(f"eval_{kind}") is not None]
    base = base_model_id(str(config.get("model", "")))
    data = ModelCardData(
        library_name="transformers", pipeline_tag="text-classification",
        tags=["text-classification", "corecpu", "cpu", "ddp"], base_model=base,
        metrics=["accuracy", "f1"] if results else None, model_name=model_name if results else None,
        eval_results=results or None,
    )
    settings = "\n".join(f"| `{k}` | `{config[k]}` |" for k in SETTINGS if k in config)
    ranks = len(summary.get("ranks", [])) or "?"
    per_rank, accum = config.get("batch_size"), config.get("grad_accum")
    global_batch = per_rank * accum * ranks if isinstance(ranks, int) and per_rank and accum else "?"
    eval_rows = "\n".join(f"| {k[5:]} | {v:.4f} |" for k, v in last_eval.items() if k != "eval_examples"
                          and isinstance(v, (int, float)))
    rate = summary.get("samples_per_s_after_warmup")
    body = f"""
# {model_name}

A {len(label_names)}-class text classifier fine-tuned{f' from [{base}](https://huggingface.co/{base})' if base else ''}
with corecpu (data-parallel training on CPUs).
Labels: {', '.join(f'`{n}`' for n in label_names)}.

## Data

- training: {data_desc}
- evaluation: {eval_data or 'none'}{f" ({last_eval['eval_examples']} examples)" if 'eval_examples' in last_eval else ''}

## Training

{summary.get('steps', '?')} optimizer steps on {ranks} rank(s), global batch {global_batch},
{_fmt(summary.get('seconds'), '.1f')} s{f', {rate:.1f} samples/s after warm-up' if rate else ''};
final training loss {_fmt(summary.get('final_loss'), '.4f')}.

| setting | value |
|---|---|
{settings}

## Results (last evaluation)

{('| metric | value |' + chr(10) + '|---|---|' + chr(10) + eval_rows) if eval_rows else 'No evaluation was run.'}

## How to load

```python
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

model = AutoModelForSequenceClassification.from_pretrained("PATH/TO/final")
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/final")
print(pipeline("text-classification", model=model, tokenizer=tokenizer)("an example sentence"))
```
"""
    return f"---\n{data.to_yaml()}\n---\n{body}"


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def write_model_card(final_dir: str | Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                     label_names: Sequence[str], data_desc: str) -> Path:
    path = Path(final_dir) / "README.md"
    path.write_text(model_card(config, summary, label_names, data_desc, model_name=Path(final_dir).resolve().parent.name
                               or "corecpu-finetuned"), encoding="utf-8")
    return path
