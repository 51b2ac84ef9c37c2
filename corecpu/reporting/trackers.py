"""Experiment trackers (--report-to): TensorBoard, MLflow, Weights & Biases, on rank 0 only.

Each tracker is an optional extra, imported only when asked for. They read the
environment variables Hugging Face transformers' integrations read, so a setup that
works with `Trainer` works here:

  TensorBoard  TENSORBOARD_LOGGING_DIR (default OUTPUT_DIR/tensorboard)
  MLflow       MLFLOW_TRACKING_URI (default a local file store, OUTPUT_DIR/mlruns),
               MLFLOW_EXPERIMENT_NAME (default: MLflow's Default experiment), MLFLOW_TAGS (JSON),
               MLFLOW_RUN_ID (continue that run instead of starting one),
               HF_MLFLOW_LOG_ARTIFACTS=1 (the final model, final/, as the run's artifacts, under "final")
  wandb        WANDB_PROJECT (default "corecpu"), WANDB_MODE (e.g. offline; read by wandb itself),
               WANDB_LOG_MODEL=end (the final model as a "model" artifact; "checkpoint" uploads it at the end too)

`--report-to all` is every tracker whose package is installed, as transformers' report_to="all".

Usage (rank 0):
    names = parse_report_to(cfg.report_to)          # every rank, at set-up: bad names fail early
    trackers = open_trackers(names, out, cfg.to_dict(), env=os.environ, rank=run.rank)
    metrics = MetricsLog(out / "metrics.jsonl", resume_step, trackers=trackers)
MetricsLog then forwards every record it writes to every tracker at the record's step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from corecpu.errors import CoreCPUError, install_extra

# tracker name -> (module that must import, pyproject extra that installs it)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
MLFLOW_PARAM_MAX = 250  # MLflow rejects longer parameter values (transformers drops them too)
MLFLOW_BATCH = 100  # MLflow's limit of params per log_batch call


class Tracker(Protocol):
    def log_config(self, config: Mapping[str, Any]) -> None: ...
    def log(self, record: Mapping[str, Any], step: int) -> None: ...
    def log_model(self, final: Path) -> None: ...  # the exported model, where the tracker's variables ask for it
    def close(self) -> None: ...


def truthy(value: str | None) -> bool:
    """transformers' reading of a yes/no variable (HF_MLFLOW_LOG_ARTIFACTS)."""
    return (value or "").strip().upper() in ("1", "TRUE", "YES", "ON")


# ---------------------------------------------------------------- pure decisions

def parse_report_to(spec: str, find_spec: Callable[[str], Any] = importlib.util.find_spec) -> list[str]:
    """Tracker names from a comma list; [] for 'none'. Fails on unknown names and missing packages."""
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    if not names or names == ["none"]:
        return []
    if names == ["all"]:  # transformers' report_to="all": whatever is installed, possibly nothing
        return [name for name, (module, _) in TRACKERS.items() if find_spec(module) is not None]
    if "all" in names:
        raise CoreCPUError(f"report-to {spec!r} mixes 'all' with trackers; give either 'all' or a list of trackers")
    if "none" in names:
        raise CoreCPUError(f"report-to {spec!r} mixes 'none' with trackers; give either 'none' or a list of trackers")
    for name in names:
        if name not in TRACKERS:
            raise CoreCPUError(f"unknown tracker {name!r} in report-to; use none or a comma list of: "
                               f"{', '.join(TRACKERS)}")
    for name in names:
        module, extra = TRACKERS[name]
        if find_spec(module) is None:
            raise CoreCPUError(f"reporting to {name} needs the {module} package; {install_extra(extra)}")
    return list(dict.fromkeys(names))  # keep order, drop repeats


def numeric_items(record: Mapping[str, Any]) -> dict[str, float]:
    """The values a tracker can plot: ints and finite floats; strings, None and NaN are skipped."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def rewrite_keys(values: Mapping[str, float]) -> dict[str, float]:
    """transformers' rewrite_logs naming: eval_loss -> eval/loss, loss -> train/loss."""
    return {(f"eval/{k[5:]}" if k.startswith("eval_") else f"train/{k}"): v for k, v in values.items()}


def flat_params(config: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """Config as flat hyper-parameters: nested dicts joined with '.', other values as text."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in flat_params(value).items()})
        elif isinstance(value, (str, int, float, bool)):
            out[key] = value
        else:
            out[key] = json.dumps(value, default=str)
    return out


def tensorboard_dir(output_dir: str | Path, env: Mapping[str, str]) -> Path:
    explicit = env.get("TENSORBOARD_LOGGING_DIR")
    return Path(explicit).expanduser() if explicit else Path(output_dir) / "tensorboard"


def mlflow_settings(output_dir: str | Path, env: Mapping[str, str]) -> tuple[str, str | None]:
    """(tracking URI, experiment name or None for MLflow's Default experiment)."""
    uri = env.get("MLFLOW_TRACKING_URI") or (Path(output_dir).resolve() / "mlruns").as_uri()
    return uri, env.get("MLFLOW_EXPERIMENT_NAME") or None


def is_file_store(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri and not uri.startswith(("databricks", "sqlite"))


# ---------------------------------------------------------------- trackers

class TensorBoardTracker:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log_config(self, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        # The HParams tab, written into this run's own event file (add_hparams would start a new run).
        for summary in hparams(flat_params(config), {}):
            self._writer.file_writer.add_summary(summary)
        self._writer.add_text("config", "```\n" + json.dumps(dict(config), indent=2, default=str) + "\n```")

    def log(self, record: Mapping[str, Any], step: int) -> None:
        for key, value in rewrite_keys(numeric_items(record)).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def log_model(self, final: Path) -> None:
        pass  # TensorBoard keeps scalars, not models

    def close(self) -> None:
        self._writer.close()


class MLflowTracker:
    def __init__(self, uri: str, experiment: str | None, run_name: str, tags: Mapping[str, str] | None = None,
                 run_id: str | None = None, log_artifacts: bool = False) -> None:
        self.log_artifacts = log_artifacts  # HF_MLFLOW_LOG_ARTIFACTS
        if is_file_store(uri):
            # MLflow 3 refuses the file store unless asked; a local directory is what the user chose here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        if run_id:  # MLFLOW_RUN_ID: continue that run, e.g. after --resume
            self.run_id = self._client.get_run(run_id).info.run_id
            self._client.update_run(self.run_id, status="RUNNING")
            for key, value in (tags or {}).items():
                self._client.set_tag(self.run_id, key, value)
            return
        experiment_id = "0"
        if experiment:
            found = self._client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {})).info.run_id

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)) for k, v in flat_params(config).items() if len(str(v)) <= MLFLOW_PARAM_MAX]
        for i in range(0, len(params), MLFLOW_BATCH):
            self._client.log_batch(self.run_id, params=params[i:i + MLFLOW_BATCH])

    def log(self, record: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in numeric_items(record).items()]
        if metrics:
            self._client.log_batch(self.run_id, metrics=metrics)

    def log_model(self, final: Path) -> None:
        if self.log_artifacts:
            self._client.log_artifacts(self.run_id, str(final), artifact_path="final")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


class WandbTracker:
    def __init__(self, project: str, run_dir: Path, run_name: str, log_model: str = "false") -> None:
        import wandb  # WANDB_MODE (offline, disabled) and the API key are read by wandb itself

        self._wandb = wandb
        self.log_model_when = log_model.strip().lower()  # WANDB_LOG_MODEL: end, checkpoint (legacy: true), false
        run_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project, dir=str(run_dir), name=run_name)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log(self, record: Mapping[str, Any], step: int) -> None:
        self._run.log(rewrite_keys(numeric_items(record)), step=step)

    def log_model(self, final: Path) -> None:
        if self.log_model_when in ("end", "checkpoint", "true", "1"):
            artifact = self._wandb.Artifact(name=f"model-{self._run.id}", type="model")
            artifact.add_dir(str(final))
            self._run.log_artifact(artifact)

    def close(self) -> None:
        self._run.finish()


def open_trackers(names: Sequence[str], output_dir: str | Path, config: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None, rank: int = 0) -> list[Tracker]:
    """Start one tracker per name and log the resolved config to each as hyper-parameters; [] off rank 0."""
    if rank != 0:
        return []  # one run per job in every tracker, not one per rank
    env = os.environ if env is None else env
    output_dir = Path(output_dir)
    run_name = output_dir.resolve().name
    trackers: list[Tracker] = []
    try:
        for name in names:
            if name == "tensorboard":
                trackers.append(TensorBoardTracker(tensorboard_dir(output_dir, env)))
            elif name == "mlflow":
                uri, experiment = mlflow_settings(output_dir, env)
                tags = json.loads(env["MLFLOW_TAGS"]) if env.get("MLFLOW_TAGS") else None
                trackers.append(MLflowTracker(uri, experiment, run_name, tags, env.get("MLFLOW_RUN_ID") or None,
                                              log_artifacts=truthy(env.get("HF_MLFLOW_LOG_ARTIFACTS"))))
            elif name == "wandb":
                trackers.append(WandbTracker(env.get("WANDB_PROJECT") or "corecpu", output_dir, run_name,
                                             log_model=env.get("WANDB_LOG_MODEL") or "false"))
            else:
                raise CoreCPUError(f"unknown tracker {name!r}; use one of: {', '.join(TRACKERS)}")
        if config is not None:
            for tracker in trackers:
                tracker.log_config(config)
    except ImportError as exc:
        close_all(trackers)
        module, extra = TRACKERS.get(name, (name, name))
        raise CoreCPUError(f"reporting to {name} failed to import {exc.name or module}; "
                           f"{install_extra(extra)}") from None
    except json.JSONDecodeError as exc:
        close_all(trackers)
        raise CoreCPUError(f"MLFLOW_TAGS is not valid JSON ({exc.msg}); set it to a JSON object or unset it") from None
    return trackers


def close_all(trackers: Sequence[Tracker]) -> None:
    for tracker in trackers:
        tracker.close()
