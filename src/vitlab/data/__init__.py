"""Data sets held in memory as uint8 tensors, batch augmentation on tensors, and image files.

``load_dataset`` returns (train, test) :class:`DataSplit` s already at the model's ``in_chans`` and
``img_size``; ``normalize`` turns a uint8 batch into float32 and ``BatchAugment`` augments a whole
batch with one ``grid_sample`` call.
"""

from vitlab.data.augment import BatchAugment
from vitlab.data.datasets import (
    DATASETS,
    DataSplit,
    dataset_stats,
    default_root,
    load_dataset,
    mnist5k_split_indices,
    normalization,
    normalize,
)
from vitlab.data.idx import find_idx_files, read_idx
from vitlab.data.images import IMAGE_EXTENSIONS, convert_channels, load_image, prepare_images, resize_images

__all__ = [
    "DATASETS",
    "IMAGE_EXTENSIONS",
    "BatchAugment",
    "DataSplit",
    "convert_channels",
    "dataset_stats",
    "default_root",
    "find_idx_files",
    "load_dataset",
    "load_image",
    "mnist5k_split_indices",
    "normalization",
    "normalize",
    "prepare_images",
    "read_idx",
    "resize_images",
]
