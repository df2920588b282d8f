"""Run outputs besides checkpoints: the tqdm bar, one printed line and one ``metrics.jsonl`` row per epoch,
TensorBoard scalars when ``tensorboard`` imports, and ``summary.json``. Only rank 0 creates a logger.

A write that fails (a full disk) raises a one-line :class:`~vitlab.errors.WriteError` and leaves the file as it
was: ``metrics.jsonl`` without a torn row, ``summary.json`` the previous one."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from vitlab.atomic import atomic_write_text, write_error

METRICS, SUMMARY = "metrics.jsonl", "summary.json"


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """The complete rows of ``metrics.jsonl`` (a torn last line is ignored)."""
    path = Path(out_dir) / METRICS
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
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
    """Writes metrics under ``out_dir``; ``completed_epochs`` rows already there are kept (resume)."""

    def __init__(self, out_dir: Path, *, progress: bool = True, completed_epochs: int = 0) -> None:
        self.out_dir = out_dir
        self.progress = progress
        self.metrics_path = out_dir / METRICS
        text = "".join(json.dumps(r) + "\n" for r in kept_rows(read_metrics(out_dir), completed_epochs))
        try:
            atomic_write_text(self.metrics_path, text)
        except OSError as exc:
            raise write_error(METRICS, out_dir, exc, len(text), "free some space there") from exc
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        except ImportError:
            pass

    def bar(self, *, epoch: int, epochs: int, total: int, initial: int):
        """A tqdm bar over the steps of one epoch, or None with ``--no-progress``."""
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=f"epoch {epoch}/{epochs}", unit="step", leave=False,
                    dynamic_ncols=True, file=sys.stderr)

    def log_epoch(self, row: dict[str, Any]) -> None:
        line = json.dumps(row) + "\n"
        size = self.metrics_path.stat().st_size if self.metrics_path.exists() else 0
        try:
            with open(self.metrics_path, "a") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.truncate(self.metrics_path, size)  # no torn row
            raise write_error(METRICS, self.out_dir, exc, len(line), "free some space there") from exc
        if self.tb is not None:
            for key in ("train_loss", "test_loss", "test_acc", "lr"):
                self.tb.add_scalar(key, row[key], row["epoch"])
            self.tb.flush()
        print(f"epoch {row['epoch']:>3}  train_loss {row['train_loss']:.4f}  test_loss {row['test_loss']:.4f}  "
              f"test_acc {100 * row['test_acc']:.2f}%  lr {row['lr']:.2e}  {row['seconds']:.1f} s", flush=True)

    def write_summary(self, summary: dict[str, Any]) -> None:
        text = json.dumps(summary, indent=2) + "\n"
        try:
            atomic_write_text(self.out_dir / SUMMARY, text)
        except OSError as exc:
            raise write_error(SUMMARY, self.out_dir, exc, len(text), "free some space there") from exc

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
