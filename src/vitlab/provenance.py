"""What a run's record says about where it came from: the git commit of the code, the command that trained it,
and its per-image test predictions (so two runs on the same test images can be compared image by image, by
:func:`vitlab.experiments.stats.paired`)."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from vitlab.atomic import atomic_write_text

if TYPE_CHECKING:
    import torch

    from vitlab.data import DataSplit

PREDICTIONS = "test_predictions.json"

_command: list[str] | None = None


def set_command(argv: Sequence[str]) -> None:
    """Record the arguments of the ``vitlab`` invocation running now (called by the command line's ``main``)."""
    global _command
    _command = list(argv)


def command() -> str | None:
    """The ``vitlab ...`` command line that is running, shell-quoted; None when vitlab runs from Python, not from
    its command line."""
    return None if _command is None else shlex.join(["vitlab", *_command])


@cache
def git_commit() -> str | None:
    """The commit of the git checkout vitlab's code is imported from (``git rev-parse HEAD``); None for an installed
    package outside a checkout, or without git."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def stamp() -> dict[str, str | None]:
    """The ``git_commit`` and ``command`` keys of a run's ``summary.json``."""
    return {"git_commit": git_commit(), "command": command()}


def write_predictions(out_dir: Path, split: DataSplit, predictions: torch.Tensor | None) -> None:
    """``test_predictions.json`` in ``out_dir``: the true and the predicted class index of every image of ``split``
    (the test set), in its order, and the class names (written atomically); nothing when ``predictions`` is None
    (no test evaluation in this process, e.g. a finished run resumed)."""
    if predictions is None:
        return
    record = {"classes": list(split.classes), "labels": split.labels.tolist(), "predictions": predictions.tolist()}
    atomic_write_text(out_dir / PREDICTIONS, json.dumps(record, separators=(",", ":")) + "\n")


def read_predictions(run_dir: Path) -> tuple[list[int], list[int]] | None:
    """``(labels, predictions)`` of a run folder's ``test_predictions.json``; None when the run has none."""
    path = Path(run_dir) / PREDICTIONS
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record["labels"], record["predictions"]
