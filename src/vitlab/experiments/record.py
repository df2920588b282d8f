"""Whether a run of a study has finished: the one decision every study and every executor asks of a run folder.

A study reads a run back, instead of training it, only when the run's record verifies:

1. ``summary.json`` is a JSON object holding a finite test accuracy in [0, 1] and the epochs it trained, as many as
   its ``config.json`` asks for (fewer only when it says it diverged or stopped early);
2. ``config.json`` is there, recorded in ``manifest.json`` and equal to its SHA-256 there, and so is
   ``model.safetensors`` (:mod:`vitlab.checkpoint.manifest`; ``state.pt`` is checked when a run resumes from it);
3. the settings in ``config.json`` equal the cell's: every option the study sets, run and model alike, except the
   result-neutral ones (:data:`vitlab.train.config.RESULT_NEUTRAL`: device, threads, output...).

Two records carry no manifest, and their settings are compared without a checksum: a run that diverged before its
first checkpoint has no ``config.json``, and its ``summary.json`` (written by
:func:`vitlab.experiments.runs.record_divergence`) records the run config it was trained with; a run record kept
without weights or training state (``scripts/findings_tables.py --keep-runs``: summary, config, metrics) has its
``config.json``, validated. A record holding weights or a training state must have its manifest.

Anything else is not read back. :func:`finished_run` says which of three it is:

- the verified summary: read back;
- None: train it. Nothing but a summary that is no result would be replaced (no summary yet, or one that is not
  complete beside a checkpoint that verifies, which the trainer resumes and which rewrites the summary);
- :class:`UnverifiedRun` (a :class:`~vitlab.errors.ConfigError`, one line): training would replace something that
  cannot be checked (a checkpoint whose ``config.json`` is missing or fails its checksum, a finished run of other
  settings, a record without a result and nothing to resume, a file where the run folder belongs); the user
  restores it or deletes it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from vitlab.errors import CheckpointError, ConfigError

SUMMARY = "summary.json"
# the checkpoint's files (vitlab.checkpoint's names; spelled here so that reading a record imports no torch)
CONFIG, WEIGHTS, STATE, MANIFEST = "config.json", "model.safetensors", "state.pt", "manifest.json"
DELETE = "delete that run's folder to train the run again"


class UnverifiedRun(ConfigError):
    """A run folder of a study that is neither a verified finished run nor safe to train over."""


def read_summary(run_dir: Path) -> Any:
    """The parsed ``summary.json`` of ``run_dir``; None when there is none or it is not JSON."""
    path = run_dir / SUMMARY
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 24:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, nested deeper than Python reads
        return None


def summary_problem(summary: Any, epochs: Any = None) -> str | None:
    """Why ``summary`` is not the summary of a finished run (None: it is): ``epochs`` is the number its config
    asks for (None: unknown, not compared)."""
    if not isinstance(summary, dict):
        return "it is not a JSON object"
    if summary.get("failed"):
        return "it records a failed run"
    acc = summary.get("final_test_acc", summary.get("test_acc"))
    if acc is None:
        return "it holds no test accuracy"
    if isinstance(acc, bool) or not isinstance(acc, int | float) or not math.isfinite(acc) or not 0 <= acc <= 1:
        return f"its test accuracy {acc!r} is not a number in [0, 1]"
    done = summary.get("epochs")
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        return f"its epochs {done!r} is not a count of epochs"
    short = summary.get("diverged") is True or summary.get("stopped_early") is True
    if isinstance(epochs, int) and not short and done != epochs:
        return f"it trained {done} of the {epochs} epochs its config.json asks for"
    return None


def setting_differences(cfg: Any, stored: dict[str, Any], built: dict[str, Any] | None = None) -> list[str]:
    """The options ``cfg`` sets that differ from ``stored`` (a run config as stored), as ``"key A there, B now"``;
    model options against the options of the model that was built (``built``), when known. The result-neutral
    options and the options ``cfg`` leaves to the recipe (None) do not count."""
    from vitlab.train.config import RESULT_NEUTRAL

    out = []
    for key, value in cfg.to_dict().items():
        if key in RESULT_NEUTRAL or value is None or key not in stored:
            continue
        if key == "model_overrides":
            have = {**(stored[key] or {}), **(built or {})}
            out += [f"{k} {have.get(k)!r} there, {v!r} now" for k, v in value.items() if have.get(k) != v]
        elif stored[key] != value:
            out.append(f"{key} {stored[key]!r} there, {value!r} now")
    return out


def length_difference(cfg: Any, stored: dict[str, Any], where: Path) -> list[str]:
    """``["epochs A there, B now"]`` when the run stored as ``stored`` (its ``config.json``'s run settings) trained
    another number of epochs than ``cfg`` would (:func:`vitlab.train.plan.plan_run`: ``--epochs`` left to the budget
    or the recipe resolved), else ``[]``: so a study asked for the recipe's 50 epochs does not read back a run of 1.
    The other options ``cfg`` leaves to the recipe are not compared (:func:`setting_differences`). ``where`` is a
    folder name the plan may check but never writes (a finished run occupies the run's own). A run the plan cannot
    be made for here (its data set not on this machine) gets ``[]``."""
    from vitlab.errors import DataError
    from vitlab.train.plan import plan_run

    if cfg.epochs is not None or not isinstance(stored.get("epochs"), int):
        return []  # typed: setting_differences compared it
    try:
        epochs = plan_run(cfg.replace(output=str(where)), count_macs=False).run.epochs
    except (ConfigError, DataError, CheckpointError):
        return []
    return [] if epochs == stored["epochs"] else [f"epochs {stored['epochs']!r} there, {epochs!r} now"]


def _checkpoint(run_dir: Path) -> list[str]:
    """The checkpoint files in ``run_dir`` (what training over the folder would replace)."""
    return [n for n in (CONFIG, WEIGHTS, STATE, MANIFEST) if os.path.lexists(run_dir / n)]


def verified_config(run_dir: Path) -> dict[str, Any]:
    """The ``config.json`` of ``run_dir``, validated, once it and ``model.safetensors`` verify against
    ``manifest.json``; a :class:`~vitlab.errors.CheckpointError` naming what does not. A kept run record (summary,
    config and metrics without weights or training state: ``scripts/findings_tables.py --restore-runs``) carries
    no manifest; its ``config.json`` is validated, not checksummed."""
    from vitlab.checkpoint import read_config
    from vitlab.checkpoint.manifest import read_manifest, verify

    if not (run_dir / CONFIG).is_file():
        raise CheckpointError(f"it has no {CONFIG}, so the settings it was trained with are unknown")
    weights = [n for n in (WEIGHTS, STATE) if os.path.lexists(run_dir / n)]
    manifest = read_manifest(run_dir)
    if manifest is None:
        if weights:
            raise CheckpointError(f"it has no {MANIFEST}, so its {CONFIG} cannot be checked")
        return read_config(run_dir)  # a kept record: nothing recorded a checksum of it
    recorded = {**(manifest.get("previous") or {}), **manifest["files"]}
    if CONFIG not in recorded:
        raise CheckpointError(f"its {MANIFEST} does not record {CONFIG} (an older vitlab, or a copy), so it cannot "
                              "be checked")
    config = read_config(run_dir)  # validated, and its SHA-256 checked
    if weights and not (run_dir / WEIGHTS).is_file():
        raise CheckpointError(f"its {WEIGHTS} is missing")
    if (run_dir / WEIGHTS).is_file():
        if WEIGHTS not in recorded:
            raise CheckpointError(f"its {MANIFEST} does not record {WEIGHTS}, so it cannot be checked")
        verify(run_dir / WEIGHTS)
    return config


def _built(config: dict[str, Any]) -> dict[str, Any]:
    from vitlab.checkpoint import ModelSpec

    try:
        return ModelSpec.from_dict(config["model"]).options()
    except (ValueError, TypeError, AttributeError, KeyError):
        return {}


def finished_run(run_dir: str | Path, cfg: Any) -> dict | None:
    """The verified summary of the finished run in ``run_dir`` for the cell ``cfg`` (a RunConfig); None when the
    run is to be trained (or resumed); :class:`UnverifiedRun` when it can be neither (see the module)."""
    return check_run(run_dir, cfg)[0]


def check_run(run_dir: str | Path, cfg: Any) -> tuple[dict | None, str | None]:
    """:func:`finished_run`, with a note saying why a run folder holding a ``summary.json`` is trained (None: it
    holds none, or it is read back)."""
    run_dir = Path(run_dir)
    if os.path.lexists(run_dir) and (run_dir.is_symlink() or not run_dir.is_dir()):
        raise UnverifiedRun(f"{run_dir} is where this study keeps a run, but it is not a folder; move it away, or "
                            "pick another --output")
    if not os.path.lexists(run_dir / SUMMARY):
        return None, None  # not finished: the trainer starts it, or resumes its checkpoint (which it verifies)
    summary = read_summary(run_dir)
    held = _checkpoint(run_dir)
    if not held:
        stored = summary.get("run_config") if isinstance(summary, dict) else None
        if summary_problem(summary) is None and summary.get("diverged") is True and isinstance(stored, dict):
            changed = setting_differences(cfg, stored)
            if changed:
                raise UnverifiedRun(_other_settings(run_dir, changed))
            return summary, None  # a divergence before the first checkpoint: its recorded settings, compared
        return None, f"its {SUMMARY} is no verified result (no checkpoint beside it); training the run"
    try:
        config = verified_config(run_dir)
    except CheckpointError as exc:
        why = str(exc).split("; ")[0]
        raise UnverifiedRun(f"the run folder {run_dir} cannot be verified ({why}), so its result is not read back, "
                            f"and training it again would replace its {', '.join(held)}: restore the folder from a "
                            f"good copy, or {DELETE}") from None
    stored = config["run"] if isinstance(config.get("run"), dict) else {}
    changed = setting_differences(cfg, stored, _built(config)) or length_difference(
        cfg, stored, run_dir.with_name(f".{run_dir.name}.plan"))
    if changed:
        raise UnverifiedRun(_other_settings(run_dir, changed))
    problem = summary_problem(summary, stored.get("epochs"))
    if problem is None:
        return summary, None
    if not (run_dir / STATE).is_file():
        raise UnverifiedRun(f"{run_dir / SUMMARY} is no finished run's ({problem}) and the folder holds no {STATE} "
                            f"to resume from, so training it again would replace its {', '.join(held)}: {DELETE}")
    return None, f"its {SUMMARY} is no finished run's ({problem}); resuming its checkpoint"  # written again


def _other_settings(run_dir: Path, changed: list[str]) -> str:
    return (f"{run_dir} finished with other settings ({'; '.join(changed)}); pass another --output for the new "
            f"settings, or {DELETE}")
