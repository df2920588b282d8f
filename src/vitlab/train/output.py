"""The run's output folder, checked before a run writes there (and before any data loads).

A folder is a vitlab run folder only by vitlab's own marker: the ``config.json`` whose ``format`` is
``vitlab-checkpoint/1`` that every checkpoint writes (:func:`vitlab.checkpoint.files.is_run_folder`), or, for a
run stopped before its first checkpoint, the ``train.lock`` vitlab leaves there (a regular file, empty or holding
``PID HOST``). A new run may write into a missing folder, an existing folder holding none of the files a run
writes, or a marked folder without a checkpoint; a folder holding a checkpoint is continued with ``--resume``;
a folder without the marker that holds a file a run would replace (``metrics.jsonl``, ``summary.json``,
``state.pt``...) is refused unless ``--force``. The output may not sit inside the data folder (an image folder
would read it as a class), and a path the file system cannot hold (a name over 255 bytes, a file where a folder
belongs) is refused in one line. This is the run's case of the rule every command's output folder follows
(:mod:`vitlab.outputs`: studies and reports carry a marker file of their own).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from vitlab.checkpoint import CONFIG, MANIFEST, STATE, WEIGHTS
from vitlab.checkpoint.files import is_run_folder
from vitlab.errors import ConfigError
from vitlab.outputs import check_folder, refusal
from vitlab.train.lock import LOCK
from vitlab.train.logging import METRICS, SUMMARY
from vitlab.train.tracking import STATE as TRACKING

RUN_FILES = (CONFIG, WEIGHTS, STATE, MANIFEST, METRICS, SUMMARY, TRACKING, LOCK)  # what a run writes (or replaces)
_LOCK_TEXT = re.compile(rb"(\d+( [^\s]+)?\n?)?")


def check_path(out: Path, data_dir: str | None) -> None:
    """Refuse an output path the file system cannot hold, or one inside ``data_dir``, in one line."""
    check_folder(out)
    try:
        if data_dir and out.resolve().is_relative_to(Path(data_dir).resolve()):
            raise ConfigError(f"--output {out} is inside --data-dir {data_dir}, where the run's files would be read "
                              "as data (an image folder takes a folder there for a class); pick an --output outside "
                              "the data folder")
    except OSError as exc:
        raise ConfigError(f"--output {out} cannot be used ({exc.strerror or exc}); pick another --output") from None


def check_new_run(out: Path, *, resume: str | Path | None, force: bool) -> None:
    """Refuse to start a run in ``out`` where it would replace a checkpoint, or files vitlab did not write
    (``force`` replaces the latter)."""
    if resume is not None and out.resolve() == Path(resume).resolve():
        return  # the resumed run's own folder
    if not out.is_dir():
        return
    if is_run_folder(out):
        if resume is None:
            raise ConfigError(f"{out} already holds a checkpoint; continue it with --resume {out}, or pick another "
                              "--output (or delete the folder)")
        raise ConfigError(f"{out} already holds the checkpoint of another run; resume {resume} into another --output "
                          "(or delete the folder)")
    if force or stopped_run(out):
        return
    clash = [name for name in RUN_FILES if os.path.lexists(out / name)]
    if clash:
        raise ConfigError(refusal(out, clash, f"is not a vitlab run folder (it has no vitlab {CONFIG})", "this run"))


def stopped_run(out: Path) -> bool:
    """True when ``out`` holds vitlab's ``train.lock`` (a run stopped before its first checkpoint)."""
    lock = out / LOCK
    try:
        if lock.is_symlink() or not lock.is_file() or lock.stat().st_size > 300:
            return False
        return _LOCK_TEXT.fullmatch(lock.read_bytes()) is not None
    except OSError:
        return False
