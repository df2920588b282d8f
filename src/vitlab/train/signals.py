"""SIGINT / SIGTERM during training: remember the request so the loop can save and stop at a step boundary."""

from __future__ import annotations

import signal
import threading


class StopRequest:
    """Context manager that turns the first SIGINT/SIGTERM into ``self.signum``; a second one interrupts.

    Exit status convention: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask the loop to stop, as a signal would (used by tests and callbacks)."""
        if self.signum is None:
            self.signum = int(signum)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.signum = int(signum)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
