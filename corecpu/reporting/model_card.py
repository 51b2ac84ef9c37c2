"""The model card (final/README.md): what was trained, on what, how, and how well.

Hugging Face conventions: YAML front matter (library_name, pipeline_tag, tags,
base_model, metrics, a model-index with the final eval results) written through
huggingface_hub's ModelCardData, then a Markdown body.

    write_model_card(out / "final", cfg.to_dict(), summary, label_names, data_desc)           # classification
    write_model_card(out / "final", cfg.to_dict(), summary, None, data_desc, kind=QA_CARD)    # extractive QA
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from corecpu.cpu.hardware import read_cpu_features

DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what --model default ships
DEFAULT_BASE_LICENSE = "apache-2.0"  # its model card's
VERSIONS = ("corecpu", "torch", "transformers", "peft", "intel_extension_for_pytorch", "oneccl_bind_pt")
RESOLVED = ("precision", "backend")  # settings whose "auto" the run resolved (summary["resolved"])
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SETTINGS = ("task", "model", "data", "eval_data", "max_seq_len", "doc_stride", "version_2_with_negative",
            "batch_size", "grad_accum", "lr", "weight_decay", "warmup_ratio", "max_grad_norm", "epochs", "max_steps",
            "seed", "precision", "backend", "packing", "completion_only_loss", "lora_r", "lora_alpha", "lora_dropout",
            "lora_target_modules", "gradient_checkpointing")

@dataclass(frozen=True)
class CardKind:
    """What differs between the cards of two tasks: the Hub's task names, the metrics, how to load."""

    pipeline_tag: str
    task_name: str
    metrics: tuple[tuple[str, str], ...]  # (key in last_eval without "eval_", name shown)
    how_to_load: str  # the Python of the card's "How to load" section


CLASSIFICATION_CARD = CardKind("text-classification", "Text Classification", (("accuracy", "Accuracy"), ("f1", "F1")),
                               """\
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

model = AutoModelForSequenceClassification.from_pretrained("PATH/TO/final")
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/final")
print(pipeline("text-classification", model=model, tokenizer=tokenizer)("an example sentence"))""")
# transformers 5 has no question-answering pipeline: the card shows the span read-out itself.
QA_CARD = CardKind("question-answering", "Question Answering", (("exact_match", "Exact Match"), ("f1", "F1")),
                   """\
import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

model = AutoModelForQuestionAnswering.from_pretrained("PATH/TO/final").eval()
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/final")
question, context = "Who wrote it?", "It was written by Ada Lovelace in 1843."
inputs = tokenizer(question, context, return_tensors="pt", return_offsets_mapping=True, truncation="only_second")
offsets = inputs.pop("offset_mapping")[0]
with torch.no_grad():
    out = model(**inputs)
context_tokens = torch.tensor([s == 1 for s in inputs.sequence_ids(0)])
start = out.start_logits[0].masked_fill(~context_tokens, -1e9).argmax()
end = start + out.end_logits[0][start:].masked_fill(~context_tokens[start:], -1e9)[:30].argmax()
print(context[offsets[start][0]:offsets[end][1]])""")
CAUSAL_CARD = CardKind("text-generation", "Causal Language Modeling", (("loss", "Loss"), ("perplexity", "Perplexity"),
                                                                      ("exact_match", "Exact Match")), """\
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH/TO/final")
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/final")
inputs = tokenizer("a prompt", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=32)[0], skip_special_tokens=True))""")
# final/ holds the adapter only: it loads on the base it was trained on (final/merged/ with --merge-lora).
LORA_CARD = CardKind("text-generation", "Causal Language Modeling", CAUSAL_CARD.metrics, """\
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base = AutoModelForCausalLM.from_pretrained("BASE")
model = PeftModel.from_pretrained(base, "PATH/TO/final")
tokenizer = AutoTokenizer.from_pretrained("PATH/TO/final")
inputs = tokenizer("a prompt", return_tensors="pt")
print(tokenizer.decode(model.generate(**inputs, max_new_tokens=32)[0], skip_special_tokens=True))""")


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


def base_license(model_spec: str) -> str | None:
    """The base model's license, where known: the default model's, or the `license:` of a local copy's README."""
    if model_spec == "default":
        return DEFAULT_BASE_LICENSE
    try:
        text = (Path(model_spec) / "README.md").read_text(encoding="utf-8")
    except OSError:
        return None
    head = text.split("\n---", 2)[0] if text.startswith("---") else ""
    found = re.search(r"^license:\s*([\w.+-]+)\s*$", head, re.M)
    return found.group(1) if found else None


def card_name(config: Mapping[str, Any], kind: CardKind, base: str | None) -> str:
    """What was trained, as a name: `all-MiniLM-L6-v2-finetuned-text-classification` (not the output directory's)."""
    model = base or str(config.get("model") or "model")
    return f"{Path(model.rstrip('/')).name or 'model'}-finetuned-{kind.pipeline_tag}"


def versions() -> str:
    """`corecpu 0.1.0, torch 2.13.0, ...`: the packages that made the weights, those installed."""
    found = []
    for name in VERSIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found + [f"Python {platform.python_version()}"])


def hardware(summary: Mapping[str, Any]) -> str:
    """`2 rank(s) on 1 host(s), 1 thread(s) each, Intel(R) Xeon(R) ...`: where it ran."""
    ranks = summary.get("ranks") or []
    hosts = len({r.get("host") for r in ranks if r.get("host")}) or "?"
    threads = (summary.get("resolved") or {}).get("threads", "?")
    return f"{len(ranks) or '?'} rank(s) on {hosts} host(s), {threads} thread(s) each, {read_cpu_features().model_name}"


def _setting(key: str, config: Mapping[str, Any], resolved: Mapping[str, Any]) -> str:
    value = resolved.get(key) if key in RESOLVED and resolved.get(key) is not None else config[key]
    asked = f" (asked: {config[key]})" if str(value) != str(config[key]) else ""
    return f"| `{key}` | `{value}`{asked} |"


def _what(kind: CardKind, label_names: Sequence[str] | None, base: str | None, config: Mapping[str, Any]) -> str:
    source = f" from [{base}](https://huggingface.co/{base})" if base else ""
    if kind.pipeline_tag == "question-answering":
        scored = "SQuAD v2.0 (unanswerable questions included)" if config.get("version_2_with_negative") else "SQuAD v1.1"
        return (f"An extractive question-answering model (it points at the answer span in a context) fine-tuned"
                f"{source}\nwith corecpu (data-parallel training on CPUs). Exact match and F1 are scored as {scored} "
                "scores them.")
    if kind.pipeline_tag == "text-generation":
        how = (f"LoRA (r={config.get('lora_r')}, alpha={config.get('lora_alpha')}, on "
               f"{config.get('lora_target_modules') or 'every linear layer of the blocks'}); this directory holds the "
               "adapter in PEFT's format" if config.get("lora_r") else "full fine-tuning")
        return (f"A causal language model fine-tuned{source} from `{config.get('model')}`\nwith corecpu (data-parallel "
                f"training on CPUs): {how}. Loss and perplexity are per label token of the held-out set.")
    labels = list(label_names or [])
    return (f"A {len(labels)}-class text classifier fine-tuned{source}\nwith corecpu (data-parallel training on "
            f"CPUs).\nLabels: {', '.join(f'`{n}`' for n in labels)}.")


def model_card(config: Mapping[str, Any], summary: Mapping[str, Any], label_names: Sequence[str] | None,
               data_desc: str, model_name: str | None = None, kind: CardKind = CLASSIFICATION_CARD) -> str:
    """The README.md text. `summary` is what train.py writes to summary.json; its `resolved` choices (precision,
    backend) are shown beside the flags asked. `model_name`: default the model and the task (card_name)."""
    from huggingface_hub import EvalResult, ModelCardData

    last_eval = summary.get("last_eval") or {}
    eval_data = str(config.get("eval_data", ""))
    results = [EvalResult(task_type=kind.pipeline_tag, task_name=kind.task_name,
                          dataset_type=eval_data or "local", dataset_name=eval_data or "evaluation data",
                          metric_type=key, metric_name=name, metric_value=round(float(last_eval[f"eval_{key}"]), 6))
               for key, name in kind.metrics if last_eval.get(f"eval_{key}") is not None]
    base = base_model_id(str(config.get("model", "")))
    model_name = model_name or card_name(config, kind, base)
    license_id = base_license(str(config.get("model", "")))
    data = ModelCardData(
        library_name="transformers", pipeline_tag=kind.pipeline_tag, license=license_id,
        tags=[kind.pipeline_tag, "corecpu", "cpu", "ddp"], base_model=base,
        metrics=[key for key, _ in kind.metrics] if results else None, model_name=model_name if results else None,
        eval_results=results or None,
    )
    shown = [k for k in SETTINGS if k in config]  # config.json holds only this run's task options
    settings = "\n".join(_setting(k, config, summary.get("resolved") or {}) for k in shown)
    ranks = len(summary.get("ranks", [])) or "?"
    per_rank, accum = config.get("batch_size"), config.get("grad_accum")
    global_batch = per_rank * accum * ranks if isinstance(ranks, int) and per_rank and accum else "?"
    eval_rows = "\n".join(f"| {k[5:]} | {v:.4f} |" for k, v in last_eval.items()
                          if k not in ("eval_examples", "eval_runtime") and isinstance(v, (int, float)))
    rate = summary.get("samples_per_s_after_warmup")
    body = f"""
# {model_name}

{_what(kind, label_names, base, config)}

## Data

- training: {data_desc}
- evaluation: {eval_data or 'none'}{f" ({last_eval['eval_examples']} examples)" if 'eval_examples' in last_eval else ''}

## Training

{summary.get('steps', '?')} optimizer steps on {ranks} rank(s), global batch {global_batch},
{_fmt(summary.get('seconds'), '.1f')} s{f', {rate:.1f} samples/s after warm-up' if rate else ''};
final training loss {_fmt(summary.get('final_loss'), '.4f')}.

- hardware: {hardware(summary)}
- software: {versions()}

| setting | value |
|---|---|
{settings}

## Results (last evaluation)

{('| metric | value |' + chr(10) + '|---|---|' + chr(10) + eval_rows) if eval_rows else 'No evaluation was run.'}

## License

{f"`{license_id}`, the base model's license." if license_id else
 "Not recorded: the base model's license applies" + (f" (see [{base}](https://huggingface.co/{base}))." if base else
                                                     "; a model built here from random weights carries none.")}

## How to load

```python
{kind.how_to_load.replace("BASE", str(config.get("base_model_path") or config.get("model", "")))}
```
"""
    return f"---\n{data.to_yaml()}\n---\n{body}"


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def write_model_card(final_dir: str | Path, config: Mapping[str, Any], summary: Mapping[str, Any],
                     label_names: Sequence[str] | None, data_desc: str, kind: CardKind = CLASSIFICATION_CARD) -> Path:
    path = Path(final_dir) / "README.md"
    path.write_text(model_card(config, summary, label_names, data_desc, kind=kind), encoding="utf-8")
    return path
