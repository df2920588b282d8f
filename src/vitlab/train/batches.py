"""The data stage of a run: the data its plan names loaded in memory at the model's input (:func:`load_run_data`),
checked against the facts the plan was made from, then, step by step, model-ready batches: per-epoch order,
normalise + augment + mix. Nothing here decides a setting: the subsets, the hold-out, the normalisation and the
augmentation are the plan's (:mod:`vitlab.train.plan`).

Nothing here loops over images in Python except the optional TrivialAugment (torchvision works per image);
the affine augmentation and random erasing run on the whole batch (``vitlab.data.BatchAugment``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vitlab.data import BatchAugment, DataSplit, load_dataset, normalize
from vitlab.data.augment import ThreeAugment
from vitlab.data.datasets import stratified_indices, subset_indices
from vitlab.errors import ConfigError, DataError
from vitlab.train.config import RunConfig
from vitlab.train.distributed import DistContext
from vitlab.train.plan import RunPlan
from vitlab.train.seeding import derive_seed, generator

VAL_SEED = 0x7A1  # --val-split / --val-size hold out the same images in every run, whatever --seed


def subset(split: DataSplit, n: int | None) -> DataSplit:
    """A fixed random subset of ``n`` images (in their original order); the split itself when ``n`` is None."""
    idx = subset_indices(len(split), n)  # what load_dataset(limit_train=, limit_test=) keeps before resizing
    if idx is None:
        return split
    return DataSplit(split.images[idx], split.labels[idx], list(split.classes))


def holdout(split: DataSplit, *, fraction: float | None = None, size: int | None = None,
            stratify: bool = False) -> tuple[DataSplit, DataSplit | None]:
    """(train, validation): a fixed random ``size`` images (or ``fraction`` of them) of a training split held
    out for validation, both in their original order; (split, None) when neither is given. ``stratify``: the
    held-out images keep each class's share (:func:`vitlab.data.datasets.stratified_indices`), so both parts do."""
    if size is None and fraction is None:
        return split, None
    n = size if size is not None else round(fraction * len(split))
    if not 0 < n < len(split):
        what = f"--val-size {size}" if size is not None else f"--val-split {fraction}"
        raise ConfigError(f"{what} holds out {n} of the {len(split)} training images; hold out at least one "
                          "and leave at least one to train on")
    if stratify:
        val_idx = stratified_indices(split.labels, n, VAL_SEED)
        rest = torch.ones(len(split), dtype=torch.bool)
        rest[val_idx] = False
        train_idx = torch.nonzero(rest).flatten()
    else:
        perm = torch.randperm(len(split), generator=generator(VAL_SEED))
        val_idx, train_idx = perm[:n].sort().values, perm[n:].sort().values
    classes = list(split.classes)
    return (DataSplit(split.images[train_idx], split.labels[train_idx], classes),
            DataSplit(split.images[val_idx], split.labels[val_idx], list(classes)))


@dataclass
class RunData:
    """The data of a run, in memory on its device: the splits, what each epoch is judged on, and the batch pipeline."""

    train: DataSplit
    test: DataSplit
    val: DataSplit | None  # held out of the training images (--val-split / --val-size), else None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    pipeline: BatchPipeline

    @property
    def classes(self) -> list[str]:
        return list(self.train.classes)

    @property
    def eval_name(self) -> str:
        """What each epoch is judged on: ``val`` (the held-out images) when there are some, else ``test``."""
        return "test" if self.val is None else "val"

    @property
    def eval(self) -> DataSplit:
        return self.test if self.val is None else self.val


def load_run_data(plan: RunPlan, ctx: DistContext) -> RunData:
    """Load the data of ``plan`` at the input its model takes (rank 0 downloads first), take the subsets and the
    validation hold-out it names, and put it on the run's device; data that is not what the plan was made from (a
    file changed since) is refused."""
    d = plan.data
    if not ctx.is_main:
        ctx.barrier()
    train_split, test_split = load_dataset(d.dataset, data_dir=d.data_dir, img_size=d.img_size, in_chans=d.in_chans,
                                           download=d.download and ctx.is_main,
                                           limit_train=plan.run.limit_train, limit_test=plan.run.limit_test,
                                           stratify=plan.run.stratify)
    if ctx.is_main:
        ctx.barrier()
    found = (len(train_split), len(test_split), len(train_split.classes))
    if found != (d.limit_train, d.num_test, d.num_classes) or d.classes not in (None, tuple(train_split.classes)):
        raise DataError(f"{d.dataset}{f' in {d.data_dir}' if d.data_dir else ''} holds {found[0]} training and "
                        f"{found[1]} test images of {found[2]} classes once subset, but its facts said "
                        f"{d.limit_train}, {d.num_test} and {d.num_classes}: its files changed or are not the data "
                        "set's; restore them (or delete them to download them again)")
    train_split, val_split = holdout(train_split, size=d.num_val, stratify=plan.run.stratify)

    def on_device(split: DataSplit | None) -> DataSplit | None:
        return None if split is None else DataSplit(split.images.to(ctx.device), split.labels.to(ctx.device),
                                                    split.classes)

    pipeline = BatchPipeline(plan.run, d.mean, d.std, d.num_classes, d.in_chans)
    return RunData(on_device(train_split), on_device(test_split), on_device(val_split), d.mean, d.std, pipeline)


def epoch_order(num: int, seed: int, epoch: int, repeats: int = 1) -> Tensor:
    """The shuffled order of ``num`` training images in ``epoch``, a pure function of (seed, epoch).

    With ``repeats`` above 1, repeated augmentation (Hoffer et al. 2020; DeiT's ``RASampler``): timm's
    ``RepeatAugSampler`` on one process, so each image comes ``repeats`` times in a row (in the same global batch,
    differently augmented) and an epoch still holds ``num`` samples, ``num / repeats`` distinct images (DeiT's
    "only one-third of the dataset is seen per epoch")."""
    seed = derive_seed(seed, epoch, 0x5EED)
    if repeats <= 1:
        return torch.randperm(num, generator=generator(seed))
    from timm.data.distributed_sampler import RepeatAugSampler

    sampler = RepeatAugSampler(range(num), num_replicas=1, rank=0, shuffle=True, num_repeats=repeats,
                               selected_round=0)
    sampler.set_epoch(seed)  # the sampler shuffles with a generator seeded by its epoch
    return torch.tensor(list(sampler), dtype=torch.long)


class BatchPipeline:
    """Normalisation, augmentation (3-Augment and color jitter, TrivialAugment, the affine) and mixup of training
    batches."""

    def __init__(self, cfg: RunConfig, mean: tuple[float, ...], std: tuple[float, ...], num_classes: int,
                 in_chans: int) -> None:
        self.mean, self.std = mean, std
        self.loss, self.label_smoothing = cfg.loss or "ce", cfg.label_smoothing or 0.0
        self.augment = BatchAugment(degrees=cfg.degrees, scale=cfg.scale, shear=cfg.shear,
                                    translate=cfg.translate, erase_prob=cfg.erase_prob, hflip=cfg.hflip,
                                    pad_crop=cfg.pad_crop)
        self.three = None
        if cfg.three_augment or cfg.color_jitter:
            self.three = ThreeAugment(color_jitter=cfg.color_jitter or 0.0, ops=bool(cfg.three_augment))
        self.trivial = None
        if cfg.trivial_augment and in_chans == 3:
            from torchvision.transforms import v2

            self.trivial = v2.TrivialAugmentWide()
        self.mixup = None
        if cfg.mixup or cfg.cutmix:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                               num_classes=num_classes)

    def criterion(self) -> torch.nn.Module:
        """The training loss of these batches' targets: cross-entropy with label smoothing (soft-target cross-entropy
        under mixup), or with ``loss='bce'`` DeiT III's binary cross-entropy, one binary problem per class (without
        label smoothing, mixed targets made 1 where above 0, as the authors' ``engine.py`` does)."""
        if self.loss == "bce":
            from timm.loss import BinaryCrossEntropy

            return BinaryCrossEntropy(smoothing=self.label_smoothing, target_threshold=None if self.label_smoothing
                                      else 0.0)
        if self.soft_targets:
            from timm.loss import SoftTargetCrossEntropy

            return SoftTargetCrossEntropy()
        return torch.nn.CrossEntropyLoss(label_smoothing=self.label_smoothing)

    @property
    def soft_targets(self) -> bool:
        """True when training targets are class distributions (mixup/cutmix), not indices."""
        return self.mixup is not None

    def train_batch(self, images: Tensor, labels: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """uint8 (B, C, H, W) + (B,) labels -> float (B, C, H, W) + targets, random parameters from ``gen``."""
        if self.three is not None:
            images = self.three(images, generator=gen)
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
