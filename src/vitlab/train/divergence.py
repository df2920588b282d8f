"""When a run has diverged, and the error that says so (raised by the training loop, :mod:`vitlab.train.engine`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vitlab.checkpoint import CONFIG
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


def causes(lr: float, *, amp: bool, clip_grad: float | None, out_dir: Path) -> str:
    """The likely causes of a divergence and what became of the run's folder, as its error names them."""
    found = [f"a learning rate too high (--lr {lr:g}; try {lr / 4:g})"]
    if amp:
        found.append("low-precision overflow (try --amp off)")
    if not clip_grad:
        found.append("no gradient clipping (try --clip-grad 1.0)")
    kept = f"the last good checkpoint in {out_dir} is kept" if (out_dir / CONFIG).exists() \
        else "no checkpoint was saved yet"
    return f"likely {' or '.join(found)}; {kept}"


def nonfinite_message(where: str, loss: float, why: str) -> str:
    """A non-finite loss (or gradient norm, the loss being finite) at ``where``; ``why``: :func:`causes`."""
    what = f"loss ({loss})" if not math.isfinite(loss) else f"gradient norm (loss {loss:.4g})"
    return f"the run diverged: non-finite {what} at {where}; {why}; --skip-nonfinite skips such steps instead"


def diverged_message(where: str, what: str, loss: float, classes: int, why: str) -> str:
    """A loss past :data:`DIVERGENCE_FACTOR` times a uniform guess's over ``classes`` classes at ``where``."""
    return (f"the run diverged: {what} {loss:.4g} at {where} is more than {DIVERGENCE_FACTOR:g} times that of a "
            f"uniform guess over the {classes} classes ({math.log(classes):.4g}); {why}")


def divergence_limit(classes: int) -> float:
    """The loss past which a run of ``classes`` classes has diverged: :data:`DIVERGENCE_FACTOR` x ln(classes)."""
    return DIVERGENCE_FACTOR * math.log(max(classes, 2))
