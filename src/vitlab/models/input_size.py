"""Changing the input size of a built model: ``set_input_size`` and the per-call grid of ``dynamic_img_size``.

A learned position table is resampled bicubically (antialiased, as timm's ``resample_abs_pos_embed``), a fixed
sin-cos table is recomputed for the new grid, and a new patch size resamples the patch kernel (FlexiViT).
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.layers import build_pos_embed, resample_abs_pos_embed
from vitlab.models.config import ModelConfig
from vitlab.models.pretrained_cfg import set_pretrained_cfg


def square_side(value: int | tuple[int, int] | list[int], what: str) -> int:
    """One side from an int or an ``(h, w)`` pair with ``h == w`` (a vitlab config holds square sizes)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ConfigError(f"{what} {tuple(value)} is not square; vitlab models are configured square: give one "
                              f"number, and build with dynamic_img_size=True to run non-square images")
        value = value[0]
    return int(value)


class ResizableInput:
    """Mixin for models with ``cfg``, ``patch_embed``, ``pos_embed``, ``grid_size`` and ``num_patches``."""

    cfg: ModelConfig
    patch_embed: nn.Module
    pos_embed: Tensor | None
    grid_size: int
    num_patches: int

    def _pos_slots(self) -> int:
        """Prefix-token slots at the front of the position table."""
        return 0

    def _input_size_changed(self) -> None:
        """Hook: rebuild what else depends on the patch grid (RoPE tables)."""

    def pos_embed_for(self, grid: tuple[int, int]) -> Tensor | None:
        """The position table ``(1, slots + h * w, D)`` for a ``(h, w)`` patch grid: the stored one at the
        configured grid; otherwise a learned table resampled, a fixed sin-cos table computed for that grid."""
        if self.pos_embed is None or tuple(grid) == (self.grid_size, self.grid_size):
            return self.pos_embed
        if self.cfg.pos_embed == "learned":
            return resample_abs_pos_embed(self.pos_embed, tuple(grid), num_prefix=self._pos_slots(),
                                          old_grid=self.grid_size)
        table = build_pos_embed(self.cfg.pos_embed, grid_size=tuple(grid), dim=self.cfg.embed_dim,
                                num_prefix=self._pos_slots())
        return table.to(self.pos_embed)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None) -> None:
        """Rebuild the model for ``img_size`` and/or ``patch_size`` (timm's ``set_input_size``): the patch grid,
        the position table (resampled or recomputed), the patch kernel (resampled), RoPE tables, ``cfg`` and
        ``pretrained_cfg['input_size']``. The weights keep their values wherever the shapes allow."""
        img = self.cfg.img_size if img_size is None else square_side(img_size, "img_size")
        patch = self.cfg.patch_size if patch_size is None else square_side(patch_size, "patch_size")
        cfg = self.cfg.replace(img_size=img, patch_size=patch)  # validates (multiple of the patch, even stems...)
        new_grid = img // patch
        if self.pos_embed is not None and new_grid != self.grid_size:
            table = self.pos_embed_for((new_grid, new_grid)).detach()
            if isinstance(self.pos_embed, nn.Parameter):
                self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
            else:
                self.pos_embed = table  # the registered buffer, replaced
        self.patch_embed.set_input_size(img, patch)
        self.grid_size, self.num_patches = self.patch_embed.grid_size, self.patch_embed.num_patches
        self.cfg = cfg
        spec = getattr(self, "vitlab_spec", None)
        if isinstance(getattr(spec, "config", None), ModelConfig):
            self.vitlab_spec = dataclasses.replace(spec, config=cfg)  # what a checkpoint of this model records
        self._input_size_changed()
        old = dict(getattr(self, "pretrained_cfg", None) or {})
        set_pretrained_cfg(self, {**old, "input_size": (cfg.in_chans, img, img)})
