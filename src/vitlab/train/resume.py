"""The checkpoint stage of a run: the one place that reads a checkpoint to continue it and decides what may change,
restores a resumed run's state (:func:`restore`) and opens the run's folder (:func:`open_run_folder`).

``vitlab train --resume DIR`` continues the run saved in DIR bit-exactly: the run config stored there, with only
the options in :data:`RESUMABLE` changed by the command line, and the training state of its ``state.pt``. Every
other option, and every option of the model (weight shapes or not: ``num_heads``, ``global_pool``, a drop-path
rate), is compared with the stored ``config.json`` before the state loads; a difference is refused in one line
naming the option and both values (:func:`restore`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.atomic import copy_file
from vitlab.checkpoint import CONFIG, STATE, ModelSpec, load_train_state, read_config, spec_of, state_mismatch
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


def resume_config(resume: str | Path, changes: dict[str, Any], *, verify: bool = True) -> RunConfig:
    """The run config stored in checkpoint ``resume`` with ``changes`` (CLI flags) applied; ``verify=False``
    accepts a ``config.json`` whose SHA-256 no longer matches its ``manifest.json``."""
    run = read_config(resume, verify=verify).get("run")
    if not isinstance(run, dict):
        raise CheckpointError(f"{resume}/{CONFIG} holds no run config to resume; start a new run")
    stored = RunConfig.from_dict({k: v for k, v in run.items() if k != "data"}, f"{resume}/{CONFIG}")
    # a resumed run continues in the folder it was resumed from (which may have been moved or copied), not in the
    # output path recorded when it started; --output still sends it elsewhere
    return stored.replace(**{"output": str(resume), **changes})


def resumed_run_config(resume: str | Path, options: dict[str, Any], *, verify: bool = True) -> RunConfig:
    """The config of the run resumed from ``resume`` with the command line's ``options``; changing an option
    outside :data:`RESUMABLE` is refused, naming it and both values (the model's options are compared once the
    model is built, :func:`restore`)."""
    cfg = resume_config(resume, {}, verify=verify)
    stored = cfg.to_dict()
    given = RunConfig.from_dict(options).to_dict()
    check_run_options(stored, {k: v for k, v in given.items() if k in options})
    options = dict(options)
    if "model_overrides" in options:
        options["model_overrides"] = {**stored["model_overrides"], **options["model_overrides"]}
    options.setdefault("output", resume)  # the folder resumed, wherever it was first written
    return cfg.replace(**options)


def _differences(stored: dict[str, Any], now: dict[str, Any], keys: list[str]) -> list[str]:
    return [f"{k} {stored.get(k)!r} in the run, {now.get(k)!r} now" for k in keys]


def check_run_options(stored: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse run options in ``now`` (``RunConfig.to_dict()`` fields) that differ from the ``stored`` ones outside
    :data:`RESUMABLE`, in one line naming each option and both values."""
    changed = sorted(k for k, v in now.items() if k in stored and v != stored[k] and k not in RESUMABLE)
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
        details = "; ".join(_differences(stored, now, changed))
        raise ConfigError(f"cannot change {flags} when resuming ({details}): the run would not continue exactly; "
                          f"drop {'it' if len(changed) == 1 else 'them'}, or start a new run with another --output")


def model_differences(saved: ModelSpec, built: ModelSpec) -> list[str]:
    """Each option (``ModelConfig`` field, or timm keyword) in which two specs differ, with both values; the preset
    name aside (a label)."""
    if saved.is_timm != built.is_timm or saved.timm != built.timm:
        return [f"model {saved.label!r} in the run, {built.label!r} now"]
    a, b = (json.loads(json.dumps(s.options())) for s in (saved, built))  # as config.json stores them
    return _differences(a, b, [k for k in sorted(set(a) | set(b)) if k != "name" and a.get(k) != b.get(k)])


@dataclass
class Resume:
    """The checkpoint a run continues: its folder, its ``config.json`` and its training state."""

    path: Path
    config: dict[str, Any]
    state: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> Resume:
        state = load_train_state(path, verify=verify)
        return cls(Path(path), read_config(path, verify=verify), state)

    def check_architecture(self, model: nn.Module) -> None:
        """Refuse to load the saved state into another model: another architecture (other weight shapes), or any
        other model option (``num_heads``, ``global_pool``, a drop-path rate...), named with both values."""
        saved, built = ModelSpec.from_dict(self.config["model"]), spec_of(model)
        options = "; ".join(model_differences(saved, built)[:6])
        problem = state_mismatch(model.state_dict(), self.state["model"])
        if problem:
            raise CheckpointError(f"cannot resume {self.path}: it holds a {saved.label} model but this run "
                                  f"builds a {built.label} model: {problem}{f' ({options})' if options else ''}; "
                                  "resume without --model / model flags, or start a new run")
        if options:
            raise CheckpointError(f"cannot resume {self.path} exactly: the model differs from the run's ({options}); "
                                  "resume without --model / model flags, or start a new run with another --output")

    def check_run(self, cfg: RunConfig) -> None:
        """Refuse a run config that differs from the stored one outside :data:`RESUMABLE` (the data, the recipe, the
        augmentation, the seed), naming each option and both values."""
        run = {k: v for k, v in (self.config.get("run") or {}).items() if k != "data"}
        stored = RunConfig.from_dict(run, f"{self.path}/{CONFIG}").to_dict()
        check_run_options(stored, {k: v for k, v in cfg.to_dict().items() if k not in ("model", "model_overrides")})


def restore(resume: str | Path, *, verify: bool, model: nn.Module, optimizer: Any, scheduler: WarmupCosine,
            ema: Any, progress: Progress, cfg: RunConfig | None = None) -> None:
    """Load the training state saved in ``resume`` into the run's model, optimiser, schedule, EMA copy and progress
    record; refused when the model or (given ``cfg``, the run's resolved config) a run option outside
    :data:`RESUMABLE` differs from the stored ones. ``verify=False`` accepts a ``state.pt`` or ``config.json`` whose
    SHA-256 no longer matches its ``manifest.json``."""
    resumed = Resume.load(resume, verify)
    if cfg is not None:
        resumed.check_run(cfg)
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
            copy_file(src, out_dir / METRICS)  # atomic: a link there is replaced, not written through
    return lock
