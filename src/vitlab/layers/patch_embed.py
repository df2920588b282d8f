"""Image to patch tokens: a strided convolution, or DeepViT's convolutional stem."""

from __future__ import annotations

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


class PatchEmbed(nn.Module):
    """``(B, C, H, W) -> (B, N, D)`` with ``N = (img_size / patch_size) ** 2`` (timm name ``proj``)."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 bias: bool = True) -> None:
        super().__init__()
        if in_chans <= 0 or embed_dim <= 0:
            raise ConfigError(f"in_chans and embed_dim must be positive, got {in_chans} and {embed_dim}")
        self.grid_size = check_grid(img_size, patch_size)
        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.num_patches = self.grid_size**2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        _check_input(x, self.in_chans, self.img_size)
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, D, g, g) -> (B, N, D)

    def flop_count(self, num_tokens: int | None = None, *, matmul_only: bool = False) -> int:
        n = self.num_patches if num_tokens is None else num_tokens
        return n * self.proj.in_channels * self.patch_size**2 * self.proj.out_channels


class ConvStem(nn.Module):
    """DeepViT's convolutional stem (official ``PatchEmbed_CNN``): a 7x7/2 conv and two 3x3 convs with
    BatchNorm and ReLU (64 channels), then a ``patch_size/2`` strided projection."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 stem_chans: int = 64) -> None:
        super().__init__()
        self.grid_size = check_grid(img_size, patch_size)
        if patch_size % 2:
            raise ConfigError(f"the convolutional stem halves the image first, so patch_size must be even, "
                              f"got {patch_size}; use an even patch_size or stem='patch'")
        self.img_size, self.patch_size, self.in_chans = img_size, patch_size, in_chans
        self.num_patches = self.grid_size**2
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
        _check_input(x, self.in_chans, self.img_size)
        x = self.act(self.bn1(self.conv1(x)))  # (B, 64, H/2, W/2)
        x = self.act(self.bn2(self.conv2(x)))
        x = self.act(self.bn3(self.conv3(x)))
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)

    def flop_count(self, num_tokens: int | None = None, *, matmul_only: bool = False) -> int:
        half = (self.img_size // 2) ** 2
        c = self.conv1.out_channels
        macs = half * c * (self.in_chans * 49 + 2 * c * 9)
        macs += self.num_patches * c * (self.patch_size // 2) ** 2 * self.proj.out_channels
        return macs if matmul_only else macs + 3 * 2 * half * c  # BatchNorm (eval): scale and shift-mul


def _check_input(x: Tensor, in_chans: int, img_size: int) -> None:
    if x.ndim != 4 or x.shape[1] != in_chans or x.shape[2] != img_size or x.shape[3] != img_size:
        raise ConfigError(
            f"expected images of shape (B, {in_chans}, {img_size}, {img_size}), got {tuple(x.shape)}; "
            f"resize the input or create the model with matching img_size/in_chans"
        )
