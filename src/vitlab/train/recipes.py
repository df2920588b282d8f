"""The recipe tables: what a run takes for every option its user leaves unset. Decides the defaults by training-set
size (:data:`SIZE_DEFAULTS`), the augmentation and model defaults by kind of image (:data:`AUGMENT_DEFAULTS`,
:data:`MODEL_DEFAULTS`), the model and recipe ``vitlab train`` trains with no ``--model`` (:data:`DEFAULT_MODELS`,
:data:`DEFAULT_RECIPES`), the named recipes (``deit3``) and how long a warm-up the recipe gives a run whose length
the user chose (:func:`fit_warmup`).

Only the run plan (:mod:`vitlab.train.plan`) reads these tables for a run, once, before its first step. Precedence,
lowest first: the size row and the kind's augmentation, a named recipe, the command's default recipe, then the user's
options (a ``--config`` YAML file, then command-line flags).
"""

from __future__ import annotations

from typing import Any

from vitlab.catalog import dataset_info
from vitlab.errors import ConfigError

__all__ = ["AUGMENT_DEFAULTS", "DEFAULT_MODELS", "DEFAULT_RECIPES", "DEIT3", "DEIT3_BY_WIDTH", "LIBRARY_MODEL",
           "MODEL_DEFAULTS", "NO_AUGMENT", "RECIPES", "SIZE_DEFAULTS", "WARMUP_SHARE", "data_kind", "default_model",
           "default_recipe", "fill", "fit_warmup", "model_defaults", "recipe_defaults", "recipe_values",
           "size_defaults"]

# Training recipe by number of training images (the first row whose bound is >= N applies).
# The small-data row is tuned on mnist-5k (4,000 digits) with vit_mnist: batch 64 beat 128 and drop-path 0
# beat 0.1 (98.3% vs 97.2% after 60 epochs); 50 epochs (97.8%) fit in 5 minutes on one 2-core-machine thread,
# --epochs 60 gives 98.3%. Deep models (24+ blocks) still want --drop-path 0.1-0.2. See docs/training.md.
# The mid-size row is sized to Fashion-MNIST on a 2-core CPU: 20 epochs of batch 128 at lr 2e-3 (drop-path 0 for a
# 0.4M-parameter model) took 701 s with vit_mnist and ended at 88.2% test accuracy; the former row (30 epochs of
# batch 256 at lr 1e-3, drop-path 0.1) needed about 18 minutes. benchmarks/README.md, "Time to accuracy".
SIZE_DEFAULTS: list[tuple[int, dict[str, Any]]] = [
    (10_000, dict(epochs=50, batch_size=64, lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=3,
                  label_smoothing=0.1, clip_grad=1.0, drop_path=0.0, ema_decay=0.0)),
    (100_000, dict(epochs=20, batch_size=128, lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=2,
                   label_smoothing=0.1, clip_grad=1.0, drop_path=0.0, ema_decay=0.0)),
    (1 << 62, dict(epochs=10, batch_size=256, lr=1e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=1,
                   label_smoothing=0.1, clip_grad=1.0, drop_path=0.1, ema_decay=0.0)),
]

# A warm-up the recipe chooses takes at most this share of the run's epochs. Every size row's and the clothing
# recipe's warm-up fits it at their own length (3 of 50, 2 of 20, 1 of 10 epochs; 1 of 19), as DeiT III's does at its
# 400 epochs (5 epochs, Touvron et al. 2022; Goyal et al. 2017 warm up 5 of 90), so it shortens only the warm-up of a
# run shorter than the recipe it comes from: a run whose epochs the user cut (--epochs 2 would otherwise spend the
# whole run in a 3-epoch warm-up and end at 67 % of --lr), or DeiT III's 5 epochs on a data set whose size row trains
# 20 or 10 epochs (2 and 1 then). A warm-up the user gives is kept as given.
WARMUP_SHARE = 0.1

# Augmentation by kind of image (each data set's kind is in vitlab.catalog): digits must not be flipped;
# natural images are flipped and shifted; clothing (Fashion-MNIST: centred, upright, mirror-symmetric garments) is
# flipped and shifted a little, never rotated or sheared: a rotated shirt or a sheared shoe is not a garment of the
# data set.
AUGMENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": dict(degrees=12.0, scale=(0.9, 1.1), shear=8.0, translate=0.12, erase_prob=0.0, hflip=False,
                   pad_crop=0, trivial_augment=False, mixup=0.0, cutmix=0.0),
    "clothing": dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.0, hflip=True,
                     pad_crop=2, trivial_augment=False, mixup=0.0, cutmix=0.0),
    "natural": dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.25, hflip=True,
                    pad_crop=4, trivial_augment=False, mixup=0.0, cutmix=0.0),
}
# what --no-augment sets: every augmentation off
NO_AUGMENT: dict[str, Any] = dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.0,
                                  hflip=False, pad_crop=0, trivial_augment=False, mixup=0.0, cutmix=0.0,
                                  three_augment=False, color_jitter=0.0)

# Model overrides a data set's recipe applies to vitlab presets of arch 'vit' unless the user sets them.
# (on mnist-5k the class-token head learned far slower: 63% vs 80% test accuracy after 9 epochs; weight_init=xavier
# leaves the early plateau but did not reach 97.5% sooner: benchmarks/README.md, "Time to accuracy")
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {"digits": {"global_pool": "avg"}, "clothing": {"global_pool": "avg"},
                                             "natural": {}}
# The model of RunConfig() and of every study: the paper's plain ViT.
LIBRARY_MODEL = "vit_mnist"
# The model `vitlab train` trains with no --model, by kind of image (else LIBRARY_MODEL; docs/training.md's scan), and
# the recipe options that model trains with unless the user sets them (DEFAULT_RECIPES). Command defaults, not library
# ones: RunConfig() and every study keep vit_mnist and the recipe of the data set's size.
DEFAULT_MODELS: dict[str, str] = {"digits": "vit_mnist_conv_patch14", "clothing": "vit_fashion_conv_patch14"}
# clothing: a channels-last stem (1.16x the images/s on 2 cores), the 19 epochs 15 min hold, EMA, flip, 1-pixel shift
DEFAULT_RECIPES: dict[str, dict[str, Any]] = {"clothing": {**NO_AUGMENT, "epochs": 19, "lr": 3e-3, "warmup_epochs": 1,
                                                           "ema_decay": 0.999, "hflip": True, "pad_crop": 1,
                                                           "channels_last": True}}

# The default recipe is the data set's (SIZE_DEFAULTS, AUGMENT_DEFAULTS); deit3 is DeiT III's (Touvron et al. 2022,
# "DeiT III: Revenge of the ViT"), the recipe the ViT-5 paper trains with: the values and their sources are in
# docs/training.md, "The DeiT III recipe".
RECIPES = ("default", "deit3")
# DeiT III's peak learning rate at its batch of 2048 by model width (the authors' and ViT-5's training commands: ViT-S
# 4e-3, ViT-B and larger 3e-3, with --unscale-lr), scaled linearly to the run's batch; drop-path per width (ViT-5's
# commands: S 0.05, B 0.2, L 0.35). A width at or below the row's bound takes the row.
DEIT3_REFERENCE_BATCH = 2048
DEIT3_BY_WIDTH: list[tuple[int, dict[str, Any]]] = [
    (384, dict(lr=4e-3, drop_path=0.05)),
    (768, dict(lr=3e-3, drop_path=0.2)),
    (1 << 62, dict(lr=3e-3, drop_path=0.35)),
]
DEIT3: dict[str, Any] = dict(optimizer="lamb", loss="bce", weight_decay=0.05, min_lr=1e-5, warmup_epochs=5,
                             label_smoothing=0.0, clip_grad=0.0, ema_decay=0.0, mixup=0.8, cutmix=1.0,
                             three_augment=True, color_jitter=0.3, repeated_aug=3, erase_prob=0.0,
                             trivial_augment=False)


def size_defaults(num_train: int) -> dict[str, Any]:
    """The recipe row of :data:`SIZE_DEFAULTS` for a training set of ``num_train`` images."""
    return dict(next(row for bound, row in SIZE_DEFAULTS if num_train <= bound))


def data_kind(dataset: str) -> str:
    """The kind of image of a data set (its catalog entry's); natural for one the catalog does not know."""
    info = dataset_info(dataset)
    return info.kind if info is not None else "natural"


def model_defaults(dataset: str) -> dict[str, Any]:
    return dict(MODEL_DEFAULTS[data_kind(dataset)])


def default_model(dataset: str) -> str:
    """The preset `vitlab train` trains on ``dataset`` when no model is named (:data:`DEFAULT_MODELS`)."""
    return DEFAULT_MODELS.get(data_kind(dataset), LIBRARY_MODEL)


def default_recipe(dataset: str) -> dict[str, Any]:
    """The run options :func:`default_model` trains with on ``dataset`` where the user sets none
    (:data:`DEFAULT_RECIPES`); empty for a kind of image whose default recipe is that of its size."""
    return dict(DEFAULT_RECIPES.get(data_kind(dataset), {}))


def recipe_defaults(recipe: str, *, batch_size: int, width: int | None = None) -> dict[str, Any]:
    """The defaults a named recipe sets over those of the data set (none for ``default``). ``deit3``: :data:`DEIT3`,
    with the learning rate and drop-path of the model's ``width`` (:data:`DEIT3_BY_WIDTH`; None: ViT-S's), the rate
    scaled linearly from DeiT III's batch of 2048 to ``batch_size``."""
    if recipe == "default":
        return {}
    if recipe != "deit3":
        raise ConfigError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    row = next(r for bound, r in DEIT3_BY_WIDTH if (width or 0) <= bound)
    return {**DEIT3, "lr": row["lr"] * batch_size / DEIT3_REFERENCE_BATCH, "drop_path": row["drop_path"]}


def recipe_values(dataset: str, recipe: str, *, num_train: int, batch_size: int | None,
                  width: int | None = None) -> dict[str, Any]:
    """Every recipe and augmentation option's default for ``num_train`` training images of ``dataset``: the size
    row and the kind's augmentation, a named ``recipe`` over them (``batch_size``: the run's, None for the size
    row's; ``width``: the model's embedding width)."""
    values = {**size_defaults(num_train), **AUGMENT_DEFAULTS[data_kind(dataset)]}
    batch = batch_size if batch_size is not None else values["batch_size"]
    values.update(recipe_defaults(recipe, batch_size=batch, width=width))
    return values


def fit_warmup(warmup_epochs: float, epochs: int) -> float:
    """The warm-up a recipe gives a run of ``epochs`` epochs: its own, at most :data:`WARMUP_SHARE` of the run."""
    return min(warmup_epochs, round(WARMUP_SHARE * epochs, 6))


def fill(options: dict[str, Any], *, num_train: int, width: int | None = None,
         chosen: frozenset[str] | set[str] = frozenset()) -> tuple[dict[str, Any], str | None]:
    """``(values, note)``: the value of every recipe option ``options`` leaves unset (None) for ``num_train``
    training images (:func:`recipe_values`), and a note when the warm-up was fitted to the run (:func:`fit_warmup`).
    ``options``: run options by name (``dataset``, ``recipe``, ``batch_size``, ``epochs``, ``warmup_epochs``...);
    ``chosen``: those of them a default layer set (the command's default recipe), whose warm-up is fitted too."""
    values = recipe_values(options["dataset"], options["recipe"], num_train=num_train,
                           batch_size=options.get("batch_size"), width=width)
    filled = {k: v for k, v in values.items() if options.get(k) is None}
    note = None
    if "warmup_epochs" in filled or "warmup_epochs" in chosen:
        warmup = filled.get("warmup_epochs", options.get("warmup_epochs"))
        epochs = options["epochs"] if options.get("epochs") is not None else filled["epochs"]
        fitted = fit_warmup(warmup, epochs)
        if fitted != warmup:
            note = (f"warm-up {fitted:g} epochs: the recipe's {warmup:g}, at most {100 * WARMUP_SHARE:.0f} % of the "
                    f"{epochs} epochs")
        filled["warmup_epochs"] = fitted
    return filled, note
