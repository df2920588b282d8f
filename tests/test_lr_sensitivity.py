"""``vitlab lr-sensitivity``: the runs it plans, the proxies paper's LR sensitivity computed from the rows, and a
tiny study end to end (tables, per-layer logits, figures, read-back, bad input)."""

from __future__ import annotations

import json
import math

import pytest

from _helpers import cli_error, read_rows
from vitlab.experiments.lr_sensitivity import (
    capped_loss,
    lr_sensitivity,
    lr_specs,
    lr_table,
    seed_sensitivities,
    sensitivity,
)
from vitlab.train.config import RunConfig

L0 = math.log(10)


def _row(variant, depth, lr, seed, loss, diverged=False):
    return {"variant": variant, "depth": depth, "lr": lr, "seed": seed, "val_loss": loss, "val_acc": 0.5,
            "test_acc": 0.5, "train_loss": loss, "max_logit": 3.0, "diverged": diverged, "failed": False}


def test_specs_cover_the_grid_once_seed_major_and_keep_the_variants_run_options():
    cfg = RunConfig(dataset="mnist-5k", epochs=1)
    specs = lr_specs("vit_mnist", [2, 4], ["vit", "tfixup"], [1e-3, 3e-3, 1e-2], [0, 1], cfg)
    assert len(specs) == 2 * 2 * 3 * 2 and len({s.name for s in specs}) == len(specs)
    assert [s.info["seed"] for s in specs] == sorted(s.info["seed"] for s in specs)  # seed 0 of everything first
    first = [s for s in specs if s.info["seed"] == 0]
    assert [s.info["depth"] for s in first] == sorted((s.info["depth"] for s in first), reverse=True)
    for s in specs:
        assert s.config.lr == s.info["lr"] and s.config.seed == s.info["seed"]
        assert s.config.model_overrides["depth"] == s.info["depth"]
        assert f"_lr{s.info['lr']:g}_" in s.name
        assert (s.config.warmup_epochs == 0.0) == (s.info["variant"] == "tfixup")


def test_capped_loss_counts_divergence_and_losses_above_a_uniform_guess_as_the_uniform_guess():
    assert capped_loss(_row("vit", 2, 1e-3, 0, 0.4), L0) == 0.4
    assert capped_loss(_row("vit", 2, 1e-3, 0, 5.0), L0) == L0
    assert capped_loss(_row("vit", 2, 1e-3, 0, 0.1, diverged=True), L0) == L0
    assert capped_loss(_row("vit", 2, 1e-3, 0, math.nan), L0) == L0


def test_sensitivity_is_the_mean_gap_to_the_best_rate_over_the_grid():
    lrs = [1e-3, 3e-3, 1e-2]
    rows = [_row("vit", 2, 1e-3, 0, 0.8), _row("vit", 2, 1e-3, 1, 0.6),  # mean 0.7
            _row("vit", 2, 3e-3, 0, 0.3), _row("vit", 2, 3e-3, 1, 0.5),  # mean 0.4: the best
            _row("vit", 2, 1e-2, 0, 0.2, diverged=True), _row("vit", 2, 1e-2, 1, 9.0),  # both capped at L0
            _row("ls", 2, 1e-3, 0, 0.5), _row("ls", 2, 3e-3, 0, 0.5)]  # a rate missing: no sensitivity
    per_lr = lr_table(rows, L0)
    mine = {(a["variant"], a["lr"]): a for a in per_lr}
    assert mine[("vit", 1e-3)]["capped_loss_mean"] == pytest.approx(0.7)
    assert mine[("vit", 1e-2)]["capped_loss_mean"] == pytest.approx(L0) and mine[("vit", 1e-2)]["diverged"] == 1
    assert mine[("vit", 1e-2)]["val_loss_mean"] == 9.0  # the diverged run's loss is left out of the mean
    sens = {s["variant"]: s for s in sensitivity(per_lr, lrs, seed_sensitivities(rows, L0, lrs))}
    vit = sens["vit"]
    assert vit["best_lr"] == 3e-3 and vit["best_val_loss"] == pytest.approx(0.4)
    # the mean over seeds of each seed's sensitivity (the seed is the unit): seed 0 0.8/0.3/L0, seed 1 0.6/0.5/L0
    seed0, seed1 = (0.8 + 0.3 + L0) / 3 - 0.3, (0.6 + 0.5 + L0) / 3 - 0.5
    assert vit["lr_sensitivity"] == pytest.approx((seed0 + seed1) / 2)
    assert vit["seeds"] == 2 and vit["lr_sensitivity_std"] == pytest.approx(abs(seed0 - seed1) / math.sqrt(2))
    assert lr_sensitivity({1e-3: 0.8, 3e-3: 0.3, 1e-2: L0}) == pytest.approx(seed0)
    assert vit["divergence_rate"] == pytest.approx(1 / 6) and vit["runs"] == 6
    assert math.isnan(sens["ls"]["lr_sensitivity"]) and sens["ls"]["lrs"] == 2
    assert sens["ls"]["seeds"] == 0 and math.isnan(sens["ls"]["lr_sensitivity_std"])


def _study(tmp, *extra):
    return ["lr-sensitivity", "--depths", "1,2", "--variants", "vit,tfixup", "--lrs", "1e-3,3e-3", "--epochs", "1",
            "--batch-size", "16", "--limit-train", "64", "--limit-test", "32", "--val-split", "0.25",
            "--probe-images", "8", "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress",
            "--output", str(tmp / "study"), *extra]


@pytest.mark.full  # an 8-run study end to end
def test_a_tiny_study_writes_its_tables_from_the_runs_and_reads_them_back(tmp_path, capsys):
    from vitlab.cli import main

    assert main(_study(tmp_path)) == 0
    out = tmp_path / "study"
    rows = read_rows(out / "results.csv")
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        summary = json.loads((out / r["run"] / "summary.json").read_text())
        assert float(r["val_loss"]) == pytest.approx(summary["final_val_loss"])
        assert float(r["test_acc"]) == pytest.approx(summary["final_test_acc"])
        assert json.loads((out / r["run"] / "config.json").read_text())["run"]["lr"] == float(r["lr"])
    logits = read_rows(out / "logits.csv")
    for r in rows:  # every layer of every run, after its one epoch
        mine = [x for x in logits if x["variant"] == r["variant"] and x["depth"] == r["depth"] and x["lr"] == r["lr"]]
        assert sorted(int(x["layer"]) for x in mine) == list(range(int(r["depth"])))
        assert float(r["max_logit"]) == pytest.approx(max(float(x["max_logit"]) for x in mine))
    sens = read_rows(out / "sensitivity.csv")
    assert {(s["variant"], s["depth"]) for s in sens} == {(v, d) for v in ("vit", "tfixup") for d in ("1", "2")}
    for s in sens:
        assert 0 <= float(s["lr_sensitivity"]) <= L0 and s["runs"] == "2"
    for name in ("summary.csv", "loss_vs_lr.png", "sensitivity_vs_depth.png", "max_logit_vs_lr.png", "logit_growth.png",
                 "index.html"):
        assert (out / name).is_file()
    capsys.readouterr()
    assert main(_study(tmp_path, "--finished-only")) == 0  # read back, nothing trained
    assert "training" not in capsys.readouterr().err
    assert read_rows(out / "results.csv") == rows


@pytest.mark.parametrize("change, words", [
    (["--lrs", "1e-3"], "at least two learning rates"),
    (["--lrs", "1e-3,fast"], "'fast' is not a number"),
    (["--lrs", "1e-3,1e-3"], "repeats a value"),
    (["--lrs", "1e-3,100"], "lr must be in"),
    (["--val-split", "0"], "val_split"),
    (["--probe-images", "0"], "--probe-images"),
])
def test_bad_input_is_refused_in_one_line_before_any_run(tmp_path, capsys, change, words):
    argv = _study(tmp_path)
    for flag, value in zip(change[::2], change[1::2]):
        argv[argv.index(flag) + 1] = value
    assert words in cli_error(capsys, argv)
    assert not any((tmp_path / "study").glob("*_seed0")) if (tmp_path / "study").exists() else True


def test_without_a_validation_split_nothing_is_chosen_on_the_test_set(tmp_path, capsys):
    argv = _study(tmp_path)
    i = argv.index("--val-split")
    del argv[i:i + 2]
    assert "--val-split" in cli_error(capsys, argv)


def test_finished_only_names_ten_unfinished_runs_and_counts_the_rest(tmp_path, capsys):
    from vitlab.cli import main

    argv = _study(tmp_path)
    argv[argv.index("--lrs") + 1] = "1e-3,3e-3"
    assert main(argv) == 0
    argv[argv.index("--depths") + 1] = "1,2,3,4,5,6"  # 16 runs more, none finished
    capsys.readouterr()
    assert main([*argv, "--finished-only"]) == 0
    err = capsys.readouterr().err
    assert "leaves out 16 run(s) not finished yet: " in err and "and 6 more" in err
