"""Tier 3: train.py reporting to TensorBoard and MLflow from a saved dataset, and refusing a bad
--report-to before writing anything (the trackers themselves: tests/unit/reporting/test_tracking.py)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers.common import ROOT
from helpers.launching import run_train


def test_train_reports_to_tensorboard_and_mlflow_from_a_saved_dataset(tmp_path, monkeypatch):
    """One process: a save_to_disk DatasetDict in, both trackers and the model card out."""
    import subprocess

    monkeypatch.setenv("CORECPU_CACHE_DIR", str(tmp_path / "host-cache"))  # where the tokenized data goes

    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import yaml

    feats = Features({"text": Value("string"), "label": ClassLabel(names=["bad", "good"])})
    rows = lambda n: {"text": [f"{'good' if i % 2 else 'bad'} item {i}" for i in range(n)],  # noqa: E731
                      "label": [i % 2 for i in range(n)]}
    DatasetDict(train=Dataset.from_dict(rows(32), features=feats),
                validation=Dataset.from_dict(rows(8), features=feats)).save_to_disk(str(tmp_path / "data"))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--model", "tiny", "--precision", "fp32",
                           "--progress", "off", "--data", str(tmp_path / "data"), "--batch-size", "8",
                           "--max-steps", "4", "--log-every", "2", "--report-to", "tensorboard,mlflow",
                           "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_EXPERIMENT_NAME": "e2e",
                               "HF_MLFLOW_LOG_ARTIFACTS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows_out = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows_out if "loss" in r]
    (evaluation,) = [r for r in rows_out if "eval_accuracy" in r]
    assert evaluation["eval_examples"] == 8  # the validation split, picked by --eval-data auto

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, round(e.value, 5)) for e in acc.Scalars("train/loss")] == \
        [(r["step"], round(r["loss"], 5)) for r in train] and [r["step"] for r in train] == [2, 4]
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [4]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what reading a file store takes in MLflow 3
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["report_to"] == "tensorboard,mlflow"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == \
        [(r["step"], r["loss"]) for r in train]
    assert run.data.metrics["eval_accuracy"] == evaluation["eval_accuracy"]
    # transformers' names, so panels line up with a Trainer's runs; the final model as artifacts, as asked
    assert {"learning_rate", "grad_norm", "epoch", "peak_rss_mb"} <= run.data.metrics.keys()
    stored = {a.path for a in client.list_artifacts(run.info.run_id, "final")}
    assert {"final/model.safetensors", "final/README.md"} <= stored
    assert {"train/learning_rate", "train/grad_norm", "train/epoch"} <= set(acc.Tags()["scalars"])

    card = (out / "final" / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    metrics = {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert metrics["accuracy"] == round(evaluation["eval_accuracy"], 6) and "`bad`, `good`" in card
    assert len(list((tmp_path / "host-cache" / "tokenized").glob("tokenized-*.pt"))) == 2  # train + eval


@pytest.mark.parametrize("spec, expected", [("tensorboard,comet", "unknown tracker 'comet'"),
                                            ("none,mlflow", "mixes 'none'")]
                         + ([("wandb", "pip install 'corecpu[wandb]'")]
                            if __import__("importlib").util.find_spec("wandb") is None else []))
def test_train_rejects_bad_report_to_before_writing(tmp_path, spec, expected):
    _, line = run_train(tmp_path, "--report-to", spec)
    assert expected in line
