"""Test-set evaluation: loss, accuracy and confusion matrix, sharded over processes and summed (``vitlab eval``,
and the trainer after each epoch)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.data import DataSplit, normalize

if TYPE_CHECKING:
    from vitlab.train.distributed import DistContext


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``dtype`` is set, else nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(model: nn.Module, split: DataSplit, *, mean: tuple[float, ...], std: tuple[float, ...],
             batch_size: int, device: torch.device, amp_dtype: torch.dtype | None = None,
             ctx: DistContext | None = None, slices: int = 1, predictions: bool = False) -> dict:
    """Mean cross-entropy (no label smoothing), accuracy and the confusion matrix (true x predicted) of
    ``model`` on ``split``; with several processes each takes every world_size-th image and the sums are
    all-reduced, so every process returns the numbers of the whole split. ``slices`` > 1 computes each batch
    as that many concurrent row slices (``vitlab.perf.sliced_forward``). ``predictions``: also the predicted
    class of every image, in the split's order (``"predictions"``, on the CPU)."""
    from vitlab.perf import sliced_forward
    from vitlab.train.distributed import DistContext  # not at the top: vitlab.train imports this module

    ctx = ctx or DistContext(device=device)
    was_training = model.training
    model.eval()
    k = len(split.classes)
    images, labels = split.images, split.labels
    mine = torch.arange(ctx.rank, len(split), ctx.world_size)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
    confusion = torch.zeros(k * k, dtype=torch.int64, device=device)
    # each process fills its own images with prediction + 1, so the sum over processes is every image's
    predicted = torch.zeros(len(split) if predictions else 0, dtype=torch.int64, device=device)

    def forward(rows: Tensor) -> Tensor:
        with autocast(device, amp_dtype):
            return model(rows).float()

    for start in range(0, len(mine), batch_size):
        idx = mine[start:start + batch_size].to(images.device)
        x = normalize(images[idx].to(device, non_blocking=True), mean, std)
        y = labels[idx].to(device, non_blocking=True)
        logits = sliced_forward(forward, x, slices)
        pred = logits.argmax(dim=1)
        sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
        sums[1] += (pred == y).sum()
        confusion += torch.bincount(y * k + pred, minlength=k * k)
        if predictions:
            predicted[idx.to(device)] = pred + 1
    ctx.all_reduce_sum(sums)
    ctx.all_reduce_sum(confusion)
    if predictions:
        ctx.all_reduce_sum(predicted)
    model.train(was_training)
    n = len(split)
    out = {"loss": sums[0].item() / max(n, 1), "acc": sums[1].item() / max(n, 1), "count": n,
           "confusion": confusion.view(k, k).cpu()}
    if predictions:
        out["predictions"] = predicted.cpu() - 1
    return out


def top_k(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(probabilities, class indices) of the ``k`` most likely classes per row, best first."""
    probs = logits.float().softmax(dim=-1)
    return probs.topk(min(k, probs.shape[-1]), dim=-1)
