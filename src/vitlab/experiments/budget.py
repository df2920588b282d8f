"""The training budget of a study's runs (a fraction of the data set's recipe) and the check that marks runs that
ended far below a trained model's accuracy (under-trained or diverged), with the warning a report leads with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.table import diverged, summary_value
from vitlab.experiments.values import unknown_option

BUDGETS = {"quick": 0.2, "default": 1.0, "long": 2.0}  # fraction of the data set's recipe epochs


def budget_epochs(budget: str, dataset: str, limit_train: int | None = None) -> int | None:
    """Epochs per run of ``budget`` on ``dataset``: a fraction of the recipe's epochs (the row of
    :data:`~vitlab.train.recipes.SIZE_DEFAULTS` for its training-set size). None for ``default``: the run then
    takes the recipe's epochs when it resolves its config, exactly as ``vitlab train`` does."""
    from vitlab.data.reference import TRAIN_SIZES
    from vitlab.train.recipes import size_defaults

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


def run_marks(summary: dict, cfg: Any) -> dict[str, bool]:
    """The ``undertrained``, ``diverged`` and ``failed`` columns of one run of a study (its summary and run config;
    ``failed``: no result, its worker died or it raised on every attempt)."""
    return {"undertrained": undertrained(summary, cfg), "diverged": diverged(summary),
            "failed": bool(summary.get("failed"))}


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
    from vitlab.writers import Section

    if warning is None:
        return []
    marked = [{k: r[k] for k in (*keys, "test_acc") if k in r} for r in rows if r.get("undertrained")]
    for m in marked:
        m["test_acc"] = f"{100 * m['test_acc']:.2f}%"
    text = warning.removeprefix("warning: ")
    return [Section("Warning: under-trained runs", text[0].upper() + text[1:], [], [marked])]
