"""Tests of vitlab.experiments and the study commands: value parsing, skipping finished runs (counted trainer
calls), the numbers behind every figure (mean/std over seeds, fitted exponents, MAC splits), and each command
end to end on tiny models."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from _helpers import option_args, read_rows
from _study import finish
from vitlab.cli import main
from vitlab.errors import CheckpointError, ConfigError
from vitlab.experiments import budget, runs
from vitlab.experiments.complexity import fit_rows, measure_size, saved_activation_bytes, split_macs
from vitlab.experiments.power_law import fit_power_law
from vitlab.experiments.runs import RunSpec, run_all
from vitlab.experiments.sweep import (
    aggregate_rows,
    figure_series,
    parse_param,
    parse_params,
    sweep_specs,
    write_sweep,
)
from vitlab.experiments.table import aggregate, mean_std
from vitlab.experiments.values import parse_ints
from vitlab.models import create_model, get_config
from vitlab.train.config import RunConfig

TINY_RUN = option_args(epochs=1, limit_train=64, limit_test=32, batch_size=32, threads=1, progress=False)


class FakeTrainer:
    """Stands in for the trainer: counts calls and writes a run's record whose accuracy is a known function."""

    def __init__(self, acc=lambda cfg: 0.5) -> None:
        self.calls: list[RunConfig] = []
        self.acc = acc

    def __call__(self, cfg: RunConfig, init: str | None = None) -> dict:
        self.calls.append(cfg)
        summary = {"final_test_acc": self.acc(cfg), "best_test_acc": self.acc(cfg), "train_time_s": 1.0 + cfg.seed,
                   "train_cpu_s": 0.5 + cfg.seed, "wall_time_s": 2.0 + cfg.seed, "epochs": 1, "params": 1000,
                   "macs": 5000}
        return finish(cfg, summary)


# ---------------------------------------------------------------- values


def test_one_value_parser_and_one_set_of_coercion_rules():
    from vitlab.train.config import coerce_to, parse_set, parse_value

    assert parse_value("64") == 64 and parse_value("0.5") == 0.5 and parse_value("true") is True
    assert parse_value("1e-5") == 1e-5 and parse_value("5E3") == 5000.0  # YAML 1.1 leaves these strings
    assert parse_value("'8'") == "8" and parse_value("null") is None and parse_value("") is None
    assert parse_value("[1, 2") == "[1, 2"  # not YAML: the text itself
    assert parse_set(["drop-path-rate=1e-2", "gate=layerscale", "depth='4'"]) == {
        "drop_path_rate": 0.01, "gate": "layerscale", "depth": "4"}
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        parse_set(["depth"], "--run-set")
    assert coerce_to("x", 64, int, "x") == 64 and coerce_to("x", 2, float, "x") == 2.0
    assert coerce_to("x", "none", float | None, "x") is None and coerce_to("x", 1e-5, float | None, "x") == 1e-5
    with pytest.raises(ConfigError, match="x must be int, got 3.5"):
        coerce_to("x", 3.5, int, "x")
    with pytest.raises(ConfigError, match="x must be bool"):
        coerce_to("x", "maybe", bool, "x")
    with pytest.raises(ConfigError, match="finite number"):
        coerce_to("x", "abc", float, "x")


def test_result_neutral_options_are_one_list():
    from vitlab.train.config import RESULT_NEUTRAL
    from vitlab.train.resume import RESUMABLE

    assert RESULT_NEUTRAL <= set(RunConfig.field_names()) and RESULT_NEUTRAL < RESUMABLE
    assert RESUMABLE - RESULT_NEUTRAL == {"epochs", "model", "model_overrides"}
    assert {"logger", "device", "output", "threads"} <= RESULT_NEUTRAL and "amp" not in RESULT_NEUTRAL


def test_parse_param_types_and_kinds():
    p = parse_param("vit_mnist", "embed_dim", "32,64,128")
    assert (p.kind, p.values, p.numeric) == ("model", [32, 64, 128], True)
    assert parse_param("vit_mnist", "mlp_ratio", "2,4").values == [2.0, 4.0]
    assert parse_param("vit_mnist", "gate", "none,layerscale").values == ["none", "layerscale"]
    assert parse_param("vit_mnist", "qkv_bias", "true,false").values == [True, False]
    assert parse_param("vit_mnist", "init_values", "none,0.1").values == [None, 0.1]
    lr = parse_param("vit_mnist", "lr", "1e-3,2e-3")
    assert (lr.kind, lr.values) == ("run", [1e-3, 2e-3])
    assert parse_param("timm:vit_tiny_patch16_224", "depth", "2,4").values == [2, 4]


def test_parse_param_errors_name_the_fix():
    with pytest.raises(ConfigError, match="did you mean embed_dim"):
        parse_param("vit_mnist", "embed_dims", "32")
    with pytest.raises(ConfigError, match="repeats 32"):
        parse_param("vit_mnist", "embed_dim", "32,32")
    with pytest.raises(ConfigError, match="is empty"):
        parse_param("vit_mnist", "embed_dim", " , ")
    with pytest.raises(ConfigError, match="one --values after each --param"):
        parse_params("vit_mnist", ["embed_dim", "depth"], ["32"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_params("vit_mnist", ["depth", "depth"], ["1", "2"])
    with pytest.raises(ConfigError, match=">= 1"):
        parse_ints("4,0", "--depths")


# ---------------------------------------------------------------- numbers behind the figures


def test_mean_std_and_aggregate_over_seeds():
    assert mean_std([0.9, 0.95, 0.97]) == pytest.approx((statistics.fmean([0.9, 0.95, 0.97]),
                                                         statistics.stdev([0.9, 0.95, 0.97])))
    assert mean_std([0.8]) == (0.8, 0.0)
    m, s = mean_std([float("nan")])
    assert math.isnan(m) and math.isnan(s)
    rows = [{"d": 32, "seed": 0, "acc": 0.90}, {"d": 64, "seed": 0, "acc": 0.95}, {"d": 32, "seed": 1, "acc": 0.92},
            {"d": 64, "seed": 1, "acc": 0.99}, {"d": 32, "seed": 2, "acc": 0.94}]
    agg = aggregate(rows, ["d"], ["acc"])
    assert [a["d"] for a in agg] == [32, 64] and [a["n"] for a in agg] == [3, 2]
    assert agg[0]["acc_mean"] == pytest.approx(0.92) and agg[0]["acc_std"] == pytest.approx(0.02)
    assert agg[1]["acc_mean"] == pytest.approx(0.97) and agg[1]["acc_std"] == pytest.approx(0.04 / math.sqrt(2))
    assert agg[0]["acc_median"] == 0.92 and agg[1]["acc_median"] == pytest.approx(0.97)


def test_the_median_over_seeds_ignores_one_outlying_or_failed_seed():
    """What a page quotes over seeds: one seed far off moves the mean, not the median; a NaN (diverged) is left out."""
    rows = [{"v": "a", "acc": x} for x in (0.86, 0.87, 0.88, 0.10, float("nan"))]
    (a,) = aggregate(rows, ["v"], ["acc"])
    assert a["acc_median"] == pytest.approx(0.865) and a["acc_mean"] == pytest.approx(0.6775)
    assert math.isnan(aggregate([{"v": "a", "acc": float("nan")}], ["v"], ["acc"])[0]["acc_median"])


def test_fit_power_law_recovers_the_exponent():
    tokens = [17, 65, 145, 257, 1025]
    a, b = fit_power_law(tokens, [3e-7 * t ** 2 for t in tokens])
    assert b == pytest.approx(2.0) and math.exp(a) == pytest.approx(3e-7)
    assert fit_power_law(tokens, [5.0 * t for t in tokens])[1] == pytest.approx(1.0)
    # a mix of a linear and a quadratic term lies between, closer to 2 at the large end
    mixed = [t * 1000 + t ** 2 for t in tokens]
    assert 1.0 < fit_power_law(tokens, mixed)[1] < 2.0
    assert fit_power_law(tokens[-2:], mixed[-2:])[1] > fit_power_law(tokens[:2], mixed[:2])[1]
    with pytest.raises(ConfigError, match="two distinct"):
        fit_power_law([4, 4], [1.0, 2.0])


@pytest.mark.parametrize("img_size", [14, 28, 56])
def test_split_macs_isolates_the_attention_term(img_size):
    model = create_model("vit_mnist", img_size=img_size, depth=2)
    t, c, h = model.num_patches + 1, 64, 8
    linear, attention = split_macs(model)
    assert linear + attention == model.flop_count()
    assert attention == 2 * (2 * t * t * c + h * t * t)  # per block: QK^T and AV, softmax division
    cait = create_model("cait_xxs24", img_size=img_size, patch_size=7, in_chans=1, embed_dim=64, num_heads=4,
                        depth=2, depth_token_only=2)
    n = cait.num_patches
    # self-attention blocks on the patches only: QK^T, AV, softmax and talking heads (two h x h mixes);
    # class-attention is linear in the tokens
    assert split_macs(cait)[1] == 2 * (2 * n * n * 64 + 4 * n * n + 2 * n * n * 4 * 4)


def test_fit_rows_on_the_analytic_macs():
    points = []
    for size in (14, 28, 56):
        model = create_model("vit_mnist", img_size=size, depth=1)
        lin, att = split_macs(model)
        points.append(type("P", (), dict(tokens=model.num_patches + 1, forward_s=1e-6 * (model.num_patches + 1) ** 2,
                                         forward_backward_s=1.0, memory_bytes=1, macs=lin + att, linear_macs=lin,
                                         attention_macs=att))())
    fits = {r["quantity"]: r for r in fit_rows(points)}
    assert fits["attention_macs"]["exponent"] == pytest.approx(2.0)
    assert fits["forward_s"]["exponent"] == pytest.approx(2.0)
    assert fits["forward_backward_s"]["exponent"] == pytest.approx(0.0, abs=1e-12)
    assert 1.0 < fits["macs"]["exponent"] < 2.0
    assert fits["linear_macs"]["exponent"] == pytest.approx(1.0, abs=0.02)  # the head is a constant


def test_saved_activations_hold_the_attention_maps_only_with_the_math_kernel():
    from vitlab.experiments.complexity import attention_backend

    model = create_model("vit_mnist", depth=1, img_size=56).train()
    x = torch.randn(2, 1, 56, 56)
    t, heads = model.num_patches + 1, 8
    fused = saved_activation_bytes(model, x)
    with attention_backend("math"):
        math_bytes = saved_activation_bytes(model, x)
    # the math kernel keeps the (B, H, T, T) float32 map; the fused one only q, k, v and its output
    assert math_bytes - fused >= 0.9 * 2 * heads * t * t * 4
    assert saved_activation_bytes(model, torch.randn(4, 1, 56, 56)) == pytest.approx(2 * fused, rel=0.05)
    with pytest.raises(ConfigError, match="unknown attention backend"):
        attention_backend("flash3")


def test_measure_size_reports_one_point():
    point = measure_size(create_model("vit_mnist", depth=1), batch_size=2, repeats=1, device=torch.device("cpu"))
    assert point.tokens == 17 and point.img_size == 28 and point.memory_kind == "saved_activations"
    assert point.forward_s > 0 and point.forward_backward_s > 0 and point.memory_bytes > 0
    assert point.linear_macs + point.attention_macs == point.macs


# ---------------------------------------------------------------- runs and skipping


def test_run_all_skips_finished_runs(tmp_path: Path, capsys):
    specs = [RunSpec(f"run{i}", RunConfig(seed=i), {"seed": i}) for i in range(3)]
    trainer = FakeTrainer()
    first = run_all(specs, tmp_path, trainer=trainer)
    assert len(trainer.calls) == 3 and [s["train_time_s"] for _, s in first] == [1.0, 2.0, 3.0]
    assert [Path(c.output).name for c in trainer.calls] == ["run0", "run1", "run2"]
    assert "[3/3]" in capsys.readouterr().err
    again = run_all(specs, tmp_path, trainer=trainer)
    assert len(trainer.calls) == 3 and [s for _, s in again] == [s for _, s in first]
    (tmp_path / "run1" / "summary.json").unlink()  # an unfinished run is redone, the others are read
    run_all(specs, tmp_path, trainer=trainer)
    assert len(trainer.calls) == 4 and trainer.calls[-1].seed == 1
    (tmp_path / "run2" / "summary.json").write_text("{torn")
    run_all(specs, tmp_path, trainer=trainer)
    assert len(trainer.calls) == 5 and trainer.calls[-1].seed == 2
    with pytest.raises(ConfigError, match="share the folder"):
        run_all(specs + specs[:1], tmp_path, trainer=trainer)


def test_base_run_config_from_the_shared_options():
    import argparse

    from vitlab.commands.options import add_run_options, base_run_config

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    args = parser.parse_args(["--epochs", "3", "--no-augment", "--run-set", "warmup_epochs=0.5", "--run-set",
                              "hflip=false", "--no-progress"])
    cfg = base_run_config(args, dataset="mnist-5k")
    assert (cfg.epochs, cfg.warmup_epochs, cfg.hflip, cfg.progress, cfg.dataset) == (3, 0.5, False, False, "mnist-5k")
    assert (cfg.degrees, cfg.scale, cfg.translate, cfg.lr) == (0.0, (1.0, 1.0), 0.0, None)
    with pytest.raises(ConfigError, match="did you mean warmup_epochs"):
        base_run_config(parser.parse_args(["--run-set", "warmup_epoch=1"]))
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        base_run_config(parser.parse_args(["--run-set", "warmup_epochs"]))


def test_budget_comes_from_the_data_sets_recipe():
    import argparse

    from vitlab.commands.options import add_run_options, base_run_config
    from vitlab.experiments.budget import budget_epochs
    from vitlab.train.config import size_defaults

    recipe = size_defaults(4000)["epochs"]  # mnist-5k trains on 4,000 digits
    assert budget_epochs("default", "mnist-5k") is None  # the run resolves the recipe's epochs itself
    assert budget_epochs("quick", "mnist-5k") == max(1, round(0.2 * recipe))
    assert budget_epochs("long", "mnist-5k") == 2 * recipe
    assert budget_epochs("long", "mnist", limit_train=5000) == 2 * size_defaults(5000)["epochs"]
    with pytest.raises(ConfigError, match="pass --epochs N"):
        budget_epochs("long", "imagefolder")
    parser = argparse.ArgumentParser()
    add_run_options(parser)
    assert parser.parse_args([]).budget == "default"
    assert base_run_config(parser.parse_args([]), dataset="mnist-5k").epochs is None
    assert base_run_config(parser.parse_args(["--budget", "long"]), dataset="mnist-5k").epochs == 2 * recipe
    assert base_run_config(parser.parse_args(["--budget", "long", "--epochs", "3"]), dataset="mnist-5k").epochs == 3


def test_reference_accuracy_and_the_undertrained_check():
    from vitlab.data.reference import is_undertrained, reference_accuracy

    assert reference_accuracy("mnist-5k") == 0.98 and reference_accuracy("cifar10") is None
    assert reference_accuracy("mnist-5k", limit_train=64) is None  # a subset is not held to the reference
    assert is_undertrained(0.50, "mnist-5k") and not is_undertrained(0.95, "mnist-5k")
    assert not is_undertrained(0.50, "mnist-5k", limit_train=64) and not is_undertrained(float("nan"), "mnist")


def test_study_command_warns_about_undertrained_runs(tmp_path: Path, monkeypatch, capsys):
    trainer = FakeTrainer(lambda cfg: 0.30 if cfg.model_overrides["depth"] == 1 else 0.97)
    monkeypatch.setattr(runs, "train_run", trainer)
    assert main(["sweep", "--param", "depth", "--values", "1,2", "--budget", "quick", "--no-progress",
                 "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "depth=1: test accuracy 30.00%" in out and "[under-trained]" in out.split("depth=2")[0]
    assert "[under-trained]" not in out.split("depth=2")[1].splitlines()[0]
    assert "warning: 1 of 2 runs ended more than 5 points below the 98% a trained model reaches on mnist-5k" in out
    assert trainer.calls[0].epochs == budget.budget_epochs("quick", "mnist-5k")


def test_the_undertrained_warning_tells_diverged_runs_from_short_ones():
    low = {"undertrained": True, "test_acc": 0.40}
    bad = {"undertrained": True, "test_acc": 0.10, "diverged": True}
    good = {"undertrained": False, "test_acc": 0.97}
    short = budget.undertrained_warning([low, good], "mnist-5k")
    assert "1 of 2 runs" in short and "give more epochs" in short and "diverged" not in short
    both = budget.undertrained_warning([bad, bad], "mnist-5k")  # more epochs cannot help a diverged run
    assert "all of them diverged" in both and "a lower --lr" in both and "more epochs" not in both
    mixed = budget.undertrained_warning([bad, low, good], "mnist-5k")
    assert "2 of 3 runs" in mixed and "1 of them diverged" in mixed and "give more epochs" in mixed
    assert "(lowest 10.0%)" in mixed
    assert budget.undertrained_warning([good], "mnist-5k") is None


def test_sweep_specs_make_a_validated_grid():
    params = parse_params("vit_mnist", ["embed_dim", "depth", "lr"], ["32,64", "1,2", "0.001"])
    specs = sweep_specs("vit_mnist", params, [0, 1], RunConfig(epochs=1), {"mlp_ratio": 2.0})
    assert len(specs) == 8 and len({s.name for s in specs}) == 8
    s = specs[-1]
    assert s.name == "embed_dim=64_depth=2_lr=0.001_seed=1"
    assert s.config.model_overrides == {"mlp_ratio": 2.0, "embed_dim": 64, "depth": 2}
    assert (s.config.lr, s.config.seed, s.config.epochs) == (0.001, 1, 1)
    bad = parse_params("vit_mnist", ["num_heads"], ["8,3"])
    with pytest.raises(ConfigError, match="num_heads=3 is invalid.*does not divide"):
        sweep_specs("vit_mnist", bad, [0], RunConfig(), {})


def test_sweep_tables_and_figure_numbers(tmp_path: Path):
    params = parse_params("vit_mnist", ["embed_dim", "depth"], ["16,32", "1,2"])
    specs = sweep_specs("vit_mnist", params, [0, 1, 2], RunConfig(epochs=1), {})
    accs = {("16", "1"): [0.5, 0.6, 0.7], ("16", "2"): [0.6, 0.6, 0.6], ("32", "1"): [0.8, 0.9, 1.0],
            ("32", "2"): [0.7, 0.75, 0.8]}

    def acc(cfg: RunConfig) -> float:
        o = cfg.model_overrides
        return accs[(str(o["embed_dim"]), str(o["depth"]))][cfg.seed]

    pairs = run_all(specs, tmp_path, trainer=FakeTrainer(acc))
    result = write_sweep(tmp_path, pairs, params, title="t", command="vitlab sweep", meta={"model": "vit_mnist"})
    rows = read_rows(tmp_path / "results.csv")
    assert len(rows) == 12 and {"embed_dim", "depth", "seed", "test_acc", "params", "macs", "flops",
                                "train_time_s"} <= set(rows[0])
    assert rows[0]["flops"] == "10000"
    summary = {(r["embed_dim"], r["depth"]): r for r in read_rows(tmp_path / "summary.csv")}
    for key, values in accs.items():
        assert float(summary[key]["test_acc_mean"]) == pytest.approx(statistics.fmean(values))
        assert float(summary[key]["test_acc_std"]) == pytest.approx(statistics.stdev(values))
        assert float(summary[key]["train_time_s_mean"]) == pytest.approx(2.0)  # seeds 0, 1, 2 -> 1, 2, 3 s
        assert float(summary[key]["train_cpu_s_mean"]) == pytest.approx(1.5)
    series = figure_series(aggregate_rows(result["rows"], params), params[0], params)
    assert [s.label for s in series] == ["depth=1", "depth=2"]
    assert series[0].x == [16, 32]
    assert series[0].acc_mean == pytest.approx([0.6, 0.9]) and series[0].acc_std == pytest.approx([0.1, 0.1])
    assert series[1].acc_mean == pytest.approx([0.6, 0.75]) and series[1].acc_std == pytest.approx([0.0, 0.05])
    with_seeds = figure_series(aggregate_rows(result["rows"], params), params[0], params, result["rows"])
    assert with_seeds[0].acc_seeds == [pytest.approx([0.5, 0.6, 0.7]), pytest.approx([0.8, 0.9, 1.0])]
    assert with_seeds[1].acc_seeds == [pytest.approx([0.6] * 3), pytest.approx([0.7, 0.75, 0.8])]
    assert with_seeds[1].acc_median == pytest.approx([0.6, 0.75]) and with_seeds[0].time_median == [2.0, 2.0]
    assert series[0].acc_seeds == []  # no per-run rows given: the figure falls back to mean +- std
    by_depth = figure_series(aggregate_rows(result["rows"], params), params[1], params)
    assert [s.label for s in by_depth] == ["embed_dim=16", "embed_dim=32"] and by_depth[1].x == [1, 2]
    for name in ("sweep_embed_dim.png", "sweep_depth.png", "index.html", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert "Best mean test accuracy 90.00%" in result["text"]
    # every run but the one at 100% ends more than 5 points below mnist-5k's 98% reference: marked, warned
    assert [r["undertrained"] for r in rows].count("True") == 11
    assert summary[("32", "1")]["undertrained"] == "True" and result["warning"].startswith("warning: 11 of 12 runs")
    assert "Warning: under-trained runs" in (tmp_path / "index.html").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["warning"] == result["warning"]


# ---------------------------------------------------------------- the commands end to end


def test_finished_only_writes_the_tables_of_what_finished(tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    base = ["sweep", "--param", "embed_dim", "--set", "depth=1", *TINY_RUN, "--output", str(out)]
    assert main(base[:3] + ["--values", "16"] + base[3:]) == 0  # one process trained 16 only
    calls = []
    monkeypatch.setattr(runs, "train_run", lambda cfg, init=None: calls.append(cfg) or {})
    capsys.readouterr()
    assert main(base[:3] + ["--values", "16,32"] + base[3:] + ["--finished-only"]) == 0
    assert calls == []  # nothing trained
    assert [r["embed_dim"] for r in read_rows(out / "results.csv")] == ["16"]
    assert "leaves out 1 run(s) not finished yet: embed_dim=32_seed=0" in capsys.readouterr().err
    empty = tmp_path / "empty"
    assert main(base[:3] + ["--values", "16"] + base[3:-1] + [str(empty), "--finished-only"]) == 2
    assert "no run of this study has finished" in capsys.readouterr().err and calls == []
    assert main(["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-4:1e-2", "--finished-only",
                 "--output", str(tmp_path / "s")]) == 2


def test_a_diverged_run_is_a_result_of_the_study(tmp_path: Path, monkeypatch, capsys):
    from vitlab.train.engine import Trainer

    real = Trainer._train_step

    def step(self, epoch, step, order):  # lr 0.002 diverges at its second step; lr 0.001 trains
        if self.plan.run.lr == 0.002 and self.progress.global_step >= 1:
            raise self._nonfinite_error(epoch, step, float("nan"))
        return real(self, epoch, step, order)

    monkeypatch.setattr(Trainer, "_train_step", step)
    out = tmp_path / "sweep"
    argv = ["sweep", "--param", "lr", "--values", "0.001,0.002", "--set", "depth=1", *TINY_RUN, "--output", str(out)]
    assert main(argv) == 0  # the study goes on and writes its tables
    rows = read_rows(out / "results.csv")
    assert [r["diverged"] for r in rows] == ["False", "True"]
    summary = json.loads((out / rows[1]["run"] / "summary.json").read_text())
    assert summary["diverged"] is True and summary["diverged_at"]["epoch"] == 1 and summary["diverged_at"]["step"] == 2
    assert 0.0 <= summary["final_test_acc"] <= 1.0 and summary["epochs"] == 0  # its last finite weights, tested
    assert "non-finite loss" in summary["error"]
    assert float(rows[1]["test_acc"]) == summary["final_test_acc"]
    assert [r["diverged"] for r in read_rows(out / "summary.csv")] == ["0", "1"]
    captured = capsys.readouterr()
    assert "diverged at epoch 1" in captured.err
    assert "[diverged: 1 of 1 seeds]" in captured.out and captured.out.count("[diverged") == 1
    calls = []  # read back as a finished run, never retrained
    monkeypatch.setattr(runs, "train_run", lambda cfg, init=None: calls.append(cfg) or {})
    assert main(argv) == 0 and calls == []
    assert [r["diverged"] for r in read_rows(out / "results.csv")] == ["False", "True"]


def test_a_plain_train_still_stops_at_a_divergence(tmp_path: Path, monkeypatch):
    from vitlab.train.engine import NonFiniteLoss, Trainer, train

    real = Trainer._train_step

    def step(self, epoch, step, order):
        if self.progress.global_step >= 3:
            raise self._nonfinite_error(epoch, step, float("nan"))
        return real(self, epoch, step, order)

    monkeypatch.setattr(Trainer, "_train_step", step)
    cfg = RunConfig(epochs=2, limit_train=64, limit_test=32, batch_size=32, threads=1, progress=False,
                    output=str(tmp_path / "r"), model_overrides={"depth": 1})
    with pytest.raises(NonFiniteLoss) as info:
        train(cfg)
    s = info.value.summary
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == s  # a plain run records it too
    assert s["diverged"] and s["diverged_at"]["epoch"] == 2 and s["epochs"] == 1
    assert s["best_test_acc"] >= s["final_test_acc"] >= 0.0


def test_sweep_command_end_to_end_and_resume(tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--param", "embed_dim", "--values", "16,32", "--set", "depth=1", "--set", "global_pool=token",
            *TINY_RUN, "--output", str(out)]
    assert main(argv) == 0
    rows = read_rows(out / "results.csv")
    assert [r["embed_dim"] for r in rows] == ["16", "32"]
    assert all(0.0 <= float(r["test_acc"]) <= 1.0 and float(r["train_time_s"]) > 0 for r in rows)
    assert int(rows[1]["params"]) > int(rows[0]["params"])
    assert rows[0]["macs"] == str(create_model("vit_mnist", depth=1, embed_dim=16, global_pool="token").flop_count())
    page = (out / "index.html").read_text()
    assert "sweep_embed_dim.png" in page and "--param embed_dim --values 16,32 --seeds 1" in page and "torch" in page
    calls = []
    monkeypatch.setattr(runs, "train_run", lambda cfg, init=None: calls.append(cfg) or {})
    capsys.readouterr()
    assert main(argv) == 0
    assert calls == [] and "already finished" in capsys.readouterr().err
    assert read_rows(out / "results.csv") == rows
    # a finished run is never silently reused for other settings (run or model options)
    assert main([*argv[:-2], "--lr", "0.01", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "finished with other settings (lr 0.002 there, 0.01 now)" in err and calls == []
    assert main([*argv[:-2], "--set", "mlp_ratio=2", "--output", str(out)]) == 2
    assert "(mlp_ratio 4.0 there, 2 now)" in capsys.readouterr().err and calls == []


def test_sweep_command_errors(tmp_path: Path, capsys):
    assert main(["sweep", "--param", "embed_dimm", "--values", "16", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean embed_dim" in err
    assert main(["sweep", "--param", "depth", "--values", "1", "--set", "depth=2", "--output", str(tmp_path)]) == 2
    assert "swept by --param and fixed by --set" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_complexity_command(tmp_path: Path, capsys):
    out = tmp_path / "cx"
    assert main(["complexity", "--img-sizes", "14,28,42", "--set", "depth=1", "--repeats", "1", "--batch-size", "2",
                 "--threads", "1", "--output", str(out)]) == 0
    rows = read_rows(out / "complexity.csv")
    assert [int(r["tokens"]) for r in rows] == [5, 17, 37]
    for r in rows:
        model = create_model("vit_mnist", depth=1, img_size=int(r["img_size"]))
        assert int(r["macs"]) == model.flop_count()
        assert int(r["linear_macs"]) + int(r["attention_macs"]) == int(r["macs"])
    fits = {r["quantity"]: r for r in read_rows(out / "fits.csv")}
    assert float(fits["attention_macs"]["exponent"]) == pytest.approx(2.0)
    tokens = [int(r["tokens"]) for r in rows]
    assert float(fits["forward_s"]["exponent"]) == pytest.approx(
        fit_power_law(tokens, [float(r["forward_s"]) for r in rows])[1])
    assert (out / "complexity.png").stat().st_size > 0 and "complexity.png" in (out / "index.html").read_text()
    assert main(["complexity", "--img-sizes", "28,30", "--output", str(tmp_path / "bad")]) == 2
    assert "not multiples of the patch size 7" in capsys.readouterr().err
    assert main(["complexity", "--img-sizes", "28", "--output", str(tmp_path / "bad")]) == 2
    assert "at least two image sizes" in capsys.readouterr().err


def test_depth_study_variants_share_the_width():
    from vitlab.experiments.depth_study import parse_variants, variant_model
    from vitlab.layers import cait_init_value

    base = get_config("vit_mnist")
    for depth in (4, 20, 30):
        _, vit = variant_model("vit", "vit_mnist", depth)
        assert vit == {"depth": depth, "gate": "none"}
        _, ls = variant_model("layerscale", "vit_mnist", depth)
        assert ls == {"depth": depth, "gate": "layerscale", "init_values": cait_init_value(depth)}
        assert variant_model("rezero", "vit_mnist", depth)[1]["gate"] == "rezero"
        assert variant_model("skipinit", "vit_mnist", depth)[1]["gate"] == "skipinit"
        assert variant_model("deepvit", "vit_mnist", depth)[1]["attn"] == "reattention"
        preset, cait = variant_model("cait", "vit_mnist", depth)
        cfg = get_config(preset, **cait)
        assert (cfg.arch, cfg.depth, cfg.depth_token_only, cfg.init_values) == ("cait", depth, 2,
                                                                                 cait_init_value(depth))
        for key in ("embed_dim", "num_heads", "img_size", "patch_size", "in_chans", "mlp_ratio"):
            assert getattr(cfg, key) == getattr(base, key)
    from vitlab.experiments.depth_study import depth_specs

    specs = depth_specs("vit_mnist", [2], ["vit", "cait"], [0, 1], RunConfig(), {"global_pool": "token"})
    assert [s.name for s in specs] == ["vit_depth2_seed0", "cait_depth2_seed0", "vit_depth2_seed1",
                                       "cait_depth2_seed1"]  # seed-major: a study stopped early has whole seeds
    assert specs[2].config.model_overrides == {"depth": 2, "gate": "none", "global_pool": "token"}
    assert specs[2].config.seed == 1 and specs[1].config.model == "cait_xxs24"
    assert json.loads(specs[1].info["overrides"])["global_pool"] == "token"
    deep = depth_specs("vit_mnist", [2, 6], ["vit", "cait"], [0, 1], RunConfig())
    assert [s.name for s in deep][:3] == ["vit_depth6_seed0", "cait_depth6_seed0", "vit_depth2_seed0"]
    wide = depth_specs("vit_mnist", [2], ["vit", "cait"], [0], RunConfig(), {"embed_dim": 32, "num_heads": 4})
    assert [get_config(s.config.model, **s.config.model_overrides).embed_dim for s in wide] == [32, 32]
    with pytest.raises(ConfigError, match="--set gate would change"):
        depth_specs("vit_mnist", [2], ["vit"], [0], RunConfig(), {"gate": "layerscale"})
    assert parse_variants("vit,cait,vit") == ["vit", "cait"]
    with pytest.raises(ConfigError, match="did you mean layerscale"):
        parse_variants("layerscal")


def test_depth_study_fixup_variants():
    from vitlab.experiments.depth_study import depth_specs, parse_variants, variant_model

    assert parse_variants("fixup,tfixup") == ["fixup", "tfixup"]
    assert variant_model("fixup", "vit_mnist", 8) == ("vit_mnist", {"depth": 8, "gate": "fixup"})
    assert variant_model("tfixup", "vit_mnist", 8) == ("vit_mnist", {"depth": 8, "gate": "tfixup"})
    specs = depth_specs("vit_mnist", [2], ["vit", "fixup", "tfixup"], [0], RunConfig(warmup_epochs=3.0))
    warmups = {s.info["variant"]: s.config.warmup_epochs for s in specs}
    assert warmups == {"vit": 3.0, "fixup": 3.0, "tfixup": 0.0}  # T-Fixup trains without warm-up
    assert json.loads(specs[2].info["run_options"]) == {"warmup_epochs": 0.0}


def test_depth_study_diagnostic_columns():
    from vitlab.analysis.depth_diagnostics import diagnostic_columns

    diag = {"collapse": [{"group": "self_attention", "layers": [0, 1, 2], "mean_similarity": 0.7,
                          "similar_blocks": [1, 1, 0], "similarity": [[1, .95, .3], [.95, 1, .4], [.3, .4, 1]]}],
            "residual_ratios": [{"kind": "self_attention", "attn_mean": a, "mlp_mean": m}
                                for a, m in ((0.1, 0.2), (0.3, 0.4), (0.5, 0.6))]
            + [{"kind": "class_attention", "attn_mean": 9.0, "mlp_mean": 9.0}]}
    cols = diagnostic_columns(diag)
    assert cols["mean_similarity"] == 0.7 and cols["layers_with_similar"] == 2
    assert cols["similar_fraction"] == pytest.approx(2 / 3) and cols["mean_similar_blocks"] == pytest.approx(2 / 3)
    assert cols["ratio_attn_mean"] == pytest.approx(0.3) and cols["ratio_mlp_mean"] == pytest.approx(0.4)
    assert cols["ratio_attn_last"] == 0.5


def test_depth_study_curves_average_over_seeds():
    from vitlab.experiments.depth_study import aggregate_rows as depth_aggregate
    from vitlab.plots.depth import curves

    rows = []
    for variant, depth, seed, acc in (("vit", 8, 0, 0.90), ("vit", 8, 1, 0.94), ("vit", 4, 0, 0.95),
                                      ("vit", 4, 1, 0.97), ("cait", 4, 0, 0.96), ("cait", 8, 0, 0.98)):
        rows.append({"variant": variant, "depth": depth, "seed": seed, "test_acc": acc, "best_test_acc": acc,
                     "train_time_s": 1.0, "train_cpu_s": 0.9, "params": depth, "macs": 2 * depth,
                     "mean_similarity": acc / 2,
                     "similar_fraction": 0.5, "mean_similar_blocks": 1.0, "ratio_attn_mean": 0.1,
                     "ratio_mlp_mean": 0.2, "mean_similarity_pre_mix": float("nan"),
                     "similar_fraction_pre_mix": float("nan"), "mean_similar_blocks_pre_mix": float("nan"),
                     "attn_entropy": 0.5})
    lines = curves(depth_aggregate(rows), "test_acc", ["vit", "cait", "rezero"])
    assert list(lines) == ["vit", "cait"]
    depths, means, stds = lines["vit"]
    assert depths == [4, 8] and means == pytest.approx([0.96, 0.92])
    assert stds == pytest.approx([statistics.stdev([0.95, 0.97]), statistics.stdev([0.90, 0.94])])
    assert lines["cait"] == ([4, 8], pytest.approx([0.96, 0.98]), [0.0, 0.0])
    assert curves(depth_aggregate(rows), "mean_similarity", ["vit"])["vit"][1] == pytest.approx([0.48, 0.46])


def test_depth_study_similar_blocks_per_layer(tmp_path: Path):
    from vitlab.plots.depth import plot_similar_blocks, similar_block_lines

    rows = []
    for seed, counts in ((0, [2, 1, 0]), (1, [0, 1, 2])):
        for layer, c in enumerate(counts):
            rows.append({"variant": "deepvit", "depth": 3, "seed": seed, "maps": "recorded",
                         "group": "self_attention", "layer": layer, "similar_blocks": c})
            rows.append({"variant": "deepvit", "depth": 3, "seed": seed, "maps": "pre_mix",
                         "group": "self_attention", "layer": layer, "similar_blocks": 2})
    rows.append({"variant": "cait", "depth": 3, "seed": 0, "maps": "recorded", "group": "class_attention",
                 "layer": 3, "similar_blocks": 1})
    rows.append({"variant": "vit", "depth": 6, "seed": 0, "maps": "recorded", "group": "self_attention",
                 "layer": 0, "similar_blocks": 5})
    lines = similar_block_lines(rows, 3, ["vit", "cait", "deepvit"])
    assert lines == {"deepvit": ([0, 1, 2], [1.0, 1.0, 1.0]), "deepvit pre-mix": ([0, 1, 2], [2.0, 2.0, 2.0])}
    assert similar_block_lines(rows, 6, ["vit"]) == {"vit": ([0], [5.0])}
    path = plot_similar_blocks(rows, ["vit", "cait", "deepvit"], [3, 6], 0.9, tmp_path / "similar.png")
    assert path.stat().st_size > 0


def test_depth_study_diagnose_a_checkpoint(tmp_path: Path):
    from vitlab.analysis import collapse_groups, residual_ratios
    from vitlab.analysis.depth_diagnostics import diagnose
    from vitlab.checkpoint import save_checkpoint
    from vitlab.data import normalize

    model = create_model("vit_mnist", depth=3, gate="layerscale", init_values=0.1).eval()
    save_checkpoint(tmp_path, model)
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    mean, std = (0.1307,), (0.3081,)
    diag = diagnose(tmp_path, images, None, [], mean, std, threshold=0.5, batch_size=4)
    x = normalize(images, mean, std)
    with torch.no_grad():
        group = collapse_groups(model.attention_maps(x), threshold=0.5)[0]
    assert diag["collapse"][0]["layers"] == [0, 1, 2]
    assert torch.allclose(torch.tensor(diag["collapse"][0]["similarity"]), group.similarity, atol=1e-5)
    assert diag["collapse"][0]["similar_blocks"] == group.similar.tolist()
    expected = residual_ratios(model, x)
    assert [r["attn_mean"] for r in diag["residual_ratios"]] == pytest.approx([r.attn_mean for r in expected])
    stamp = (tmp_path / "diagnostics.json").stat().st_mtime_ns
    assert diagnose(tmp_path, images, None, [], mean, std, threshold=0.5) == json.loads(
        (tmp_path / "diagnostics.json").read_text())
    assert (tmp_path / "diagnostics.json").stat().st_mtime_ns == stamp  # read back, not recomputed
    diagnose(tmp_path, images, None, [], mean, std, threshold=0.8)
    assert json.loads((tmp_path / "diagnostics.json").read_text())["threshold"] == 0.8


def test_depth_study_diagnoses_reattention_before_the_head_mix(tmp_path: Path):
    from vitlab.analysis import attention_entropy, collapse_groups
    from vitlab.analysis.depth_diagnostics import diagnose, diagnostic_columns
    from vitlab.checkpoint import save_checkpoint
    from vitlab.data import normalize
    from vitlab.experiments.depth_study import per_layer_rows
    from vitlab.layers.reattention import record_pre_mix

    model = create_model("vit_mnist", depth=3, attn="reattention").eval()
    save_checkpoint(tmp_path, model)
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    mean, std = (0.1307,), (0.3081,)
    x = normalize(images, mean, std)
    with torch.no_grad(), record_pre_mix(model.modules()) as pre_mix:
        recorded = model.attention_maps(x)
    assert len(pre_mix) == len(recorded) == 3
    assert torch.allclose(pre_mix[0].sum(-1), torch.ones(6, 8, 17))  # softmax rows, before the mix
    assert not torch.allclose(pre_mix[0], recorded[0])
    diag = diagnose(tmp_path, images, None, [], mean, std, threshold=0.5)
    expected = collapse_groups(list(pre_mix), threshold=0.5)[0]
    got = diag["collapse_pre_mix"][0]
    assert torch.allclose(torch.tensor(got["similarity"]), expected.similarity, atol=1e-5)
    assert got["similar_blocks"] == expected.similar.tolist()
    cols = diagnostic_columns(diag)
    assert cols["mean_similarity_pre_mix"] == pytest.approx(expected.mean_off_diagonal())
    assert cols["mean_similarity_pre_mix"] > cols["mean_similarity"]  # probability rows are alike by construction
    spec = RunSpec("r", RunConfig(), {"variant": "deepvit", "depth": 3, "seed": 0})
    layers = per_layer_rows(spec, diag)[1]
    assert [r["maps"] for r in layers] == ["recorded"] * 3 + ["pre_mix"] * 3
    # the entropy is that of the softmax maps before the mix (the mixed ones are not probability rows)
    assert diag["entropy"]["layers"] == [0, 1, 2]
    torch.testing.assert_close(torch.tensor(diag["entropy"]["values"]), attention_entropy(list(pre_mix)))
    assert cols["attn_entropy"] == pytest.approx(sum(diag["entropy"]["values"]) / 3)
    # a diagnostics.json written before the pre-mix maps were recorded is recomputed
    old = {k: v for k, v in diag.items() if k not in ("collapse_pre_mix", "version", "entropy")}
    (tmp_path / "diagnostics.json").write_text(json.dumps(old))
    assert "collapse_pre_mix" in diagnose(tmp_path, images, None, [], mean, std, threshold=0.5)
    # ... unless the run has no weights (restored from its committed record): kept, the new measures NaN
    (tmp_path / "diagnostics.json").write_text(json.dumps({**old, "version": 2}))
    (tmp_path / "model.safetensors").unlink()
    kept = diagnose(tmp_path, images, None, [], mean, std, threshold=0.5)
    assert kept == {**old, "version": 2} and math.isnan(diagnostic_columns(kept)["attn_entropy"])
    with pytest.raises(CheckpointError):  # no diagnostics for these settings and no weights: the error stays
        diagnose(tmp_path, images, None, [], mean, std, threshold=0.7)
    plain = create_model("vit_mnist", depth=2).eval()
    save_checkpoint(tmp_path / "plain", plain)
    diag = diagnose(tmp_path / "plain", images, None, [], mean, std, threshold=0.5)
    assert diag["collapse_pre_mix"] == [] and math.isnan(diagnostic_columns(diag)["mean_similarity_pre_mix"])
    with torch.no_grad():  # a plain ViT's recorded maps are its softmax maps
        torch.testing.assert_close(torch.tensor(diag["entropy"]["values"]), attention_entropy(plain.attention_maps(x)))


def test_talking_heads_maps_are_recorded_before_their_post_softmax_mix(tmp_path: Path):
    from vitlab.analysis.depth_diagnostics import diagnose
    from vitlab.checkpoint import save_checkpoint
    from vitlab.data import normalize
    from vitlab.layers import record_attention, record_pre_mix

    model = create_model("cait_xxs24", depth=2, embed_dim=32, num_heads=4, img_size=28, patch_size=7, in_chans=1,
                         num_classes=10).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # talking-heads mixes far from the identity
            if "proj_w" in name or "proj_l" in name:
                p.add_(0.5 * torch.randn_like(p))
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    x = normalize(images, (0.1307,), (0.3081,))
    with torch.no_grad(), record_pre_mix(model.modules()) as pre_mix, record_attention(model.modules()) as maps:
        model(x)
    assert len(pre_mix) == 2 and len(maps) == 4  # the 2 self-attention blocks; class attention has no mix
    assert torch.allclose(pre_mix[0].sum(-1), torch.ones(6, 4, 16), atol=1e-5)  # probability rows (patches only)
    assert not torch.allclose(pre_mix[0], maps[0], atol=1e-3)  # the recorded map is the mixed one
    save_checkpoint(tmp_path, model)
    diag = diagnose(tmp_path, images, None, [], (0.1307,), (0.3081,), threshold=0.5)
    assert diag["collapse_pre_mix"][0]["layers"] == [0, 1] and diag["version"] >= 2


@pytest.mark.slow
def test_depth_study_command(tmp_path: Path, monkeypatch):
    out = tmp_path / "depth"
    argv = ["depth-study", "--depths", "2,1", "--variants", "layerscale,cait", "--num-images", "8", "--analyze-runs",
            *TINY_RUN, "--output", str(out)]
    assert main(argv) == 0
    rows = read_rows(out / "results.csv")
    assert [(r["variant"], r["depth"]) for r in rows] == [("layerscale", "1"), ("layerscale", "2"), ("cait", "1"),
                                                         ("cait", "2")]
    assert json.loads(rows[1]["overrides"]) == {"depth": 2, "gate": "layerscale", "init_values": 0.1}
    assert rows[2]["preset"] == "cait_xxs24" and json.loads(rows[2]["overrides"])["embed_dim"] == 64
    diag = json.loads((out / "layerscale_depth2_seed0" / "diagnostics.json").read_text())
    sa = diag["collapse"][0]
    assert diag["num_images"] == 8 and sa["group"] == "self_attention" and len(sa["layers"]) == 2
    assert float(rows[1]["mean_similarity"]) == pytest.approx(sa["mean_similarity"])
    ratios = [r for r in read_rows(out / "residual_ratios.csv") if r["variant"] == "cait" and r["depth"] == "2"]
    assert [r["kind"] for r in ratios] == ["self_attention"] * 2 + ["class_attention"] * 2
    assert [(r["variant"], r["depth"]) for r in read_rows(out / "summary.csv")] == [
        ("layerscale", "1"), ("layerscale", "2"), ("cait", "1"), ("cait", "2")]  # trained deepest first, read in order
    summary = {(r["variant"], r["depth"]): r for r in read_rows(out / "summary.csv")}
    assert float(summary[("cait", "2")]["test_acc_mean"]) == pytest.approx(float(rows[3]["test_acc"]))
    assert float(summary[("cait", "2")]["test_acc_median"]) == pytest.approx(float(rows[3]["test_acc"]))
    report = json.loads((out / "cait_depth2_seed0" / "analysis" / "summary.json").read_text())
    assert report["collapse"][0]["similar_blocks"] == json.loads(
        (out / "cait_depth2_seed0" / "diagnostics.json").read_text())["collapse"][0]["similar_blocks"]
    for name in ("accuracy_vs_depth.png", "collapse_vs_depth.png", "residual_ratios.png", "similarity_depth2.png",
                 "collapse_layers.csv", "index.html"):
        assert (out / name).stat().st_size > 0
    calls = []
    monkeypatch.setattr(runs, "train_run", lambda cfg, init=None: calls.append(cfg) or {})
    assert main(argv) == 0 and calls == []


def test_depth_study_figure_is_told_the_planned_seeds(tmp_path: Path, monkeypatch):
    """A depth study rewritten with --finished-only while seeds are still missing hands the planned seed count to
    the accuracy figure, which draws a point short of it apart instead of as a median over the planned seeds."""
    from vitlab.plots import depth as depth_plots

    seen = []
    real = depth_plots.plot_accuracy
    monkeypatch.setattr(depth_plots, "plot_accuracy", lambda agg, variants, path, runs=None, planned=None: (
        seen.append((sorted(int(r["seed"]) for r in runs), planned)), real(agg, variants, path, runs, planned))[1])
    argv = ["depth-study", "--depths", "1", "--variants", "vit", "--epochs", "1", "--batch-size", "16",
            "--limit-train", "32", "--limit-test", "16", "--num-images", "4", "--probe-images", "0",
            "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress", "--output", str(tmp_path / "d")]
    assert main(argv) == 0 and seen[-1] == ([0], 1)
    assert main([*argv, "--seeds", "3", "--finished-only"]) == 0 and seen[-1] == ([0], 3)
    assert (tmp_path / "d" / "accuracy_vs_depth.png").stat().st_size > 0


def test_depth_accuracy_figure_zooms_on_trained_points(tmp_path: Path, monkeypatch):
    from vitlab.plots import depth as depth_plots

    def row(variant, depth, acc, undertrained=False, diverged=0):
        return {"variant": variant, "depth": depth, "test_acc_mean": acc, "test_acc_std": 0.0,
                "undertrained": undertrained, "diverged": diverged}

    trained = [row("vit", 2, 0.97), row("vit", 4, 0.975), row("fixup", 2, 0.98)]
    failed = [row("fixup", 4, 0.10, True, 2)]
    drawn = []
    real = depth_plots.plot_against_depth

    def spy(agg, variants, panels, path, title, subsets=None, runs=None, planned=None):
        drawn.append((panels, subsets))
        return real(agg, variants, panels, path, title, subsets=subsets, runs=runs, planned=planned)

    monkeypatch.setattr(depth_plots, "plot_against_depth", spy)
    depth_plots.plot_accuracy(trained + failed, ["vit", "fixup"], tmp_path / "a.png")
    panels, subsets = drawn[-1]
    assert len(panels) == 2 and subsets[0] == trained + failed and subsets[1] == trained  # the zoom leaves it out
    depth_plots.plot_accuracy(trained, ["vit", "fixup"], tmp_path / "b.png")
    assert len(drawn[-1][0]) == 1 and drawn[-1][1] is None  # nothing to zoom on
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0


def test_compare_parsing(tmp_path: Path):
    from vitlab.experiments.compare import entries, parse_model_sets, parse_models, parse_pretrained

    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    models = parse_models("vit_mnist,timm:vit_tiny_patch16_224")
    assert parse_pretrained(["-", str(weights)], models) == [("timm:vit_tiny_patch16_224", str(weights))]
    assert parse_pretrained([f"vit_mnist={weights}"], models) == [("vit_mnist", str(weights))]
    with pytest.raises(CheckpointError, match="no such file"):
        parse_pretrained([str(tmp_path / "missing.pth")], models)
    with pytest.raises(ConfigError, match="no model to pair"):
        parse_pretrained(["-", "-", str(weights)], models)
    with pytest.raises(ConfigError, match="did you mean vit_mnist"):
        parse_models("vit_mnst")
    sets = parse_model_sets(["depth=2", "timm:vit_tiny_patch16_224:patch_size=7"], models)
    assert sets == {"vit_mnist": {"depth": 2}, "timm:vit_tiny_patch16_224": {"depth": 2, "patch_size": 7}}
    with pytest.raises(ConfigError, match="not in --models"):
        parse_model_sets(["vit_tiny:depth=2"], models)
    items = entries(models, sets, [("timm:vit_tiny_patch16_224", str(weights))] * 2)
    assert [e.label for e in items] == ["vit_mnist (scratch)", "timm:vit_tiny_patch16_224 (scratch)",
                                        "timm:vit_tiny_patch16_224 (fine-tuned)",
                                        "timm:vit_tiny_patch16_224 (fine-tuned #2)"]


def test_load_init_adapts_timm_weights_to_the_run(tmp_path: Path):
    import timm

    from vitlab.train.run_model import load_init

    source = timm.create_model("vit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2, img_size=32,
                               patch_size=8, in_chans=3, num_classes=5)
    torch.save(source.state_dict(), tmp_path / "src.pth")
    target = create_model("timm:vit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2, img_size=28, patch_size=7,
                          in_chans=1, num_classes=10)
    load_init(target, str(tmp_path / "src.pth"))
    s, t = source.state_dict(), target.state_dict()
    for key in ("blocks.0.attn.qkv.weight", "blocks.0.mlp.fc2.weight", "cls_token", "norm.weight"):
        assert torch.equal(s[key], t[key]), key
    assert t["patch_embed.proj.weight"].shape == (32, 1, 7, 7)
    assert torch.equal(t["pos_embed"], s["pos_embed"])  # 4 x 4 patches and the class token both times
    assert t["head.weight"].shape == (10, 32)
    vit = create_model("vit_mnist", depth=1)
    with pytest.raises(ConfigError, match="vitlab model"):
        load_init(vit, "hub")


def test_compare_command_with_a_fine_tuned_timm_model(tmp_path: Path):
    import timm

    source = timm.create_model("vit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2, img_size=32,
                               patch_size=8, in_chans=3, num_classes=5)
    torch.save(source.state_dict(), tmp_path / "src.pth")
    out = tmp_path / "cmp"
    timm_name = "timm:vit_tiny_patch16_224"
    argv = ["compare", "--models", f"vit_mnist,{timm_name}", "--set", "vit_mnist:depth=1",
            *[f"--set={timm_name}:{k}" for k in ("depth=1", "embed_dim=32", "num_heads=2", "patch_size=7")],
            "--pretrained", "-", "--pretrained", str(tmp_path / "src.pth"), *TINY_RUN, "--output", str(out)]
    assert main(argv) == 0
    rows = read_rows(out / "summary.csv")
    assert [r["model"] for r in rows] == ["vit_mnist (scratch)", f"{timm_name} (scratch)",
                                          f"{timm_name} (fine-tuned)"]
    assert rows[1]["params"] == rows[2]["params"] == str(sum(p.numel() for p in timm.create_model(
        "vit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2, img_size=28, patch_size=7, in_chans=1,
        num_classes=10).parameters()))
    vit = create_model("vit_mnist", depth=1)
    assert int(rows[0]["matmul_macs"]) == vit.flop_count(matmul_only=True)
    assert (out / "compare.png").stat().st_size > 0 and "compare.png" in (out / "index.html").read_text()
    assert [float(r["test_acc_median"]) for r in rows] == [float(r["test_acc"]) for r in rows]  # one seed each
    # the weights a finished fine-tuned run started from are not committed with its record: --finished-only reads
    # the runs back (and rewrites the tables) without them; training still needs them
    (tmp_path / "src.pth").unlink()
    before = read_rows(out / "results.csv")
    assert main([*argv, "--finished-only"]) == 0
    assert read_rows(out / "results.csv") == before
    assert main(argv) == 2


def test_compare_prints_the_median_over_seeds():
    """The line `vitlab compare` prints per row quotes the median over seeds (an outlying seed moves the mean, not
    the headline), says so when there is more than one seed, and the median training time."""
    from vitlab.commands.compare import report_lines

    row = {"model": "vit_mnist (scratch)", "start": "scratch", "test_acc": 0.60, "test_acc_median": 0.85,
           "train_time_s": 50.0, "train_time_s_median": 40.0, "params": 404_000, "macs": 7e6, "matmul_macs": 7e6,
           "seeds": 3, "undertrained": False, "diverged": 0}
    line = report_lines({"summary": [row], "warning": None, "out": "o"})[0]
    assert "test accuracy 85.00% (median of 3 seeds)" in line and "training 40.0 s" in line
    line = report_lines({"summary": [{**row, "seeds": 1}], "warning": None, "out": "o"})[0]
    assert "test accuracy 85.00%," in line and "median" not in line
