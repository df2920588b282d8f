"""``vitlab depth-study --lr-from STUDY`` reuses the learning-rate study's runs: a run of the depth study whose
variant, depth, rate and seed the grid already trained, with every setting that matters equal (options left to the
recipe resolved), is copied into ``--output`` (atomically) and read back, not trained; a grid run of other settings
is named and the run trains. ``--lr-of VARIANT`` trains every variant at the rate chosen for VARIANT.

The grid here is trained the way ``vitlab lr-sensitivity`` trains it (its ``lr_specs``, two tiny runs), without the
study's tables and figures, so the tests stay fast; one ``full`` test runs both commands end to end."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest

from _helpers import cli_error, read_rows
from vitlab.experiments.depth_study import DepthStudyConfig, depth_run_specs, grid_run_name
from vitlab.experiments.lr_sensitivity import lr_specs
from vitlab.experiments.record import finished_run
from vitlab.train.config import RunConfig

SHARED = {"embed_dim": 16, "num_heads": 2}
OPTIONS = {"epochs": 1, "batch_size": 16, "limit_train": 32, "limit_test": 16, "val_split": 0.25}
COLUMNS = ["variant", "depth", "lrs", "runs", "best_lr", "best_val_loss", "best_val_acc", "test_acc_at_best_lr",
           "lr_sensitivity", "divergence_rate", "max_logit"]
BEST = {"vit": 3e-3, "layerscale": 1e-3}  # the rates the grid's sensitivity.csv chose


def _sensitivity(folder: Path, rates: dict[str, float]) -> None:
    with (folder / "sensitivity.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for variant, lr in rates.items():
            w.writerow({"variant": variant, "depth": 1, "lrs": 2, "runs": 2, "best_lr": lr, "best_val_loss": 0.5,
                        "best_val_acc": 0.9, "test_acc_at_best_lr": 0.9, "lr_sensitivity": 0.1,
                        "divergence_rate": 0.0, "max_logit": 3.0})


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A learning-rate study's folder: vit at 3e-3, layerscale at 1e-3 and 3e-3 (seed 0, depth 1), trained as
    ``vitlab lr-sensitivity`` plans them, and a sensitivity.csv choosing vit 3e-3, layerscale 1e-3."""
    from vitlab.experiments.runs import train_run

    folder = tmp_path_factory.mktemp("grid")
    cfg = RunConfig(**OPTIONS, progress=False, probe_images=8)
    wanted = {grid_run_name("vit", 1, 3e-3, 0), grid_run_name("layerscale", 1, 1e-3, 0),
              grid_run_name("layerscale", 1, 3e-3, 0)}
    for spec in lr_specs("vit_mnist", [1], ["vit", "layerscale"], [1e-3, 3e-3], [0], cfg, SHARED):
        if spec.name in wanted:
            train_run(spec.config.replace(output=str(folder / spec.name)))
            wanted.discard(spec.name)
    assert not wanted, f"lr_specs names no run {wanted}"
    _sensitivity(folder, BEST)
    return folder


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the runs the study trains (the real trainer, counted)."""
    from vitlab.experiments import runs

    names: list[str] = []
    real = runs.train_run

    def counting(cfg, init=None):
        names.append(Path(cfg.output).name)
        return real(cfg, init=init)

    monkeypatch.setattr(runs, "train_run", counting)
    return names


def _argv(out: Path, *extra: str, variants: str = "vit", depths: str = "1") -> list[str]:
    return ["depth-study", "--depths", depths, "--variants", variants, "--epochs", "1", "--batch-size", "16",
            "--limit-train", "32", "--limit-test", "16", "--val-split", "0.25", "--num-images", "4",
            "--probe-images", "0", "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress",
            "--output", str(out), *extra]


def _config(grid: Path, out: Path, seeds: int = 1, variants: tuple[str, ...] = ("vit",), depth: int = 1,
            **fields) -> DepthStudyConfig:
    return DepthStudyConfig("vit_mnist", [depth], list(variants), RunConfig(**OPTIONS, progress=False), out,
                            seeds=seeds, shared=dict(SHARED), probe_images=0, lr_from=str(grid), **fields)


def test_grid_run_names_are_the_learning_rate_studys():
    cfg = RunConfig(**OPTIONS)
    lrs = [3e-4, 0.0007071067811865476, 1e-2, 0.5]
    for spec in lr_specs("vit_mnist", [1, 2], ["vit", "cait"], lrs, [0, 3], cfg, SHARED):
        i = spec.info
        assert grid_run_name(i["variant"], i["depth"], i["lr"], i["seed"]) == spec.name


def test_seed_0_is_copied_from_the_grid_and_only_seed_1_trains(grid, tmp_path, trained):
    from vitlab.experiments.runs import run_study

    before = {p.name: p.stat().st_mtime_ns for p in (grid / "vit_depth1_lr0.003_seed0").iterdir()}
    config = _config(grid, tmp_path / "d", seeds=2)
    specs = depth_run_specs(config)
    assert [s.source for s in specs] == [str(grid / "vit_depth1_lr0.003_seed0"), None]
    out, pairs = run_study(specs, tmp_path / "d", "depth-study", title="depth study")
    assert trained == ["vit_depth1_seed1"]
    copy = out / "vit_depth1_seed0"
    assert finished_run(copy, specs[0].config) == pairs[0][1]  # the copy verifies where the study reads it
    assert (copy / "model.safetensors").read_bytes() == (grid / "vit_depth1_lr0.003_seed0" / "model.safetensors"
                                                          ).read_bytes()
    assert not (copy / "train.lock").exists()  # the grid run's lock stays there
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".vit_")) == []  # no temporary copy left
    assert {p.name: p.stat().st_mtime_ns for p in (grid / "vit_depth1_lr0.003_seed0").iterdir()} == before
    # invoked again, both runs read back from the study's own folder: nothing trained, nothing copied
    trained.clear()
    specs = depth_run_specs(config)
    assert [s.source for s in specs] == [None, None]
    run_study(specs, tmp_path / "d", "depth-study", title="depth study")
    assert trained == []


def test_the_progress_line_and_dry_run_say_reused(grid, tmp_path, trained, capsys):
    from vitlab.cli import main

    out = tmp_path / "d"
    assert main(_argv(out, "--lr-from", str(grid), "--dry-run")) == 0
    plan = capsys.readouterr().out
    assert f"vit_depth1_seed0: reused from {grid / 'vit_depth1_lr0.003_seed0'} (copied, not trained)" in plan, plan
    assert "0 of 1 runs to train" in plan, plan
    assert not out.exists() and trained == []
    from vitlab.experiments.runs import run_study

    run_study(depth_run_specs(_config(grid, out)), out, "depth-study", title="depth study")
    err = capsys.readouterr().err
    assert f"[1/1] depth study vit_depth1_seed0: reused from {grid / 'vit_depth1_lr0.003_seed0'}; test accuracy" \
        in err, err
    assert trained == []


@pytest.mark.parametrize("change, differs", [
    (["--epochs", "2"], "epochs 1 there, 2 now"),
    (["--no-val-split"], "val_split 0.25 there, None now"),  # left to the recipe here, given to the grid
    (["--set", "mlp_ratio=2"], "mlp_ratio 4.0 there, 2 now"),
], ids=["epochs", "val-split-left-out", "model-option"])
def test_a_grid_run_of_other_settings_is_named_and_not_reused(grid, tmp_path, trained, capsys, change, differs):
    from vitlab.cli import main

    argv = _argv(tmp_path / "d", "--lr-from", str(grid), "--dry-run")
    if change == ["--no-val-split"]:
        i = argv.index("--val-split")
        del argv[i:i + 2]
    else:
        argv += change
    assert main(argv) == 0
    captured = capsys.readouterr()
    line = [x for x in captured.err.splitlines() if "not reused" in x]
    assert line == [f"depth study vit_depth1_seed0: not reused from {grid / 'vit_depth1_lr0.003_seed0'}: it was "
                    f"trained with other settings ({line[0].split('settings (')[1].split(')')[0]}); training it"], line
    assert differs in line[0], line
    assert "1 of 1 runs to train" in captured.out and "reused from" not in captured.out


def test_a_grid_run_kept_without_weights_is_not_reused(grid, tmp_path, capsys):
    kept = tmp_path / "grid"
    shutil.copytree(grid, kept)
    for name in ("model.safetensors", "state.pt", "manifest.json"):  # scripts/findings_tables.py --keep-runs
        (kept / "vit_depth1_lr0.003_seed0" / name).unlink()
    spec = depth_run_specs(_config(grid, tmp_path / "x"))[0]
    assert finished_run(kept / "vit_depth1_lr0.003_seed0", spec.config)  # the engine reads such a record back
    capsys.readouterr()
    assert depth_run_specs(_config(kept, tmp_path / "d"))[0].source is None
    err = capsys.readouterr().err
    assert f"not reused from {kept / 'vit_depth1_lr0.003_seed0'}: it holds no model.safetensors" in err, err


def test_a_kept_record_of_other_settings_is_named_for_the_settings_not_the_weights(grid, tmp_path, capsys):
    # a drop-path control beside a grid run trained without drop path: the settings are why it can never stand in
    kept = tmp_path / "grid"
    shutil.copytree(grid, kept)
    for name in ("model.safetensors", "state.pt", "manifest.json"):
        (kept / "vit_depth1_lr0.003_seed0" / name).unlink()
    config = _config(kept, tmp_path / "d")
    config.run = config.run.replace(drop_path=0.1)
    capsys.readouterr()
    assert depth_run_specs(config)[0].source is None
    err = capsys.readouterr().err
    assert f"not reused from {kept / 'vit_depth1_lr0.003_seed0'}: it was trained with other settings (drop_path 0.0 " \
           "there, 0.1 now" in err, err
    assert "model.safetensors" not in err, err


def test_other_epochs_train_the_run(grid, tmp_path, trained):
    from vitlab.experiments.runs import run_study

    config = _config(grid, tmp_path / "d")
    config.run = config.run.replace(epochs=2)
    specs = depth_run_specs(config)
    assert specs[0].source is None
    run_study(specs, tmp_path / "d", "depth-study", title="depth study")
    assert trained == ["vit_depth1_seed0"]


def test_lr_of_trains_every_variant_at_that_variants_rate_and_reuses_its_grid_run(grid, tmp_path, capsys):
    from vitlab.cli import main

    own = depth_run_specs(_config(grid, tmp_path / "d", variants=("vit", "layerscale")))
    assert {s.info["variant"]: s.config.lr for s in own} == BEST
    same = depth_run_specs(_config(grid, tmp_path / "d", variants=("vit", "layerscale"), lr_of="vit"))
    assert {s.info["variant"]: s.config.lr for s in same} == {"vit": 3e-3, "layerscale": 3e-3}
    assert {s.info["variant"]: s.source for s in same} == {
        "vit": str(grid / "vit_depth1_lr0.003_seed0"), "layerscale": str(grid / "layerscale_depth1_lr0.003_seed0")}
    assert main(_argv(tmp_path / "d", "--lr-from", str(grid), "--lr-of", "layerscale", "--dry-run",
                      variants="vit,layerscale")) == 0
    plan = capsys.readouterr().out
    assert "vit_depth1_seed0: vit_mnist" in plan and ", lr 0.001" in plan, plan  # vit at layerscale's rate: no run
    assert f"layerscale_depth1_seed0: reused from {grid / 'layerscale_depth1_lr0.001_seed0'}" in plan, plan


@pytest.mark.parametrize("extra, words", [
    (["--lr-of", "vit"], "--lr-of vit picks a rate --lr-from read; add --lr-from STUDY"),
    (["--lr-from", "GRID", "--lr-of", "vitt"], "--lr-of: unknown variant 'vitt'; did you mean vit"),
    (["--lr-from", "GRID", "--lr-of", "deepvit"], "has no learning rate for deepvit at depth 1 (--lr-of deepvit)"),
    (["--lr-from", "GRID", "--lr-of", "vit", "--depths", "1,2"], "has no learning rate for vit at depth 2"),
], ids=["no-lr-from", "unknown", "no-row", "no-row-at-a-depth"])
def test_lr_of_refusals_are_one_line_before_anything_is_written(grid, tmp_path, capsys, extra, words):
    argv = _argv(tmp_path / "d", *[str(grid) if x == "GRID" else x for x in extra])
    msg = cli_error(capsys, argv)
    assert words in msg, msg
    assert not (tmp_path / "d").exists()


def test_an_interrupted_copy_leaves_nothing_under_the_runs_name(grid, tmp_path, trained, monkeypatch):
    from vitlab.experiments.runs import run_study

    real, copied = shutil.copy2, []

    def interrupted(src, dst, **kw):
        if copied:
            raise KeyboardInterrupt
        copied.append(dst)
        return real(src, dst, **kw)

    specs = depth_run_specs(_config(grid, tmp_path / "d"))
    monkeypatch.setattr(shutil, "copy2", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_study(specs, tmp_path / "d", "depth-study", title="depth study")
    assert copied and not os.path.lexists(copied[0])  # the one file copied was removed with its folder
    assert not (tmp_path / "d").exists()  # the study folder it created, left empty, is gone too
    monkeypatch.setattr(shutil, "copy2", real)
    run_study(depth_run_specs(_config(grid, tmp_path / "d")), tmp_path / "d", "depth-study", title="depth study")
    assert trained == [] and finished_run(tmp_path / "d" / "vit_depth1_seed0", specs[0].config) is not None


def test_a_copy_left_by_a_killed_study_is_removed_by_the_next_copy(grid, tmp_path, trained):
    """A SIGKILL between the copy's start and its rename leaves a hidden sibling; the next copy of that run (the
    study's lock held) removes it."""
    from vitlab.experiments.runs import run_study

    stale = tmp_path / "d" / ".vit_depth1_seed0.abc123.copy"
    stale.mkdir(parents=True)
    (stale / "summary.json").write_text("{")
    run_study(depth_run_specs(_config(grid, tmp_path / "d")), tmp_path / "d", "depth-study", title="depth study")
    assert trained == [] and not stale.exists()
    assert sorted(p.name for p in (tmp_path / "d").iterdir() if p.name.endswith(".copy")) == []


@pytest.mark.parametrize("where", ["source", "copy"])
def test_a_copy_that_does_not_verify_is_removed(grid, tmp_path, monkeypatch, where):
    """The source damaged after it was judged, or the copy damaged on its way (the copy itself is verified)."""
    from vitlab.experiments.record import UnverifiedRun
    from vitlab.experiments.runs import copy_run

    def damage(weights: Path) -> None:
        weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))

    source = tmp_path / "run"
    shutil.copytree(grid / "vit_depth1_lr0.003_seed0", source)
    spec = depth_run_specs(_config(grid, tmp_path / "d"))[0]
    if where == "source":
        damage(source / "model.safetensors")
    else:
        real = shutil.copy2

        def damaging(src, dst, **kw):
            real(src, dst, **kw)
            if Path(dst).name == "model.safetensors":
                damage(Path(dst))

        monkeypatch.setattr(shutil, "copy2", damaging)
    (tmp_path / "d").mkdir()
    with pytest.raises(UnverifiedRun):
        copy_run(source, tmp_path / "d" / spec.name, spec.config)
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.full  # a real lr-sensitivity study, then the depth study from its folder, both end to end
def test_a_real_grid_then_the_depth_study_reads_seed_0_from_it(tmp_path, trained, capsys):
    from vitlab.cli import main

    grid = tmp_path / "grid"  # 2 blocks: the diagnostics of one block compare no layers
    assert main(["lr-sensitivity", "--depths", "2", "--variants", "vit", "--lrs", "1e-3,3e-3", "--epochs", "1",
                 "--batch-size", "16", "--limit-train", "32", "--limit-test", "16", "--val-split", "0.25",
                 "--probe-images", "8", "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress",
                 "--output", str(grid)]) == 0
    best = float(read_rows(grid / "sensitivity.csv")[0]["best_lr"])
    trained.clear()
    capsys.readouterr()
    out = tmp_path / "d"
    argv = _argv(out, "--lr-from", str(grid), "--seeds", "2", "--probe-images", "8", depths="2")
    assert main(argv) == 0
    assert trained == ["vit_depth2_seed1"]
    source = grid / grid_run_name("vit", 2, best, 0)
    assert f"vit_depth2_seed0: reused from {source}; test accuracy" in capsys.readouterr().err
    rows = read_rows(out / "results.csv")
    assert [r["run"] for r in rows] == ["vit_depth2_seed0", "vit_depth2_seed1"]
    spec = depth_run_specs(_config(grid, out, seeds=2, depth=2))[0]
    assert spec.name == "vit_depth2_seed0" and finished_run(out / spec.name, spec.config) is not None
    assert main(argv) == 0  # read back: nothing trained or copied
    assert trained == ["vit_depth2_seed1"]
    assert "reused" not in capsys.readouterr().err


def test_reuse_copies_another_depth_studys_run_of_the_same_name_and_settings(grid, tmp_path, trained, capsys):
    """``--reuse STUDY``: the same-rate control (every arm at the ViT's rate) copies the main study's runs of an arm
    whose own rate is the ViT's; a run there of other settings (another rate) trains."""
    from vitlab.experiments.runs import run_study

    main_study = tmp_path / "main"
    run_study(depth_run_specs(_config(grid, main_study, seeds=2, variants=("vit", "layerscale"))), main_study,
              "depth-study", title="depth study")
    assert sorted(trained) == ["layerscale_depth1_seed1", "vit_depth1_seed1"]  # seed 0 came from the grid
    trained.clear()
    # every arm at layerscale's rate (1e-3): layerscale's runs are the main study's; vit at 1e-3 is not (3e-3 there)
    specs = depth_run_specs(_config(grid, tmp_path / "same", seeds=2, variants=("vit", "layerscale"),
                                    lr_of="layerscale", reuse=str(main_study)))
    sources = {s.name: s.source for s in specs}
    assert sources["layerscale_depth1_seed1"] == str(main_study / "layerscale_depth1_seed1"), sources
    assert sources["vit_depth1_seed1"] is None, sources
    assert "vit_depth1_seed1: not reused from" in capsys.readouterr().err
    out, _ = run_study(specs, tmp_path / "same", "depth-study", title="depth study")
    assert sorted(trained) == ["vit_depth1_seed0", "vit_depth1_seed1"]
    assert finished_run(out / "layerscale_depth1_seed1", specs[-1].config) is not None
    capsys.readouterr()
    # refusals: no such folder, or the study's own folder
    for bad, words in ((tmp_path / "nowhere", "no such folder"), (tmp_path / "same", "this study's own --output")):
        msg = cli_error(capsys, _argv(tmp_path / "same", "--lr-from", str(grid), "--reuse", str(bad)))
        assert words in msg, msg


def test_a_grid_kept_without_weights_stands_in_when_lr_sensitivity_diagnosed_it(tmp_path, trained, capsys):
    """`lr-sensitivity --diagnose` writes the depth study's diagnostics into each run, so the run's record, kept
    without its weights (as committed study records are), is still copied in by `depth-study --lr-from` instead of
    trained again; its diagnostics are read back from the record. A study with other diagnostics settings (another
    --num-images) does not take it."""
    import json

    from vitlab.cli import main

    grid = tmp_path / "grid"
    assert main(["lr-sensitivity", "--depths", "2", "--variants", "vit", "--lrs", "1e-3,3e-3", "--epochs", "1",
                 "--batch-size", "16", "--limit-train", "32", "--limit-test", "16", "--val-split", "0.25",
                 "--probe-images", "8", "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress",
                 "--diagnose", "--output", str(grid)]) == 0
    runs = sorted(p for p in grid.iterdir() if (p / "summary.json").is_file())
    assert len(runs) == 2 and all(json.loads((p / "diagnostics.json").read_text())["num_images"] == 64 for p in runs)
    best = float(read_rows(grid / "sensitivity.csv")[0]["best_lr"])
    for run in runs:  # what scripts/findings_tables.py --keep-runs commits: no weights, no optimizer state
        for name in ("model.safetensors", "state.pt", "manifest.json"):
            (run / name).unlink()
    trained.clear()
    capsys.readouterr()
    argv = _argv(tmp_path / "other", "--lr-from", str(grid), "--seeds", "2", "--probe-images", "8", depths="2")
    assert main([*argv, "--dry-run"]) == 0  # --num-images 4: not the diagnostics the record holds
    assert "not reused" in capsys.readouterr().err
    i = argv.index("--num-images")
    del argv[i:i + 2]
    out = tmp_path / "d"
    argv[argv.index("--output") + 1] = str(out)
    assert main(argv) == 0
    assert trained == ["vit_depth2_seed1"]
    assert f"vit_depth2_seed0: reused from {grid / grid_run_name('vit', 2, best, 0)}; test accuracy" in \
        capsys.readouterr().err
    rows = read_rows(out / "results.csv")
    assert [r["run"] for r in rows] == ["vit_depth2_seed0", "vit_depth2_seed1"]
    diag = json.loads((grid / grid_run_name("vit", 2, best, 0) / "diagnostics.json").read_text())
    similarity = next(g for g in diag["collapse"] if g["group"] == "self_attention")["mean_similarity"]
    assert float(rows[0]["mean_similarity"]) == pytest.approx(similarity)  # read back from the record


def test_a_study_reads_back_a_run_kept_without_weights_or_diagnostics_and_writes_its_table(tmp_path, trained,
                                                                                           capsys):
    """A finished run restored from its committed record (no weights) and kept before its diagnostics were written
    cannot be diagnosed: the study still writes its table, that run's row with its accuracy and empty diagnostic
    columns, the run named in one line on stderr; a run that kept its diagnostics.json is read back from it."""
    import json

    from vitlab.cli import main

    out = tmp_path / "d"
    argv = _argv(out, "--seeds", "2")
    assert main(argv) == 0
    first = {r["run"]: r for r in read_rows(out / "results.csv")}
    for run in ("vit_depth1_seed0", "vit_depth1_seed1"):  # what scripts/findings_tables.py --keep-runs commits
        for name in ("model.safetensors", "state.pt", "manifest.json"):
            (out / run / name).unlink()
    assert json.loads((out / "vit_depth1_seed0" / "diagnostics.json").read_text())["num_images"] == 4
    (out / "vit_depth1_seed1" / "diagnostics.json").unlink()
    capsys.readouterr()
    trained.clear()
    assert main(argv) == 0
    assert trained == []  # both read back
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if "finished run(s)" in x]
    assert line == ["depth study: 1 finished run(s) hold neither weights nor a diagnostics.json for 4 images at "
                    "threshold 0.9: vit_depth1_seed1; their diagnostic columns are empty"], err
    rows = {r["run"]: r for r in read_rows(out / "results.csv")}
    assert rows["vit_depth1_seed1"]["test_acc"] == first["vit_depth1_seed1"]["test_acc"]
    assert rows["vit_depth1_seed1"]["mean_similarity"] in ("", "nan"), rows["vit_depth1_seed1"]
    assert rows["vit_depth1_seed0"]["mean_similarity"] == first["vit_depth1_seed0"]["mean_similarity"] != ""
    assert not (out / "vit_depth1_seed1" / "diagnostics.json").exists()  # nothing made up for it


def test_the_similarity_figure_comes_from_the_lowest_seed_with_diagnostics(tmp_path, trained):
    """Seed 0 restored from a record kept before its diagnostics were written: the heatmap of the deepest depth
    comes from seed 1 (its panel says so) instead of the study failing while it writes its report; with no seed
    diagnosable the tables are written and the figures of diagnostics left out."""
    from vitlab.cli import main

    out = tmp_path / "d"
    argv = _argv(out, "--seeds", "2")
    assert main(argv) == 0
    for run in ("vit_depth1_seed0", "vit_depth1_seed1"):
        for name in ("model.safetensors", "state.pt", "manifest.json"):
            (out / run / name).unlink()
    (out / "vit_depth1_seed0" / "diagnostics.json").unlink()
    (out / "similarity_depth1.png").unlink()
    assert main(argv) == 0
    assert (out / "similarity_depth1.png").is_file() and "similarity_depth1.png" in (out / "index.html").read_text()
    # no seed diagnosable: the study still writes its tables (diagnostic columns empty) and leaves those figures out
    (out / "vit_depth1_seed1" / "diagnostics.json").unlink()
    (out / "results.csv").unlink()
    assert main(argv) == 0  # and the earlier write's figures of diagnostics are removed with them
    assert [r["test_acc"] != "" for r in read_rows(out / "results.csv")] == [True, True]
    assert (out / "residual_ratios.csv").read_text().startswith("variant,depth,seed,block")
    report = (out / "index.html").read_text()
    for name in ("similarity_depth1.png", "residual_ratios.png", "similar_blocks.png"):
        assert not (out / name).exists() and name not in report, name


def test_kept_diagnostics_are_read_back_only_at_their_settings(tmp_path):
    """The one rule both diagnose() and --lr-from/--reuse use to read a run's diagnostics.json instead of its
    weights: the same threshold and number of images; ``current`` also wants this version."""
    import json

    from vitlab.analysis.depth_diagnostics import DIAG_VERSION, kept_diagnostics
    from vitlab.experiments.depth_study import _has_diagnostics

    path = tmp_path / "diagnostics.json"
    assert kept_diagnostics(tmp_path, 0.9, 64) is None  # none kept
    path.write_text(json.dumps({"version": DIAG_VERSION, "threshold": 0.9, "num_images": 64}))
    assert kept_diagnostics(tmp_path, 0.9, 64, current=True)["num_images"] == 64
    assert _has_diagnostics(tmp_path, (0.9, 64)) and not _has_diagnostics(tmp_path, None)
    assert kept_diagnostics(tmp_path, 0.8, 64) is None and kept_diagnostics(tmp_path, 0.9, 32) is None
    assert not _has_diagnostics(tmp_path, (0.9, 32))
    path.write_text(json.dumps({"version": DIAG_VERSION - 1, "threshold": 0.9, "num_images": 64}))
    assert kept_diagnostics(tmp_path, 0.9, 64)["version"] == DIAG_VERSION - 1  # diagnose() keeps it without weights
    assert kept_diagnostics(tmp_path, 0.9, 64, current=True) is None and not _has_diagnostics(tmp_path, (0.9, 64))
    path.write_text("{not json")
    assert kept_diagnostics(tmp_path, 0.9, 64) is None
