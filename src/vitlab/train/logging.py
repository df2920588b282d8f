"""Run outputs besides checkpoints: the tqdm bar (on a terminal only), one printed line and one
``metrics.jsonl`` row per epoch, ``summary.json``, and the same to the ``--logger`` tracker
(:mod:`vitlab.train.tracking`). Only rank 0 creates a logger.

A write that fails (a full disk) raises a one-line :class:`~vitlab.errors.WriteError` and leaves the file as it
was: ``metrics.jsonl`` without a torn row, ``summary.json`` the previous one."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from vitlab.atomic import atomic_write_text, open_in_place, write_error
from vitlab.outputs import METRICS, SUMMARY  # the file names, with the rest of a run folder's (vitlab.outputs)
from vitlab.train.tracking import open_tracker


def on_terminal() -> bool:
    """True when both stdout and stderr are terminals: only then is the live bar (carriage returns) drawn.

    Redirected to a file or a pipe (``make demo > log``, CI, ``| tee``), a run prints one line per epoch."""
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """The complete rows of ``metrics.jsonl`` (a torn last line is ignored)."""
    path = Path(out_dir) / METRICS
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # a torn line, or one nested too deeply to read
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def kept_rows(rows: list[dict[str, Any]], completed_epochs: int) -> list[dict[str, Any]]:
    """The rows of the epochs ``1..completed_epochs``, one per epoch (the last written), in epoch order: a row
    logged after the last checkpoint (the run was killed before saving it) is dropped, to be logged again."""
    by_epoch = {r["epoch"]: r for r in rows if isinstance(r.get("epoch"), int) and 1 <= r["epoch"] <= completed_epochs}
    return [by_epoch[e] for e in sorted(by_epoch)]


class RunLogger:
    """Writes metrics under ``out_dir``; ``completed_epochs`` rows already there are kept (resume). ``tracker``
    names the ``--logger`` backend that also receives ``params`` (the run config), each row and the summary."""

    def __init__(self, out_dir: Path, *, progress: bool = True, completed_epochs: int = 0, tracker: str = "none",
                 params: dict[str, Any] | None = None) -> None:
        self.out_dir = out_dir
        self.progress = progress
        self.metrics_path = out_dir / METRICS
        text = "".join(json.dumps(r) + "\n" for r in kept_rows(read_metrics(out_dir), completed_epochs))
        try:
            atomic_write_text(self.metrics_path, text)
        except OSError as exc:
            raise write_error(METRICS, out_dir, exc, len(text), "free some space there") from exc
        self.tracker = open_tracker(tracker, out_dir, start_step=completed_epochs)
        if self.tracker is not None and params is not None:
            self.tracker.log_params(params)

    def bar(self, *, epoch: int, epochs: int, total: int, initial: int):
        """A tqdm bar over the steps of one epoch; None with ``--no-progress`` or off a terminal."""
        if not self.progress or not on_terminal():
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=f"epoch {epoch}/{epochs}", unit="step", leave=False,
                    dynamic_ncols=True, file=sys.stderr)

    def log_epoch(self, row: dict[str, Any]) -> None:
        """Append, print and track one epoch's row (``val_*`` keys with a validation split, else ``test_*``)."""
        name = "val" if "val_acc" in row else "test"
        line = json.dumps(row) + "\n"
        with open_in_place(self.metrics_path, "ab", buffering=0) as fh:  # a planted link is refused
            size = os.fstat(fh.fileno()).st_size
            try:
                fh.write(line.encode())
                os.fsync(fh.fileno())
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fh.fileno(), size)  # no torn row
                raise write_error(METRICS, self.out_dir, exc, len(line), "free some space there") from exc
        if self.tracker is not None:
            self.tracker.log_metrics({k: v for k, v in row.items() if k not in ("epoch", "step")}, row["epoch"])
        print(f"epoch {row['epoch']:>3}  train_loss {row['train_loss']:.4f}  {name}_loss {row[f'{name}_loss']:.4f}  "
              f"{name}_acc {100 * row[f'{name}_acc']:.2f}%  lr {row['lr']:.2e}  {row['seconds']:.1f} s", flush=True)

    def write_summary(self, summary: dict[str, Any]) -> None:
        text = json.dumps(summary, indent=2) + "\n"
        try:
            atomic_write_text(self.out_dir / SUMMARY, text)
        except OSError as exc:
            raise write_error(SUMMARY, self.out_dir, exc, len(text), "free some space there") from exc
        if self.tracker is not None:
            self.tracker.log_summary(summary)

    def close(self, status: str = "finished") -> None:
        """End the tracker run as ``finished``, ``stopped`` (a signal; resumable) or ``failed``."""
        if self.tracker is not None:
            self.tracker.close(status)
