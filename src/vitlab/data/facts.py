"""What a data set is before its images are decoded: how many training and test images, which classes, the native
image size and channels (:func:`data_facts`). A run's plan is made from these facts (:mod:`vitlab.train.plan`).

They come from the catalog (:mod:`vitlab.catalog`) for data sets whose files are fixed (mnist-5k, and the files
torchvision downloads), from the headers of the label files for MNIST-format idx files in ``--data-dir``, and from
the listing of an image folder. The data stage of a run checks the loaded data against them.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

from vitlab.catalog import CATALOG
from vitlab.data.datasets import _canonical, data_folder, imagefolder_files
from vitlab.data.idx import find_idx_files, read_idx
from vitlab.errors import DataError

__all__ = ["DataFacts", "data_facts", "idx_length"]


@dataclass(frozen=True)
class DataFacts:
    """A data set's facts, known before its images are read."""

    dataset: str  # canonical name
    num_train: int  # images in the training split (before any subset)
    num_test: int
    num_classes: int
    classes: tuple[str, ...] | None  # the class names; None where only the loaded files tell (torchvision's)
    img_size: int | None  # native side in pixels (None: an image folder, whose images are resized)
    in_chans: int | None


def idx_length(path: Path) -> int:
    """The number of items an idx file holds (its first dimension), read from its header alone; a damaged file is
    refused as :func:`vitlab.data.read_idx` refuses it."""
    try:
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as fh:
            head = fh.read(8)
        magic, length = struct.unpack(">II", head)
    except (OSError, EOFError, struct.error):
        magic, length = 0, 0
    if magic >> 16 != 0 or not 1 <= magic & 0xFF <= 3:
        read_idx(path)  # raises the one-line error naming the file
        raise DataError(f"{path} has no idx header; replace it with the original MNIST-format file")
    return length


def data_facts(name: str, data_dir: str | Path | None = None) -> DataFacts:
    """The facts of data set ``name`` (read from ``data_dir`` where its files are the user's)."""
    key = _canonical(name)
    info = CATALOG[key]
    folder = data_folder(key, data_dir)
    if key == "imagefolder":
        if folder is None:
            raise DataError("imagefolder needs a folder: pass --data-dir with train/<class>/ and "
                            "val/<class>/ sub-folders of images")
        classes, train, val = imagefolder_files(folder)
        return DataFacts(key, len(train), len(val), len(classes), tuple(classes), None, None)
    num_train, num_test = info.num_train, info.num_test
    files = None
    if folder is not None and key in ("mnist", "fashion-mnist"):
        files = find_idx_files(folder, prefer="FashionMNIST" if key == "fashion-mnist" else "MNIST")
    if files is not None:
        num_train, num_test = idx_length(files["train_labels"]), idx_length(files["test_labels"])
    # torchvision names the classes of the files it reads, but for MNIST's (vitlab's bare digits)
    by_loader = files is None and key not in ("mnist", "mnist-5k")
    classes = None if by_loader else info.classes
    return DataFacts(key, num_train, num_test, info.num_classes, classes, info.img_size, info.in_chans)
