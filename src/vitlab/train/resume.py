"""The checkpoint stage of a run: a resumed run's training state loaded into what the run built (:func:`restore`),
and the run's folder opened (:func:`open_run_folder`).

``vitlab train --resume DIR`` continues the run saved in DIR bit-exactly. What it continues with is decided by its
plan (:mod:`vitlab.train.plan`): the record stored in DIR's config.json, the options the user changes compared with it
there, once (a change outside :data:`~vitlab.train.plan.RESUMABLE` is refused in one line naming the option and both
values; so is any other model). Here the state of ``state.pt`` is loaded, under today's parameter names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from vitlab.atomic import copy_file
from vitlab.checkpoint import CONFIG, STATE, load_train_state, read_config, spec_of, state_mismatch
from vitlab.checkpoint.legacy import rename_legacy_keys
from vitlab.errors import CheckpointError
from vitlab.train.config import RunConfig
from vitlab.train.distributed import DistContext
from vitlab.train.lock import RunLock
from vitlab.train.logging import METRICS
from vitlab.train.optim import WarmupCosine
from vitlab.train.plan import NOT_OPTIONS, RESUMABLE, check_run_options, model_differences
from vitlab.train.progress import Progress

__all__ = ["RESUMABLE", "check_run_options", "model_differences", "open_run_folder", "restore", "resume_config"]


def resume_config(resume: str | Path, changes: dict[str, Any], *, verify: bool = True) -> RunConfig:
    """The run config stored in checkpoint ``resume`` with ``changes`` applied, continued in ``resume`` (a search's
    interrupted trial); ``verify=False`` accepts a ``config.json`` whose SHA-256 no longer matches its manifest."""
    run = read_config(resume, verify=verify).get("run")
    if not isinstance(run, dict):
        raise CheckpointError(f"{resume}/{CONFIG} holds no run config to resume; start a new run")
    stored = RunConfig.from_dict({k: v for k, v in run.items() if k not in NOT_OPTIONS}, f"{resume}/{CONFIG}")
    return stored.replace(**{"output": str(resume), **changes})


def restore(resume: str | Path, *, verify: bool, model: nn.Module, optimizer: Any, scheduler: WarmupCosine,
            ema: Any, progress: Progress) -> None:
    """Load the training state saved in ``resume`` into the run's model, optimiser, schedule, EMA copy and progress
    record (an older vitlab's parameter names under today's). ``verify=False`` accepts a ``state.pt`` whose SHA-256
    no longer matches its ``manifest.json``."""
    state = load_train_state(resume, verify=verify)
    for key in ("model", "ema"):  # an older vitlab's names (CaiT's gamma_1/gamma_2) under today's
        if state.get(key) is not None:
            state[key] = rename_legacy_keys(state[key], model.state_dict())
    problem = state_mismatch(model.state_dict(), state["model"])
    if problem:  # the plan compared the stored model with this one: the state does not fit its own config
        label = spec_of(model).label
        raise CheckpointError(f"cannot resume {resume}: its {STATE} does not fit the {label} model of its "
                              f"{CONFIG} ({problem}); resume without --model / model flags, or start a new run")
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
