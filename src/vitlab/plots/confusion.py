"""The confusion-matrix figure written by ``vitlab eval`` (matplotlib's pyplot on the Agg backend)."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from vitlab.atomic import atomic_write


def save_confusion_matrix(path: str | Path, confusion: Tensor, classes: list[str], title: str = "") -> Path:
    """Write ``confusion`` (true x predicted counts) as a PNG heat map with per-cell counts (<= 30 classes); class
    names that are not valid UTF-8 are drawn with U+FFFD for their undecodable bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vitlab.data.datasets import shown

    classes = [shown(str(c)) for c in classes]  # a folder name that is not UTF-8 cannot be drawn as it is
    k = len(classes)
    counts = confusion.numpy()
    size = max(4.0, min(0.45 * k + 2, 24.0))
    fig, ax = plt.subplots(figsize=(size, size * 0.9), dpi=100)
    try:
        im = ax.imshow(counts, cmap="Blues")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        if k <= 30:
            ax.set_xticks(range(k), labels=classes, rotation=90 if k > 10 else 0)
            ax.set_yticks(range(k), labels=classes)
            top = counts.max() if counts.size else 0
            for i in range(k):
                for j in range(k):
                    if counts[i, j]:
                        ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                                color="white" if counts[i, j] > top / 2 else "black")
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        if title:
            ax.set_title(title)
        fig.tight_layout()
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
    return Path(path)
