"""What a trained model reaches on each data set: the yardstick studies use to flag under-trained runs.

:data:`REFERENCE_ACCURACY` is the test accuracy a small ViT reaches with the data set's default recipe
(:data:`vitlab.train.recipes.SIZE_DEFAULTS`) on the full training set. A study run that ends more than
:data:`UNDERTRAINED_MARGIN` below it is marked under-trained: its number describes an early phase of
training (on mnist-5k, the plateau near 20-45 %), not the finding the study is after. Data sets without an
entry (CIFAR, image folders) are not checked.
"""

from __future__ import annotations

from vitlab.catalog import CATALOG

REFERENCE_ACCURACY: dict[str, float] = {n: d.reference_acc for n, d in CATALOG.items() if d.reference_acc}
UNDERTRAINED_MARGIN = 0.05  # five points of accuracy

# training images per data set (the recipe row of SIZE_DEFAULTS depends on it)
TRAIN_SIZES: dict[str, int] = {n: d.num_train for n, d in CATALOG.items() if d.num_train}


def reference_accuracy(dataset: str, limit_train: int | None = None) -> float | None:
    """The reference test accuracy for a run on ``dataset``; None when unknown or when the run trains on a
    subset (``limit_train`` below the full set), for which the reference does not hold."""
    ref = REFERENCE_ACCURACY.get(dataset)
    full = TRAIN_SIZES.get(dataset)
    if ref is None or (limit_train is not None and (full is None or limit_train < full)):
        return None
    return ref


def is_undertrained(test_acc: float, dataset: str, limit_train: int | None = None,
                    margin: float = UNDERTRAINED_MARGIN) -> bool:
    """True when ``test_acc`` (a fraction) ends more than ``margin`` below the data set's reference."""
    ref = reference_accuracy(dataset, limit_train)
    return ref is not None and test_acc == test_acc and test_acc < ref - margin
