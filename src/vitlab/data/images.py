"""Image tensors: channel conversion, resizing and reading single image files.

All functions work on uint8 tensors, (N, C, H, W) for batches and (C, H, W) for one image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.errors import DataError

__all__ = ["IMAGE_EXTENSIONS", "convert_channels", "find_images", "load_image", "prepare_images", "resize_images"]

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"}
)

# ITU-R 601-2 luma in PIL's 16-bit fixed point: L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16
_LUMA = (19595, 38470, 7471)
_RESIZE_CHUNK = 2048  # images resized per interpolate call, to bound the float32 working memory


def _check_chans(in_chans: int) -> None:
    if in_chans not in (1, 3):
        raise DataError(f"in_chans={in_chans} is not supported for images; use in_chans=1 (gray) or 3 (RGB)")


def convert_channels(images: Tensor, in_chans: int) -> Tensor:
    """Convert uint8 images (N, C, H, W) or (C, H, W) to ``in_chans`` channels.

    1 -> 3 repeats the gray channel; 3 -> 1 takes the ITU-R 601 luminance exactly as PIL's
    ``convert("L")`` does; equal counts return the input unchanged.
    """
    _check_chans(in_chans)
    if images.dim() not in (3, 4):
        raise DataError(f"expected images of shape (N, C, H, W) or (C, H, W), got {tuple(images.shape)}")
    cdim = images.dim() - 3
    c = images.shape[cdim]
    if c == in_chans:
        return images
    if c == 1 and in_chans == 3:
        return images.expand(*images.shape[:cdim], 3, *images.shape[cdim + 1 :]).contiguous()
    if c == 3 and in_chans == 1:
        r, g, b = (images.select(cdim, i).to(torch.int32) for i in range(3))
        luma = (r * _LUMA[0] + g * _LUMA[1] + b * _LUMA[2] + 0x8000) >> 16
        return luma.to(torch.uint8).unsqueeze(cdim)
    raise DataError(
        f"cannot convert {c}-channel images to {in_chans} channels; give 1- or 3-channel images "
        f"or set in_chans={c}"
    )


def resize_images(images: Tensor, img_size: int) -> Tensor:
    """Resize uint8 images (N, C, H, W) or (C, H, W) to (img_size, img_size), bilinear with antialias.

    Returns the input itself when it already has that size.
    """
    if img_size <= 0:
        raise DataError(f"img_size={img_size} must be a positive number of pixels; pass e.g. --img-size 28")
    if images.shape[-2:] == (img_size, img_size):
        return images
    single = images.dim() == 3
    batch = images.unsqueeze(0) if single else images  # (N, C, H, W)
    out = torch.empty((*batch.shape[:2], img_size, img_size), dtype=torch.uint8, device=batch.device)
    for start in range(0, len(batch), _RESIZE_CHUNK):
        chunk = batch[start : start + _RESIZE_CHUNK].float()
        chunk = F.interpolate(chunk, size=(img_size, img_size), mode="bilinear", align_corners=False,
                              antialias=True)
        out[start : start + _RESIZE_CHUNK] = chunk.round_().clamp_(0, 255).to(torch.uint8)
    return out[0] if single else out


def prepare_images(images: Tensor, *, img_size: int, in_chans: int) -> Tensor:
    """Channel conversion and resize, ordered so the costlier step runs on fewer channels."""
    _check_chans(in_chans)
    if images.shape[-3] > in_chans:
        return resize_images(convert_channels(images, in_chans), img_size)
    return convert_channels(resize_images(images, img_size), in_chans)


def _pil_to_array(img, in_chans: int) -> np.ndarray:
    """A PIL image as an (H, W, in_chans) uint8 array, for any PIL mode."""
    from PIL import Image

    mode = img.mode
    if mode.startswith("I;16") or mode in ("I", "F"):  # 16/32-bit gray: scale to 8 bits
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        gray = np.clip(np.round(arr * (255.0 / top)), 0, 255).astype(np.uint8)
        img = Image.fromarray(gray, mode="L")
    elif mode in ("P", "PA"):  # via RGBA so PIL applies the palette's transparency without a warning
        img = img.convert("RGBA")
    # like torchvision's and timm's loaders, alpha is dropped (the stored colour of each pixel is kept)
    img = img.convert("L" if in_chans == 1 else "RGB")
    arr = np.array(img, dtype=np.uint8)  # a writable copy
    return arr[:, :, None] if arr.ndim == 2 else arr


def find_images(folder: str | Path) -> list[Path]:
    """The image files under ``folder`` and all its sub-folders (by suffix, :data:`IMAGE_EXTENSIONS`, any case),
    sorted by path. Hidden files and folders (a leading dot) are skipped, and links to folders are not followed,
    so a link cannot pull a tree in twice or loop."""
    import os

    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files
                  if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_EXTENSIONS]
    return sorted(found, key=str)


def load_image(path: str | Path, *, img_size: int, in_chans: int) -> Tensor:
    """Read one image file (any size, any PIL mode; PNG, JPEG, ...) as a (C, H, W) uint8 tensor.

    The image is converted to ``in_chans`` channels (alpha dropped, as torchvision's loader does), its
    EXIF orientation applied, and resized to ``img_size`` square. Unreadable files raise DataError.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    _check_chans(in_chans)
    path = Path(path)
    try:
        with Image.open(path) as img:
            img.load()
            img = ImageOps.exif_transpose(img)
            arr = _pil_to_array(img, in_chans)  # (H, W, C)
    except FileNotFoundError as exc:
        raise DataError(f"image file {path} does not exist; check the path") from exc
    except UnidentifiedImageError as exc:
        raise DataError(f"{path} is not a readable image; remove it or replace it with a PNG/JPEG") from exc
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        msg = str(exc).replace("\n", " ")
        raise DataError(f"cannot read image {path} ({msg}); remove or re-save the file") from exc
    tensor = torch.from_numpy(arr).permute(2, 0, 1).contiguous()  # (C, H, W)
    return resize_images(tensor, img_size)
