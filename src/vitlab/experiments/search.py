"""Hyper-parameter search with Optuna (Akiba et al. 2019): a TPE sampler picks each trial's values from
ranges (``--range LOW:HIGH[:log][:int]``) or lists (``--values``), each trial trains one run, and a pruner
(median or Hyperband) stops unpromising runs from their per-epoch validation metric.

Trials are compared on a validation split, never on the test set: every trial holds out ``val_split`` of its
training images (10 % unless the run config sets ``val_split`` or ``val_size``, as ``vitlab train --val-split``),
the pruner and the best trial read its accuracy or loss, and each trial's test accuracy is measured once at the
end and reported beside it.

The study lives in ``<output>/optuna.db`` (SQLite), so invoking the same search again continues it up to
``trials`` finished trials: finished trials (complete, pruned, invalid or diverged) are never re-run, and a
trial that was interrupted is marked failed and re-run with the same values, resuming its run's checkpoint.
The sampler is reseeded from ``(seed, trial number)`` before each trial, so a search that was interrupted
and resumed picks the same values as one that ran straight through.

One file (about 400 lines): the trial function, the pruning and the resume rules of one search read together;
the report is :mod:`vitlab.experiments.search_report`.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.search_report import OBJECTIVES, write_search
from vitlab.experiments.sweep import MODEL, param_types
from vitlab.experiments.values import format_value, unknown_option
from vitlab.train.config import RESULT_NEUTRAL, coerce_to, parse_value

DB = "optuna.db"
STUDY = "vitlab-search"
PRUNERS = ("median", "hyperband", "none")
INSTALL = "--search optuna needs Optuna, which is not installed; run pip install 'vitlab[optuna]'"
HEARTBEAT_S = 60  # --storage: a running trial whose worker beat no heartbeat for 3 of these is failed and re-run
VAL_SPLIT = 0.1  # the validation share of every trial's training images when the run config holds none out


@dataclass
class SearchParam:
    """A searched option: a numeric range (``low``..``high``, ``log``, ``integer``) or a list of ``choices``."""

    name: str
    kind: str  # model | run
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: list[Any] | None = None

    def suggest(self, trial: Any) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, self.choices)
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def describe(self) -> str:
        if self.choices is not None:
            return f"{self.name} in {{{', '.join(format_value(c) for c in self.choices)}}}"
        flags = "".join(f":{f}" for f, on in (("log", self.log), ("int", self.integer)) if on)
        return f"{self.name} in {format_value(self.low)}:{format_value(self.high)}{flags}"


def parse_range(model: str, name: str, text: str) -> SearchParam:
    """``--param NAME --range LOW:HIGH[:log][:int]`` for ``model``; the option's type decides int or float."""
    name = name.strip().replace("-", "_")
    types = param_types(model)
    if name in types:
        kind, tp = types[name]
    elif model.startswith("timm:"):
        kind, tp = MODEL, float
    else:
        raise ConfigError(unknown_option(name, list(types), "search parameter"))
    parts = [t.strip() for t in str(text).split(":")]
    flags = parts[2:]
    if len(parts) < 2 or any(f not in ("log", "int") for f in flags) or len(set(flags)) != len(flags):
        raise ConfigError(f"--range {text!r} for {name} must be LOW:HIGH, LOW:HIGH:log or LOW:HIGH:int "
                          "(e.g. --range 1e-4:1e-2:log)")
    base = _base_type(tp)
    if base not in (int, float):
        raise ConfigError(f"{name} is not numeric; give its choices with --values instead of --range")
    integer = base is int or "int" in flags
    what = f"--range for {name}"
    low, high = (coerce_to(name, parse_value(t), float, what) for t in parts[:2])
    if integer and (low != int(low) or high != int(high)):
        raise ConfigError(f"{what}: {text!r} needs whole-number bounds for an integer option")
    if low >= high:
        raise ConfigError(f"{what}: LOW {format_value(low)} must be below HIGH {format_value(high)}")
    if "log" in flags and low <= 0:
        raise ConfigError(f"{what}: a log range needs LOW > 0, got {format_value(low)}")
    if integer:
        low, high = int(low), int(high)
    return SearchParam(name, kind, low, high, log="log" in flags, integer=integer)


def parse_choices(model: str, name: str, text: str) -> SearchParam:
    """``--param NAME --values A,B`` in a search: a categorical parameter (parsed as the grid parses it)."""
    from vitlab.experiments.sweep import parse_param

    p = parse_param(model, name, text)
    return SearchParam(p.name, p.kind, choices=p.values)


def _base_type(tp: Any) -> Any:
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def parse_search_params(model: str, pairs: list[tuple[str, str, str]]) -> list[SearchParam]:
    """``[(name, 'range' | 'values', text)]`` -> the search space, each name once."""
    if not pairs:
        raise ConfigError("give at least one --param NAME followed by --range LOW:HIGH or --values V1,V2,...")
    params = [parse_range(model, n, t) if how == "range" else parse_choices(model, n, t) for n, how, t in pairs]
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise ConfigError(f"--param {', '.join(sorted({n for n in names if names.count(n) > 1}))} is given twice; "
                          "give one --range or --values per parameter")
    return params


@dataclass
class SearchConfig:
    """Everything a search needs; ``base`` is the shared :class:`~vitlab.train.config.RunConfig`."""

    model: str
    dataset: str
    params: list[SearchParam]
    base: Any
    output: Path
    trials: int
    fixed: dict[str, Any] = field(default_factory=dict)
    pruner: str = "median"
    objective: str = "val_acc"
    seed: int = 0
    prune_startup: int = 5  # finished trials before the median pruner prunes any
    prune_warmup: int = 0  # epochs of every trial that are never pruned
    command: str = "vitlab sweep --search optuna"
    storage: str | None = None  # an Optuna RDB URL several processes or machines share (None: <output>/optuna.db)
    force: bool = False  # replace the files of the study's names in an --output folder vitlab did not claim

    def validate(self) -> None:
        """Refuse impossible settings; a run config without a validation split gets :data:`VAL_SPLIT`."""
        if self.objective.startswith("test_"):
            fix = self.objective.replace("test", "val")
            raise ConfigError(f"--objective {self.objective} would choose trials on the test set; the search "
                              f"chooses on its validation split: pass --objective {fix}")
        if self.base.val_split is None and self.base.val_size is None:
            self.base = self.base.replace(val_split=VAL_SPLIT)
        if self.trials < 1:
            raise ConfigError(f"--trials must be >= 1, got {self.trials}")
        if self.pruner not in PRUNERS:
            raise ConfigError(unknown_option(self.pruner, list(PRUNERS), "--pruner"))
        if self.objective not in OBJECTIVES:
            raise ConfigError(unknown_option(self.objective, list(OBJECTIVES), "--objective"))
        if self.prune_startup < 0 or self.prune_warmup < 0:
            raise ConfigError("--prune-startup and --prune-warmup must be >= 0")
        clash = [p.name for p in self.params if p.name in self.fixed]
        if clash:
            raise ConfigError(f"{', '.join(clash)} is searched by --param and fixed by --set; drop one of them")

    def signature(self) -> dict[str, Any]:
        """What a resumed search must share with the stored one (trials, pruner and seed may change)."""
        run = {k: v for k, v in self.base.to_dict().items() if k not in RESULT_NEUTRAL and k != "seed"}
        sig = {**run, "model": self.model, "dataset": self.dataset, "space": [p.describe() for p in self.params],
               "fixed": self.fixed, "objective": self.objective}
        return json.loads(json.dumps(sig, default=str))


def import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(INSTALL) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    return optuna


def make_pruner(config: SearchConfig) -> Any:
    optuna = import_optuna()
    if config.pruner == "median":  # steps are 1-based epochs: the first prune_warmup epochs are never pruned
        return optuna.pruners.MedianPruner(n_startup_trials=config.prune_startup,
                                           n_warmup_steps=config.prune_warmup + 1)
    if config.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=config.prune_warmup + 1,
                                              max_resource=config.base.epochs or "auto", reduction_factor=3)
    return optuna.pruners.NopPruner()


def open_study(config: SearchConfig) -> Any:
    """Create ``<output>/optuna.db`` or load it; a stored study with other settings is refused in one line."""
    optuna = import_optuna()
    out = config.output
    db = out / DB
    if config.storage is None and not db.exists() and any(out.glob("trial_*")):
        raise ConfigError(f"{out} holds trial folders but no {DB}; pass another --output (or delete the folder)")
    if config.storage is None:
        storage: Any = f"sqlite:///{db.resolve()}"
    else:  # shared: every worker beats a heartbeat, so a trial whose worker died is told apart from a live one
        try:
            storage = optuna.storages.RDBStorage(config.storage, heartbeat_interval=HEARTBEAT_S,
                                                 grace_period=3 * HEARTBEAT_S)
        except Exception as exc:  # noqa: BLE001 - a bad URL or an unreachable database: one line
            raise ConfigError(f"--storage {config.storage}: {type(exc).__name__}: {str(exc).splitlines()[0]}; pass "
                              "an RDB URL Optuna can open, e.g. sqlite:////shared/study.db or "
                              "postgresql://user@host/db") from None
    study = optuna.create_study(storage=storage, study_name=STUDY, load_if_exists=True,
                                direction=OBJECTIVES[config.objective], pruner=make_pruner(config))
    sig = config.signature()
    stored = study.user_attrs.get("signature")
    if stored is None:
        study.set_user_attr("signature", sig)
    elif stored != sig:
        diff = [f"{k} {json.dumps(stored.get(k))} there, {json.dumps(sig.get(k))} now" for k in {**stored, **sig}
                if stored.get(k) != sig.get(k)]
        raise ConfigError(f"{db} holds a search with other settings ({'; '.join(diff)}); pass another --output "
                          "for the new settings")
    return study


def finished(trial: Any) -> bool:
    """Whether a trial counts toward ``--trials``: complete, pruned, or failed for a reason of its own."""
    from optuna.trial import TrialState

    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and "error" in trial.user_attrs)


def requeue_interrupted(study: Any, shared: bool = False) -> list[int]:
    """Mark trials left running by a stopped process as failed and queue each interrupted trial once more
    with the same values (it resumes its run folder); returns the numbers queued. ``shared`` (a ``--storage``
    other workers use): only the running trials whose heartbeat stopped are failed, the others are live."""
    from optuna.storages import fail_stale_trials
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    if shared:
        fail_stale_trials(study)
    else:
        for t in trials:
            if t.state == TrialState.RUNNING:
                study.tell(t.number, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    rerun = {t.user_attrs.get("rerun_of") for t in trials}
    queued = []
    for t in trials:
        if t.state == TrialState.FAIL and not finished(t) and t.number not in rerun:
            study.enqueue_trial(t.params, user_attrs={"rerun_of": t.number, "run": t.user_attrs.get("run")},
                                skip_if_exists=False)
            queued.append(t.number)
    return queued


def trial_config(config: SearchConfig, values: dict[str, Any], run_dir: Path) -> Any:
    """The run config of one trial; an invalid combination raises :class:`ConfigError` naming it."""
    from vitlab.models import get_config

    overrides, run_fields = dict(config.fixed), {}
    for p in config.params:
        (overrides if p.kind == MODEL else run_fields)[p.name] = values[p.name]
    if not config.model.startswith("timm:"):
        get_config(config.model, **overrides)
    cfg = config.base.replace(model=config.model, model_overrides=overrides, seed=config.seed,
                              output=str(run_dir), **run_fields)
    cfg.validate()
    return cfg


def run_trial(study: Any, config: SearchConfig, log: Any) -> Any:
    """Ask for one trial, train it (pruning from its per-epoch metric) and tell the study how it ended."""
    import optuna
    from optuna.trial import TrialState

    from vitlab.checkpoint import CONFIG
    from vitlab.train.engine import NonFiniteLoss, train
    from vitlab.train.logging import read_metrics
    from vitlab.train.resume import resume_config
    from vitlab.train.seeding import derive_seed

    number = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=derive_seed(config.seed, number) % 2**32)
    trial = study.ask()
    values = {p.name: p.suggest(trial) for p in config.params}
    run = trial.user_attrs.get("run") or f"trial_{trial.number:04d}"
    trial.set_user_attr("run", run)
    run_dir = config.output / run
    where = ", ".join(f"{k}={format_value(v)}" for k, v in values.items())
    metric = config.objective

    def on_epoch(epoch: int, row: dict[str, Any]) -> bool:
        trial.report(float(row[metric]), epoch)
        trial.set_user_attr("epochs", epoch)
        return trial.should_prune()

    try:
        cfg = trial_config(config, values, run_dir)
    except ConfigError as exc:
        return _fail(study, trial, f"invalid: {exc}", log, where)
    resume = run_dir if (run_dir / CONFIG).is_file() else None
    if resume is not None:  # an interrupted trial continues with its stored config as `vitlab train --resume` does;
        # its finished epochs are reported to the new trial again
        cfg = resume_config(run_dir, {k: getattr(cfg, k) for k in ("output", "progress", "device", "threads")})
        for row in read_metrics(run_dir):
            on_epoch(int(row["epoch"]), row)
    log(f"[trial {trial.number}] {where}: training in {run_dir}" + (" (resumed)" if resume else ""))
    try:
        if resume is not None and trial.should_prune():
            result = None
        else:
            with heartbeat(study, trial):
                result = train(cfg, resume=resume, on_epoch=on_epoch)
    except NonFiniteLoss as exc:
        return _fail(study, trial, f"diverged: {exc}", log, where)
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    if result is not None and result.exit_code:
        study.tell(trial, state=TrialState.FAIL)
        raise KeyboardInterrupt
    if result is not None:
        trial.set_user_attr("train_time_s", result.summary.get("train_time_s"))
        trial.set_user_attr("test_acc", result.summary.get("final_test_acc"))  # reported, never compared
    if result is None or result.summary.get("stopped_early"):
        frozen = study.tell(trial, state=TrialState.PRUNED)
        log(f"[trial {trial.number}] {where}: pruned at epoch {frozen.last_step} ({_metric(metric, frozen.value)})")
    else:
        value = float(result.summary[f"final_{metric}"])
        frozen = study.tell(trial, value)
        log(f"[trial {trial.number}] {where}: complete ({_metric(metric, value)})")
    return frozen


@contextlib.contextmanager
def heartbeat(study: Any, trial: Any) -> Iterator[None]:
    """While a trial trains, record its heartbeat in a shared storage every :data:`HEARTBEAT_S` (Optuna beats it
    only inside ``Study.optimize``; these trials are asked and told), so other workers see it is alive."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = study._storage
    if not is_heartbeat_enabled(storage):
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial._trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="vitlab-trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _fail(study: Any, trial: Any, why: str, log: Any, where: str) -> Any:
    from optuna.trial import TrialState

    trial.set_user_attr("error", why)
    log(f"[trial {trial.number}] {where}: failed, {why}")
    return study.tell(trial, state=TrialState.FAIL)


def _metric(metric: str, value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return f"{metric} n/a"
    return f"validation accuracy {100 * value:.2f}%" if metric == "val_acc" else f"validation loss {value:.4f}"


def run_search(config: SearchConfig, log: Any = print) -> dict[str, Any]:
    """Run (or continue) the search in ``config.output`` until ``config.trials`` trials finished, then write
    trials.csv, history.png, curves.png, importance.png (when it can be computed), summary.json and
    index.html. Returns what the report says (``trials`` rows, ``best``, ``text``, ``figures``)."""
    config.validate()
    import_optuna()
    from vitlab.experiments.runs import check_output

    config.output = check_output(config.output, "search", force=config.force)
    study = open_study(config)
    for n in requeue_interrupted(study, shared=config.storage is not None):
        log(f"[trial {n}] was interrupted: marked failed, re-run with the same values")
    ran = 0
    while sum(finished(t) for t in study.get_trials(deepcopy=False)) < config.trials:
        run_trial(study, config, log)
        ran += 1
    return {**write_search(study, config, storage=DB if config.storage is None else _shown(config.storage)),
            "ran": ran}


def _shown(url: str) -> str:
    """A storage URL without its password, for the report."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, user = head.partition("://")
    return f"{scheme}://{user.partition(':')[0]}@{tail}"
