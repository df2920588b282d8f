"""When a run has diverged, and the error that says so (raised by the training loop, :mod:`vitlab.train.loop`)."""

from __future__ import annotations

from typing import Any

from vitlab.errors import NumericalError

# A run has diverged when the mean loss of a training step (over all processes) or of an epoch's evaluation exceeds
# this many times ln(classes), the cross-entropy of a uniform guess: a ViT starts near it (its head is initialised
# with std 0.02, so its first logits are near 0), training lowers it, and label smoothing or mixup keep it below it.
# At 100 times (230 for 10 classes, 69 for 2) the model gives the true class a probability of e^-230 on average:
# its weights are wrecked, not learning. A run that overfits ends a few times above it on held-out data, far below.
DIVERGENCE_FACTOR = 100.0


class NonFiniteLoss(NumericalError):
    """The run diverged: the loss (or gradient norm) became NaN or infinite, or the loss grew past
    :data:`DIVERGENCE_FACTOR` times a uniform guess's (then it is a :class:`LossDiverged`). ``summary``: the run's
    numbers at that step (the test accuracy of its last finite weights, or of its kept checkpoint, ``diverged`` and
    where), so a study can keep the divergence as a result; None when they could not be taken."""

    summary: dict[str, Any] | None = None


class LossDiverged(NonFiniteLoss):
    """The loss stayed finite but grew past :data:`DIVERGENCE_FACTOR` times ln(classes)."""
