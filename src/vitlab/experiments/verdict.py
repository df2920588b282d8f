"""Ask a claim of your own runs: two arms, each a study folder, a run folder or ``STUDY/PREFIX`` (the runs
``PREFIX_seed=N`` / ``PREFIX_seedN`` of a study), compared with the run as the unit (:mod:`vitlab.experiments.stats`).

    from vitlab.experiments.verdict import compare_runs
    r = compare_runs("runs/sweep_lr/lr=0.002", "runs/sweep_lr/lr=0.004")   # paired t over the shared seeds
    print(r.effect, r.ci_low, r.ci_high, r.verdict)

The command is ``vitlab verdict RUNS_A RUNS_B [--paired | --unpaired] [--margin M [--noninferior]] [--csv FILE]``.

A run counts only when its record is complete: ``summary.json`` with a finite value of the measure, and its seed
(``config.json``'s ``run.seed``, else the ``_seed=N`` of its name). Anything else is refused with one line naming the
run: a comparison never silently drops a run, switches its test or reports "nan".
The arms are paired (paired t over the per-seed differences) when both have the same set of at least two seeds,
compared by Welch's t over runs otherwise; ``paired=True`` insists (and refuses arms with other seeds), ``False``
forbids it. :func:`per_image` describes two paired arms on their stored test predictions (``test_predictions.json``)
after checking that both scored the same images in the same order; it is a description of these runs on these images,
never the verdict.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vitlab.checkpoint.textfiles import read_json, read_text
from vitlab.errors import DataError
from vitlab.experiments import stats

SEED_NAME = re.compile(r"_seed=?(\d+)$")
# measures read from a run folder: test accuracy in points, any numeric summary.json key, or a diagnostic
MEASURES = ("acc", "max_logit", "cv_attn", "cv_mlp", "similarity", "similar_share")
COLUMNS = ["a", "b", "measure", "effect", "ci_low", "ci_high", "p", "test", "runs", "mde", "margin", "verdict",
           "runs_to_decide"]


def _json(path: Path, run: Path) -> dict[str, Any]:
    """A run file's JSON object; one line naming the run and the file when it is missing, not UTF-8 JSON, nested too
    deeply, over 16 MiB (:mod:`vitlab.checkpoint.textfiles`) or not an object."""
    if not path.is_file():
        raise DataError(f"run {run}: no {path.name}; it has not finished (train it again, or leave it out)")
    data = read_json(path, name=f"run {run}: {path.name}", fix="train the run again", error=DataError)
    if not isinstance(data, dict):
        raise DataError(f"run {run}: {path.name} is a JSON {type(data).__name__}, not an object; train the run again")
    return data


def _metric_rows(run: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (at most 256 MiB); a torn or unreadable line is skipped, as on resume."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"run {run}: no metrics.jsonl; train it again with --probe-every")
    text = read_text(path, name=f"run {run}: metrics.jsonl", fix="train the run again", limit=1 << 28,
                     error=DataError)
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_folders(arm: str | Path | Sequence[str | Path]) -> list[Path]:
    """The finished run folders of an arm: a run folder (it holds ``summary.json``), a study folder (every
    sub-folder with a ``summary.json``), ``STUDY/PREFIX`` (the runs ``PREFIX_seed*`` of the study), or a list of
    these. Refuses an arm with no run."""
    if not isinstance(arm, str | Path):
        return [run for a in arm for run in run_folders(a)]
    path = Path(arm)
    if path.is_dir():
        # a study folder holds run folders (a sweep also writes its own summary.json beside them); a run, none
        found = sorted(p for p in path.iterdir() if (p / "summary.json").is_file())
        if not found and (path / "summary.json").is_file():
            return [path]
        if not found:
            raise DataError(f"{path}: no finished run there (no sub-folder holds a summary.json); pass a study "
                            "folder, a run folder or STUDY/PREFIX")
        return found
    if path.parent.is_dir():
        pattern = re.compile(rf"{re.escape(path.name)}_seed=?\d+")
        found = sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name)
                       and (p / "summary.json").is_file())
        if found:
            return found
        raise DataError(f"{path}: no finished run {path.name}_seed* in {path.parent}; pass a study folder, a run "
                        "folder or STUDY/PREFIX")
    raise DataError(f"{path}: no such run or study folder; check the path")


def seed_of(run: Path) -> int:
    """A run's seed: ``config.json``'s ``run.seed``, else the ``_seed=N`` of its folder name."""
    config = run / "config.json"
    if config.is_file():
        seed = (_json(config, run).get("run") or {}).get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool):
            return seed
    m = SEED_NAME.search(run.name)
    if m:
        return int(m.group(1))
    raise DataError(f"run {run}: no seed in its config.json nor its name (..._seed=N); keep the run's config.json")


def _finite(run: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataError(f"run {run}: {key} is {value!r}, not a finite number; train the run again or leave it out")
    return float(value)


def measure(run: Path, what: str = "acc") -> float:
    """One run's value: ``acc`` (final test accuracy in points), ``max_logit`` (the largest attention logit of any
    layer after the last epoch), ``cv_attn``/``cv_mlp`` (the coefficient of variation over blocks of a depth study's
    residual ratios), ``similarity`` (the mean cross-layer attention similarity), ``similar_share`` (DeepViT's ratio
    of similar blocks, Zhou et al. 2021: the share of self-attention blocks whose attention map has a cosine
    similarity above the study's threshold, 0.9, with another block's), or any numeric key of ``summary.json``
    (e.g. ``final_val_loss``)."""
    if what == "acc":
        summary = _json(run / "summary.json", run)
        return 100 * _finite(run, "final_test_acc", summary.get("final_test_acc"))
    if what == "max_logit":
        rows = _metric_rows(run)
        last = [r for r in rows if any(k.startswith("probe/max_logit/") for k in r)]
        if not last:
            raise DataError(f"run {run}: no probe/max_logit/* in metrics.jsonl; train it with --probe-every")
        return max(_finite(run, k, v) for k, v in last[-1].items() if k.startswith("probe/max_logit/"))
    if what in ("similarity", "similar_share", "cv_attn", "cv_mlp"):
        try:
            return _diagnostic(run, what, _json(run / "diagnostics.json", run))
        except (KeyError, TypeError, AttributeError, ValueError, ZeroDivisionError) as exc:
            if isinstance(exc, DataError):
                raise
            raise DataError(f"run {run}: diagnostics.json has no usable {what} record ({type(exc).__name__}: "
                            f"{exc}); run the depth study's diagnostics again") from None
    summary = _json(run / "summary.json", run)
    if what not in summary:
        raise DataError(f"run {run}: summary.json has no {what!r}; measures: {', '.join(MEASURES)} or a key of "
                        f"summary.json ({', '.join(sorted(summary))})")
    return _finite(run, what, summary[what])


def _diagnostic(run: Path, what: str, diag: dict) -> float:
    collapse = next((c for c in diag.get("collapse", []) if c["group"] == "self_attention"), None)
    if what.startswith("simil"):
        if collapse is None:
            raise DataError(f"run {run}: diagnostics.json has no self-attention collapse record; run the depth "
                            "study's diagnostics again")
        if what == "similarity":
            return _finite(run, "mean_similarity", collapse["mean_similarity"])
        return sum(1 for n in collapse["similar_blocks"] if n > 0) / len(collapse["similar_blocks"])
    branch = what.split("_")[1]
    ratios = [_finite(run, f"{branch}_mean", r[f"{branch}_mean"]) for r in diag["residual_ratios"]
              if r["kind"] == "self_attention"]
    return statistics.pstdev(ratios) / statistics.fmean(ratios)


def arm_values(arm: str | Path | Sequence[str | Path], what: str = "acc") -> dict[int, float]:
    """``{seed: value}`` of an arm's runs (:func:`run_folders`, :func:`measure`); two runs of one seed in one arm
    are refused (they are not independent runs)."""
    out: dict[int, float] = {}
    where: dict[int, Path] = {}
    for run in run_folders(arm):
        seed = seed_of(run)
        if seed in where:
            raise DataError(f"runs {where[seed]} and {run} both have seed {seed}: an arm holds one run per seed; "
                            "pass the runs of one setting (STUDY/PREFIX)")
        where[seed], out[seed] = run, measure(run, what)
    return dict(sorted(out.items()))


def compare_runs(a: str | Path | Sequence[str | Path], b: str | Path | Sequence[str | Path], *,
                 paired: bool | None = None, margin: float = 0.0, noninferior: bool = False, what: str = "acc",
                 confidence: float = 0.95) -> stats.Result:
    """The claim "``a`` beats ``b``" (or is as good, or no worse within ``margin``) over two arms of runs:
    :func:`vitlab.experiments.stats.compare` on their values (:func:`arm_values`), paired by seed when ``paired`` is
    None and both arms have the same seeds."""
    va, vb = arm_values(a, what), arm_values(b, what)
    if paired is None:
        paired = set(va) == set(vb) and len(va) >= 2
    return stats.compare(va, vb, paired=paired, margin=margin, noninferior=noninferior, confidence=confidence)


def _predictions(run: Path) -> tuple[list[int], list[int]]:
    record = _json(run / "test_predictions.json", run)
    labels, preds = record.get("labels"), record.get("predictions")
    if not isinstance(labels, list) or not isinstance(preds, list) or len(labels) != len(preds) or not labels:
        raise DataError(f"run {run}: test_predictions.json needs equal, non-empty 'labels' and 'predictions' lists; "
                        "evaluate the run again")
    return labels, preds


def per_image(a: str | Path | Sequence[str | Path], b: str | Path | Sequence[str | Path],
              confidence: float = 0.95) -> stats.Comparison:
    """A description of two arms on the same test images (never a verdict): every seed of both arms must have its
    ``test_predictions.json`` and both arms the same seeds and, per seed, the same labels in the same order (the
    same images); then :func:`vitlab.experiments.stats.paired` over the (seed, image) pairs."""
    arms = []
    for arm in (a, b):
        by_seed = {}
        for run in run_folders(arm):
            by_seed[seed_of(run)] = (run, *_predictions(run))
        arms.append(by_seed)
    if set(arms[0]) != set(arms[1]):
        raise DataError(f"per-image pairs need the same seeds in both arms: {sorted(arms[0])} against "
                        f"{sorted(arms[1])}")
    correct_a: list[bool] = []
    correct_b: list[bool] = []
    for seed in sorted(arms[0]):
        (run_a, labels_a, preds_a), (run_b, labels_b, preds_b) = arms[0][seed], arms[1][seed]
        if labels_a != labels_b:
            raise DataError(f"runs {run_a} and {run_b} did not score the same images in the same order "
                            f"({len(labels_a)} against {len(labels_b)} labels, or in another order); compare runs "
                            "evaluated on one test set")
        correct_a += [p == t for p, t in zip(preds_a, labels_a)]
        correct_b += [p == t for p, t in zip(preds_b, labels_b)]
    return stats.paired(correct_a, correct_b, confidence=confidence)


def result_row(a: str, b: str, what: str, r: stats.Result) -> dict[str, str]:
    """The CSV row of :func:`compare_runs` (:data:`COLUMNS`)."""
    row = r.row()
    return {"a": a, "b": b, "measure": what, **{k: row[k] for k in COLUMNS[3:]}}


def describe(r: stats.Result, unit: str = "") -> Iterable[str]:
    """The lines ``vitlab verdict`` prints."""
    u = f" {unit}" if unit else ""
    if math.isfinite(r.ci_low) or math.isfinite(r.ci_high):
        yield (f"effect {r.effect:+.4g}{u}, {100 * r.confidence:g} % interval {r.ci_low:+.4g} to {r.ci_high:+.4g}, "
               f"p = {r.p:.3g} ({r.test})")
    else:
        yield f"effect {r.effect:+.4g}{u}, no interval: {r.test}"
    runs = f"{r.n_a} and {r.n_b} runs" + (" (paired by seed)" if r.paired else "")
    yield f"{runs}; minimal detectable effect at 80 % power {r.mde:.3g}{u}"
    need = r.runs_to_decide
    tail = (f"; {need} runs per arm would detect an effect this size" if need.isdigit()
            else f"; more than {need[2:]} runs per arm would be needed" if need.startswith(">")
            else f"; {need}" if need else "")
    yield f"verdict: {r.verdict}{tail}"
