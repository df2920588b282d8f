"""The mode every analysis of a model runs in: eval, the caller's own mode put back afterwards.

In training mode a forward pass is not a measurement of the model: dropout and drop-path draw random masks,
and batch norms (DeepViT's re-attention) normalise with the statistics of the batch at hand and update their
running statistics, so looking at a model would change it and an image's map would depend on the other images
of its batch. Attention maps, residual ratios, rollout and ``vitlab analyze`` therefore run inside
:func:`analysis_mode`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def analysis_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block ``model`` is in eval mode; afterwards every submodule has its own earlier mode back
    (a caller's mixed setting, e.g. frozen batch norms in a training model, included)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training
