"""``vitlab verdict`` and :func:`vitlab.experiments.verdict.compare_runs` on study folders a user made: the seed is
the unit, and every record that cannot be trusted is refused by name instead of changing the test or the answer."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from vitlab.cli import main
from vitlab.errors import DataError
from vitlab.experiments.verdict import compare_runs, per_image


def _run(folder: Path, seed: int, acc: float, *, labels: list[int] | None = None, predictions: bool = True) -> Path:
    run = folder / f"run_seed={seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final_test_acc": acc}))
    (run / "config.json").write_text(json.dumps({"model": {"num_classes": 10}, "run": {"seed": seed}}))
    labels = labels if labels is not None else [i % 10 for i in range(200)]
    right = round(acc * len(labels))
    preds = [t if i < right else (t + 1) % 10 for i, t in enumerate(labels)]
    if predictions:
        (run / "test_predictions.json").write_text(json.dumps({"labels": labels, "predictions": preds}))
    return run


def _studies(tmp_path: Path, a=(0.90, 0.92, 0.91), b=(0.85, 0.88, 0.86)) -> tuple[Path, Path]:
    for seed, (x, y) in enumerate(zip(a, b)):
        _run(tmp_path / "a", seed, x)
        _run(tmp_path / "b", seed, y)
    return tmp_path / "a", tmp_path / "b"


def test_two_study_folders_give_the_paired_verdict_in_the_terminal_and_as_csv(tmp_path, capsys):
    a, b = _studies(tmp_path)
    assert main(["verdict", str(a), str(b), "--csv", str(tmp_path / "v.csv")]) == 0
    out = capsys.readouterr().out
    assert "paired t over seeds" in out and "verdict: reproduced" in out
    row = next(csv.DictReader((tmp_path / "v.csv").open()))
    assert row["runs"] == "3/3" and row["verdict"] == "reproduced" and float(row["effect"]) == pytest.approx(4.6667,
                                                                                                         abs=1e-3)
    r = compare_runs(a, b)
    assert r.paired and r.ci_low > 0
    assert compare_runs(a, b, paired=False).test == "welch"
    assert compare_runs([a / "run_seed=0", a / "run_seed=1"], b).test == "welch"  # seeds differ: not paired


def test_a_small_difference_is_undecided_with_the_runs_that_would_decide_it(tmp_path, capsys):
    a, b = _studies(tmp_path, a=(0.905, 0.92, 0.90), b=(0.90, 0.91, 0.905))
    assert main(["verdict", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "verdict: undecided" in out and "runs per arm" in out


def test_per_image_is_a_description_that_checks_the_images(tmp_path, capsys):
    a, b = _studies(tmp_path)
    assert main(["verdict", str(a), str(b), "--per-image"]) == 0
    assert "not a verdict" in capsys.readouterr().out
    (b / "run_seed=1" / "test_predictions.json").write_text(json.dumps(
        {"labels": list(reversed([i % 10 for i in range(200)])), "predictions": [0] * 200}))
    with pytest.raises(DataError, match="same images in the same order"):
        per_image(a, b)
    (b / "run_seed=1" / "test_predictions.json").unlink()  # a missing file is an error, never a switch of test
    assert main(["verdict", str(a), str(b), "--per-image"]) == 2
    err = capsys.readouterr().err
    assert "run_seed=1: no test_predictions.json" in err and "Traceback" not in err
    assert compare_runs(a, b).test == "paired t over seeds"  # the verdict needs no per-image file


@pytest.mark.parametrize("summary", [{}, {"final_test_acc": "abc"}, {"final_test_acc": float("nan")}])
def test_a_run_without_a_finite_result_is_refused_by_name(tmp_path, capsys, summary):
    a, b = _studies(tmp_path)
    (a / "run_seed=2" / "summary.json").write_text(json.dumps(summary).replace("NaN", "NaN"))
    assert main(["verdict", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run_seed=2" in err and "final_test_acc" in err


def test_bad_arms_are_one_line(tmp_path, capsys):
    a, b = _studies(tmp_path)
    _run(tmp_path / "dup", 0, 0.9)
    (tmp_path / "dup" / "other").mkdir()
    (tmp_path / "dup" / "other" / "summary.json").write_text(json.dumps({"final_test_acc": 0.8}))
    (tmp_path / "dup" / "other" / "config.json").write_text(json.dumps({"run": {"seed": 0}}))
    for args, message in ((["verdict", str(tmp_path / "nope" / "x"), str(b)], "no such run or study folder"),
                          (["verdict", str(tmp_path / "nope"), str(b)], "no finished run nope_seed*"),
                          (["verdict", str(tmp_path / "dup"), str(b)], "both have seed 0"),
                          (["verdict", str(a), str(b), "--noninferior"], "needs --margin"),
                          (["verdict", str(a), f"{b}/run_seed=0,{b}/run_seed=1", "--paired"], "same seeds")):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_study_prefix_and_margins(tmp_path, capsys):
    study = tmp_path / "sweep"
    for seed, (x, y) in enumerate(((0.90, 0.899), (0.92, 0.921), (0.91, 0.908))):
        run = _run(study / "tmp", seed, x)
        run.rename(study / f"lr=0.002_seed={seed}")
        run = _run(study / "tmp", seed, y)
        run.rename(study / f"lr=0.004_seed={seed}")
    (study / "tmp").rmdir()
    assert main(["verdict", f"{study}/lr=0.002", f"{study}/lr=0.004", "--margin", "1"]) == 0
    out = capsys.readouterr().out
    assert "TOST (margin 1)" in out and "verdict: reproduced" in out
    assert main(["verdict", f"{study}/lr=0.002", f"{study}/lr=0.004", "--margin", "1", "--noninferior"]) == 0
    assert "non-inferiority (margin 1)" in capsys.readouterr().out


@pytest.mark.parametrize("diag", [{}, {"collapse": [{"group": "self_attention"}]}, {"residual_ratios": [{}]},
                                  {"collapse": "x"}, []])
def test_a_crafted_diagnostics_file_is_refused_by_name(tmp_path, capsys, diag):
    a, b = _studies(tmp_path)
    for arm in (a, b):
        for run in arm.iterdir():
            (run / "diagnostics.json").write_text(json.dumps({"collapse": [
                {"group": "self_attention", "mean_similarity": 0.5, "similar_blocks": [0, 1]}],
                "residual_ratios": [{"kind": "self_attention", "attn_mean": 0.1 * (1 + run.name.count("1"))}]}))
    (a / "run_seed=1" / "diagnostics.json").write_text(json.dumps(diag))
    for metric in ("similarity", "cv_attn"):
        assert main(["verdict", str(a), str(b), "--metric", metric]) == 2
        err = capsys.readouterr().err
        assert "run_seed=1" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_study_folder_with_its_own_summary_is_a_study_not_a_run(tmp_path):
    a, b = _studies(tmp_path)
    (a / "summary.json").write_text(json.dumps({"rows": []}))  # a sweep writes its table beside its runs
    assert compare_runs(a, b).n_a == 3
    assert compare_runs(a / "run_seed=0", b / "run_seed=0").n_a == 1
