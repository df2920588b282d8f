"""One writer per run folder: an exclusive ``fcntl.flock`` on ``DIR/train.lock`` while a run writes there.

The operating system drops the lock when the process ends, however it ends (SIGKILL, a crash, a reboot), so a
stale ``train.lock`` of a killed run never blocks ``--resume`` and no stale-lock rule (age, heartbeat) is needed; a
live run makes a second ``vitlab train`` on its folder (``--output`` or ``--resume``) stop in one line. The file
holds the holder's host and process id, for that message. The file is left in place: deleting a lock file while
another process may be opening it would let two holders in.

Within one process the lock is re-entrant: a study worker claims a run folder (:func:`claim`) before it trains
there, and the trainer's own :meth:`RunLock.acquire` of that folder then shares the claim instead of refusing it
(``flock`` locks belong to an open file, so a second open in the same process would otherwise conflict).

Across hosts that share a file system the lock holds where ``flock`` is served by the file server: on Linux NFS
clients (NFSv4, and NFSv3 with ``lockd``) ``flock`` is carried out as a whole-file POSIX lock on the server, and
the server drops it when the holder's lease ends (a host that dies loses its locks after the lease time,
typically 90 s). Mounts with ``nolock`` or ``local_lock=flock``, and file systems whose ``flock`` is local to
one host (Lustre without ``-o flock``, some FUSE and SMB mounts), keep the lock per host only: there, give each
host its own study folder, or run the study from one host. Where ``fcntl`` does not exist (Windows) runs are not
locked.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import IO

from vitlab.atomic import open_in_place
from vitlab.errors import ConfigError
from vitlab.outputs import LOCK  # the file name, one of a run folder's files (vitlab.outputs.RUN_FILES)

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

_HELD: dict[str, list] = {}  # resolved folder -> [open lock file, holders in this process]


class RunBusy(ConfigError):
    """Another live process (on this host or another) holds the run folder's lock; ``holder`` names it
    (``process 7281 on host vm``, or empty when the lock file does not say)."""

    holder: str = ""


def _key(folder: Path) -> str:
    return str(folder.resolve())


class RunLock:
    """The lock of one run folder; :meth:`acquire` it, :meth:`release` it (or let the process end)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._fh: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self) -> RunLock:
        """Take the lock (creating the folder), or raise :class:`RunBusy` naming the live run."""
        if self._fh is not None or fcntl is None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        key = _key(self.folder)
        if key in _HELD:  # this process holds it already (a study worker's claim): share it
            _HELD[key][1] += 1
            self._fh = _HELD[key][0]
            return self
        fh = open_in_place(self.folder / LOCK)  # a planted link is refused, never truncated through
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            pid, _, host = holder.partition(" ")
            process = f"process {pid}" if pid.isdigit() else ""
            on = f" on host {host.strip()}" if process and host.strip() else ""
            busy = RunBusy(f"{self.folder} is being written by another vitlab train run"
                           f"{f' ({process}){on}' if process else ''}; wait for it to end or stop it, or pick "
                           "another --output")
            busy.holder = process + on
            raise busy from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()} {socket.gethostname()}\n")
        fh.flush()
        _HELD[key] = [fh, 1]
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is None:
            return
        key = _key(self.folder)
        entry = _HELD.get(key)
        self._fh = None
        if entry is not None:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _HELD[key]
            fh = entry[0]
            with contextlib.suppress(OSError):
                fh.truncate(0)
            fh.close()  # closing the file drops the flock


def claim(folder: str | Path) -> RunLock | None:
    """The folder's lock, taken now, or None when another live process holds it (a run trained elsewhere)."""
    try:
        return RunLock(folder).acquire()
    except RunBusy:
        return None


def check_free(folder: str | Path) -> None:
    """Refuse now, before any data is loaded, when a live run holds ``folder``'s lock (no lock is kept)."""
    folder = Path(folder)
    if (folder / LOCK).is_file() or (folder / LOCK).is_symlink():
        RunLock(folder).acquire().release()
