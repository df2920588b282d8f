"""Where a training run stands: the counters, clocks and best result a checkpoint's ``state.pt`` carries."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class Progress:
    """The progress record of a run, saved as a plain dict in ``state.pt`` (``"progress"``)."""

    epoch: int = 0  # completed epochs
    step: int = 0  # optimiser steps done in the current epoch
    global_step: int = 0
    loss_sum: float = 0.0  # this epoch's summed training loss (over images) and
    seen: float = 0  # the images it summed over
    epoch_seconds: float = 0.0
    best_test_acc: float = 0.0
    best_epoch: int = 0
    train_time_s: float = 0.0
    # CPU seconds of the training steps, all threads of this process (on a GPU: the host's share); unlike
    # train_time_s it does not grow when other work shares the cores. None: resumed from a record without it.
    train_cpu_s: float | None = 0.0
    wall_time_s: float = 0.0
    train_images: float = 0
    skipped_steps: int = 0
    test_loss: float | None = None
    test_acc: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the fields a saved record holds (a record from an older run may lack some)."""
        for f in dataclasses.fields(self):
            if f.name in saved:
                setattr(self, f.name, saved[f.name])
        if "train_cpu_s" not in saved:  # counted from the start or not at all
            self.train_cpu_s = None

    def end_epoch(self, test_loss: float, test_acc: float) -> None:
        """Record the evaluation of the epoch just trained and start the next one."""
        if test_acc > self.best_test_acc:
            self.best_test_acc, self.best_epoch = test_acc, self.epoch + 1
        self.epoch, self.step, self.loss_sum, self.seen, self.epoch_seconds = self.epoch + 1, 0, 0.0, 0, 0.0
        self.test_loss, self.test_acc = test_loss, test_acc
