"""Output folders: the one rule by which every vitlab command decides whether it may write into a folder.

A folder is vitlab's only by vitlab's own marker for that kind of output:

- a training run's folder by its checkpoint's ``config.json`` (:func:`vitlab.checkpoint.files.is_run_folder`), or
  the ``train.lock`` of a run stopped before its first checkpoint (the section "run folders" below applies this rule
  to runs, with ``--force`` and ``--resume``: :func:`check_path`, :func:`check_new_run`, :func:`stopped_run`);
- the folder of a study (``sweep``, ``compare``, ``depth-study``, ``complexity``, ``sweep --search optuna``) or of
  a report (``analyze``, ``eval --output``) by :data:`MARKER`, a small JSON file
  ``{"format": "vitlab-output/1", "commands": [...]}`` written atomically when a command first claims the folder.

:func:`claim` (and :func:`check`, the same decision without writing) takes a folder for ``command`` when

1. it is missing or holds none of the files the command writes (the user's other files are left alone); the
   folder is created and the marker written;
2. its marker names the command: a study resumes there, a report is replaced;
3. (studies) it has no marker but an older vitlab wrote a study there, recognised by a sub-folder that is a vitlab
   run folder; the marker is written;
4. ``force`` is given (the user's files of those names are replaced).

Any other folder holding a file the command writes (by a user, or another command's output) is refused in one
line naming the files, ``--force`` and another ``--output``. A run folder is never a study's or a report's folder
(its ``summary.json`` belongs to the run), ``--force`` or not; ``eval`` writes its confusion matrix into the run
folder by default, so it accepts one. A path the file system cannot hold (a name over its limit, a file where a
folder belongs) or whose name is not UTF-8 text (the report, written as UTF-8, records it) is refused in one
line.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from vitlab.atomic import atomic_write_text
from vitlab.checkpoint import CONFIG, MANIFEST, STATE, WEIGHTS
from vitlab.checkpoint.files import is_run_folder
from vitlab.errors import ConfigError

MARKER = ".vitlab-output.json"
FORMAT = "vitlab-output/1"


def marked_by(out: Path) -> list[str] | None:
    """The commands ``out``'s marker names, or None when it has no valid marker (a link is not one)."""
    file = out / MARKER
    try:
        if file.is_symlink() or not file.is_file() or file.stat().st_size > 1 << 16:
            return None
        data = json.loads(file.read_bytes())
    except (OSError, ValueError):
        return None
    commands = data.get("commands") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return [c for c in commands if isinstance(c, str)] if isinstance(commands, list) else None


def clashing(out: Path, files: Iterable[str]) -> list[str]:
    """The entries of ``out`` (files, folders or links) a command writing ``files`` (names or ``*`` patterns) would
    replace, sorted."""
    try:
        names = os.listdir(out)
    except (FileNotFoundError, NotADirectoryError):
        return []
    patterns = list(files)
    return sorted(n for n in names if n != MARKER and any(fnmatch.fnmatchcase(n, p) for p in patterns))


def holds_runs(out: Path) -> bool:
    """True when a sub-folder of ``out`` is a vitlab run folder (a study an older vitlab wrote without a marker)."""
    try:
        return any(sub.is_dir() and not sub.is_symlink() and is_run_folder(sub) for sub in out.iterdir())
    except OSError:
        return False


def check_folder(out: Path, flag: str = "--output") -> None:
    """Refuse, in one line, a path the file system cannot hold: a name over its limit, a file where a folder
    belongs."""
    for part in out.parts:
        if len(os.fsencode(part)) > name_max(out):
            raise ConfigError(f"{flag} {str(out)[:60]}...: the name {part[:20]}... ({len(os.fsencode(part))} bytes) "
                              f"is too long for the file system (at most {name_max(out)}); pick a shorter {flag}")
    try:
        for parent in [out, *out.parents]:
            if parent.exists() and not parent.is_dir():
                raise ConfigError(f"{flag} {out}: {parent} is a file, not a folder; pick another {flag}")
    except OSError as exc:
        raise ConfigError(f"{flag} {out} cannot be used ({exc.strerror or exc}); pick another {flag}") from None


def shown(text: str) -> str:
    """``text`` as it can be printed and written: each byte of a name that is not UTF-8 (decoded by Python as a
    lone surrogate) written as ``\\xNN``."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_text(text: str, what: str) -> None:
    """Refuse, in one line, ``text`` that a report (UTF-8: ``index.html``, ``summary.json``) cannot hold: a path
    whose name is not UTF-8 would let a study train every run and then fail writing its report."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {shown(text)} holds a name that is not UTF-8 text, which the report (written as "
                          f"UTF-8) cannot record; rename it, or pick a UTF-8 name") from None


def refusal(out: Path, clash: list[str], whose: str, writer: str, flag: str = "--output") -> str:
    """The one-line refusal of a folder (``whose``: what it is) holding ``clash``, which ``writer`` would replace."""
    shown = ", ".join(clash[:6]) + (f" and {len(clash) - 6} more" if len(clash) > 6 else "")
    return (f"{flag} {out} {whose} but holds {shown}, which {writer} would replace; pick another {flag} (a new or "
            "empty folder), or pass --force to replace them")


def check(out: str | Path, command: str, files: Iterable[str], *, force: bool = False, study: bool = False,
          runs: bool = False, flag: str = "--output") -> list[str] | None:
    """Refuse ``out`` for ``command`` (writing ``files``) unless the rule of this module gives it the folder; returns
    the commands its marker names (None: no marker). Writes nothing. ``study``: recognise a study an older vitlab
    wrote; ``runs``: a run folder is acceptable (``eval``)."""
    out = Path(out).expanduser()
    check_folder(out, flag)
    check_text(str(out), flag)
    if not out.is_dir():
        return None
    marked = marked_by(out)
    if marked is not None and command in marked:
        return marked
    if is_run_folder(out):
        if runs:
            return marked
        raise ConfigError(f"{flag} {out} is a run folder of vitlab (its summary.json and files belong to that run); "
                          f"pass {flag} another folder, e.g. a subfolder of it")
    clash = clashing(out, files)
    if not clash or force or (marked is None and study and holds_runs(out)):
        return marked
    whose = (f"is the folder of vitlab {', '.join(marked)}" if marked else
             f"is not a folder vitlab {command} wrote (it has no {MARKER})")
    raise ConfigError(refusal(out, clash, whose, f"vitlab {command}", flag))


def claim(out: str | Path, command: str, files: Iterable[str], **options: bool | str) -> Path:
    """:func:`check` ``out``, then create it and write the marker naming ``command``; returns the folder."""
    out = Path(out).expanduser()
    marked = check(out, command, files, **options)  # type: ignore[arg-type]
    if marked is not None and command in marked:
        return out
    if is_run_folder(out):
        return out  # eval into a run folder: the run's config.json is its marker
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / MARKER, json.dumps({"format": FORMAT, "commands": [*(marked or []), command]}) + "\n")
    except OSError as exc:
        raise ConfigError(f"--output {out} cannot be used ({exc.strerror or exc}); pick another --output") from None
    return out


def name_max(out: Path) -> int:
    """The longest file name the file system of ``out`` (or its nearest existing parent) holds."""
    for parent in [out, *out.parents]:
        try:
            return os.pathconf(parent, "PC_NAME_MAX")
        except (OSError, ValueError, AttributeError):
            continue
    return 255


# ---------------------------------------------------------------------------------------------------- run folders
# A training run's folder is vitlab's by the checkpoint's config.json (format vitlab-checkpoint/1) or, for a run
# stopped before its first checkpoint, the train.lock vitlab leaves there (a regular file, empty or holding
# "PID HOST"). A new run may write into a missing folder, an existing folder holding none of the files a run writes,
# or a marked folder without a checkpoint; a folder holding a checkpoint is continued with --resume; a folder without
# the marker that holds a file a run would replace is refused unless --force. The output may not sit inside the data
# folder (an image folder would read it as a class). vitlab.train.plan applies these checks before any data loads.

METRICS, SUMMARY = "metrics.jsonl", "summary.json"  # written by vitlab.train.logging
TRACKING = "tracking.json"  # vitlab.train.tracking: {"backend": ..., "run_id": ...} of the tracker run it logs to
LOCK = "train.lock"  # vitlab.train.lock: the lock a running (or stopped) run holds
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
