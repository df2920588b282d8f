"""Atomic file writes: a temporary file beside the target, fsynced, then renamed over it.

The one mechanism behind checkpoints, summaries, metrics and reports, so a kill mid-write leaves the
previous file intact and no half-written one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from vitlab.errors import WriteError

_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed onto ``path``, on error
    removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual permissions
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it to ``path``."""
    with atomic_path(path) as tmp:
        write(str(tmp))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    atomic_write(path, write)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def write_error(what: str, folder: Path, exc: OSError, needed: int, fix: str) -> WriteError:
    """A one-line :class:`WriteError` for a failed write of ``what`` (``needed`` bytes) into ``folder``."""
    try:
        free = megabytes(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]
    err = WriteError(f"cannot write {what} in {folder} ({reason}): it needs about {megabytes(needed)} free, "
                     f"{free} is free there; {fix}")
    err.errno = exc.errno
    return err
