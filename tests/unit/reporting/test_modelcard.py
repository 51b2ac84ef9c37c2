"""The model card in final/: front matter that parses, with the numbers from the run's summary."""

from __future__ import annotations

import json

import yaml

from corecpu.reporting.model_card import base_model_id, write_model_card

CONFIG = {"model": "default", "data": "train.parquet", "eval_data": "dev.parquet", "batch_size": 16, "grad_accum": 2,
          "lr": 3e-5, "epochs": 3, "max_seq_len": 64, "precision": "auto", "backend": "gloo"}
SUMMARY = {"steps": 189, "seconds": 74.25, "final_loss": 0.0421, "samples_per_s_after_warmup": 84.5,
           "last_eval": {"eval_loss": 0.031, "eval_accuracy": 0.9975, "eval_f1": 0.99749, "eval_examples": 400},
           "resolved": {"precision": "fp32", "backend": "gloo", "threads": 1},
           "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "a"}]}


def front_matter(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def test_card_front_matter_and_numbers(tmp_path):
    final = tmp_path / "myrun" / "final"
    final.mkdir(parents=True)
    meta, body = front_matter(write_model_card(final, CONFIG, SUMMARY, ["neg", "pos"], "train.parquet:train")
                              .read_text())
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and "corecpu" in meta["tags"]
    (result,) = meta["model-index"][0]["results"]
    # Named for what was trained, not for the output directory (issue 27: "# default").
    assert meta["model-index"][0]["name"] == "all-MiniLM-L6-v2-finetuned-text-classification"
    assert "# all-MiniLM-L6-v2-finetuned-text-classification\n" in body and "myrun" not in body
    assert result["task"]["type"] == "text-classification" and meta["license"] == "apache-2.0"
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"accuracy": 0.9975, "f1": 0.99749}
    assert "| accuracy | 0.9975 |" in body and "| loss | 0.0310 |" in body
    assert "189 optimizer steps on 2 rank(s), global batch 64" in body and "84.5 samples/s" in body
    assert "final training loss 0.0421" in body and "train.parquet:train" in body and "`neg`, `pos`" in body
    assert "| `lr` | `3e-05` |" in body and "(400 examples)" in body
    # What ran, beside what was asked; where and with what.
    assert "| `precision` | `fp32` (asked: auto) |" in body and "| `backend` | `gloo` |" in body
    assert "2 rank(s) on 1 host(s), 1 thread(s) each" in body and "torch " in body and "transformers " in body


def test_card_without_eval_or_known_base(tmp_path):
    local = tmp_path / "mymodel"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"_name_or_path": "bert-base-uncased"}))
    meta, body = front_matter(write_model_card(tmp_path, {**CONFIG, "model": str(local), "eval_data": "none"},
                                               {**SUMMARY, "last_eval": None}, ["a", "b", "c"], "x.tsv").read_text())
    assert "base_model" not in meta and "model-index" not in meta and "No evaluation was run." in body
    assert "license" not in meta and "Not recorded: the base model's license applies" in body
    assert "# mymodel-finetuned-text-classification" in body
    (local / "config.json").write_text(json.dumps({"_name_or_path": "google-bert/bert-base-uncased"}))
    assert base_model_id(str(local)) == "google-bert/bert-base-uncased"
    assert base_model_id("tiny") is None and base_model_id(str(tmp_path / "absent")) is None
