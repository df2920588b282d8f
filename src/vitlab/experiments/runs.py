"""Running the training runs of a study: each in its own sub-folder of the study, trained in-process or read back
when it already finished, with one progress line per run; and the study's own folder and tracker run.

A run whose record verifies (:mod:`vitlab.experiments.record`: a complete ``summary.json``, its ``config.json``
under the manifest's checksum and equal to the cell's settings) is read back, not re-run, so a study interrupted
half-way resumes where it stopped when invoked again; a run folder that can be neither read back nor trained over
is refused before anything is written. A run whose spec names a ``source`` (a finished run of another study that its
caller verified against the run's settings: ``vitlab depth-study --lr-from``) is copied in instead of trained
(:func:`copy_run`). A study ends with :func:`exit_status`: 0 when every run finished,
:data:`RUNS_FAILED` (3) when some failed, each named in one line. The command-line side (argparse options, the
run config they make, the command a report shows) is :mod:`vitlab.commands.options`; values given as text are read
by :mod:`vitlab.train.config`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.budget import undertrained
from vitlab.experiments.executors import ExecutorConfig, RunTask, open_executor, run_tasks
from vitlab.experiments.record import SUMMARY, check_run, finished_run
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
        return record_divergence(run_dir, {**exc.summary, "run_config": cfg.to_dict()})
    if result.exit_code:
        raise KeyboardInterrupt
    return result.summary


def record_divergence(run_dir: Path, summary: dict) -> dict:
    """Write a diverged run's ``summary`` as its ``summary.json`` (so the study reads it back as finished, like
    any deterministic result) and return it. :func:`train_run` adds the run config it trained (``run_config``):
    a run that diverged before its first checkpoint has no ``config.json``, and the study compares that instead."""
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
    # a finished run folder elsewhere (another study's) whose record its caller verified against ``config``:
    # :func:`run_study` copies it in (:func:`copy_run`) instead of training, when the study has no folder of this name
    source: str | None = None


def run_or_load(spec: RunSpec, out_dir: Path, trainer: Trainer) -> tuple[dict, bool]:
    """``(summary, ran)``: the summary of ``out_dir / spec.name``, training it first unless it finished (its record
    verified by :func:`vitlab.experiments.record.finished_run`)."""
    run_dir = out_dir / spec.name
    done = finished_run(run_dir, spec.config)
    if done is not None:
        return done, False
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = trainer(spec.config.replace(output=str(run_dir)), init=spec.init)
    if not isinstance(summary, dict):
        raise ConfigError(f"the trainer returned {type(summary).__name__} for {run_dir}, not a summary dict")
    return summary, True


def copy_run(source: Path, run_dir: Path, cfg: Any) -> dict:
    """Copy the finished run folder ``source`` to ``run_dir`` (which must not exist yet) and return its summary: the
    files go to a temporary sibling first (each fsynced, the run's lock left behind), whose record must verify
    against ``cfg`` (:func:`vitlab.experiments.record.finished_run`) before it is renamed to ``run_dir``, so the
    name never holds half a copy; an interrupted or failed copy removes the sibling. The copied ``config.json``
    keeps the ``output`` it was trained in: a result-neutral option, so the copy reads back like any run."""
    import shutil
    import tempfile

    from vitlab.experiments.record import UnverifiedRun
    from vitlab.outputs import LOCK

    def synced(src: str, dst: str) -> None:
        shutil.copy2(src, dst)
        with open(dst, "rb") as fh:
            os.fsync(fh.fileno())

    for stale in run_dir.parent.glob(f".{run_dir.name}.*.copy"):  # a copy killed before its rename (SIGKILL)
        shutil.rmtree(stale, ignore_errors=True)  # the study's lock is held: no other process copies here now
    tmp = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f".{run_dir.name}.", suffix=".copy"))
    try:
        shutil.copytree(source, tmp, symlinks=True, ignore=shutil.ignore_patterns(LOCK), copy_function=synced,
                        dirs_exist_ok=True)
        summary = finished_run(tmp, cfg)
        if summary is None:
            raise UnverifiedRun(f"{source} changed while it was copied and is no finished run now; run the study "
                                "again")
        os.rename(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with contextlib.suppress(OSError):  # the new name, on disk
        fd = os.open(run_dir.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return summary


def changed_options(cfg: Any, run_dir: Path) -> list[str]:
    """The options ``cfg`` sets that differ from those the run in ``run_dir`` was trained with (its ``config.json``,
    which must verify against its manifest: :class:`~vitlab.experiments.record.UnverifiedRun` otherwise): run
    options against the stored run config, model options against the model that was built. The result-neutral
    options (:data:`vitlab.train.config.RESULT_NEUTRAL`: device, threads, output...) do not count."""
    from vitlab.checkpoint import ModelSpec
    from vitlab.errors import CheckpointError
    from vitlab.experiments.record import UnverifiedRun, setting_differences, verified_config

    try:
        config = verified_config(Path(run_dir))
    except CheckpointError as exc:
        raise UnverifiedRun(f"the run folder {run_dir} cannot be verified ({str(exc).split('; ')[0]})") from None
    stored = config["run"] if isinstance(config.get("run"), dict) else {}
    return setting_differences(cfg, stored, ModelSpec.from_dict(config["model"]).options())


def print_plans(specs: list[RunSpec], out_dir: str | Path, title: str) -> int:
    """``--dry-run`` of a study: each run's plan (:func:`vitlab.train.plan.plan_run`, one line: model, data,
    schedule, threads) as the study would train it in ``out_dir / spec.name`` (resumed where a checkpoint is there;
    a finished run is read back, not planned), and the FLOPs of those to train; nothing is trained or written. A
    run another live process is training (a study already running in that folder) is listed as such: the study
    waits for it and reads it back, so a running study's plan can be looked at."""
    from vitlab.checkpoint import CONFIG
    from vitlab.experiments.record import finished_run
    from vitlab.flops import human
    from vitlab.train.lock import RunBusy, check_free
    from vitlab.train.plan import plan_run

    out_dir, total, planned, elsewhere = Path(out_dir), 0, 0, 0
    for i, spec in enumerate(specs):
        run_dir = out_dir / spec.name
        head = f"[{i + 1}/{len(specs)}] {title} {spec.name}"
        if finished_run(run_dir, spec.config) is not None:  # the study's one decision of "finished"
            print(f"{head}: finished, read back")
            continue
        if spec.source and not os.path.lexists(run_dir):
            print(f"{head}: reused from {spec.source} (copied, not trained)")
            continue
        try:
            check_free(run_dir)
        except RunBusy as busy:
            elsewhere += 1
            print(f"{head}: being trained now by another vitlab run ({busy.holder or 'a live process'}); the study "
                  "waits for it and reads it back")
            continue
        cfg = spec.config.replace(output=str(run_dir))
        resume = run_dir if (run_dir / CONFIG).is_file() else None
        plan = plan_run(cfg, resume=resume, init_weights=None if resume else spec.init)
        flops = plan.estimated_flops()
        total, planned = total + (flops or 0), planned + 1
        print(f"{head}{' (resumed)' if resume else ''}: {plan.describe().removeprefix('vitlab train: ')}")
    where = f"{out_dir} is not created" if not os.path.lexists(out_dir) else f"nothing in {out_dir} changes"
    now = f"; {elsewhere} being trained now by another run" if elsewhere else ""
    print(f"{title}: {planned} of {len(specs)} runs to train, about {human(total, 'FLOPs')}{now} (dry run: nothing "
          f"is trained or written, {where})")
    return 0


class Progress:
    """One line per run on stderr: ``[3/12] name: ...`` with the elapsed time and an estimate of what is left: the
    mean time of a run trained so far, times the rounds of ``slots`` parallel runs (workers) the runs left need."""

    def __init__(self, total: int, title: str, stream: Any = None, slots: int = 1) -> None:
        self.total, self.title, self.stream = total, title, stream or sys.stderr
        self.slots = max(1, slots)
        self.start = time.perf_counter()
        self.trained = 0
        self.train_seconds = 0.0
        self.done = 0

    def begin(self, name: str) -> float:
        print(f"[{self.done + 1}/{self.total}] {self.title} {name}: training", file=self.stream, flush=True)
        return time.perf_counter()

    def end(self, name: str, started: float | None, note: str, *, failed: bool = False,
            source: str | None = None) -> None:
        self.done += 1
        if started is not None:
            self.trained += 1
            self.train_seconds += time.perf_counter() - started
        left = self.total - self.done
        rounds = -(-left // self.slots)  # ceil: the last round may run fewer than slots runs
        eta = f", about {_duration(rounds * self.train_seconds / self.trained)} left" if self.trained and left else ""
        how = "failed" if failed else "finished" if started is not None else \
            f"reused from {source}" if source else "already finished, read back"
        how += " " if failed else "; "
        print(f"[{self.done}/{self.total}] {self.title} {name}: {how}{note} "
              f"(elapsed {_duration(time.perf_counter() - self.start)}{eta})", file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plan_runs(specs: Sequence[RunSpec], out_dir: Path, *, title: str = "run", finished_only: bool = False
              ) -> tuple[list[RunSpec], dict[str, dict], list[RunSpec]]:
    """Before anything is written: every run's settings validated and its folder judged by
    :func:`vitlab.experiments.record.check_run`. Returns the specs of the study (``finished_only``: those that
    finished), the verified summaries of the finished ones by name, and the specs left to train. A run folder
    that can be neither read back nor trained over is refused here, in one line
    (:class:`~vitlab.experiments.record.UnverifiedRun`)."""
    from vitlab.models import get_config

    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"two runs of this study share the folder name(s) {', '.join(dup)}; remove the repeated "
                          "values")
    for spec in specs:
        try:
            spec.config.validate()
            if spec.config.model and not spec.config.model.startswith("timm:"):
                get_config(spec.config.model, **dict(spec.config.model_overrides or {}))
        except ConfigError as exc:
            raise ConfigError(f"the run {spec.name} is invalid: {exc}") from None
    done: dict[str, dict] = {}
    pending: list[RunSpec] = []
    for spec in specs:
        summary, note = check_run(out_dir / spec.name, spec.config)
        if summary is not None:
            done[spec.name] = summary
            continue
        pending.append(spec)
        if note and not finished_only:
            print(f"{title} {spec.name}: {note}", file=sys.stderr, flush=True)
    if finished_only:
        left, specs = pending, [s for s in specs if s.name in done]
        pending = []
        if not specs:
            raise ConfigError(f"no run of this study has finished in {out_dir} yet; drop --finished-only to train "
                              "them")
        if left:
            names = ", ".join(s.name for s in left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
            print(f"{title}: --finished-only leaves out {len(left)} run(s) not finished yet: {names}",
                  file=sys.stderr, flush=True)
    return list(specs), done, pending


def run_all(specs: Sequence[RunSpec], out_dir: Path, *, trainer: Trainer | None = None, title: str = "run",
            finished_only: bool = False, executor: Any = None) -> list[tuple[RunSpec, dict]]:
    """Run (or read back) every spec in the study folder ``out_dir``; returns ``(spec, summary)`` pairs in
    ``specs`` order. A run is read back only when its record verifies (:func:`vitlab.experiments.record.check_run`).
    ``finished_only`` trains nothing: the specs without a finished run are left out (at least one must have
    finished).

    ``executor`` (:class:`vitlab.experiments.executors.ExecutorConfig`; None: one run at a time in this process)
    says where the runs train (a ``trainer`` given with worker processes must be importable by them); each calls
    :func:`vitlab.experiments.executors.train_task`. A run that failed is kept in the table with a ``failed``
    summary (no ``summary.json``: the next invocation tries it again); :func:`exit_status` says so.
    :func:`run_study` does the same and claims the study folder once nothing is left to refuse."""
    config = executor if executor is not None else ExecutorConfig(workers=1)
    config.validate()
    specs, done, pending = plan_runs(specs, out_dir, title=title, finished_only=finished_only)
    pool = open_executor(config, [s.config for s in pending], len(pending)) if pending else None
    return _execute(specs, out_dir, done, pending, pool, config.retries, trainer, title)


Follow = Callable[[dict[str, dict]], list["RunSpec"]]  # the summaries so far -> runs to add to the study


def run_study(specs: Sequence[RunSpec], output: str | Path, kind: str, *, force: bool = False, command: str = "",
              trainer: Trainer | None = None, title: str = "run", finished_only: bool = False,
              executor: Any = None, follow: Follow | None = None) -> tuple[Path, list[tuple[RunSpec, dict]]]:
    """:func:`run_all` for a ``kind`` study (a key of :data:`STUDY_FILES`) into the folder ``output``, in the order
    of the folder rule (:mod:`vitlab.outputs`): everything that can refuse the study does so before the folder is
    claimed (the folder itself, the report's text ``command``, each run's settings and folder, the executor: Ray
    installed and its cluster answering), so an input refused at the start leaves no folder behind; a study stopped
    by an error removes the run folders it created and left empty, and its folder when it created it and nothing is
    in it. A run whose spec names a ``source`` and that has no folder in ``output`` yet is copied from there once the
    folder is claimed (:func:`copy_run`), not trained (``finished_only``: left out).

    ``follow(summaries)`` (not with ``finished_only``) adds runs while the study runs: it is given every summary so
    far (finished runs read back, then each run as it ends) and returns the runs to add, never one it returned
    before; a run it adds that already finished is read back (and ``follow`` asked again), the others train in the
    same worker pool as soon as a slot frees up, before the runs still queued (never copied: their ``source`` is
    not read). Returns the folder and the pairs, the added runs after ``specs`` in the order they were added."""
    from vitlab import outputs

    out = Path(output).expanduser()
    outputs.check(out, kind, STUDY_FILES[kind], force=force, study=True)
    outputs.check_text(command, "the command line")
    config = executor if executor is not None else ExecutorConfig(workers=1)
    config.validate()
    specs, done, pending = plan_runs(specs, out, title=title, finished_only=finished_only)
    if follow is not None and finished_only:
        raise ValueError("run_study: follow adds runs to train; finished_only trains none")
    if follow is not None:  # what the runs read back already determine, planned before the pool is sized
        added, found, left = _follow_all(follow, done, out, title)
        specs, pending = [*specs, *added], [*pending, *left]
        done.update(found)
    copies = [s for s in pending if s.source and not os.path.lexists(out / s.name)]
    pending = [s for s in pending if s not in copies]
    new = not os.path.lexists(out)
    made = [s.name for s in pending if not os.path.lexists(out / s.name)]
    slots = len(pending) if follow is None else max(len(pending), config.workers or 0)  # room for runs added later
    pool = open_executor(config, [s.config for s in pending], slots) if pending else None
    try:
        out = check_output(out, kind, force=force)
    except BaseException:
        if pool is not None:
            pool[0].close()
        raise
    try:
        for spec in copies:
            done[spec.name] = copy_run(Path(str(spec.source)), out / spec.name, spec.config)
        return out, _execute(specs, out, done, pending, pool, config.retries, trainer, title,
                             {s.name: str(s.source) for s in copies}, follow)
    except BaseException:
        _remove_if_empty(out, made, new)
        raise


def _follow_all(follow: Follow, summaries: dict[str, dict], out_dir: Path,
                title: str) -> tuple[list[RunSpec], dict[str, dict], list[RunSpec]]:
    """Ask ``follow`` until it adds nothing (a run it adds that finished already is read back, and may decide
    more): every run it added, the summaries of those read back, and those left to train."""
    added: list[RunSpec] = []
    found: dict[str, dict] = {}
    left: list[RunSpec] = []
    while new := follow({**summaries, **found}):
        _, done, pending = plan_runs(new, out_dir, title=title)
        added += new
        found.update(done)
        left += pending
    return added, found, left


def _remove_if_empty(out: Path, names: Sequence[str], new: bool) -> None:
    """Remove what a study stopped by an error created and left empty: the run folders ``names`` holding only their
    lock, then, when ``out`` is ``new``, its marker and the folder itself if nothing else is there."""
    from vitlab.outputs import MARKER
    from vitlab.train.lock import LOCK

    for name in names:
        run_dir = out / name
        with contextlib.suppress(OSError):
            if not run_dir.is_symlink() and run_dir.is_dir() and os.listdir(run_dir) == [LOCK]:
                (run_dir / LOCK).unlink()
                run_dir.rmdir()
    with contextlib.suppress(OSError):
        if new and os.listdir(out) == [MARKER]:
            (out / MARKER).unlink()
            out.rmdir()


def _execute(specs: Sequence[RunSpec], out_dir: Path, done: dict[str, dict], pending: Sequence[RunSpec],
             pool: tuple[Any, int | None] | None, retries: int, trainer: Trainer | None,
             title: str, copied: dict[str, str] | None = None,
             follow: Follow | None = None) -> list[tuple[RunSpec, dict]]:
    specs = list(specs)
    meter = Progress(len(specs), title, slots=pool[0].slots if pool is not None else 1)
    summaries = dict(done)
    for spec in specs:
        if spec.name in done:
            meter.end(spec.name, None, _note(spec, done[spec.name]), source=(copied or {}).get(spec.name))
    if pending and pool is not None:
        by_name = {s.name: s for s in pending}
        started: dict[str, float] = {}
        executor, threads = pool
        train = trainer or train_run  # looked up now: a patched one too

        def task_of(s: RunSpec) -> RunTask:
            return RunTask(s.name, s.config.replace(threads=threads) if threads else s.config, str(out_dir / s.name),
                           train, s.init)

        def on_start(task: RunTask) -> None:
            started[task.name] = meter.begin(task.name)

        def on_end(task: RunTask, summary: dict, ran: bool) -> None:
            meter.end(task.name, started.get(task.name) if ran else None, _note(by_name[task.name], summary),
                      failed=failed(summary))

        def more(task: RunTask, summary: dict) -> list[RunTask]:
            """The runs ``follow`` adds now that ``task`` ended: those finished already are read back."""
            summaries[task.name] = summary
            added, found, left = _follow_all(follow, summaries, out_dir, title)
            specs.extend(added)
            meter.total += len(added)
            summaries.update(found)
            for s in added:
                if s.name in found:
                    meter.end(s.name, None, _note(s, found[s.name]))
            by_name.update((s.name, s) for s in left)
            return [task_of(s) for s in left]

        summaries.update(run_tasks([task_of(s) for s in pending], executor, retries=retries, on_start=on_start,
                                   on_end=on_end, more=more if follow is not None else None))
    return [(spec, summaries[spec.name]) for spec in specs]


def _note(spec: RunSpec, summary: dict) -> str:
    """The end of a run's progress line: its test accuracy and marks, or why it failed."""
    if summary.get("failed"):
        return (f"after {summary.get('attempts', 1)} attempt(s): {summary['failed']} "
                f"({'a retry can help' if summary.get('retry') else 'a retry cannot help'})")
    acc = summary_value(summary, "test_acc")
    note = f"test accuracy {100 * acc:.2f}%" if acc == acc else ""
    if diverged(summary):
        note += f" (diverged at epoch {(summary.get('diverged_at') or {}).get('epoch')})"
    elif undertrained(summary, spec.config):
        note += " (far below the data set's reference: under-trained)"
    return note


def failed(summary: dict) -> bool:
    """Whether a run of a study failed (its worker died or it raised, on every attempt a retry could help): no
    result, a row marked failed."""
    return bool(summary.get("failed"))


RUNS_FAILED = 3  # the exit status of a study some of whose runs failed (2: bad input, refused before training)


def exit_status(command: str, pairs: Sequence[tuple[RunSpec, dict]], stream: Any = None) -> int:
    """The exit status of a ``vitlab COMMAND`` study that ran ``pairs``: 0 when every run finished, else
    :data:`RUNS_FAILED`, after one line per failed run on ``stream`` (stderr) naming its cause, whether a retry
    can help and where its traceback is."""
    stream = stream or sys.stderr
    bad = [(spec, summary) for spec, summary in pairs if failed(summary)]
    for spec, summary in bad:
        if summary.get("retry"):
            advice = (f"a retry can help: run the study again (it retried {summary.get('attempts', 1) - 1} "
                      "time(s); finished runs are read back)")
        else:
            advice = "a retry cannot help: fix the cause, then run the study again (finished runs are read back)"
        log = f"; traceback in {summary['log']}" if summary.get("log") else ""
        print(f"vitlab {command}: run {spec.name} failed: {summary['failed']}; {advice}{log}", file=stream,
              flush=True)
    if bad:
        print(f"vitlab {command}: {len(bad)} of {len(pairs)} runs failed (rows marked failed); exit status "
              f"{RUNS_FAILED}", file=stream, flush=True)
    return RUNS_FAILED if bad else 0


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
