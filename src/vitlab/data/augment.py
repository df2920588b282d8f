"""Batch augmentation on tensors: one random affine per image, applied to the whole batch at once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.errors import DataError

__all__ = ["BatchAugment"]


class BatchAugment(torch.nn.Module):
    """Random affine (rotation, scale, x-shear, translation, flip, pad-and-crop shift) and erasing of a batch.

    Every image gets its own parameters; all are composed into one (B, 2, 3) matrix and applied with a
    single ``affine_grid`` + ``grid_sample`` call (bilinear, zero padding: on a normalised batch zero is
    the data set's mean colour, on a uint8 batch it is black).

    Args:
        degrees: rotation drawn uniformly in [-degrees, degrees].
        scale: zoom factor drawn uniformly in [scale[0], scale[1]] (> 1 enlarges the content).
        shear: x-shear angle drawn uniformly in [-shear, shear] degrees.
        translate: shift drawn uniformly in [-translate, translate] times the width / height.
        erase_prob: probability of timm's ``RandomErasing`` (per-pixel noise) on each image.
        hflip: flip each image left-right with probability 0.5.
        pad_crop: shift by a whole number of pixels in [-pad_crop, pad_crop] per axis, the tensor
            form of "pad by pad_crop then random crop".

    Geometric parameters come from ``generator`` when given (deterministic), else the global torch RNG.
    Erasing is timm's and draws from the global Python and torch RNGs.
    """

    def __init__(
        self,
        *,
        degrees: float = 12.0,
        scale: tuple[float, float] = (0.9, 1.1),
        shear: float = 8.0,
        translate: float = 0.12,
        erase_prob: float = 0.0,
        hflip: bool = False,
        pad_crop: int = 0,
    ) -> None:
        super().__init__()
        scale = (float(scale[0]), float(scale[1]))
        if degrees < 0 or shear < 0 or translate < 0 or pad_crop < 0:
            raise DataError(
                f"augmentation magnitudes must be >= 0 (degrees={degrees}, shear={shear}, "
                f"translate={translate}, pad_crop={pad_crop}); use 0 to switch one off"
            )
        if not 0 < scale[0] <= scale[1]:
            raise DataError(f"augmentation scale={scale} must satisfy 0 < low <= high; e.g. (0.9, 1.1)")
        if not 0.0 <= erase_prob <= 1.0:
            raise DataError(f"erase_prob={erase_prob} is a probability; use a value in [0, 1]")
        if abs(shear) >= 90:
            raise DataError(f"shear={shear} degrees is degenerate; use a value below 90")
        self.degrees = float(degrees)
        self.scale = scale
        self.shear = float(shear)
        self.translate = float(translate)
        self.erase_prob = float(erase_prob)
        self.hflip = bool(hflip)
        self.pad_crop = int(pad_crop)
        self._eraser = None
        if self.erase_prob > 0:
            from timm.data.random_erasing import RandomErasing

            self._eraser = RandomErasing(probability=self.erase_prob, mode="pixel", device="cpu")

    @property
    def geometric(self) -> bool:
        """True when the affine part does something."""
        return bool(
            self.degrees or self.scale != (1.0, 1.0) or self.shear or self.translate or self.hflip
            or self.pad_crop
        )

    def extra_repr(self) -> str:
        return (
            f"degrees={self.degrees}, scale={self.scale}, shear={self.shear}, translate={self.translate}, "
            f"erase_prob={self.erase_prob}, hflip={self.hflip}, pad_crop={self.pad_crop}"
        )

    def sample_theta(self, batch: int, height: int, width: int,
                     generator: torch.Generator | None = None) -> Tensor:
        """Random (B, 2, 3) float32 matrices mapping output to input coordinates, as ``affine_grid`` wants."""
        device = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand(batch, 8, generator=generator, device=device, dtype=torch.float64)  # (B, 8) in [0, 1)
        u = u.cpu()
        angle = torch.deg2rad((2 * u[:, 0] - 1) * self.degrees)
        s = self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 1]
        shear = torch.deg2rad((2 * u[:, 2] - 1) * self.shear)
        tx = (2 * u[:, 3] - 1) * self.translate * width  # pixels
        ty = (2 * u[:, 4] - 1) * self.translate * height
        if self.pad_crop:  # whole-pixel shift in [-pad_crop, pad_crop]
            n = 2 * self.pad_crop + 1
            tx = tx + (u[:, 5] * n).floor().clamp_(max=n - 1) - self.pad_crop
            ty = ty + (u[:, 6] * n).floor().clamp_(max=n - 1) - self.pad_crop
        flip = torch.where(u[:, 7] < 0.5, -1.0, 1.0) if self.hflip else torch.ones(batch, dtype=torch.float64)
        # forward map in pixel coordinates about the centre: M = R(angle) @ Shear_x @ diag(s * flip, s)
        cos, sin, tan = torch.cos(angle), torch.sin(angle), torch.tan(shear)
        m00, m01 = cos * s * flip, (cos * tan - sin) * s
        m10, m11 = sin * s * flip, (sin * tan + cos) * s
        # inverse of the 2x2 part; translation of the inverse map is -M^-1 t
        det = m00 * m11 - m01 * m10
        i00, i01, i10, i11 = m11 / det, -m01 / det, -m10 / det, m00 / det
        # to affine_grid's normalised coordinates: x_n = 2 x / W, y_n = 2 y / H
        ax, ay = 2.0 / width, 2.0 / height
        theta = torch.stack(
            [
                torch.stack([i00, i01 * ax / ay, -(i00 * tx + i01 * ty) * ax], dim=1),
                torch.stack([i10 * ay / ax, i11, -(i10 * tx + i11 * ty) * ay], dim=1),
            ],
            dim=1,
        )  # (B, 2, 3)
        return theta.float()

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Augment a (B, C, H, W) batch; returns a new tensor of the same shape and dtype."""
        if x.dim() != 4:
            raise DataError(f"BatchAugment expects a (B, C, H, W) batch, got shape {tuple(x.shape)}; "
                            "add a batch dimension with x.unsqueeze(0)")
        if not self.geometric and self._eraser is None:
            return x
        dtype = x.dtype
        out = x if dtype.is_floating_point else x.float()
        if self.geometric:
            b, _, h, w = out.shape
            theta = self.sample_theta(b, h, w, generator).to(device=out.device, dtype=out.dtype)
            grid = F.affine_grid(theta, list(out.shape), align_corners=False)  # (B, H, W, 2)
            out = F.grid_sample(out, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        elif out is x:
            out = x.clone()
        if self._eraser is not None:
            self._eraser.device = out.device
            out = self._eraser(out)  # in place, per image
        if not dtype.is_floating_point:
            out = out.round_().clamp_(0, 255).to(dtype)
        return out

