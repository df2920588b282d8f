"""Image to patch tokens: a strided convolution, or DeepViT's convolutional stem."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.errors import ConfigError


def check_grid(img_size: int, patch_size: int) -> int:
    """Validate sizes and return the grid side ``img_size // patch_size``."""
    if img_size <= 0 or patch_size <= 0:
        raise ConfigError(f"img_size and patch_size must be positive, got img_size={img_size}, "
                          f"patch_size={patch_size}")
    if img_size % patch_size:
        lo = img_size - img_size % patch_size
        raise ConfigError(
            f"img_size {img_size} is not a multiple of patch_size {patch_size}; use img_size {lo} or "
            f"{lo + patch_size}, or a patch_size that divides {img_size}"
        )
    return img_size // patch_size


def resample_kernel(weight: Tensor, size: int) -> Tensor:
    """A patch kernel ``(D, C, p, p)`` for ``size x size`` patches such that a patch resized (bicubic, antialiased)
    to the new size gives, in the least-squares sense, the old embedding (FlexiViT, Beyer et al. 2023): with
    ``B`` the resize as a matrix, the new kernel is ``pinv(B^T) w``."""
    D, C, p, _ = weight.shape
    if p == size:
        return weight
    basis = torch.eye(p * p, dtype=torch.float32, device=weight.device).reshape(p * p, 1, p, p)
    resized = F.interpolate(basis, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    inverse = torch.linalg.pinv(resized.reshape(p * p, size * size))  # pinv(B^T): (size^2, p^2)
    out = weight.float().reshape(D * C, p * p) @ inverse.T  # (D*C, size^2)
    return out.reshape(D, C, size, size).to(weight.dtype)


class _Resizable:
    """Input-size plumbing shared by the stems: the configured grid, and with ``dynamic_img_size`` the grid
    of any input whose sides are multiples of the patch (or padded up to one with ``dynamic_img_pad``)."""

    img_size: int
    patch_size: int
    in_chans: int
    dynamic_img_size: bool = False
    dynamic_img_pad: bool = False
    proj: nn.Conv2d

    def _set_grid(self, img_size: int, patch_size: int) -> None:
        self.grid_size = check_grid(img_size, patch_size)
        self.img_size, self.patch_size = img_size, patch_size
        self.num_patches = self.grid_size**2

    def feat_size(self, x: Tensor) -> tuple[int, int]:
        """``(grid_h, grid_w)`` of the patch grid for images ``x`` (checked, as ``forward`` checks them)."""
        x = _check_input(x, self.in_chans, self.img_size, self.patch_size, self.dynamic_img_size,
                         self.dynamic_img_pad)
        if not self.dynamic_img_size:
            return self.grid_size, self.grid_size
        p = self.patch_size
        return -(-x.shape[-2] // p), -(-x.shape[-1] // p)

    def _pad(self, x: Tensor) -> Tensor:
        x = _check_input(x, self.in_chans, self.img_size, self.patch_size, self.dynamic_img_size,
                         self.dynamic_img_pad)
        if self.dynamic_img_pad:
            p = self.patch_size
            x = F.pad(x, (0, (p - x.shape[-1] % p) % p, 0, (p - x.shape[-2] % p) % p))  # right and bottom
        return x

    def _resample_proj(self, kernel: int) -> None:
        """Swap ``proj`` for a ``kernel``-sized one whose weights are the resampled old ones (FlexiViT)."""
        old = self.proj
        if old.kernel_size[0] == kernel:
            return
        new = nn.Conv2d(old.in_channels, old.out_channels, kernel_size=kernel, stride=kernel, bias=old.bias is not None,
                        device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(resample_kernel(old.weight, kernel))
            if old.bias is not None:
                new.bias.copy_(old.bias)
        new.weight.requires_grad_(old.weight.requires_grad)
        if new.bias is not None:
            new.bias.requires_grad_(old.bias.requires_grad)
        self.proj = new.train(old.training)


class PatchEmbed(_Resizable, nn.Module):
    """``(B, C, H, W) -> (B, N, D)`` with ``N = (img_size / patch_size) ** 2`` (timm name ``proj``).

    With ``dynamic_img_size`` any ``H, W`` that are multiples of the patch give ``N = (H / p) * (W / p)``,
    in row-major order; ``dynamic_img_pad`` zero-pads the right and bottom edges up to a multiple first."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 bias: bool = True, *, dynamic_img_size: bool = False, dynamic_img_pad: bool = False) -> None:
        super().__init__()
        if in_chans <= 0 or embed_dim <= 0:
            raise ConfigError(f"in_chans and embed_dim must be positive, got {in_chans} and {embed_dim}")
        self._set_grid(img_size, patch_size)
        self.in_chans = in_chans
        self.dynamic_img_size, self.dynamic_img_pad = dynamic_img_size, dynamic_img_pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self._pad(x)).flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, N, D)

    def set_input_size(self, img_size: int | None = None, patch_size: int | None = None) -> None:
        """New configured size; a new patch size resamples the kernel (timm's ``PatchEmbed.set_input_size``)."""
        patch = self.patch_size if patch_size is None else patch_size
        self._set_grid(self.img_size if img_size is None else img_size, patch)
        self._resample_proj(patch)

    def flop_count(self, num_tokens: int | None = None, *, matmul_only: bool = False) -> int:
        n = self.num_patches if num_tokens is None else num_tokens
        return n * self.proj.in_channels * self.patch_size**2 * self.proj.out_channels


class ConvStem(_Resizable, nn.Module):
    """DeepViT's convolutional stem (official ``PatchEmbed_CNN``): a 7x7/2 conv and two 3x3 convs with
    BatchNorm and ReLU (64 channels), then a ``patch_size/2`` strided projection."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 stem_chans: int = 64, *, dynamic_img_size: bool = False, dynamic_img_pad: bool = False) -> None:
        super().__init__()
        _check_even(patch_size)
        self._set_grid(img_size, patch_size)
        self.in_chans = in_chans
        self.dynamic_img_size, self.dynamic_img_pad = dynamic_img_size, dynamic_img_pad
        c = stem_chans
        self.conv1 = nn.Conv2d(in_chans, c, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.act = nn.ReLU(inplace=True)
        self.proj = nn.Conv2d(c, embed_dim, kernel_size=patch_size // 2, stride=patch_size // 2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.act(self.bn1(self.conv1(self._pad(x))))  # (B, 64, H/2, W/2)
        x = self.act(self.bn2(self.conv2(x)))
        x = self.act(self.bn3(self.conv3(x)))
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)

    def set_input_size(self, img_size: int | None = None, patch_size: int | None = None) -> None:
        """New configured size; a new patch size resamples the final ``patch_size / 2`` projection."""
        patch = self.patch_size if patch_size is None else patch_size
        _check_even(patch)
        self._set_grid(self.img_size if img_size is None else img_size, patch)
        self._resample_proj(patch // 2)

    def flop_count(self, num_tokens: int | None = None, *, matmul_only: bool = False) -> int:
        half = (self.img_size // 2) ** 2
        c = self.conv1.out_channels
        macs = half * c * (self.in_chans * 49 + 2 * c * 9)
        macs += self.num_patches * c * (self.patch_size // 2) ** 2 * self.proj.out_channels
        return macs if matmul_only else macs + 3 * 2 * half * c  # BatchNorm (eval): scale and shift-mul


def _check_even(patch_size: int) -> None:
    if patch_size % 2:
        raise ConfigError(f"the convolutional stem halves the image first, so patch_size must be even, "
                          f"got {patch_size}; use an even patch_size or stem='patch'")


@torch.fx.wrap  # a leaf of torch.fx graphs: the traced model checks its input at run time, as the eager one
def _check_input(x: Tensor, in_chans: int, img_size: int, patch_size: int, dynamic: bool, pad: bool) -> Tensor:
    """``x`` itself, or a :class:`ConfigError` naming the fix when its shape does not fit the stem."""
    if not dynamic:
        if x.ndim != 4 or x.shape[1] != in_chans or x.shape[2] != img_size or x.shape[3] != img_size:
            raise ConfigError(
                f"expected images of shape (B, {in_chans}, {img_size}, {img_size}), got {tuple(x.shape)}; "
                f"resize the input or create the model with matching img_size/in_chans (or call "
                f"model.set_input_size(img_size=...), or build it with dynamic_img_size=True)")
    elif x.ndim != 4 or x.shape[1] != in_chans:
        raise ConfigError(f"expected images of shape (B, {in_chans}, H, W), got {tuple(x.shape)}; convert the "
                          f"input or create the model with matching in_chans")
    elif not pad and (x.shape[2] % patch_size or x.shape[3] % patch_size):
        raise ConfigError(f"image sides {x.shape[2]}x{x.shape[3]} are not multiples of patch_size {patch_size}; "
                          f"crop or resize them, or build the model with dynamic_img_pad=True")
    return x
