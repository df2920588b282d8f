"""From in-memory uint8 data to model-ready batches: subsets, per-epoch order, normalise + augment + mix.

Nothing here loops over images in Python except the optional TrivialAugment (torchvision works per image);
the affine augmentation and random erasing run on the whole batch (``vitlab.data.BatchAugment``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vitlab.data import BatchAugment, DataSplit, normalize
from vitlab.errors import ConfigError
from vitlab.train.config import RunConfig
from vitlab.train.seeding import derive_seed, generator

SUBSET_SEED = 0  # --limit-train / --limit-test pick the same images in every run, eval and predict
VAL_SEED = 0x7A1  # --val-split / --val-size hold out the same images in every run, whatever --seed


def subset(split: DataSplit, n: int | None) -> DataSplit:
    """A fixed random subset of ``n`` images (in their original order); the split itself when ``n`` is None."""
    if n is None or n >= len(split):
        return split
    idx = torch.randperm(len(split), generator=generator(SUBSET_SEED))[:n].sort().values
    return DataSplit(split.images[idx], split.labels[idx], list(split.classes))


def holdout(split: DataSplit, *, fraction: float | None = None,
            size: int | None = None) -> tuple[DataSplit, DataSplit | None]:
    """(train, validation): a fixed random ``size`` images (or ``fraction`` of them) of a training split held
    out for validation, both in their original order; (split, None) when neither is given."""
    if size is None and fraction is None:
        return split, None
    n = size if size is not None else round(fraction * len(split))
    if not 0 < n < len(split):
        what = f"--val-size {size}" if size is not None else f"--val-split {fraction}"
        raise ConfigError(f"{what} holds out {n} of the {len(split)} training images; hold out at least one "
                          "and leave at least one to train on")
    perm = torch.randperm(len(split), generator=generator(VAL_SEED))
    val_idx, train_idx = perm[:n].sort().values, perm[n:].sort().values
    classes = list(split.classes)
    return (DataSplit(split.images[train_idx], split.labels[train_idx], classes),
            DataSplit(split.images[val_idx], split.labels[val_idx], list(classes)))


def epoch_order(num: int, seed: int, epoch: int) -> Tensor:
    """The shuffled order of ``num`` training images in ``epoch``, a pure function of (seed, epoch)."""
    return torch.randperm(num, generator=generator(derive_seed(seed, epoch, 0x5EED)))


class BatchPipeline:
    """Normalisation, augmentation and mixup of training batches."""

    def __init__(self, cfg: RunConfig, mean: tuple[float, ...], std: tuple[float, ...], num_classes: int,
                 in_chans: int) -> None:
        self.mean, self.std = mean, std
        self.augment = BatchAugment(degrees=cfg.degrees, scale=cfg.scale, shear=cfg.shear,
                                    translate=cfg.translate, erase_prob=cfg.erase_prob, hflip=cfg.hflip,
                                    pad_crop=cfg.pad_crop)
        self.trivial = None
        if cfg.trivial_augment and in_chans == 3:
            from torchvision.transforms import v2

            self.trivial = v2.TrivialAugmentWide()
        self.mixup = None
        if cfg.mixup or cfg.cutmix:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                               num_classes=num_classes)

    @property
    def soft_targets(self) -> bool:
        """True when training targets are class distributions (mixup/cutmix), not indices."""
        return self.mixup is not None

    def train_batch(self, images: Tensor, labels: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """uint8 (B, C, H, W) + (B,) labels -> float (B, C, H, W) + targets, random parameters from ``gen``."""
        if self.trivial is not None:
            images = torch.stack([self.trivial(img) for img in images])  # per image, (C, H, W) uint8
        x = normalize(images, self.mean, self.std)
        x = self.augment(x, generator=gen)
        if self.mixup is None:
            return x, labels
        if len(x) % 2 == 0:
            return self.mixup(x, labels)  # soft targets (B, num_classes), label smoothing included
        from timm.data.mixup import mixup_target

        return x, mixup_target(labels, self.mixup.num_classes, smoothing=self.mixup.label_smoothing)
