"""The checkpoint stage of a run: the one place that reads a checkpoint to continue it and decides what may change,
restores a resumed run's state (:func:`restore`) and opens the run's folder (:func:`open_run_folder`).

``vitlab train --resume DIR`` continues the run saved in DIR bit-exactly: the run config stored there, with only
the options in :data:`RESUMABLE` changed by the command line, and the training state of its ``state.pt``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.checkpoint import CONFIG, STATE, load_train_state, read_config, read_spec, spec_of, state_mismatch
from vitlab.checkpoint.legacy import rename_legacy_keys
from vitlab.errors import CheckpointError, ConfigError
from vitlab.train.config import RunConfig
from vitlab.train.distributed import DistContext
from vitlab.train.lock import RunLock
from vitlab.train.logging import METRICS
from vitlab.train.optim import WarmupCosine
from vitlab.train.options import RESULT_NEUTRAL
from vitlab.train.progress import Progress

# run options a resumed run may change without breaking the continuation: the result-neutral ones, more epochs, and
# model options (the one model the run builds is checked against the checkpoint's architecture before its state loads)
RESUMABLE = RESULT_NEUTRAL | {"epochs", "model", "model_overrides"}


def resume_config(resume: str | Path, changes: dict[str, Any]) -> RunConfig:
    """The run config stored in checkpoint ``resume`` with ``changes`` (CLI flags) applied."""
    run = read_config(resume).get("run")
    if not isinstance(run, dict):
        raise CheckpointError(f"{resume}/{CONFIG} holds no run config to resume; start a new run")
    stored = RunConfig.from_dict({k: v for k, v in run.items() if k != "data"}, f"{resume}/{CONFIG}")
    # a resumed run continues in the folder it was resumed from (which may have been moved or copied), not in the
    # output path recorded when it started; --output still sends it elsewhere
    return stored.replace(**{"output": str(resume), **changes})


def resumed_run_config(resume: str | Path, options: dict[str, Any]) -> RunConfig:
    """The config of the run resumed from ``resume`` with the command line's ``options``; changing an option
    outside :data:`RESUMABLE` is refused."""
    cfg = resume_config(resume, {})
    stored = cfg.to_dict()
    changed = sorted(k for k, v in RunConfig.from_dict(options).to_dict().items()
                     if k in options and v != stored[k] and k not in RESUMABLE)
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
        raise ConfigError(f"cannot change {flags} when resuming (the run would not continue exactly); drop "
                          f"{'it' if len(changed) == 1 else 'them'}, or start a new run with another --output")
    options = dict(options)
    if "model_overrides" in options:
        options["model_overrides"] = {**stored["model_overrides"], **options["model_overrides"]}
    options.setdefault("output", resume)  # the folder resumed, wherever it was first written
    return cfg.replace(**options)


@dataclass
class Resume:
    """The checkpoint a run continues: its folder, its ``config.json`` and its training state."""

    path: Path
    config: dict[str, Any]
    state: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> Resume:
        state = load_train_state(path, verify=verify)
        return cls(Path(path), read_config(path), state)

    def check_architecture(self, model: nn.Module) -> None:
        """Refuse to load the saved state into a model of another architecture."""
        problem = state_mismatch(model.state_dict(), self.state["model"])
        if problem:
            saved = read_spec(self.path)
            raise CheckpointError(f"cannot resume {self.path}: it holds a {saved.label} model but this run "
                                  f"builds a {spec_of(model).label} model: {problem}; resume without "
                                  "--model / model flags, or start a new run")


def restore(resume: str | Path, *, verify: bool, model: nn.Module, optimizer: Any, scheduler: WarmupCosine,
            ema: Any, progress: Progress) -> None:
    """Load the training state saved in ``resume`` into the run's model (refused for another architecture),
    optimiser, schedule, EMA copy and progress record. ``verify=False`` accepts a ``state.pt`` whose SHA-256 no
    longer matches its ``manifest.json``."""
    resumed = Resume.load(resume, verify)
    state = resumed.state
    for key in ("model", "ema"):  # an older vitlab's names (CaiT's gamma_1/gamma_2) under today's
        if state.get(key) is not None:
            state[key] = rename_legacy_keys(state[key], model.state_dict())
    resumed.check_architecture(model)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if ema is not None:
        if state.get("ema") is None:
            raise CheckpointError(f"{resume}/{STATE} has no EMA weights but this run uses --ema-decay; "
                                  "resume with --ema-decay 0")
        ema.module.load_state_dict(state["ema"])
    progress.restore(state["progress"])


def open_run_folder(out_dir: Path, resume: str | Path | None, ctx: DistContext) -> RunLock:
    """Create the output folder and take its lock (rank 0, the only writer; the run releases it when it ends); a run
    resumed into another folder carries its ``metrics.jsonl`` there."""
    lock = RunLock(out_dir)
    if not ctx.is_main:
        return lock
    out_dir.mkdir(parents=True, exist_ok=True)
    lock.acquire()
    if resume is not None and Path(resume).resolve() != out_dir.resolve():
        src = Path(resume) / METRICS
        if src.is_file():
            shutil.copyfile(src, out_dir / METRICS)
    return lock
