"""``vitlab depth-study --lr-from``: each variant and depth trains at the best learning rate a learning-rate
sensitivity study chose for it on validation loss; refusals name the fix."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from _helpers import cli_error, read_rows
from vitlab.errors import ConfigError
from vitlab.experiments.depth_study import depth_specs
from vitlab.experiments.rates import best_rates
from vitlab.train.config import RunConfig

COLUMNS = ["variant", "depth", "lrs", "runs", "best_lr", "best_val_loss", "best_val_acc", "test_acc_at_best_lr",
           "lr_sensitivity", "divergence_rate", "max_logit"]


def _sensitivity(folder: Path, rows: list[tuple[str, int, float, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "sensitivity.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for variant, depth, lr, sens in rows:
            w.writerow({"variant": variant, "depth": depth, "lrs": 2, "runs": 2, "best_lr": lr, "best_val_loss": 0.5,
                        "best_val_acc": 0.9, "test_acc_at_best_lr": 0.9, "lr_sensitivity": sens,
                        "divergence_rate": 0.0, "max_logit": 3.0})
    return folder


def test_each_variant_and_depth_gets_its_own_rate(tmp_path):
    rates = best_rates(_sensitivity(tmp_path / "lr", [("vit", 1, 1e-3, "0.1"), ("vit", 2, 3e-3, "0.2"),
                                                       ("tfixup", 1, 1e-2, "0.3"), ("tfixup", 2, 1e-4, "0.0")]))
    assert rates == {("vit", 1): 1e-3, ("vit", 2): 3e-3, ("tfixup", 1): 1e-2, ("tfixup", 2): 1e-4}
    specs = depth_specs("vit_mnist", [1, 2], ["vit", "tfixup"], [0, 1], RunConfig(epochs=1), rates=rates)
    for s in specs:
        assert s.config.lr == rates[(s.info["variant"], s.info["depth"])]
        assert json.loads(s.info["run_options"])["lr"] == s.config.lr
    assert all(s.config.warmup_epochs == 0.0 for s in specs if s.info["variant"] == "tfixup")  # kept
    with pytest.raises(ConfigError, match="no learning rate for deepvit at depth 1"):
        depth_specs("vit_mnist", [1], ["deepvit"], [0], RunConfig(epochs=1), rates=rates)


def test_a_row_that_lacks_a_rate_of_its_grid_is_refused(tmp_path):
    folder = _sensitivity(tmp_path / "lr", [("vit", 1, 1e-3, "0.1"), ("vit", 2, 3e-3, "")])
    with pytest.raises(ConfigError, match="vit at depth 2 has not finished every learning rate"):
        best_rates(folder)
    with pytest.raises(ConfigError, match="no sensitivity.csv"):
        best_rates(tmp_path / "nowhere")


def _argv(tmp_path, *extra):
    return ["depth-study", "--depths", "1", "--variants", "vit,layerscale", "--epochs", "1", "--batch-size", "16",
            "--limit-train", "32", "--limit-test", "16", "--num-images", "4", "--probe-images", "0",
            "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress", "--output", str(tmp_path / "d"), *extra]


def test_the_study_trains_at_the_rates_read(tmp_path):
    from vitlab.cli import main

    lr = _sensitivity(tmp_path / "lr", [("vit", 1, 1e-3, "0.1"), ("layerscale", 1, 5e-3, "0.2")])
    assert main(_argv(tmp_path, "--lr-from", str(lr / "sensitivity.csv"))) == 0
    for row in read_rows(tmp_path / "d" / "results.csv"):
        stored = json.loads((tmp_path / "d" / row["run"] / "config.json").read_text())["run"]["lr"]
        assert stored == {"vit": 1e-3, "layerscale": 5e-3}[row["variant"]]
        assert json.loads(row["run_options"])["lr"] == stored


def test_lr_and_lr_from_together_are_refused(tmp_path, capsys):
    lr = _sensitivity(tmp_path / "lr", [("vit", 1, 1e-3, "0.1"), ("layerscale", 1, 5e-3, "0.2")])
    assert "--lr or --lr-from" in cli_error(capsys, _argv(tmp_path, "--lr-from", str(lr), "--lr", "1e-3"))
    assert not (tmp_path / "d").exists()


def test_a_cell_may_train_while_another_cells_grid_still_runs(tmp_path, capsys):
    """The rate x depth study trains phase 2 of the cells whose grids have finished while the others' grids run:
    a row whose grid has not finished is refused only when its cell is wanted; --finished-only wants none, and leaves
    out (naming them) the cells it has no rate for, so the whole table can be rewritten between the cells."""
    from vitlab.experiments.depth_study import DepthStudyConfig, depth_run_specs

    grid = _sensitivity(tmp_path / "lr", [("vit", 1, 1e-3, "0.1"), ("vit", 2, 3e-3, "0.2"),
                                          ("layerscale", 2, 1e-2, "")])  # layerscale's grid at 2 still running
    with pytest.raises(ConfigError, match="layerscale at depth 2 has not finished every learning rate"):
        best_rates(grid)
    assert best_rates(grid, {("vit", 1), ("vit", 2)}) == {("vit", 1): 1e-3, ("vit", 2): 3e-3}
    with pytest.raises(ConfigError, match="layerscale at depth 2 has not finished every learning rate"):
        best_rates(grid, {("vit", 2), ("layerscale", 2)})
    assert best_rates(grid, set()) == {("vit", 1): 1e-3, ("vit", 2): 3e-3}

    def config(variants, depths, **kw):
        return DepthStudyConfig("vit_mnist", depths, variants, RunConfig(epochs=1), tmp_path / "d", seeds=2,
                                lr_from=str(grid), **kw)

    specs = depth_run_specs(config(["vit"], [1, 2]))  # only the ViT wanted: trains at its rates
    assert sorted((s.info["variant"], s.info["depth"], s.config.lr) for s in specs if s.info["seed"] == 0) == [
        ("vit", 1, 1e-3), ("vit", 2, 3e-3)]
    with pytest.raises(ConfigError, match="layerscale at depth 2 has not finished"):
        depth_run_specs(config(["vit", "layerscale"], [2]))
    capsys.readouterr()
    specs = depth_run_specs(config(["vit", "layerscale"], [1, 2], finished_only=True))
    assert sorted({(s.info["variant"], s.info["depth"]) for s in specs}) == [("vit", 1), ("vit", 2)]
    assert ("--finished-only leaves out layerscale at depth 1, layerscale at depth 2: --lr-from"
            in capsys.readouterr().err)
    unrated: list[str] = []
    assert depth_specs("vit_mnist", [1], ["deepvit", "vit"], [0], RunConfig(epochs=1), rates={("vit", 1): 1e-3},
                       unrated=unrated)[0].info["variant"] == "vit"
    assert unrated == ["deepvit at depth 1"]
