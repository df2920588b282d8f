"""``--stratify``: the fixed subsets (--limit-train, --limit-test) and the validation hold-out drawn per class, each
class keeping its share, the same draw on every machine; without it the draws are as before."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from _helpers import run_args
from vitlab.cli import main
from vitlab.data import load_dataset
from vitlab.data.datasets import DataSplit, stratified_indices, subset_indices
from vitlab.train.batches import holdout


@pytest.mark.parametrize("seed", range(20))
def test_each_class_keeps_its_share(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    labels = torch.multinomial(torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0]), 997, replacement=True, generator=g)
    n = int(torch.randint(1, 997, (1,), generator=g))
    idx = stratified_indices(labels, n, 123)
    assert idx.numel() == n and idx.unique().numel() == n and torch.equal(idx, idx.sort().values)
    counts, kept = Counter(labels.tolist()), Counter(labels[idx].tolist())
    for c, total in counts.items():  # floor or ceil of the exact share
        assert abs(kept.get(c, 0) - n * total / 997) < 1, (c, kept, n)
    assert torch.equal(idx, stratified_indices(labels, n, 123))  # a fixed draw
    assert not torch.equal(idx, stratified_indices(labels, n, 124)) or n == 997


def test_a_stratified_subset_is_optional_and_refuses_what_cannot_be_drawn() -> None:
    labels = torch.arange(10).repeat(50)
    assert subset_indices(500, 100) is not None and subset_indices(500, 500, labels) is None
    assert Counter(labels[subset_indices(500, 100, labels)].tolist()) == {c: 10 for c in range(10)}
    with pytest.raises(ValueError, match="stratified draw of 501"):
        stratified_indices(labels, 501, 0)


def test_the_holdout_is_stratified_and_disjoint() -> None:
    labels = torch.cat([torch.zeros(300), torch.ones(100), torch.full((100,), 2)]).long()
    split = DataSplit(torch.arange(500).view(500, 1, 1, 1).to(torch.uint8), labels, ["a", "b", "c"])
    train, val = holdout(split, size=100, stratify=True)
    assert Counter(val.labels.tolist()) == {0: 60, 1: 20, 2: 20}
    assert Counter(train.labels.tolist()) == {0: 240, 1: 80, 2: 80}
    plain_train, plain_val = holdout(split, size=100)
    assert len(plain_val.labels) == 100 and Counter(plain_val.labels.tolist()) != {0: 60, 1: 20, 2: 20}


def test_load_dataset_draws_the_subsets_per_class() -> None:
    train, test = load_dataset("mnist-5k", img_size=28, in_chans=1, limit_train=1000, limit_test=200,
                               stratify=True)
    assert Counter(train.labels.tolist()) == {c: 100 for c in range(10)}
    assert Counter(test.labels.tolist()) == {c: 20 for c in range(10)}


def test_train_stratify_is_stored_with_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", *run_args(progress=False, epochs=1, limit_train=200, val_size=50), "--stratify",
                 "--output", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["run"]["stratify"] is True
