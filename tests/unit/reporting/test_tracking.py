"""Experiment trackers: name parsing, TensorBoard and MLflow written then read back, wandb import guard.
Through train.py: tests/e2e/test_trackers.py."""

from __future__ import annotations

import sys
import types

import pytest

from corecpu.errors import CoreCPUError
from corecpu.reporting.metrics_log import MetricsLog
from corecpu.reporting.trackers import (flat_params, mlflow_settings, numeric_items,
                              open_trackers, parse_report_to, rewrite_keys, tensorboard_dir)

CONFIG = {"model": "tiny", "lr": 1e-4, "batch_size": 8, "compile": False, "nested": {"a": 1}}
RECORDS = [
    {"step": 2, "epoch": 0, "loss": 0.69, "lr": 5e-5, "samples_per_s": 100.0, "note": "text is skipped"},
    {"step": 4, "epoch": 0, "loss": 0.52, "lr": 1e-4, "samples_per_s": 120.0},
    {"step": 4, "epoch": 0, "eval_loss": 0.40, "eval_accuracy": 0.875, "eval_f1": 0.8, "eval_examples": 16},
]


def installed(name: str):
    return lambda module: object() if module == name or name == "*" else None


@pytest.fixture(autouse=True)
def _mlflow_switch_restored(monkeypatch):
    # The MLflow tracker allows a local file store for its process (os.environ); tests put it back.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def test_parse_report_to():
    assert parse_report_to("none") == [] and parse_report_to("") == []
    assert parse_report_to("tensorboard, MLflow,tensorboard", installed("*")) == ["tensorboard", "mlflow"]
    with pytest.raises(CoreCPUError, match="unknown tracker 'comet'"):
        parse_report_to("tensorboard,comet", installed("*"))
    with pytest.raises(CoreCPUError, match="mixes 'none'"):
        parse_report_to("none,mlflow", installed("*"))


def test_missing_package_names_the_extra():
    with pytest.raises(CoreCPUError) as err:
        parse_report_to("tensorboard,wandb", installed("tensorboard"))
    message = str(err.value)
    assert "\n" not in message and "pip install 'corecpu[wandb]'" in message


@pytest.mark.skipif("wandb" in sys.modules or __import__("importlib").util.find_spec("wandb") is not None,
                    reason="wandb is installed here")
def test_wandb_not_installed_is_one_line_error():
    from corecpu.errors import install_extra

    with pytest.raises(CoreCPUError) as err:
        parse_report_to("wandb")
    assert str(err.value) == f"reporting to wandb needs the wandb package; {install_extra('wandb')}"


def test_values_and_names():
    assert numeric_items({"step": 3, "loss": 0.5, "n": 4, "s": "x", "nan": float("nan"), "b": True, "z": None}) \
        == {"loss": 0.5, "n": 4.0}
    assert rewrite_keys({"loss": 1.0, "eval_f1": 0.5}) == {"train/loss": 1.0, "eval/f1": 0.5}
    assert flat_params(CONFIG)["nested.a"] == 1 and flat_params({"x": [1, 2]}) == {"x": "[1, 2]"}


def test_locations_follow_transformers_variables(tmp_path):
    assert tensorboard_dir(tmp_path, {}) == tmp_path / "tensorboard"
    assert tensorboard_dir(tmp_path, {"TENSORBOARD_LOGGING_DIR": "/x/tb"}).as_posix() == "/x/tb"
    uri, exp = mlflow_settings(tmp_path, {})
    assert uri == (tmp_path / "mlruns").resolve().as_uri() and exp is None
    assert mlflow_settings(tmp_path, {"MLFLOW_TRACKING_URI": "http://h:5000", "MLFLOW_EXPERIMENT_NAME": "e"}) \
        == ("http://h:5000", "e")


def write_run(out, names, env):
    trackers = open_trackers(names, out, CONFIG, env=env)
    log = MetricsLog(out / "metrics.jsonl", None, trackers=trackers)
    for r in RECORDS:
        log.write(r)
    log.close()
    return trackers


def test_tensorboard_event_file_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    tb = tmp_path / "elsewhere"
    write_run(tmp_path, ["tensorboard"], {"TENSORBOARD_LOGGING_DIR": str(tb)})
    assert not (tmp_path / "tensorboard").exists()
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("train/loss")] == [(2, 0.69), (4, 0.52)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/accuracy")] == [(4, 0.875)]
    assert "train/note" not in acc.Tags()["scalars"]
    start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["lr"].number_value == 1e-4 and hparams["model"].string_value == "tiny"
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"lr": 0.0001' in text


def test_mlflow_file_store_reads_back(tmp_path):
    from mlflow.tracking import MlflowClient

    (tracker,) = write_run(tmp_path, ["mlflow"], {"MLFLOW_EXPERIMENT_NAME": "corecpu-test",
                                                  "MLFLOW_TAGS": '{"team": "cpu"}'})
    client = MlflowClient(tracking_uri=tracker.uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["team"] == "cpu"
    assert client.get_experiment(run.info.experiment_id).name == "corecpu-test"
    assert run.data.params["lr"] == "0.0001" and run.data.params["nested.a"] == "1"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "loss")] == [(2, 0.69), (4, 0.52)]
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "eval_f1")] == [(4, 0.8)]
    assert "note" not in run.data.metrics
    assert tracker.uri.startswith("file:") and (tmp_path / "mlruns").is_dir()


def test_only_rank_zero_reports(tmp_path):
    assert open_trackers(["tensorboard", "mlflow"], tmp_path, CONFIG, env={}, rank=1) == []
    assert list(tmp_path.iterdir()) == []


def test_mlflow_run_id_continues_a_run(tmp_path):
    from mlflow.tracking import MlflowClient

    (first,) = write_run(tmp_path, ["mlflow"], {})
    (again,) = open_trackers(["mlflow"], tmp_path, None, env={"MLFLOW_RUN_ID": first.run_id})
    again.log({"step": 6, "loss": 0.3}, step=6)
    again.close()
    history = MlflowClient(tracking_uri=first.uri).get_metric_history(first.run_id, "loss")
    assert again.run_id == first.run_id and [(m.step, m.value) for m in history] == [(2, 0.69), (4, 0.52), (6, 0.3)]


def test_bad_mlflow_tags_is_one_line_error(tmp_path):
    with pytest.raises(CoreCPUError, match="MLFLOW_TAGS is not valid JSON"):
        open_trackers(["mlflow"], tmp_path, CONFIG, env={"MLFLOW_TAGS": "{oops"})


def test_wandb_path_with_a_stand_in_module(tmp_path, monkeypatch):
    calls = []

    class Run:
        config = types.SimpleNamespace(update=lambda c, allow_val_change: calls.append(("config", c)))

        def log(self, values, step):
            calls.append(("log", step, values))

        def finish(self):
            calls.append(("finish",))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    write_run(tmp_path, ["wandb"], {"WANDB_PROJECT": "proj", "WANDB_MODE": "offline"})
    assert calls[0] == ("init", {"project": "proj", "dir": str(tmp_path), "name": tmp_path.name})
    assert calls[1][0] == "config" and calls[1][1]["lr"] == 1e-4
    assert ("log", 4, {"train/epoch": 0.0, "eval/loss": 0.4, "eval/accuracy": 0.875, "eval/f1": 0.8,
                       "eval/examples": 16.0}) in calls
    assert calls[-1] == ("finish",)


def test_wandb_import_failure_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(CoreCPUError, match=r"pip install 'corecpu\[wandb\]'"):
        open_trackers(["wandb"], tmp_path, CONFIG, env={})


def test_failing_tracker_is_dropped_not_fatal(tmp_path, capsys):
    class Broken:
        closed = False

        def log(self, record, step):
            raise RuntimeError("server gone")

        def close(self):
            Broken.closed = True

    log = MetricsLog(tmp_path / "metrics.jsonl", None, trackers=[Broken()])
    for r in RECORDS:
        log.write(r)
    log.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    assert capsys.readouterr().err.count("server gone") == 1
    assert not Broken.closed


def test_report_to_all_is_every_installed_tracker():
    assert parse_report_to("all", installed("*")) == ["tensorboard", "mlflow", "wandb"]
    assert parse_report_to("ALL", installed("mlflow")) == ["mlflow"]
    assert parse_report_to("all", lambda module: None) == []  # transformers: all of none installed is none
    with pytest.raises(CoreCPUError, match="mixes 'all'"):
        parse_report_to("all,mlflow", installed("*"))


def test_hf_mlflow_log_artifacts_stores_the_final_model(tmp_path):
    from mlflow.tracking import MlflowClient

    final = tmp_path / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    for value, stored in (("", False), ("TRUE", True)):
        (tracker,) = open_trackers(["mlflow"], tmp_path, CONFIG, env={"HF_MLFLOW_LOG_ARTIFACTS": value})
        log = MetricsLog(tmp_path / "metrics.jsonl", None, trackers=[tracker])
        log.log_model(final)
        log.close()
        listed = [a.path for a in MlflowClient(tracking_uri=tracker.uri).list_artifacts(tracker.run_id, "final")]
        assert listed == (["final/config.json"] if stored else []), value


def test_wandb_log_model_uploads_the_final_directory(tmp_path, monkeypatch):
    calls = []

    class Artifact:
        def __init__(self, name, type):
            calls.append(("artifact", name, type))

        def add_dir(self, path):
            calls.append(("add_dir", path))

    class Run:
        id = "r1"
        config = types.SimpleNamespace(update=lambda c, allow_val_change: None)
        log = finish = lambda *a, **k: None

        def log_artifact(self, artifact):
            calls.append(("log_artifact",))

    fake = types.ModuleType("wandb")
    fake.init, fake.Artifact = (lambda **kw: Run()), Artifact
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for when in ("false", "end"):
        (tracker,) = open_trackers(["wandb"], tmp_path, CONFIG, env={"WANDB_LOG_MODEL": when})
        tracker.log_model(tmp_path)
    assert calls == [("artifact", "model-r1", "model"), ("add_dir", str(tmp_path)), ("log_artifact",)]
