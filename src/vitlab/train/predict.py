"""Inference helpers shared by ``vitlab eval`` and ``vitlab predict``: normalisation, class names, top-k."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.checkpoint import ModelSpec
from vitlab.data import load_image, normalization, normalize
from vitlab.train.evaluate import top_k


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
    classes = ((config.get("run") or {}).get("data") or {}).get("classes")
    return list(classes) if classes and len(classes) == num_classes else [str(i) for i in range(num_classes)]


@torch.no_grad()
def predict_files(model: nn.Module, config: dict[str, Any], paths: list[str | Path], *, k: int = 5,
                  device: torch.device | str = "cpu") -> list[list[tuple[str, float]]]:
    """Top-``k`` (class name, probability) per image file, best first. Every file is read (and checked)
    before the model runs."""
    img_size, in_chans = ModelSpec.from_dict(config["model"]).input_shape
    images = torch.stack([load_image(p, img_size=img_size, in_chans=in_chans) for p in paths])  # (N, C, H, W)
    mean, std = checkpoint_normalization(config, (config.get("run") or {}).get("dataset"), in_chans)
    model = model.to(device).eval()
    logits = model(normalize(images.to(device), mean, std))
    probs, idx = top_k(logits, k)
    names = class_names(config, logits.shape[-1])
    return [[(names[i], float(pr)) for pr, i in zip(prow.tolist(), irow.tolist())] for prow, irow in zip(probs, idx)]
