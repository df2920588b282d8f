"""Experiment tracking behind ``--logger``: TensorBoard, MLflow or Weights & Biases, one tracker run per
training run or study, besides the ``metrics.jsonl`` / ``summary.json`` / figures vitlab always writes.

Every backend gets the same four things: the hyper-parameters (the resolved run config), per-epoch metrics,
the final summary and figures (PNG files). A run folder keeps its tracker run's id in ``tracking.json``, so
``--resume`` continues the same tracker run. Backends import only when chosen; a missing one is one
:class:`~vitlab.errors.ConfigError` naming the extra to install.

Where each writes: TensorBoard event files in ``<output>/tensorboard``; MLflow to ``MLFLOW_TRACKING_URI``
(MLflow's default otherwise) in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``vitlab``); wandb to the
project ``WANDB_PROJECT`` (default ``vitlab``), its files under ``WANDB_DIR`` or ``<output>``, online or
offline as ``WANDB_MODE`` says.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Protocol

from vitlab.atomic import atomic_write_text
from vitlab.errors import ConfigError
from vitlab.outputs import TRACKING

LOGGERS = ("none", "tensorboard", "mlflow", "wandb")
MODULE = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}  # backend -> module it needs
STATE = TRACKING  # tracking.json: {"backend": ..., "run_id": ...} of the tracker run a run folder logs to
STATUSES = ("finished", "failed", "stopped")

Scalar = int | float | str | bool


class Tracker(Protocol):
    """What a training run or study logs; ``close`` ends the tracker run with one of :data:`STATUSES`."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_summary(self, summary: dict[str, Any]) -> None: ...

    def log_figure(self, path: Path) -> None: ...

    def close(self, status: str = "finished") -> None: ...


def check_logger(name: str) -> None:
    """Refuse an unknown ``--logger`` or one whose package is not installed, naming the fix."""
    if name not in LOGGERS:
        raise ConfigError(f"unknown logger {name!r}; choose one of {', '.join(LOGGERS)}")
    if name != "none" and importlib.util.find_spec(MODULE[name]) is None:
        raise ConfigError(f"--logger {name} needs the {MODULE[name]} package; install it with "
                          f"pip install 'vitlab[{name}]' (or pick another --logger)")


def open_tracker(name: str, out_dir: Path, *, run_name: str | None = None, start_step: int = 0) -> Tracker | None:
    """The tracker run of ``out_dir`` for backend ``name`` (None for ``none``); ``start_step`` is the last step
    already logged when a run resumes (TensorBoard drops later events a crash left behind)."""
    check_logger(name)
    if name == "none":
        return None
    out_dir = Path(out_dir)
    run_name = run_name or out_dir.resolve().name
    previous = _previous_run_id(out_dir, name)
    if name == "tensorboard":
        return TensorBoardTracker(out_dir, start_step)
    if name == "mlflow":
        return MlflowTracker(out_dir, run_name, previous)
    return WandbTracker(out_dir, run_name, previous)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Nested mappings as ``a.b`` keys; lists, tuples and None as their JSON text."""
    out: dict[str, Scalar] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)
    return out


def numbers(d: dict[str, Any]) -> dict[str, float]:
    """The finite-or-not numeric entries of ``d`` (booleans excluded) as floats."""
    return {k: float(v) for k, v in d.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _previous_run_id(out_dir: Path, backend: str) -> str | None:
    try:
        state = json.loads((out_dir / STATE).read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply to read
        return None
    if isinstance(state, dict) and state.get("backend") == backend and isinstance(state.get("run_id"), str):
        return state["run_id"]
    return None


def _remember(out_dir: Path, backend: str, run_id: str) -> None:
    atomic_write_text(out_dir / STATE, json.dumps({"backend": backend, "run_id": run_id}) + "\n")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ------------------------------------------------------------------------------------------ TensorBoard


class TensorBoardTracker:
    """Scalars per epoch, the params as text and in the HParams tab (with the summary numbers as its
    metrics), figures as images; event files in ``<out_dir>/tensorboard``."""

    def __init__(self, out_dir: Path, start_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = out_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=start_step + 1 if start_step else None)
        self.params: dict[str, Scalar] = {}
        self.step = start_step

    def log_params(self, params: dict[str, Any]) -> None:
        self.params.update(flatten(params))
        table = "\n".join(f"| {k} | {v} |" for k, v in self.params.items())
        self.writer.add_text("params", "| param | value |\n| --- | --- |\n" + table, self.step)
        self.writer.flush()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in numbers(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.step = max(self.step, step)
        self.writer.flush()

    def log_summary(self, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        values = {f"summary/{k}": v for k, v in numbers(summary).items()}
        for key, value in values.items():
            self.writer.add_scalar(key, value, self.step)
        if self.params:
            for item in hparams(self.params, values):
                self.writer.file_writer.add_summary(item)
        self.writer.flush()

    def log_figure(self, path: Path) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))  # (H, W, 3) uint8
        self.writer.add_image(f"figures/{Path(path).stem}", pixels, self.step, dataformats="HWC")
        self.writer.flush()

    def close(self, status: str = "finished") -> None:
        self.writer.close()


# ------------------------------------------------------------------------------------------ MLflow


class MlflowTracker:
    """An MLflow run (``MlflowClient``, no global active run, so a study's runs never nest by accident)."""

    STATUS = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}

    def __init__(self, out_dir: Path, run_name: str, previous: str | None) -> None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        try:
            self.client = MlflowClient()
            run_id = self._reopen(previous) if previous else None
            if run_id is None:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "vitlab"
                experiment = self.client.get_experiment_by_name(name)
                eid = experiment.experiment_id if experiment else self.client.create_experiment(name)
                run_id = self.client.create_run(eid, run_name=run_name,
                                                tags={"vitlab.output": str(out_dir.resolve())}).info.run_id
        except MlflowException as exc:
            raise ConfigError(f"--logger mlflow cannot open a run ({_one_line(exc)}); check MLFLOW_TRACKING_URI, "
                              "e.g. sqlite:///mlflow.db") from exc
        self.run_id = run_id
        _remember(out_dir, "mlflow", run_id)

    def _reopen(self, run_id: str) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException:
            return None  # the store no longer holds it (another tracking URI): start a new run
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        have = self.client.get_run(self.run_id).data.params
        flat = {_key(k): str(v)[:6000] for k, v in flatten(params).items()}
        new = [Param(k, v) for k, v in flat.items() if k not in have]
        # MLflow params are immutable: a value a resumed run changed (e.g. epochs) is kept as a tag
        changed = [RunTag(f"resumed.{k}", v) for k, v in flat.items() if k in have and have[k] != v]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i:i + 100])
        if changed:
            self.client.log_batch(self.run_id, tags=changed)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_key(k), v, now, step) for k, v in numbers(metrics).items()])

    def log_summary(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        values = numbers(summary)
        words = [RunTag(_key(f"summary.{k}"), str(v)) for k, v in summary.items() if k not in values and v is not None]
        self.client.log_batch(self.run_id, metrics=[Metric(_key(k), v, now, 0) for k, v in values.items()], tags=words)

    def log_figure(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path), "figures")

    def close(self, status: str = "finished") -> None:
        self.client.set_terminated(self.run_id, self.STATUS.get(status, "FAILED"))


def _key(name: str) -> str:
    """``name`` in the characters MLflow allows in keys (others become ``_``)."""
    return re.sub(r"[^\w\-. /:]", "_", name)


# ------------------------------------------------------------------------------------------ wandb


class WandbTracker:
    """A Weights & Biases run: the params as its config, metrics by epoch, the summary, figures as images."""

    def __init__(self, out_dir: Path, run_name: str, previous: str | None) -> None:
        import wandb

        directory = None if os.environ.get("WANDB_DIR") else str(out_dir)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "vitlab", name=run_name, dir=directory,
                                  id=previous, resume="allow" if previous else None,
                                  settings=wandb.Settings(console="off", silent=True))
        except Exception as exc:  # wandb raises its own errors (no login, no network) and plain ones
            raise ConfigError(f"--logger wandb cannot start a run ({_one_line(exc)}); run `wandb login`, or set "
                              "WANDB_MODE=offline to write the run locally and `wandb sync` it later") from exc
        self.wandb = wandb
        _remember(out_dir, "wandb", self.run.id)

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(numbers(metrics), step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if v is not None})

    def log_figure(self, path: Path) -> None:
        self.run.log({f"figures/{Path(path).stem}": self.wandb.Image(str(path))})

    def close(self, status: str = "finished") -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)
