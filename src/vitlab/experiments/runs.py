"""Running the training runs of a study: each in its own sub-folder of the study, trained in-process or read back
when it already finished, with one progress line per run; and the study's own folder and tracker run.

A folder whose ``summary.json`` exists is read, not re-run, so a study interrupted half-way resumes where it
stopped when invoked again. The command-line side (argparse options, the run config they make, the command a
report shows) is :mod:`vitlab.commands.options`; values given as text are read by :mod:`vitlab.train.options`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.budget import undertrained
from vitlab.experiments.executors import SUMMARY, ExecutorConfig, RunTask, open_executor, read_summary, run_tasks
from vitlab.experiments.table import diverged, summary_value

Trainer = Callable[..., dict]  # (RunConfig, init=weights path or None) -> the run's summary dict


def train_run(cfg: Any, init: str | None = None) -> dict:
    """Train ``cfg`` in-process with :func:`vitlab.train.engine.train` and return its summary dict.

    A folder that already holds a checkpoint (an interrupted run) is resumed exactly. ``init`` starts the
    model from pretrained weights (``train(init_weights=...)``). A run stopped by Ctrl-C or SIGTERM raises
    :class:`KeyboardInterrupt`, so the study stops too; its checkpoint lets the next invocation resume.

    A run that diverges (non-finite loss or gradient) is a result of the study, not the end of it: its
    ``summary.json`` records ``diverged``, where, and the test accuracy of its last finite weights, and the
    study goes on (:func:`record_divergence`).
    """
    from vitlab.checkpoint import CONFIG
    from vitlab.train.engine import NonFiniteLoss, train

    run_dir = Path(cfg.output)
    try:
        if (run_dir / CONFIG).is_file():
            result = train(cfg, resume=run_dir)
        else:
            result = train(cfg, init_weights=init)
    except NonFiniteLoss as exc:
        if exc.summary is None:
            raise
        return record_divergence(run_dir, exc.summary)
    if result.exit_code:
        raise KeyboardInterrupt
    return result.summary


def record_divergence(run_dir: Path, summary: dict) -> dict:
    """Write a diverged run's ``summary`` as its ``summary.json`` (so the study reads it back as finished, like
    any deterministic result) and return it."""
    from vitlab.atomic import atomic_write_text

    atomic_write_text(run_dir / SUMMARY, json.dumps(summary, indent=2) + "\n")
    at = summary.get("diverged_at") or {}
    print(f"vitlab: {run_dir.name} diverged at epoch {at.get('epoch')} step {at.get('step')}; kept as a result "
          "(summary.json: diverged, the test accuracy of its last finite weights)", file=sys.stderr, flush=True)
    return summary


@dataclass
class RunSpec:
    """One training run of a study: its folder name, its run config and the columns that describe it."""

    name: str
    config: Any  # RunConfig; its ``output`` is set to the run's folder when it runs
    info: dict[str, Any] = field(default_factory=dict)
    init: str | None = None  # pretrained weights to start from (train's init_weights)


def run_or_load(spec: RunSpec, out_dir: Path, trainer: Trainer) -> tuple[dict, bool]:
    """``(summary, ran)``: the summary of ``out_dir / spec.name``, training it first unless it finished."""
    run_dir = out_dir / spec.name
    done = read_summary(run_dir)
    if done is not None:
        changed = changed_options(spec.config, run_dir)
        if changed:
            raise ConfigError(f"{run_dir} finished with other settings ({'; '.join(changed)}); pass another --output "
                              "for the new settings, or delete that run's folder to redo it")
        return done, False
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = trainer(spec.config.replace(output=str(run_dir)), init=spec.init)
    if not isinstance(summary, dict):
        raise ConfigError(f"the trainer returned {type(summary).__name__} for {run_dir}, not a summary dict")
    return summary, True


def changed_options(cfg: Any, run_dir: Path) -> list[str]:
    """The options ``cfg`` sets that differ from those the run in ``run_dir`` was trained with (its
    ``config.json``): run options against the stored run config, model options against the model that was
    built. The result-neutral options (:data:`vitlab.train.options.RESULT_NEUTRAL`: device, threads, output...) do
    not count. Empty when unknown."""
    from vitlab.checkpoint import ModelSpec, read_config
    from vitlab.train.options import RESULT_NEUTRAL

    try:
        config = read_config(run_dir)
        stored, built = config.get("run"), ModelSpec.from_dict(config["model"]).options()
    except (ValueError, TypeError, AttributeError):
        return []
    if not isinstance(stored, dict):
        return []
    out = []
    for key, value in cfg.to_dict().items():
        if key in RESULT_NEUTRAL or value is None or key not in stored:
            continue
        if key == "model_overrides":
            have = {**(stored[key] or {}), **built}
            out += [f"{k} {have.get(k)!r} there, {v!r} now" for k, v in value.items() if have.get(k) != v]
        elif stored[key] != value:
            out.append(f"{key} {stored[key]!r} there, {value!r} now")
    return out


def print_plans(specs: list[RunSpec], out_dir: str | Path, title: str) -> int:
    """``--dry-run`` of a study: each run's plan (:func:`vitlab.train.plan.plan_run`, one line: model, data,
    schedule, threads) as the study would train it in ``out_dir / spec.name`` (resumed where a checkpoint is there;
    a finished run is read back, not planned), and the FLOPs of those to train; nothing is trained or written."""
    from vitlab.checkpoint import CONFIG
    from vitlab.flops import human
    from vitlab.train.plan import plan_run

    out_dir, total, planned = Path(out_dir), 0, 0
    for i, spec in enumerate(specs):
        run_dir = out_dir / spec.name
        head = f"[{i + 1}/{len(specs)}] {title} {spec.name}"
        if read_summary(run_dir) is not None:
            print(f"{head}: finished, read back")
            continue
        cfg = spec.config.replace(output=str(run_dir))
        resume = run_dir if (run_dir / CONFIG).is_file() else None
        plan = plan_run(cfg, resume=resume, init_weights=None if resume else spec.init)
        flops = plan.estimated_flops()
        total, planned = total + (flops or 0), planned + 1
        print(f"{head}{' (resumed)' if resume else ''}: {plan.describe().removeprefix('vitlab train: ')}")
    print(f"{title}: {planned} of {len(specs)} runs to train, about {human(total, 'FLOPs')} (dry run: nothing is "
          f"trained or written, {out_dir} is not created)")
    return 0


class Progress:
    """One line per run on stderr: ``[3/12] name: ...`` with the elapsed time and an estimate of what is left."""

    def __init__(self, total: int, title: str, stream: Any = None) -> None:
        self.total, self.title, self.stream = total, title, stream or sys.stderr
        self.start = time.perf_counter()
        self.trained = 0
        self.train_seconds = 0.0
        self.done = 0

    def begin(self, name: str) -> float:
        print(f"[{self.done + 1}/{self.total}] {self.title} {name}: training", file=self.stream, flush=True)
        return time.perf_counter()

    def end(self, name: str, started: float | None, note: str) -> None:
        self.done += 1
        if started is not None:
            self.trained += 1
            self.train_seconds += time.perf_counter() - started
        left = self.total - self.done
        eta = f", about {_duration(left * self.train_seconds / self.trained)} left" if self.trained and left else ""
        how = "finished" if started is not None else "already finished, read back"
        print(f"[{self.done}/{self.total}] {self.title} {name}: {how}; {note} "
              f"(elapsed {_duration(time.perf_counter() - self.start)}{eta})", file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def run_all(specs: Sequence[RunSpec], out_dir: Path, *, trainer: Trainer | None = None, title: str = "run",
            finished_only: bool = False, executor: Any = None) -> list[tuple[RunSpec, dict]]:
    """Run (or read back) every spec; returns ``(spec, summary)`` pairs in ``specs`` order. ``finished_only``
    trains nothing: the specs without a finished run are left out (at least one must have finished).

    ``executor`` (:class:`vitlab.experiments.executors.ExecutorConfig`; None: one run at a time in this process)
    says where the runs train (a ``trainer`` given with worker processes must be importable by them); each calls
    :func:`vitlab.experiments.executors.train_task`. A run that failed on every attempt is kept in the table with
    a ``failed`` summary (no ``summary.json``: the next invocation tries it again)."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"two runs of this study share the folder name(s) {', '.join(dup)}; remove the repeated "
                          "values")
    config = executor if executor is not None else ExecutorConfig(workers=1)
    config.validate()
    if finished_only:
        finished = {s.name for s in specs if read_summary(out_dir / s.name) is not None}
        left = [s for s in specs if s.name not in finished]
        specs = [s for s in specs if s.name in finished]
        if not specs:
            raise ConfigError(f"no run of this study has finished in {out_dir} yet; drop --finished-only to train "
                              "them")
        if left:
            names = ", ".join(s.name for s in left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
            print(f"{title}: --finished-only leaves out {len(left)} run(s) not finished yet: {names}",
                  file=sys.stderr, flush=True)
    meter = Progress(len(specs), title)
    summaries: dict[str, dict] = {}
    pending = []
    for spec in specs:
        done = read_summary(out_dir / spec.name)
        if done is None:
            pending.append(spec)
            continue
        changed = changed_options(spec.config, out_dir / spec.name)
        if changed:
            raise ConfigError(f"{out_dir / spec.name} finished with other settings ({'; '.join(changed)}); pass "
                              "another --output for the new settings, or delete that run's folder to redo it")
        summaries[spec.name] = done
        meter.end(spec.name, None, _note(spec, done))
    if pending:
        by_name = {s.name: s for s in pending}
        started: dict[str, float] = {}

        def on_start(task: RunTask) -> None:
            started[task.name] = meter.begin(task.name)

        def on_end(task: RunTask, summary: dict, ran: bool) -> None:
            meter.end(task.name, started.get(task.name) if ran else None, _note(by_name[task.name], summary))

        pool, threads = open_executor(config, [s.config for s in pending], len(pending))
        tasks = [RunTask(s.name, s.config.replace(threads=threads) if threads else s.config, str(out_dir / s.name),
                         trainer or train_run, s.init) for s in pending]  # looked up now: a patched one too
        summaries.update(run_tasks(tasks, pool, retries=config.retries, on_start=on_start, on_end=on_end))
    return [(spec, summaries[spec.name]) for spec in specs]


def _note(spec: RunSpec, summary: dict) -> str:
    """The end of a run's progress line: its test accuracy and marks."""
    if summary.get("failed"):
        return f"failed ({summary['failed']})"
    acc = summary_value(summary, "test_acc")
    note = f"test accuracy {100 * acc:.2f}%" if acc == acc else ""
    if diverged(summary):
        note += f" (diverged at epoch {(summary.get('diverged_at') or {}).get('epoch')})"
    elif undertrained(summary, spec.config):
        note += " (far below the data set's reference: under-trained)"
    return note


def failed(summary: dict) -> bool:
    """Whether a run of a study failed on every attempt (its worker died or it raised): no result, a row marked
    failed."""
    return bool(summary.get("failed"))


def track_study(out: Path, logger: str, pairs: Sequence[tuple[RunSpec, dict]], params: dict[str, Any]) -> None:
    """Log a finished study to the ``--logger`` backend as one tracker run of its own (each training run has
    its own already): the study's settings as params, the number of runs and every run's final test accuracy as
    its summary (no best over runs: that would be chosen on the test set), and every figure (``*.png``) in
    ``out``."""
    from vitlab.train.tracking import open_tracker

    tracker = open_tracker(logger, out)
    if tracker is None:
        return
    accs = {f"test_acc/{spec.name}": summary_value(summary, "test_acc") for spec, summary in pairs}
    status = "failed"
    try:
        tracker.log_params(params)
        tracker.log_summary({"runs": len(pairs), **accs})
        for figure in sorted(out.glob("*.png")):
            tracker.log_figure(figure)
        status = "finished"
    finally:
        tracker.close(status)


_REPORT = ("summary.json", "index.html")
_TRACKED = ("tracking.json", "tensorboard", "wandb")  # what --logger writes beside the study's own files
STUDY_FILES: dict[str, tuple[str, ...]] = {  # what each study writes at the top of its folder (names, * patterns)
    "sweep": ("results.csv", "summary.csv", "sweep_*.png", *_REPORT, *_TRACKED),
    "compare": ("results.csv", "summary.csv", "compare.png", *_REPORT, *_TRACKED),
    "depth-study": ("results.csv", "summary.csv", "residual_ratios.csv", "collapse_layers.csv", "probes_*.csv",
                    "accuracy_vs_depth.png", "collapse_vs_depth.png", "residual_ratios.png", "similar_blocks.png",
                    "probes_*.png", "similarity_depth*.png", *_REPORT, *_TRACKED),
    "lr-sensitivity": ("results.csv", "summary.csv", "sensitivity.csv", "logits.csv", "loss_vs_lr.png",
                       "sensitivity_vs_depth.png", "max_logit_vs_lr.png", "logit_growth.png", *_REPORT),
    "complexity": ("complexity.csv", "fits.csv", "complexity.png", *_REPORT),
    "search": ("optuna.db", "trials.csv", "history.png", "curves.png", "importance.png", *_REPORT),
}


def check_output(path: str | Path, command: str, *, force: bool = False) -> Path:
    """The folder of a ``command`` study (a key of :data:`STUDY_FILES`), by the rule of :mod:`vitlab.outputs`:
    claimed (created, its marker written) when new, empty, the study's own (its marker, or the run folders an
    older vitlab wrote there) or holding none of the study's files; refused in one line when it holds any of
    them without the marker (unless ``force``) or is a run folder."""
    from vitlab import outputs

    return outputs.claim(path, command, STUDY_FILES[command], force=force, study=True)
