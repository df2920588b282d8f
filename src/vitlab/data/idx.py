"""Reader for the idx file format of MNIST and Fashion-MNIST (gzip-compressed or not): the header checked here
for clear messages, the elements read by torchvision's MNIST reader.

An idx file is a 4-byte magic number ``0x0000TTDD`` (``TT`` the element type, ``DD`` the number of
dimensions), ``DD`` big-endian uint32 sizes, then the elements in row-major order. MNIST uses
``TT = 0x08`` (unsigned byte): images are idx3 (``0x00000803``), labels idx1 (``0x00000801``).
"""

from __future__ import annotations

import gzip
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch

from vitlab.errors import DataError

__all__ = ["IDX_FILES", "find_idx_files", "load_idx_split", "read_idx"]

# role -> standard file stem; each may be stored as "<stem>.gz" or "<stem>"
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# element type code -> bytes per element (the types torchvision's reader knows)
_ITEM_SIZES: dict[int, int] = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}
_KIND = {1: "idx1 label file", 3: "idx3 image file"}
_FIX = "replace it with the original MNIST-format file (train-images-idx3-ubyte.gz and friends)"


def _read_bytes(path: Path) -> tuple[bytes, bool]:
    """(the file's content, gunzipped when it starts with the gzip magic bytes; whether it was)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}; check the file's permissions") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw), True
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(
                f"{path} is a damaged or truncated gzip file ({exc}); {_FIX}"
            ) from exc
    return raw, False


def read_idx(path: str | Path, *, ndim: int | None = None) -> np.ndarray:
    """Parse an idx file into a numpy array of its stored shape (torchvision's MNIST reader,
    ``read_sn3_pascalvincent_tensor``, after the header is checked here).

    ``ndim`` (1 for labels, 3 for images) is checked against the magic number. Wrong magic numbers,
    truncated data and trailing bytes raise :class:`DataError` naming the file.
    """
    path = Path(path)
    data, compressed = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path} is truncated: {len(data)} bytes, too short for an idx header; {_FIX}")
    (magic,) = struct.unpack(">I", data[:4])
    code, dims = (magic >> 8) & 0xFF, magic & 0xFF
    expected = f"expected an {_KIND.get(ndim, 'idx file')}" + (
        f" (magic 0x{0x800 | ndim:08x})" if ndim is not None else ""
    )
    if magic >> 16 != 0 or code not in _ITEM_SIZES or not 1 <= dims <= 3 or (ndim is not None and dims != ndim):
        raise DataError(f"{path}: wrong magic number 0x{magic:08x}; {expected}; {_FIX}")
    header = 4 + 4 * dims
    if len(data) < header:
        raise DataError(f"{path} is truncated inside its header ({len(data)} bytes); {_FIX}")
    shape = struct.unpack(f">{dims}I", data[4:header])
    need = int(np.prod(shape, dtype=np.int64)) * _ITEM_SIZES[code]
    have = len(data) - header
    if have < need:
        raise DataError(
            f"{path} is truncated: shape {tuple(shape)} needs {need} data bytes but only {have} are "
            f"present; {_FIX}"
        )
    if have > need:
        raise DataError(
            f"{path} has {have - need} bytes beyond its declared shape {tuple(shape)}; {_FIX}"
        )
    from torchvision.datasets.mnist import SN3_PASCALVINCENT_TYPEMAP, read_sn3_pascalvincent_tensor

    if need == 0:  # torchvision cannot view an empty buffer
        return torch.empty(shape, dtype=SN3_PASCALVINCENT_TYPEMAP[code]).numpy()
    if not compressed:  # torchvision reads the file itself
        return read_sn3_pascalvincent_tensor(str(path)).numpy()
    with tempfile.TemporaryDirectory() as tmp:  # torchvision reads a path: give it the unpacked bytes
        plain = Path(tmp) / path.name.removesuffix(".gz")
        plain.write_bytes(data)
        return read_sn3_pascalvincent_tensor(str(plain)).numpy()


def _candidate_dirs(data_dir: Path) -> list[Path]:
    """Folders that may hold the four files: the folder itself and torchvision's raw folders."""
    return [data_dir, data_dir / "MNIST" / "raw", data_dir / "FashionMNIST" / "raw", data_dir / "raw"]


def find_idx_files(data_dir: str | Path, *, prefer: str | None = None) -> dict[str, Path] | None:
    """The four idx files found in one folder under ``data_dir``, or ``None`` when no folder has all four.

    ``prefer`` ("MNIST" or "FashionMNIST") picks that torchvision sub-folder first when both exist.
    """
    data_dir = Path(data_dir)
    dirs = _candidate_dirs(data_dir)
    if prefer is not None:
        dirs.sort(key=lambda d: 0 if d == data_dir else (1 if d.parent.name == prefer else 2))
    for folder in dirs:
        found: dict[str, Path] = {}
        for role, stem in IDX_FILES.items():
            for name in (stem + ".gz", stem):
                if (folder / name).is_file():
                    found[role] = folder / name
                    break
        if len(found) == len(IDX_FILES):
            return found
    return None


def load_idx_split(files: dict[str, Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read the four files: (train images (N,H,W), train labels (N,), test images, test labels)."""
    out = []
    for split in ("train", "test"):
        images = read_idx(files[f"{split}_images"], ndim=3)
        labels = read_idx(files[f"{split}_labels"], ndim=1)
        if images.dtype != np.uint8 or labels.dtype != np.uint8:
            raise DataError(
                f"{files[f'{split}_images']}: MNIST idx files hold unsigned bytes (type 0x08); {_FIX}"
            )
        if len(images) != len(labels):
            raise DataError(
                f"{files[f'{split}_images']} has {len(images)} images but {files[f'{split}_labels']} has "
                f"{len(labels)} labels; use the matching pair of files"
            )
        out += [images, labels]
    return out[0], out[1], out[2], out[3]
