"""Changing the input size of a built model: ``set_input_size`` and the per-call grid of ``dynamic_img_size``.

Position tables follow the patches' 2-D places: a learned table and the 1-D sinusoid are resampled bicubically as
images of the configured grid (antialiased, as timm's ``resample_abs_pos_embed``), the 2-D sin-cos table is computed
for the new grid; a new patch size resamples the patch kernel (FlexiViT).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.layers.pos_embed import pos_embed_at_grid
from vitlab.models.config import ModelConfig
from vitlab.models.pretrained_cfg import set_pretrained_cfg

# a leaf of torch.fx graphs: traced with dynamic_img_size, the table is moved to each input's grid at run time
torch.fx.wrap("pos_embed_at_grid")


def is_grid(grid: tuple, side: int) -> bool:
    """Whether ``grid`` is the ``side x side`` grid; False for a torch.fx traced grid (decided in the graph)."""
    return not any(isinstance(g, torch.fx.Proxy) for g in grid) and tuple(grid) == (side, side)


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
        configured grid; otherwise the stored table moved to that grid, each patch keeping its 2-D place
        (:func:`vitlab.layers.pos_embed.pos_embed_at_grid`)."""
        if self.pos_embed is None or is_grid(grid, self.grid_size):
            return self.pos_embed
        return pos_embed_at_grid(self.cfg.pos_embed, self.pos_embed, tuple(grid), self.grid_size,
                                 num_prefix=self._pos_slots(), antialias=self.cfg.pos_resample_antialias)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None) -> None:
        """Rebuild the model for ``img_size`` and/or ``patch_size`` (timm's ``set_input_size``): the patch grid,
        the position table (each patch keeps its 2-D place), the patch kernel (resampled), RoPE tables, ``cfg`` and
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
        self.cfg = cfg  # and so its vitlab_spec, what a checkpoint of this model records
        self._input_size_changed()
        old = dict(getattr(self, "pretrained_cfg", None) or {})
        set_pretrained_cfg(self, {**old, "input_size": (cfg.in_chans, img, img)})
