"""Batch augmentation on tensors: one random affine per image, applied to the whole batch at once
(:class:`BatchAugment`), and DeiT III's 3-Augment (:class:`ThreeAugment`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.errors import DataError

__all__ = ["BatchAugment", "ThreeAugment"]


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



THREE_AUGMENT_OPS = ("grayscale", "solarize", "blur")


class ThreeAugment(torch.nn.Module):
    """DeiT III's 3-Augment (Touvron et al. 2022; ``new_data_aug_generator`` in the authors' ``augment.py``) on a
    uint8 (B, C, H, W) batch: each image gets exactly one of grayscale, solarization (pixels >= 128 inverted) or a
    Gaussian blur of sigma drawn in [0.1, 2.0], then a color jitter of brightness, contrast and saturation factors
    drawn in [1 - color_jitter, 1 + color_jitter], applied in a random order (torchvision's ``ColorJitter``).

    The flip and crop of the recipe are :class:`BatchAugment`'s. On one-channel images (MNIST) grayscale and
    saturation leave the image as it is, so a third of the images get no operation of the three.
    ``ops=False`` keeps the color jitter alone. Every draw comes from ``generator`` (else the global torch RNG);
    the ops are torchvision's (``torchvision.transforms.v2.functional``), one image at a time.
    """

    def __init__(self, *, color_jitter: float = 0.3, ops: bool = True) -> None:
        super().__init__()
        if not 0.0 <= color_jitter <= 1.0:
            raise DataError(f"color_jitter={color_jitter} must be in [0, 1] (factors in [1 - c, 1 + c]); e.g. 0.3")
        self.color_jitter = float(color_jitter)
        self.ops = bool(ops)

    def extra_repr(self) -> str:
        return f"ops={self.ops}, color_jitter={self.color_jitter}"

    def sample(self, batch: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """The random parameters of a batch: ``op`` (B,) index into :data:`THREE_AUGMENT_OPS`, ``sigma`` (B,),
        ``jitter`` (B, 3) brightness / contrast / saturation factors and ``order`` (B, 3) their order."""
        device = generator.device if generator is not None else torch.device("cpu")
        op = torch.randint(len(THREE_AUGMENT_OPS), (batch,), generator=generator, device=device).cpu()
        u = torch.rand(batch, 4, generator=generator, device=device, dtype=torch.float64).cpu()
        order = torch.rand(batch, 3, generator=generator, device=device).cpu().argsort(dim=1)
        c = self.color_jitter
        return {"op": op, "sigma": 0.1 + 1.9 * u[:, 0], "jitter": 1 - c + 2 * c * u[:, 1:], "order": order}

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Augment a uint8 (B, C, H, W) batch; returns a new uint8 tensor of the same shape."""
        if x.dim() != 4 or x.dtype != torch.uint8:
            raise DataError(f"ThreeAugment expects a uint8 (B, C, H, W) batch, got {x.dtype} of shape "
                            f"{tuple(x.shape)}; apply it before normalising")
        params = self.sample(len(x), generator)
        return torch.stack([self.apply_one(img, params, i) for i, img in enumerate(x)]) if len(x) else x.clone()

    def apply_one(self, img: Tensor, params: dict[str, Tensor], i: int) -> Tensor:
        """Image ``i`` of a batch (C, H, W) with its parameters from :meth:`sample`."""
        from torchvision.transforms.v2 import functional as TF

        if self.ops:
            img = self.apply_op(img, THREE_AUGMENT_OPS[int(params["op"][i])], float(params["sigma"][i]))
        if self.color_jitter:
            adjust = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation)
            for k in params["order"][i].tolist():
                img = adjust[k](img, float(params["jitter"][i, k]))
        return img

    @staticmethod
    def apply_op(img: Tensor, op: str, sigma: float = 1.0) -> Tensor:
        """One 3-Augment operation on a uint8 (C, H, W) image: ``grayscale`` (identity on one channel),
        ``solarize`` (PIL's threshold, 128) or ``blur`` (Gaussian of ``sigma``, a kernel of 3 sigma either side)."""
        from torchvision.transforms.v2 import functional as TF

        if op == "grayscale":
            return TF.rgb_to_grayscale(img, num_output_channels=img.shape[0]) if img.shape[0] == 3 else img
        if op == "solarize":
            return TF.solarize(img, threshold=128)
        size = min(2 * math.ceil(3 * sigma) + 1, 2 * min(img.shape[-2:]) - 1)  # reflect padding: below the size
        size = size if size % 2 else size - 1
        return TF.gaussian_blur(img, [size, size], [sigma, sigma])
