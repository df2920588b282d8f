"""What a study chooses is never chosen on the test set: sweep, compare and depth-study tables carry the final
epoch's test accuracy, and with a validation split (``--val-split``) the columns that pick an epoch or a setting
come from the held-out training images. Also: every command reads ``--set`` with the same parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _helpers import read_rows
from vitlab.cli import main
from vitlab.experiments import runs
from vitlab.experiments.runs import RunSpec
from vitlab.train.config import RunConfig

FAST = ["--epochs", "1", "--limit-train", "64", "--limit-test", "32", "--batch-size", "32", "--threads", "1",
        "--no-progress"]


class SummaryTrainer:
    """Writes the summary.json the trainer writes, with accuracies chosen per run: ``(final test, best test)``
    without a validation split, ``(final test, final val, best val)`` with one."""

    def __init__(self, accs) -> None:
        self.accs, self.calls = accs, []

    def __call__(self, cfg: RunConfig, init: str | None = None) -> dict:
        self.calls.append(cfg)
        acc = self.accs(cfg)
        if cfg.val_split is None:
            judged = {"final_test_acc": acc[0], "best_test_acc": acc[1]}
        else:
            judged = {"final_test_acc": acc[0], "final_val_acc": acc[1], "best_val_acc": acc[2]}
        summary = {**judged, "train_time_s": 1.0, "train_cpu_s": 1.0, "wall_time_s": 1.0, "epochs": 1,
                   "params": 1000, "macs": 5000}
        (Path(cfg.output) / "summary.json").write_text(json.dumps(summary))
        return summary


def test_no_study_table_has_a_column_chosen_on_the_test_set(tmp_path: Path, monkeypatch, capsys):
    # the best epoch on the test set (0.99) is what a run without a validation split would leak
    trainer = SummaryTrainer(lambda cfg: (0.5 if cfg.model_overrides["embed_dim"] == 16 else 0.6, 0.99))
    monkeypatch.setattr(runs, "train_run", trainer)
    out = tmp_path / "sweep"
    assert main(["sweep", "--param", "embed_dim", "--values", "16,32", *FAST, "--output", str(out)]) == 0
    for name in ("results.csv", "summary.csv"):
        rows = read_rows(out / name)
        assert not [c for c in rows[0] if "best" in c], name  # nothing picked: the final epoch is reported
        assert "0.99" not in {v for r in rows for v in r.values()}, name
    assert [float(r["test_acc"]) for r in read_rows(out / "results.csv")] == [0.5, 0.6]
    assert "best_test_acc" not in json.dumps(json.loads((out / "summary.json").read_text())["results"])
    assert "read on the test set" in capsys.readouterr().out  # the grid's highest is said to be a description

    cmp = tmp_path / "cmp"
    monkeypatch.setattr(runs, "train_run", SummaryTrainer(lambda cfg: (0.7, 0.99)))
    assert main(["compare", "--models", "vit_mnist", "--set", "depth=1", *FAST, "--output", str(cmp)]) == 0
    for name in ("results.csv", "summary.csv"):
        row = read_rows(cmp / name)[0]
        assert not [c for c in row if "best" in c] and "0.99" not in row.values(), name


def _depth_rows(validation: bool):
    from vitlab.experiments.depth_study import aggregate_rows, result_row

    diag = {"collapse": [], "residual_ratios": []}
    cfg = RunConfig(epochs=1, limit_train=64, val_split=0.25 if validation else None)
    rows = []
    # depth 2 is better on validation, depth 4 on the test set
    for depth, test, val in ((2, 0.80, 0.95), (4, 0.90, 0.85)):
        summary = {"final_test_acc": test, "params": 10, "macs": 20}
        summary.update({"final_val_acc": val, "best_val_acc": val + 0.01} if validation else {"best_test_acc": 0.99})
        spec = RunSpec(f"vit_depth{depth}_seed0", cfg, {"variant": "vit", "depth": depth, "seed": 0, "preset": "p",
                                                        "overrides": "{}"})
        rows.append(result_row(spec, summary, diag, validation))
    return rows, aggregate_rows(rows)


def test_depth_study_columns_and_text_choose_on_validation_only():
    from vitlab.experiments.depth_study import best_depths

    rows, agg = _depth_rows(validation=False)
    assert not [c for c in [*rows[0], *agg[0]] if "best" in c]
    text = best_depths(agg, ["vit"])
    assert "best" not in text and "80.00% at depth 2" in text and "90.00% at depth 4" in text

    rows, agg = _depth_rows(validation=True)
    assert [(r["val_acc"], r["best_val_acc"]) for r in rows] == [(0.95, pytest.approx(0.96)),
                                                                  (0.85, pytest.approx(0.86))]
    assert agg[0]["best_val_acc_mean"] == pytest.approx(0.96) and not [c for c in agg[0] if "best_test" in c]
    # the depth is chosen on validation (2), not on the test set (4), and its test accuracy is reported beside it
    assert best_depths(agg, ["vit"]) == "vit: best validation accuracy 95.00% at depth 2 (test 80.00%)"


def test_with_a_validation_split_the_sweep_chooses_on_it(tmp_path: Path, monkeypatch):
    accs = {16: (0.50, 0.90, 0.91), 32: (0.95, 0.60, 0.62)}  # 16 wins on validation, 32 on the test set
    trainer = SummaryTrainer(lambda cfg: accs[cfg.model_overrides["embed_dim"]])
    monkeypatch.setattr(runs, "train_run", trainer)
    out = tmp_path / "sweep"
    assert main(["sweep", "--param", "embed_dim", "--values", "16,32", "--val-split", "0.25", *FAST,
                 "--output", str(out)]) == 0
    assert [c.val_split for c in trainer.calls] == [0.25, 0.25]
    rows = read_rows(out / "results.csv")
    assert [(float(r["val_acc"]), float(r["best_val_acc"])) for r in rows] == [(0.90, 0.91), (0.60, 0.62)]
    summary = read_rows(out / "summary.csv")
    assert [float(r["best_val_acc_mean"]) for r in summary] == [0.91, 0.62]
    assert not [c for c in summary[0] if "best_test" in c]
    text = json.loads((out / "summary.json").read_text())
    assert text["run_config"]["val_split"] == 0.25
    page = (out / "index.html").read_text()
    assert "Best mean validation accuracy 90.00%" in page and "at embed_dim=16; its test accuracy 50.00%" in page


def test_a_study_tracker_run_logs_no_best_over_runs(tmp_path: Path, monkeypatch):
    from vitlab.train import tracking

    logged = {}

    class Recorder:
        def log_params(self, params):
            logged["params"] = params

        def log_summary(self, summary):
            logged["summary"] = summary

        def log_figure(self, path):
            pass

        def close(self, status):
            logged["status"] = status

    monkeypatch.setattr(tracking, "open_tracker", lambda logger, out: Recorder())
    pairs = [(RunSpec("a", None), {"final_test_acc": 0.5, "best_test_acc": 0.99}),
             (RunSpec("b", None), {"final_test_acc": 0.7})]
    runs.track_study(tmp_path, "tensorboard", pairs, {"x": 1})
    assert logged["summary"] == {"runs": 2, "test_acc/a": 0.5, "test_acc/b": 0.7} and logged["status"] == "finished"


def test_every_command_reads_set_with_one_parser():
    from vitlab.experiments.compare import parse_model_sets
    from vitlab.train.config import parse_set

    models = ["vit_mnist", "timm:vit_tiny_patch16_224"]
    sets = parse_model_sets(["vit_mnist:global-pool=avg", "drop-rate=1e-1", "vit_mnist:depth='2'"], models)
    assert sets["vit_mnist"] == parse_set(["global-pool=avg", "drop-rate=1e-1", "depth='2'"])
    assert sets["vit_mnist"] == {"global_pool": "avg", "drop_rate": 0.1, "depth": "2"}
    assert sets["timm:vit_tiny_patch16_224"] == {"drop_rate": 0.1}


def test_study_option_val_split_reaches_every_run():
    import argparse

    from vitlab.commands.options import add_run_options, base_run_config

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    assert base_run_config(parser.parse_args(["--val-split", "0.2"]), dataset="mnist-5k").val_split == 0.2
    assert base_run_config(parser.parse_args([]), dataset="mnist-5k").val_split is None


@pytest.mark.slow
def test_a_real_sweep_with_a_validation_split_tables_the_trainers_validation(tmp_path: Path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--param", "depth", "--values", "1", "--set", "embed_dim=16", "--val-split", "0.25",
                 *FAST, "--output", str(out)]) == 0
    row = read_rows(out / "results.csv")[0]
    summary = json.loads((out / row["run"] / "summary.json").read_text())
    assert float(row["best_val_acc"]) == pytest.approx(summary["best_val_acc"])
    assert float(row["val_acc"]) == pytest.approx(summary["final_val_acc"])
    assert float(row["test_acc"]) == pytest.approx(summary["final_test_acc"])


def test_a_search_compares_trials_on_a_validation_split_only(tmp_path: Path):
    from vitlab.errors import ConfigError
    from vitlab.experiments.search import VAL_SPLIT, SearchConfig, parse_search_params

    params = parse_search_params("vit_mnist", [("lr", "range", "1e-4:1e-2")])
    config = SearchConfig("vit_mnist", "mnist-5k", params, RunConfig(epochs=1), tmp_path, trials=1)
    config.validate()
    assert config.objective == "val_acc" and config.base.val_split == VAL_SPLIT  # held out by default
    kept = SearchConfig("vit_mnist", "mnist-5k", params, RunConfig(epochs=1, val_size=100), tmp_path, trials=1)
    kept.validate()
    assert (kept.base.val_split, kept.base.val_size) == (None, 100)
    for objective in ("test_acc", "test_loss"):
        with pytest.raises(ConfigError, match=f"choose trials on the test set.*--objective val_{objective[5:]}"):
            SearchConfig("vit_mnist", "mnist-5k", params, RunConfig(epochs=1), tmp_path, trials=1,
                         objective=objective).validate()
