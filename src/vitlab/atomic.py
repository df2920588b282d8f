"""Atomic file writes: a temporary file beside the target, fsynced, then renamed over it.

The one mechanism behind checkpoints, summaries, metrics and reports, so a kill mid-write leaves the
previous file intact and no half-written one. The temporary file is created exclusively (``mkstemp``) and the
rename replaces a link planted under the target's name instead of writing through it. The two files written in
place, the run folder's lock and the row appended to ``metrics.jsonl``, are opened with :func:`open_in_place`,
which refuses a link (``O_NOFOLLOW``) and a second name of another file (a hard link).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

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


def copy_file(src: str | Path, dst: str | Path) -> None:
    """Copy ``src`` to ``dst`` atomically (a link at ``dst`` is replaced, not written through)."""
    atomic_write_bytes(dst, Path(src).read_bytes())


_IN_PLACE = {"r+": os.O_RDWR, "rb+": os.O_RDWR, "a": os.O_WRONLY | os.O_APPEND, "ab": os.O_WRONLY | os.O_APPEND}


def open_in_place(path: str | Path, mode: str = "r+", **kwargs: Any) -> IO:
    """Open (creating) a file vitlab updates in place, ``mode`` ``r+`` or ``a`` (``rb+``, ``ab``), never through a
    link: a symbolic link, a hard link (a second name of another file) or anything but a regular file at ``path``
    raises a one-line :class:`WriteError` naming it, and the file it points at is untouched."""
    path = Path(path)
    flags = _IN_PLACE[mode] | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise _link_error(path, "a symbolic link") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise _link_error(path, "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode, **kwargs)


def _link_error(path: Path, what: str) -> WriteError:
    err = WriteError(f"{path} is {what}, not a file vitlab wrote; vitlab does not write through it: remove it "
                     f"(the file it points at is untouched) or pick another folder")
    err.errno = errno.ELOOP
    return err


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
