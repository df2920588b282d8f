"""One writer per run folder: an exclusive ``fcntl.flock`` on ``DIR/train.lock`` while a run writes there.

The operating system drops the lock when the process ends, however it ends (SIGKILL, a crash, a reboot), so a
stale ``train.lock`` of a killed run never blocks ``--resume``; a live run makes a second ``vitlab train`` on its
folder (``--output`` or ``--resume``) stop in one line. The file holds the holder's process id, for that message.
The file is left in place: deleting a lock file while another process may be opening it would let two holders in.
Where ``fcntl`` does not exist (Windows) runs are not locked.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from vitlab.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK = "train.lock"


class RunLock:
    """The lock of one run folder; :meth:`acquire` it, :meth:`release` it (or let the process end)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._fh = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self) -> RunLock:
        """Take the lock (creating the folder), or raise :class:`ConfigError` naming the live run."""
        if self._fh is not None or fcntl is None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fh = open(self.folder / LOCK, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            who = f" (process {holder})" if holder.isdigit() else ""
            raise ConfigError(f"{self.folder} is being written by another vitlab train run{who}; wait for it to end "
                              "or stop it, or pick another --output") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.truncate(0)
            self._fh.close()  # closing the file drops the flock
            self._fh = None


def check_free(folder: str | Path) -> None:
    """Refuse now, before any data is loaded, when a live run holds ``folder``'s lock (no lock is kept)."""
    folder = Path(folder)
    if (folder / LOCK).is_file():
        RunLock(folder).acquire().release()
