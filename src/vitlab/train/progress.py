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
    # the figures of the images each epoch is judged on: the validation split when the run holds one out,
    # else the test set (the summary names them *_val_* or *_test_* accordingly)
    best_eval_acc: float = 0.0
    best_epoch: int = 0
    train_time_s: float = 0.0
    # CPU seconds of the training steps, all threads of this process (on a GPU: the host's share); unlike
    # train_time_s it does not grow when other work shares the cores. None: resumed from a record without it.
    train_cpu_s: float | None = 0.0
    wall_time_s: float = 0.0
    train_images: float = 0
    skipped_steps: int = 0
    eval_loss: float | None = None
    eval_acc: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the fields a saved record holds (a record from an older run may lack some, or name the judged
        figures ``*test*`` whatever set they were taken on)."""
        saved = {_RENAMED.get(k, k): v for k, v in saved.items()}
        for f in dataclasses.fields(self):
            if f.name in saved:
                setattr(self, f.name, saved[f.name])
        if "train_cpu_s" not in saved:  # counted from the start or not at all
            self.train_cpu_s = None

    def end_epoch(self, eval_loss: float, eval_acc: float) -> None:
        """Record the evaluation of the epoch just trained and start the next one."""
        if eval_acc > self.best_eval_acc:
            self.best_eval_acc, self.best_epoch = eval_acc, self.epoch + 1
        self.epoch, self.step, self.loss_sum, self.seen, self.epoch_seconds = self.epoch + 1, 0, 0.0, 0, 0.0
        self.eval_loss, self.eval_acc = eval_loss, eval_acc


# the names records saved by earlier versions gave the judged figures
_RENAMED = {"test_loss": "eval_loss", "test_acc": "eval_acc", "best_test_acc": "best_eval_acc"}
