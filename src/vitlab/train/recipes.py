"""Named recipes: defaults that replace those of the data set's size and kind in a run config
(:meth:`vitlab.train.config.RunConfig.resolve`); flags and ``--config`` values still win over them."""

from __future__ import annotations

from typing import Any

from vitlab.errors import ConfigError

__all__ = ["DEIT3", "DEIT3_BY_WIDTH", "RECIPES", "recipe_defaults"]

# The default recipe is the data set's (vitlab.train.config.SIZE_DEFAULTS, AUGMENT_DEFAULTS); deit3 is DeiT III's
# (Touvron et al. 2022, "DeiT III: Revenge of the ViT"), the recipe the ViT-5 paper trains with: the values and their
# sources are in docs/training.md, "The DeiT III recipe".
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
