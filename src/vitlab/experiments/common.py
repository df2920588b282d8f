"""What every study shares: run one training in-process (or read it back when it already finished), parse
lists of values, aggregate over seeds, fit power laws, cost a model, print progress, the training budget and the
under-trained check. The command-line side (argparse options, the run config they make, the command a report
shows) is :mod:`vitlab.commands.options`; values given as text are read by :mod:`vitlab.train.options`.

Each training run of a study writes into its own sub-folder; a folder whose ``summary.json`` exists is read,
not re-run, so a study interrupted half-way resumes where it stopped when invoked again.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError

SUMMARY = "summary.json"
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


def diverged(summary: dict) -> bool:
    """Whether a run of a study diverged (see :func:`train_run`)."""
    return summary.get("diverged") is True


@dataclass
class RunSpec:
    """One training run of a study: its folder name, its run config and the columns that describe it."""

    name: str
    config: Any  # RunConfig; its ``output`` is set to the run's folder when it runs
    info: dict[str, Any] = field(default_factory=dict)
    init: str | None = None  # pretrained weights to start from (train's init_weights)


def read_summary(run_dir: Path) -> dict | None:
    """The ``summary.json`` of a finished run, or None when the run has not finished."""
    path = run_dir / SUMMARY
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # torn or unreadable: the run is redone
    return data if isinstance(data, dict) else None


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
            progress: bool = True, finished_only: bool = False) -> list[tuple[RunSpec, dict]]:
    """Run (or read back) every spec in order; returns ``(spec, summary)`` pairs. ``finished_only`` trains
    nothing: the specs without a finished run are left out (at least one must have finished)."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"two runs of this study share the folder name(s) {', '.join(dup)}; remove the repeated "
                          "values")
    trainer = trainer or train_run
    if finished_only:
        finished = {s.name for s in specs if read_summary(out_dir / s.name) is not None}
        left = [s for s in specs if s.name not in finished]
        specs = [s for s in specs if s.name in finished]
        if not specs:
            raise ConfigError(f"no run of this study has finished in {out_dir} yet; drop --finished-only to train "
                              "them")
        if left:
            print(f"{title}: --finished-only leaves out {len(left)} run(s) not finished yet: "
                  f"{', '.join(s.name for s in left)}", file=sys.stderr, flush=True)
    meter = Progress(len(specs), title, stream=None if progress else _Null())
    out = []
    for spec in specs:
        ran_at = meter.begin(spec.name) if read_summary(out_dir / spec.name) is None else None
        summary, ran = run_or_load(spec, out_dir, trainer)
        acc = summary_value(summary, "test_acc")
        note = f"test accuracy {100 * acc:.2f}%" if acc == acc else ""
        if diverged(summary):
            note += f" (diverged at epoch {(summary.get('diverged_at') or {}).get('epoch')})"
        elif undertrained(summary, spec.config):
            note += " (far below the data set's reference: under-trained)"
        meter.end(spec.name, ran_at if ran else None, note)
        out.append((spec, summary))
    return out


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


SUMMARY_KEYS = {  # the column a study writes -> the keys of the trainer's summary.json, first found wins
    "test_acc": ("final_test_acc", "test_acc"),
    "best_test_acc": ("best_test_acc",),
    "train_time_s": ("train_time_s",),
    "train_cpu_s": ("train_cpu_s",),
    "wall_time_s": ("wall_time_s",),
    "epochs": ("epochs",),
    "params": ("params",),
    "macs": ("macs",),
}


def summary_value(summary: dict, column: str) -> float:
    """The number a trainer summary holds for ``column`` (see :data:`SUMMARY_KEYS`), NaN when absent."""
    for key in SUMMARY_KEYS.get(column, (column,)):
        v = summary.get(key)
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            return float(v)
    return float("nan")


# ---- values ----------------------------------------------------------------------------------------------

def split_list(text: str, what: str) -> list[str]:
    """``'a,b, c'`` -> ``['a', 'b', 'c']``; an empty list is an error naming ``what``."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{what} is empty; give comma-separated values, e.g. 32,64,128")
    return items


def parse_ints(text: str, what: str, *, minimum: int = 1) -> list[int]:
    """Comma-separated integers ``>= minimum``, each once, in the given order."""
    out: list[int] = []
    for item in split_list(text, what):
        try:
            v = int(item)
        except ValueError:
            raise ConfigError(f"{what}: {item!r} is not an integer; give e.g. 6,12,24") from None
        if v < minimum:
            raise ConfigError(f"{what}: {v} must be >= {minimum}")
        if v not in out:
            out.append(v)
    return out


def format_value(v: Any) -> str:
    """A value as it appears in folder names, CSV cells and legends (``1e-05``, ``0.1``, ``true``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def safe_name(text: str) -> str:
    """``text`` with anything but letters, digits and ``._=-+`` replaced by ``_`` (a folder name)."""
    return "".join(c if c.isalnum() or c in "._=-+" else "_" for c in text)


def unknown_option(key: str, names: Sequence[str], kind: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown {kind} {key!r}{hint} (valid: {', '.join(names)})"


# ---- numbers ---------------------------------------------------------------------------------------------

def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite ``values``; NaNs when none."""
    xs = [float(v) for v in values if v == v]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def aggregate(rows: Sequence[dict], keys: Sequence[str], values: Sequence[str]) -> list[dict]:
    """Group ``rows`` by ``keys`` (first-seen order) and give ``n`` and ``<v>_mean`` / ``<v>_std`` per value column."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, members in groups.items():
        row = dict(zip(keys, key))
        row["n"] = len(members)
        for v in values:
            row[f"{v}_mean"], row[f"{v}_std"] = mean_std([float(m[v]) for m in members])
        out.append(row)
    return out


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``log y = a + b log x``; returns ``(a, b)``, so ``y ~ exp(a) * x ** b``."""
    pts = [(math.log(float(u)), math.log(float(v))) for u, v in zip(x, y) if u > 0 and v > 0]
    if len({p[0] for p in pts}) < 2:
        raise ConfigError("a power-law fit needs at least two distinct positive x values with positive y")
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    b = sum((px - mx) * (py - my) for px, py in pts) / sum((px - mx) ** 2 for px, _ in pts)
    return my - b * mx, b


def model_cost(preset: str, overrides: dict[str, Any]) -> tuple[int, int]:
    """``(parameters, MACs per image)`` of a vitlab preset with ``overrides``, built on the meta device."""
    import torch

    from vitlab.models import create_model

    with torch.device("meta"):
        model = create_model(preset, **overrides)
    return sum(p.numel() for p in model.parameters()), model.flop_count()


def track_study(out: Path, logger: str, pairs: Sequence[tuple[RunSpec, dict]], params: dict[str, Any]) -> None:
    """Log a finished study to the ``--logger`` backend as one tracker run of its own (each training run has
    its own already): the study's settings as params, every run's final test accuracy and the best as its
    summary, and every figure (``*.png``) in ``out``."""
    from vitlab.train.tracking import open_tracker

    tracker = open_tracker(logger, out)
    if tracker is None:
        return
    accs = {f"test_acc/{spec.name}": summary_value(summary, "test_acc") for spec, summary in pairs}
    finite = [v for v in accs.values() if v == v]
    status = "failed"
    try:
        tracker.log_params(params)
        tracker.log_summary({"runs": len(pairs), "best_test_acc": max(finite, default=float("nan")), **accs})
        for figure in sorted(out.glob("*.png")):
            tracker.log_figure(figure)
        status = "finished"
    finally:
        tracker.close(status)


def check_output(path: str | Path) -> Path:
    """The study's output folder (created); a file in its place is an error."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {out} is a file; pass a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


# ---- training budget and the under-trained check -------------------------------------------------------

BUDGETS = {"quick": 0.2, "default": 1.0, "long": 2.0}  # fraction of the data set's recipe epochs


def budget_epochs(budget: str, dataset: str, limit_train: int | None = None) -> int | None:
    """Epochs per run of ``budget`` on ``dataset``: a fraction of the recipe's epochs (the row of
    :data:`~vitlab.train.config.SIZE_DEFAULTS` for its training-set size). None for ``default``: the run then
    takes the recipe's epochs when it resolves its config, exactly as ``vitlab train`` does."""
    from vitlab.data.reference import TRAIN_SIZES
    from vitlab.train.config import size_defaults

    if budget not in BUDGETS:
        raise ConfigError(unknown_option(budget, list(BUDGETS), "--budget"))
    if budget == "default":
        return None
    size = TRAIN_SIZES.get(dataset)
    if size is None and limit_train is None:
        raise ConfigError(f"--budget {budget} needs the training-set size of {dataset}, which vitlab does not know "
                          "before loading it; pass --epochs N instead")
    num_train = min(n for n in (size, limit_train) if n is not None)
    return max(1, round(BUDGETS[budget] * size_defaults(num_train)["epochs"]))


def undertrained(summary: dict, cfg: Any) -> bool:
    """Whether a run of a study (its summary and run config) ended far below its data set's reference."""
    from vitlab.data.reference import is_undertrained

    return is_undertrained(summary_value(summary, "test_acc"), cfg.dataset, cfg.limit_train)


def mark_groups(agg: Sequence[dict], rows: Sequence[dict], keys: Sequence[str]) -> None:
    """Set ``undertrained`` on each aggregated row of ``agg`` (grouped by ``keys``) when any of its runs is, and
    ``diverged`` to the number of its runs that diverged."""
    for a in agg:
        members = [r for r in rows if all(r[k] == a[k] for k in keys)]
        a["undertrained"] = any(r.get("undertrained", False) for r in members)
        a["diverged"] = sum(1 for r in members if r.get("diverged", False))


def undertrained_warning(rows: Sequence[dict], dataset: str, limit_train: int | None = None) -> str | None:
    """One line naming how many ``rows`` (with ``undertrained`` and ``test_acc``) ended far below the
    reference of ``dataset``, and what to do; None when none did."""
    from vitlab.data.reference import UNDERTRAINED_MARGIN, reference_accuracy

    marked = [r for r in rows if r.get("undertrained")]
    ref = reference_accuracy(dataset, limit_train)
    if not marked or ref is None:
        return None
    worst = min(r["test_acc"] for r in marked)
    diverged = sum(1 for r in marked if r.get("diverged"))
    head = (f"warning: {len(marked)} of {len(rows)} runs ended more than {100 * UNDERTRAINED_MARGIN:.0f} points "
            f"below the {100 * ref:.0f}% a trained model reaches on {dataset} (lowest {100 * worst:.1f}%)")
    more_epochs = "give more epochs (--budget default or long, or --epochs N) before reading the study"
    if not diverged:
        return (f"{head}; they are under-trained or failed to train, so their differences are not a finding: "
                f"{more_epochs}")
    # more epochs cannot help a run that diverged: its numbers are those of its last finite weights
    fix = ("a lower --lr may let them train (their accuracy is that of their last finite weights; the diverged "
           "column names them, and each run's summary.json says where it diverged)")
    if diverged == len(marked):
        return f"{head}; {'all of them' if diverged > 1 else 'that run'} diverged: {fix}"
    return (f"{head}; {diverged} of them diverged: {fix}; the others are under-trained or failed to train, so "
            f"their differences are not a finding: {more_epochs}")


def warning_section(rows: Sequence[dict], keys: Sequence[str], warning: str | None) -> list[Any]:
    """The report section that leads a study with under-trained runs: the warning and the marked runs."""
    from vitlab.analysis.report import Section

    if warning is None:
        return []
    marked = [{k: r[k] for k in (*keys, "test_acc") if k in r} for r in rows if r.get("undertrained")]
    for m in marked:
        m["test_acc"] = f"{100 * m['test_acc']:.2f}%"
    text = warning.removeprefix("warning: ")
    return [Section("Warning: under-trained runs", text[0].upper() + text[1:], [], [marked])]
