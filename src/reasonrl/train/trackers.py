"""Experiment trackers users already run: TensorBoard, MLflow, Weights & Biases.

``log.report_to`` names any subset. Each tracker is an optional extra, imported only
when asked for; a missing package is an ImportError that names the pip command (the
CLI turns it into exit code 2 before any training happens). ``metrics.jsonl`` stays the
source of truth: trackers receive the same rows, numeric values only.

Resume: TensorBoard purges events logged after the checkpoint (``purge_step``); MLflow
and wandb continue the same run (its id is kept in ``trackers.json``) and receive the
replayed steps again, which both tools show as the latest value for that step.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Protocol

from reasonrl.recipe import flatten
from reasonrl.fsutil import atomic_write_text

TRACKERS = ("tensorboard", "mlflow", "wandb")
_IDS_FILE = "trackers.json"


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...

    # Optional: ``log_samples(step, split, rows)`` receives samples.jsonl's rows
    # (reasonrl.train.samples) as each tool shows text: TensorBoard text, an MLflow artifact,
    # a W&B table.


SAMPLE_COLUMNS = ("prompt", "completion", "answer", "reward", "advantage", "length", "stop_reason", "correct", "group")


def samples_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (TensorBoard renders text summaries as Markdown); cells
    escape ``|`` and show newlines as ``⏎`` so a completion stays on its row."""
    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("|", "\\|").replace("\n", "⏎")

    head = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(cell(r.get(c)) for c in SAMPLE_COLUMNS) + " |\n" for r in rows)


def _require(module: str, extra: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"log.report_to includes '{extra}', which needs the '{extra}' extra: "
                          f"pip install 'reasonrl[{extra}]'") from exc


class TensorBoardTracker:
    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events a crashed run wrote after its last checkpoint.
        self._writer = SummaryWriter(str(run_dir / "tensorboard"),
                                     purge_step=resume_step + 1 if resume_step is not None else None)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self._writer.add_text(f"samples/{split}", samples_markdown(rows), step)

    def close(self) -> None:
        self._writer.close()


class MlflowTracker:
    """Logs to ``$MLFLOW_TRACKING_URI`` if set, else ``log.mlflow_tracking_uri``, else a
    SQLite store beside the runs (``<output_dir>/mlflow.db``), so that
    ``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`` shows every run together."""

    def __init__(self, run_dir: Path, run_name: str, experiment: str, tracking_uri: str | None,
                 params: dict[str, Any], run_id: str | None) -> None:
        mlflow = _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        beside = run_dir.resolve().parent
        uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking_uri or f"sqlite:///{beside / 'mlflow.db'}"
        # With a SQLite store MLflow puts artifacts (samples.jsonl's rows) in ./mlruns of the working
        # directory unless the experiment says otherwise: keep them beside the store, in the runs folder.
        artifacts = (beside / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
        self._client = MlflowClient(uri)
        self.tracking_uri = uri
        if run_id is None:
            found = self._client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self._client.create_experiment(experiment, artifact_location=artifacts)
            run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
            # MLflow caps parameter values at 6000 characters; long lists are truncated, not refused.
            for key, value in params.items():
                self._client.log_param(run_id, key, str(value)[:6000])
        self.run_id = run_id
        self._mlflow = mlflow

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(self._mlflow.utils.time.get_current_time_millis())
        metrics = [Metric(mlflow_metric_name(key), float(v), now, step) for key, v in scalars.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        self._client.log_text(self.run_id, text, f"samples/{split}_step_{step:06d}.jsonl")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def mlflow_metric_name(key: str) -> str:
    """MLflow allows only alphanumerics and ``_ - . space : /`` in metric names:
    ``eval/pass@8`` → ``eval/pass_at_8``, ``eval/accuracy[(a+b)*c]`` → ``eval/accuracy._a_b_c_``."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_").replace("[", "."))


class WandbTracker:
    """Follows wandb's own settings (``WANDB_MODE``, ``WANDB_PROJECT``, login); the
    project defaults to ``log.experiment``. Offline runs land in ``RUN_DIR/wandb``."""

    def __init__(self, run_dir: Path, run_name: str, experiment: str, config: dict[str, Any],
                 run_id: str | None) -> None:
        wandb = _require("wandb", "wandb")
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", experiment), name=run_name,
                               dir=str(run_dir), config=config, id=run_id, resume="allow" if run_id else None,
                               reinit="create_new")
        self.run_id = self._run.id
        self._wandb = wandb

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        table = self._wandb.Table(columns=["step", *SAMPLE_COLUMNS], data=[[step, *(r.get(c) for c in SAMPLE_COLUMNS)] for r in rows])
        # commit=False: the step's metrics row, logged next at the same step, commits it.
        self._run.log({f"samples/{split}": table}, step=step, commit=False)

    def close(self) -> None:
        self._run.finish()


def check_trackers(names: list[str]) -> None:
    """Import each requested tracker's package, so a missing extra fails before training."""
    for name in names:
        _require(name, name)


def open_trackers(names: list[str], run_dir: Path, *, run_name: str, experiment: str,
                  mlflow_tracking_uri: str | None, config: dict[str, Any],
                  resume_step: int | None) -> list[Tracker]:
    ids_path = run_dir / _IDS_FILE
    ids = json.loads(ids_path.read_text()) if resume_step is not None and ids_path.exists() else {}
    trackers: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir, resume_step))
        elif name == "mlflow":
            trackers.append(MlflowTracker(run_dir, run_name, experiment, mlflow_tracking_uri,
                                          flatten(config), ids.get("mlflow")))
        elif name == "wandb":
            trackers.append(WandbTracker(run_dir, run_name, experiment, config, ids.get("wandb")))
        else:
            raise ValueError(f"unknown tracker '{name}'; allowed: {', '.join(TRACKERS)}")
    new_ids = {n: t.run_id for n, t in zip(names, trackers) if hasattr(t, "run_id")}
    if new_ids:
        atomic_write_text(ids_path, json.dumps(new_ids))
    return trackers
