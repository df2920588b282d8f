"""A validation split carved from the training set (--val-split / --val-size) and per-kind recipe defaults."""

from __future__ import annotations

import json

import pytest
import torch

from _helpers import run_config
from vitlab.cli import main
from vitlab.data import DataSplit
from vitlab.errors import ConfigError
from vitlab.train.batches import holdout
from vitlab.train.config import RunConfig
from vitlab.train.engine import train

TINY = run_config(depth=1, epochs=2, device="cpu", threads=1)


def toy(n: int) -> DataSplit:
    return DataSplit(torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).clone(),
                     torch.arange(n) % 3, ["a", "b", "c"])


def test_holdout_is_fixed_disjoint_and_complete():
    split = toy(50)
    train_a, val_a = holdout(split, fraction=0.2)
    train_b, val_b = holdout(split, size=10)
    assert len(val_a) == 10 and len(train_a) == 40 and torch.equal(val_a.images, val_b.images)
    ids = lambda s: set(s.images[:, 0, 0, 0].tolist())  # noqa: E731
    assert ids(train_a).isdisjoint(ids(val_a)) and ids(train_a) | ids(val_a) == set(range(50))
    assert ids(val_a) != set(range(10))  # drawn at random, not the first images
    assert holdout(split) == (split, None)


@pytest.mark.parametrize("kw", [dict(size=50), dict(size=0), dict(fraction=0.001)])
def test_holdout_refuses_empty_sides(kw):
    with pytest.raises(ConfigError, match="hold out at least one"):
        holdout(toy(50), **kw)


def test_bad_val_options_are_refused():
    with pytest.raises(ConfigError, match="val_split must be a fraction"):
        RunConfig(val_split=1.5).validate()
    with pytest.raises(ConfigError, match="not both"):
        RunConfig(val_split=0.1, val_size=10).validate()


def test_val_split_run_evaluates_on_validation_and_reads_test_once(tmp_path, monkeypatch):
    import vitlab.train.engine as loop  # the loop evaluates each epoch

    seen = []
    real = loop.evaluate
    def counting(model, split, **kw):
        seen.append(len(split))
        return real(model, split, **kw)

    monkeypatch.setattr(loop, "evaluate", counting)
    result = train(RunConfig(**TINY, val_split=0.25, output=str(tmp_path / "run")))
    assert seen == [64, 64, 128]  # 2 epochs on the 64 held-out images, the 128 test images once at the end
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(k for k in r if k.startswith(("val_", "test_"))) for r in rows] == [["val_acc", "val_loss"]] * 2
    s = result.summary
    assert s["final_val_acc"] == rows[-1]["val_acc"] and "best_test_acc" not in s
    assert 0 <= s["final_test_acc"] <= 1
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["run"]["data"]["num_train"] == 192 and config["run"]["data"]["num_val"] == 64


def test_val_split_cli_prints_val_lines_and_the_test_once(tmp_path, capsys):
    assert main(["train", "--limit-train", "256", "--limit-test", "128", "--depth", "1", "--embed-dim", "32",
                 "--num-heads", "4", "--batch-size", "64", "--epochs", "1", "--device", "cpu", "--threads", "1",
                 "--val-size", "50", "--output", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "val_acc" in out.splitlines()[1] and "test_acc" not in out.splitlines()[1]
    assert "test set, read once at the end: test_acc" in out.splitlines()[-1]


def test_clothing_is_flipped_and_shifted_not_rotated():
    fashion = RunConfig(dataset="fashion-mnist").resolve(60000)
    digits = RunConfig(dataset="mnist").resolve(60000)
    assert fashion.hflip and fashion.pad_crop > 0 and fashion.degrees == fashion.shear == 0
    assert not digits.hflip and digits.degrees > 0


def test_small_gray_recipes_average_the_patches():
    from vitlab.train.config import model_defaults

    for name in ("mnist-5k", "mnist", "fashion-mnist"):
        assert model_defaults(name) == {"global_pool": "avg"}
    assert model_defaults("cifar10") == {}
