"""Inference helpers shared by ``vitlab eval`` and ``vitlab predict``: normalisation, class names, top-k."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint import ModelSpec
from vitlab.data import load_image, normalization, normalize
from vitlab.data.datasets import shown
from vitlab.data.images import IMAGE_EXTENSIONS, find_images
from vitlab.errors import DataError
from vitlab.inference.evaluate import top_k


def checkpoint_normalization(config: dict[str, Any], dataset: str | None,
                             in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The (mean, std) the checkpoint was trained with; else the statistics of ``dataset``."""
    data = (config.get("run") or {}).get("data") or {}
    if data.get("mean") and len(data["mean"]) == in_chans:
        return tuple(data["mean"]), tuple(data["std"])
    if dataset is None:
        return (0.5,) * in_chans, (0.5,) * in_chans
    return normalization(dataset, in_chans)


def class_names(config: dict[str, Any], num_classes: int) -> list[str]:
    """The class names of a checkpoint as they are shown (:func:`vitlab.data.datasets.shown`), else the class
    indices."""
    classes = ((config.get("run") or {}).get("data") or {}).get("classes")
    if classes and len(classes) == num_classes:
        return [shown(str(c)) for c in classes]
    return [str(i) for i in range(num_classes)]


PREDICT_BATCH = 64  # images read and classified at a time, so a long list of files never sits in memory at once


@torch.no_grad()
def iter_predictions(model: nn.Module, config: dict[str, Any], paths: Sequence[str | Path], *, k: int = 5,
                     device: torch.device | str = "cpu",
                     batch_size: int = PREDICT_BATCH) -> Iterator[tuple[Path, list[tuple[str, float]] | DataError]]:
    """(path, top-``k`` (class name, probability), best first) for each image file, in order; a folder stands for
    its image files (:func:`vitlab.data.images.find_images`, recursive). A file that cannot be read, or a folder
    without images, comes as (path, the :class:`DataError` naming why) in its place, and the files after it are
    still classified; stopping at the first one is the caller's choice (close the iterator)."""
    img_size, in_chans = ModelSpec.from_dict(config["model"]).input_shape
    mean, std = checkpoint_normalization(config, (config.get("run") or {}).get("dataset"), in_chans)
    model = model.to(device).eval()
    names: list[str] | None = None
    pending: list[tuple[Path, torch.Tensor]] = []

    def flush() -> Iterator[tuple[Path, list[tuple[str, float]]]]:
        nonlocal names
        if not pending:
            return
        logits = model(normalize(torch.stack([x for _, x in pending]).to(device), mean, std))  # (N, classes)
        probs, idx = top_k(logits, k)
        names = names or class_names(config, logits.shape[-1])
        for (path, _), prow, irow in zip(pending, probs.tolist(), idx.tolist()):
            yield path, [(names[i], float(pr)) for pr, i in zip(prow, irow)]
        pending.clear()

    for path, problem in _image_paths(paths):
        try:
            if problem is not None:
                raise problem
            pending.append((path, load_image(path, img_size=img_size, in_chans=in_chans)))  # (C, H, W)
        except DataError as exc:
            yield from flush()  # the files before a bad one come out before its error
            yield path, exc
            continue
        if len(pending) >= batch_size:
            yield from flush()
    yield from flush()


def _image_paths(paths: Sequence[str | Path]) -> Iterator[tuple[Path, DataError | None]]:
    """(path, None) for each path given, a folder replaced by its image files, or (folder, the error) when it holds
    none."""
    for p in map(Path, paths):
        found = find_images(p) if p.is_dir() else [p]
        if not found:
            yield p, DataError(f"folder {p} holds no image files ({' '.join(sorted(IMAGE_EXTENSIONS))}, searched "
                               "recursively); pass image files or a folder of them")
        yield from ((f, None) for f in found)


def predict_files(model: nn.Module, config: dict[str, Any], paths: Sequence[str | Path], *, k: int = 5,
                  device: torch.device | str = "cpu") -> list[list[tuple[str, float]]]:
    """Top-``k`` (class name, probability) per image file, best first (folders stand for their images, as in
    :func:`iter_predictions`); the first file that cannot be read raises its :class:`DataError`."""
    out = []
    for _, top in iter_predictions(model, config, paths, k=k, device=device):
        if isinstance(top, DataError):
            raise top
        out.append(top)
    return out
