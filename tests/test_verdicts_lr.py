"""scripts/verdicts.py on learning-rate sensitivity records: the best rate is chosen on validation loss (never
the test set), the per-seed LR sensitivity, the paired per-image test where arms share seeds and test images, and
no interval from one run per arm."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from _scripts import load_script

LRS = (1e-3, 3e-3, 1e-2)


def _write_run(root: Path, name: str, *, val_loss: float, correct: list[bool], diverged: bool = False) -> None:
    run = root / "lr_sensitivity" / name
    run.mkdir(parents=True)
    labels = [i % 10 for i in range(len(correct))]
    preds = [t if ok else (t + 1) % 10 for t, ok in zip(labels, correct)]
    summary = {"final_val_loss": val_loss, "final_test_acc": sum(correct) / len(correct)}
    if diverged:
        summary["diverged"] = True
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.json").write_text(json.dumps({"model": {"num_classes": 10}, "run": {}}))
    (run / "test_predictions.json").write_text(json.dumps({"labels": labels, "predictions": preds}))


def _records(tmp_path: Path, seeds: int = 3) -> Path:
    n = 400
    for seed in range(seeds):
        # vit: best validation loss at 3e-3, where its test accuracy is 60 %; at 1e-2 a higher test accuracy (a rate
        # chosen on the test set would pick it) but a worse validation loss; the last seed diverges at 1e-2
        for lr, loss, acc in ((1e-3, 1.0, 0.5), (3e-3, 0.5 + 0.01 * seed, 0.6 + 0.01 * seed), (1e-2, 0.9, 0.9)):
            _write_run(tmp_path, f"vit_depth4_lr{lr:g}_seed{seed}", val_loss=loss,
                       correct=[i < acc * n for i in range(n)], diverged=(lr == 1e-2 and seed == seeds - 1))
        # layerscale: flat in the rate, best at 1e-2, right on 80 % of the images
        for lr, loss in zip(LRS, (0.42, 0.41, 0.40 + 0.001 * seed)):
            _write_run(tmp_path, f"layerscale_depth4_lr{lr:g}_seed{seed}", val_loss=loss,
                       correct=[i % 5 != 0 for i in range(n)])
    return tmp_path


def test_the_best_rate_is_chosen_on_validation_loss_not_on_test_accuracy(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path)
    assert v.best_lr(runs / "lr_sensitivity", "vit_depth4") == 3e-3
    assert v.best_lr(runs / "lr_sensitivity", "layerscale_depth4") == 1e-2
    assert [p.name for p in v.run_dirs("lr_sensitivity/vit_depth4@best", runs)] == [
        f"vit_depth4_lr0.003_seed{s}" for s in range(3)]


def test_lr_sensitivity_per_seed_caps_a_diverged_run_at_a_uniform_guess(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path)
    sens = v.lr_sensitivities("lr_sensitivity/vit_depth4", runs)
    assert sens[0] == pytest.approx((1.0 + 0.5 + 0.9) / 3 - 0.5)
    assert sens[2] == pytest.approx((1.0 + 0.52 + math.log(10)) / 3 - 0.52)  # seed 2 diverged at 1e-2


def test_arms_sharing_seeds_are_compared_by_a_paired_t_over_seeds_not_per_image(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path)
    row = v.evaluate(v.Claim("x", "7", "LayerScale beats the ViT", "lr_sensitivity/layerscale_depth4@best",
                             "lr_sensitivity/vit_depth4@best"), runs)
    assert row["test"] == "paired t over seeds" and row["seeds"] == "3/3"
    assert float(row["effect"]) == pytest.approx(19.0)  # 80 % against 60/61/62 %, each arm at its best val loss
    assert float(row["ci_low"]) > 0 and row["verdict"] == "reproduced"
    sens = v.evaluate(v.Claim("s", "7", "LayerScale is less sensitive", "lr_sensitivity/layerscale_depth4",
                              "lr_sensitivity/vit_depth4", measure="lr_sens"), runs)
    assert sens["unit"] == "nats" and float(sens["effect"]) > 0 and sens["test"] == "paired t over seeds"
    for run in (runs / "lr_sensitivity").glob("layerscale*seed2"):  # one arm's seed missing: no pairing, Welch
        for f in run.iterdir():
            f.unlink()
        run.rmdir()
    row = v.evaluate(v.Claim("x", "7", "LayerScale beats the ViT", "lr_sensitivity/layerscale_depth4@best",
                             "lr_sensitivity/vit_depth4@best"), runs)
    assert row["test"] == "welch" and row["seeds"] == "2/3"


def test_one_run_per_arm_gives_an_effect_but_no_interval_and_no_verdict(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path, seeds=1)
    row = v.evaluate(v.Claim("x", "7", "LayerScale beats the ViT", "lr_sensitivity/layerscale_depth4@best",
                             "lr_sensitivity/vit_depth4@best"), runs)
    assert row["verdict"] == "undecided" and row["ci_low"] == "nan" and row["seeds"] == "1/1"
    assert float(row["effect"]) == pytest.approx(20.0)  # seed 0: 80 % against 60 %


def test_a_run_that_diverged_before_saving_its_config_still_counts(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path)
    (runs / "lr_sensitivity" / "vit_depth4_lr0.01_seed2" / "config.json").unlink()  # diverged in its first epoch
    sens = v.lr_sensitivities("lr_sensitivity/vit_depth4", runs)
    assert sens[2] == pytest.approx((1.0 + 0.52 + math.log(10)) / 3 - 0.52)


def test_a_no_worse_than_claim_follows_the_difference_rule_shifted_by_its_margin(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path)
    better = v.evaluate(v.Claim("n", "7", "LayerScale no worse than the ViT", "lr_sensitivity/layerscale_depth4@best",
                                "lr_sensitivity/vit_depth4@best", margin=1.0, noninferior=True), runs)
    assert better["verdict"] == "reproduced" and "non-inferiority (margin 1)" in better["test"]
    worse = v.evaluate(v.Claim("w", "7", "the ViT no worse than LayerScale", "lr_sensitivity/vit_depth4@best",
                               "lr_sensitivity/layerscale_depth4@best", margin=1.0, noninferior=True), runs)
    assert worse["verdict"] == "contradicted"  # 19 points worse: far beyond the 1-point margin
    as_good = v.evaluate(v.Claim("e", "7", "as good as", "lr_sensitivity/layerscale_depth4@best",
                                 "lr_sensitivity/vit_depth4@best", margin=1.0), runs)
    assert as_good["verdict"] == "contradicted" and "TOST" in as_good["test"]  # equivalence: 19 points is not


def test_only_an_arm_without_runs_reads_as_not_run_yet(tmp_path):
    v = load_script("verdicts")
    runs = _records(tmp_path)
    row = v.evaluate(v.Claim("x", "7", "c", "lr_sensitivity/deepvit_depth4@best", "lr_sensitivity/vit_depth4@best"),
                     runs)
    assert row["verdict"] == "undecided" and row["runs_to_decide"] == "unknown: not run yet"
    for run in (runs / "lr_sensitivity").glob("*/config.json"):
        run.unlink()  # a broken record is an error, never a claim "not run yet"
    with pytest.raises(ValueError, match="kept its config.json"):
        v.evaluate(v.Claim("y", "7", "c", "lr_sensitivity/layerscale_depth4@best", "lr_sensitivity/vit_depth4@best"),
                   runs)


def test_a_small_deficit_inside_the_margin_is_no_worse(tmp_path):
    """About 0.5 points worse on every seed, tightly: the plain difference rule would call it worse (contradicted);
    within a 1-point non-inferiority margin it is no worse (reproduced)."""
    v = load_script("verdicts")
    n = 1000
    for seed in range(3):
        _write_run(tmp_path, f"a_depth4_lr0.001_seed{seed}", val_loss=0.5,
                   correct=[i >= 204 + seed for i in range(n)])
        _write_run(tmp_path, f"b_depth4_lr0.001_seed{seed}", val_loss=0.5, correct=[i >= 200 for i in range(n)])
    arms = ("lr_sensitivity/a_depth4@best", "lr_sensitivity/b_depth4@best")
    plain = v.evaluate(v.Claim("d", "7", "a beats b", *arms), tmp_path)
    assert float(plain["effect"]) == pytest.approx(-0.5) and plain["verdict"] == "contradicted"
    ni = v.evaluate(v.Claim("n", "7", "a no worse than b", *arms, margin=1.0, noninferior=True), tmp_path)
    assert ni["verdict"] == "reproduced"
