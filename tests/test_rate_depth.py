"""The analysis side of the rate x depth study (docs/findings.md, section 10) on synthetic run records shaped like
the study's (summary.json, config.json, metrics.jsonl): a claim is pending until both arms have the runs its design
plans, the drop-path controls' best arm is chosen on validation accuracy (never the test set), the LR sensitivity
over the study's shared grid with a curve extended beyond its edge, Spearman's rank correlation with its bootstrap
interval, the proxy rows' pending status, and the probes per arm and depth."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from _scripts import load_script

ARMS = ("vit", "qknorm", "layerscale", "cait", "deepvit")


def _run(root: Path, study: str, name: str, *, seed: int, test_acc: float = 0.85, val_acc: float = 0.85,
         val_loss: float = 0.5, depth: int = 6, probes: dict[str, list[float]] | None = None) -> Path:
    """A finished run's record as the study keeps it: summary.json, config.json and (with ``probes``: per probe one
    value per block, the last epoch's) metrics.jsonl."""
    run = root / study / name
    run.mkdir(parents=True)
    summary = {"model": "vit_mnist", "dataset": "fashion-mnist", "epochs": 50, "final_val_acc": val_acc,
               "final_val_loss": val_loss, "best_val_acc": val_acc, "final_test_acc": test_acc,
               "final_test_loss": 0.45, "diverged": False}
    (run / "summary.json").write_text(json.dumps(summary))
    config = {"format": "vitlab-checkpoint/1", "model": {"arch": "vit", "num_classes": 10, "depth": depth},
              "run": {"seed": seed, "epochs": 50, "val_split": 0.33334}}
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"epoch": 1, "step": 156, "train_loss": 1.0, "val_loss": 0.9, "val_acc": 0.7}]
    if probes:
        first = {f"probe/{p}/block{i}": 0.0 for p, values in probes.items() for i in range(len(values))}
        last = {f"probe/{p}/block{i}": v for p, values in probes.items() for i, v in enumerate(values)}
        rows = [{**rows[0], **first}, {"epoch": 2, "step": 312, "train_loss": 0.5, "val_loss": val_loss,
                                       "val_acc": val_acc, **last}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _claim(v, claim_id: str):
    return {c.id: c for c in v.CLAIMS}[claim_id]


# ------------------------------------------------------------------------------------------------ the pending gate


def test_a_claim_is_pending_until_both_arms_have_the_runs_its_design_plans(tmp_path):
    v = load_script("verdicts")
    claim = _claim(v, "budget-ls-24-6")
    assert claim.runs == 5 and claim.section == "10"
    for seed in range(4):
        _run(tmp_path, "depth_budget", f"layerscale_depth24_seed{seed}", seed=seed, test_acc=0.90 + 0.002 * seed)
        _run(tmp_path, "depth_budget", f"layerscale_depth6_seed{seed}", seed=seed, test_acc=0.88 + 0.001 * seed)
    row = v.evaluate(claim, tmp_path)
    assert row["verdict"] == v.PENDING and row["seeds"] == "4/4 of 5" and row["test"].startswith("pending")
    assert all(math.isnan(float(row[k])) for k in ("effect", "ci_low", "ci_high", "p", "q")), row
    _run(tmp_path, "depth_budget", "layerscale_depth24_seed4", seed=4, test_acc=0.908)
    assert v.evaluate(claim, tmp_path)["verdict"] == v.PENDING  # 5 against 4: still pending
    _run(tmp_path, "depth_budget", "layerscale_depth6_seed4", seed=4, test_acc=0.884)
    row = v.evaluate(claim, tmp_path)
    assert row["seeds"] == "5/5" and row["test"] == "paired t over seeds"
    assert row["verdict"] in ("reproduced", "undecided", "contradicted")
    assert float(row["ci_low"]) <= float(row["effect"]) <= float(row["ci_high"])
    assert float(row["effect"]) == pytest.approx(100 * statistics.fmean(0.02 + 0.001 * s for s in range(5)))


def test_a_pending_claim_stays_out_of_the_familys_correction(tmp_path):
    v = load_script("verdicts")
    for seed in range(3):
        _run(tmp_path, "depth_budget", f"vit_depth24_seed{seed}", seed=seed, test_acc=0.85 + 0.01 * seed)
        _run(tmp_path, "depth_budget", f"vit_depth6_seed{seed}", seed=seed, test_acc=0.80 + 0.012 * seed)
    done = v.Claim("x", "10", "24 beats 6 (no planned runs)", "depth_budget/vit_depth24", "depth_budget/vit_depth6")
    alone = v.rows([done], tmp_path)[0]
    both = v.rows([done, _claim(v, "budget-vit-24-6"), _claim(v, "budget-qk-24-6")], tmp_path)
    assert [r["verdict"] for r in both[1:]] == [v.PENDING, v.PENDING] and both[2]["seeds"] == "0/0 of 5"
    assert both[0]["q"] == alone["q"] != "nan"  # a family of one: the pending rows add no test


def test_no_row_of_verdicts_csv_is_decided_before_its_phase_ends():
    v = load_script("verdicts")
    with (Path(v.OUT)).open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["section"] == "10"]
    assert len(rows) == sum(c.section == "10" for c in v.CLAIMS) > 30
    for r in rows:
        if r["verdict"] == v.PENDING:
            done, planned = r["seeds"].split(" of ")
            a, b = (int(n) for n in done.split("/"))
            assert int(planned) == _claim(v, r["id"]).runs, r["id"]
            assert min(a, b) < _claim(v, r["id"]).runs and r["q"] == "nan", r["id"]


def test_a_where_line_keeps_pending_rows_out_with_two_conditions_on_one_column(tmp_path):
    tables = load_script("findings_tables")
    (tmp_path / "t.csv").write_text("a,v\nx,undecided\ny,reproduced\nz,pending\n")
    spec = "t.csv\na | {a}\nwhere: v!=undecided, v!=pending\n"
    assert tables.render_table(spec, tmp_path).splitlines()[2:] == ["| y |"]


def test_the_grid_table_lists_only_cells_whose_grid_has_finished(tmp_path):
    """While a cell's grid still runs, `vitlab lr-sensitivity` writes its row with a NaN sensitivity and a best rate
    over the rates finished so far; the page's phase-1 table leaves that row out until the cell's curve is whole."""
    tables = load_script("findings_tables")
    page = (Path(__file__).resolve().parents[1] / "docs" / "findings.md").read_text()
    (spec,) = [b.spec for b in tables.blocks(page) if b.spec.startswith("results/depth_budget_grid/sensitivity.csv")]
    grid = tmp_path / "results" / "depth_budget_grid"
    grid.mkdir(parents=True)
    (grid / "sensitivity.csv").write_text(
        "variant,depth,lrs,lr_low,lr_high,runs,best_lr,bracketed,best_val_loss,best_val_acc,test_acc_at_best_lr,"
        "lr_sensitivity,divergence_rate,max_logit\n"
        "vit,12,5,0.0005,0.008,5,0.001,True,0.444,0.86,0.85,0.031,0.0,968.5\n"
        "vit,24,4,0.0005,0.004,4,0.001,True,0.434,0.87,0.86,nan,0.0,224.0\n")
    rows = tables.render_table(spec, tmp_path).splitlines()[2:]
    assert len(rows) == 1 and rows[0].startswith("| vit | 12 |")


# ------------------------------------------------------------------------------------------------ the best arm


def _phase2_at_24(root: Path, seeds: int = 5) -> None:
    """qknorm has the best validation accuracy and the worst test accuracy; cait the best test accuracy."""
    val = {"vit": 0.86, "qknorm": 0.90, "layerscale": 0.87, "cait": 0.85, "deepvit": 0.84}
    test = {"vit": 0.86, "qknorm": 0.80, "layerscale": 0.87, "cait": 0.95, "deepvit": 0.84}
    for arm in ARMS:
        for seed in range(seeds):
            _run(root, "depth_budget", f"{arm}_depth24_seed{seed}", seed=seed, depth=24,
                 val_acc=val[arm] + 0.001 * seed, test_acc=test[arm] + 0.001 * seed)


def test_the_best_arm_is_chosen_on_validation_accuracy_never_on_the_test_set(tmp_path):
    v = load_script("verdicts")
    _phase2_at_24(tmp_path)
    assert v.best_arm(tmp_path) == "qknorm"
    for seed in range(5):
        _run(tmp_path, "depth_budget_dp_linear", f"qknorm_depth24_seed{seed}", seed=seed, depth=24,
             test_acc=0.80 + 0.001 * seed + 0.0002 * (-1) ** seed)
    row = v.evaluate(_claim(v, "budget-dp-0-24"), tmp_path)
    assert row["comparison"] == "depth_budget/qknorm_depth24 - depth_budget_dp_linear/qknorm_depth24"
    assert "QK-layernorm" in row["claim"] and "TOST" in row["test"] and row["seeds"] == "5/5"
    assert row["verdict"] != v.PENDING and math.isfinite(float(row["ci_low"]))
    # the uniform rule has no runs yet: pending, for the arm chosen
    row = v.evaluate(_claim(v, "budget-dp-rule-24"), tmp_path)
    assert row["verdict"] == v.PENDING and row["seeds"] == "0/5 of 5" and "qknorm" in row["comparison"]
    row = v.evaluate(_claim(v, "budget-dp-0-uniform-24"), tmp_path)
    assert row["verdict"] == v.PENDING and row["seeds"] == "5/0 of 5"
    assert row["comparison"] == "depth_budget/qknorm_depth24 - depth_budget_dp_uniform/qknorm_depth24"
    for seed in range(5):  # drop-path 0 against both rules: the uniform runs give the second control its verdict
        _run(tmp_path, "depth_budget_dp_uniform", f"qknorm_depth24_seed{seed}", seed=seed, depth=24,
             test_acc=0.80 + 0.001 * seed - 0.0003 * (-1) ** seed)
    row = v.evaluate(_claim(v, "budget-dp-0-uniform-24"), tmp_path)
    assert "TOST" in row["test"] and row["seeds"] == "5/5" and row["verdict"] != v.PENDING
    assert -0.5 < float(row["ci_low"]) < float(row["effect"]) < float(row["ci_high"]) < 0.5, row  # 0.03-point swings


def test_the_best_arm_waits_for_every_arm_at_24_blocks(tmp_path):
    v = load_script("verdicts")
    _phase2_at_24(tmp_path)
    for f in (tmp_path / "depth_budget" / "deepvit_depth24_seed4").iterdir():
        f.unlink()
    (tmp_path / "depth_budget" / "deepvit_depth24_seed4").rmdir()
    assert v.best_arm(tmp_path) is None
    row = v.evaluate(_claim(v, "budget-dp-0-24"), tmp_path)
    assert row["verdict"] == v.PENDING and row["seeds"] == "0/0 of 5" and v.BEST_PENDING in row["claim"]


def test_the_drop_path_table_holds_the_best_arms_three_settings_and_no_number_from_part_of_one(tmp_path):
    d = load_script("drop_path_controls")
    for seed in range(5):  # the best arm on validation is qknorm, whatever the test set says (cait)
        _run(tmp_path, "depth_budget", f"cait_depth24_seed{seed}", seed=seed, depth=24, val_acc=0.80, test_acc=0.99)
    rows = list(csv.DictReader(d.table(tmp_path).splitlines()))
    assert [r["status"] for r in rows] == ["pending (the best arm is chosen when phase 2 ends)"] * 3
    assert all(r[c] == "" for r in rows for c in d.NUMBERS)
    for f in (tmp_path / "depth_budget").glob("cait_depth24_seed*/*"):
        f.unlink()
    for run in (tmp_path / "depth_budget").glob("cait_depth24_seed*"):
        run.rmdir()
    _phase2_at_24(tmp_path)
    for seed in range(5):
        probes = {"token_similarity": [0.1] * 23 + [0.3 + 0.1 * seed ** 2], "max_logit": [float(seed)] * 23 + [40.0]}
        _run(tmp_path, "depth_budget_dp_uniform", f"qknorm_depth24_seed{seed}", seed=seed, depth=24,
             val_acc=0.88, test_acc=0.81 + 0.002 * seed, probes=probes)
    for seed in range(3):
        _run(tmp_path, "depth_budget_dp_linear", f"qknorm_depth24_seed{seed}", seed=seed, depth=24)
    none, uniform, linear = csv.DictReader(d.table(tmp_path).splitlines())
    assert (none["arm"], none["drop_path"], none["rule"], none["runs"]) == ("QK-layernorm", "0", "none",
                                                                            "depth_budget/qknorm_depth24")
    assert float(none["test_acc_median"]) == pytest.approx(80.2)  # points; seeds 0.800..0.804
    assert float(none["val_acc_median"]) == pytest.approx(90.2)
    assert none["token_similarity_last"] == ""  # phase 2's runs here have no probes: no number made up
    assert uniform["status"] == "complete" and uniform["seeds"] == "5/5"
    assert float(uniform["test_acc_mean"]) == pytest.approx(81.4)
    assert float(uniform["test_acc_sd"]) == pytest.approx(statistics.stdev([81.0, 81.2, 81.4, 81.6, 81.8]))
    assert float(uniform["token_similarity_last"]) == pytest.approx(0.7)  # the last block's, median (not mean)
    assert float(uniform["max_logit_max"]) == pytest.approx(40.0)  # the largest of any block
    assert linear["status"] == "pending (3 of 5 seeds)" and linear["seeds"] == "3/5"
    assert all(linear[c] == "" for c in d.NUMBERS)


# ------------------------------------------------------------------------------------------------ LR sensitivity


def test_lr_sensitivity_is_the_mean_over_the_shared_grid_and_the_minimum_over_the_whole_curve(tmp_path):
    v = load_script("verdicts")
    from vitlab.experiments.lr_sensitivity import lr_sensitivity

    grid = {1e-3: 0.9, 2e-3: 0.7, 4e-3: 0.6}
    vit = {0: {**grid, 8e-3: 0.5},  # best beyond the grid's edge: the extension bracketed it
           1: {1e-3: 0.8, 2e-3: 0.75, 4e-3: 0.7, 8e-3: 0.72},
           2: {1e-3: 0.8, 2e-3: 0.75, 4e-3: 0.7},  # the grid, not the cell's extension: its minimum is unknown
           3: {1e-3: 0.8, 2e-3: 0.75}}  # not the grid either
    for seed, curve in vit.items():
        for lr, loss in curve.items():
            _run(tmp_path, "depth_budget_grid", f"vit_depth6_lr{lr:g}_seed{seed}", seed=seed, val_loss=loss)
    for lr, loss in grid.items():
        _run(tmp_path, "depth_budget_grid", f"qknorm_depth6_lr{lr:g}_seed0", seed=0, val_loss=loss)
    cells = v.study_losses(tmp_path / "depth_budget_grid")
    assert v.study_grid(cells) == [1e-3, 2e-3, 4e-3]  # 8e-3 is one cell's, not the study's
    sens = v.lr_sensitivities("depth_budget_grid/vit_depth6", tmp_path)
    assert sorted(sens) == [0, 1]
    assert sens[0] == pytest.approx((0.9 + 0.7 + 0.6) / 3 - 0.5)
    assert sens[0] == pytest.approx(lr_sensitivity(vit[0], [1e-3, 2e-3, 4e-3]))
    assert sens[1] == pytest.approx((0.8 + 0.75 + 0.7) / 3 - 0.7)
    assert v.lr_sensitivities("depth_budget_grid/qknorm_depth6", tmp_path)[0] == pytest.approx(
        (0.9 + 0.7 + 0.6) / 3 - 0.6)


# ------------------------------------------------------------------------------------- did the proxies predict it?


def test_spearman_of_a_perfect_ranking_is_one_and_the_interval_is_scipys_bootstrap():
    p = load_script("proxy_rank")
    x = [1.0, 2.0, 3.0, 5.0, 8.0, 9.0]
    rho, low, high, undefined = p.spearman_interval(x, [2 * a + 1 for a in x])
    assert (rho, low, high) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    assert undefined < 10  # the few resamples that drew one cell six times: no ranking at all
    assert p.spearman_interval(x, [-a for a in x])[0] == pytest.approx(-1.0)
    from scipy import stats

    rng = np.random.default_rng(3)
    a = rng.normal(size=10)
    b = a + rng.normal(size=10)
    rho, low, high, undefined = p.spearman_interval(a, b, resamples=499)
    assert rho == pytest.approx(stats.spearmanr(a, b).statistic) and undefined == 0
    ref = stats.bootstrap((a, b), lambda u, w: stats.spearmanr(u, w).statistic, paired=True, vectorized=False,
                          n_resamples=499, method="percentile", rng=np.random.default_rng(p.RNG_SEED))
    assert (low, high) == (pytest.approx(ref.confidence_interval.low), pytest.approx(ref.confidence_interval.high))
    # tied rates: a resample whose one side is constant has no correlation and is left out, not a NaN interval
    rho, low, high, undefined = p.spearman_interval([1, 1, 1, 2], [1, 2, 3, 4], resamples=499)
    assert undefined > 0 and math.isfinite(low) and math.isfinite(high)


def _proxies(results: Path) -> None:
    """Section 7: 12 cells, test accuracy rising along CELLS, best rates too; section 8: vit and layerscale."""
    p = load_script("proxy_rank")
    (results / "lr_sensitivity").mkdir(parents=True)
    with (results / "lr_sensitivity" / "sensitivity.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "depth", "best_lr", "test_acc_at_best_lr"])
        for i, (arm, depth) in enumerate(p.CELLS):
            w.writerow([arm, depth, (1e-3, 2e-3, 4e-3)[i // 4], 0.5 + 0.01 * i])
        w.writerow(["tfixup", 6, 1e-3, 0.99])  # a cell the study does not have
    (results / "depth_fashion").mkdir()
    with (results / "depth_fashion" / "summary.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "depth", "n", "test_acc_mean"])
        for i, (arm, depth) in enumerate(c for c in p.CELLS if c[0] in ("vit", "layerscale")):
            w.writerow([arm, depth, 3, 0.8 - 0.01 * i])  # the reverse of the study's ranking


def test_a_proxy_row_is_pending_until_every_cell_has_finished(tmp_path):
    p = load_script("proxy_rank")
    results, runs = tmp_path / "results", tmp_path / "runs"
    _proxies(results)
    for i, (arm, depth) in enumerate(p.CELLS):
        for seed in range(5 if i else 4):  # the first cell has 4 of its 5 seeds
            _run(runs, "depth_budget", f"{arm}_depth{depth}_seed{seed}", seed=seed, depth=depth,
                 test_acc=0.7 + 0.01 * i + 0.001 * seed)
    rows = p.rows(runs, results)
    assert [r["status"] for r in rows] == ["pending (11 of 12 cells finished in phase 2)",
                                           "pending (0 of 12 cells finished in phase 1)",
                                           "pending (5 of 6 cells finished in phase 2)",
                                           "not applicable: the proxy trained each cell at section 7's rate"]
    assert all(r["spearman"] == r["ci_low"] == "" for r in rows)
    _run(runs, "depth_budget", "vit_depth6_seed4", seed=4, test_acc=0.704)
    rows = p.rows(runs, results)
    assert rows[0]["status"] == "complete" and rows[0]["cells"] == "12"
    assert float(rows[0]["spearman"]) == pytest.approx(1.0) and rows[0]["ci_low"] == "1.000"
    assert "percentile" in rows[0]["method"]
    assert rows[2]["cells"] == "6" and float(rows[2]["spearman"]) == pytest.approx(-1.0)


def test_the_chosen_rates_come_from_phase_ones_bracketed_cells(tmp_path):
    p = load_script("proxy_rank")
    results, runs = tmp_path / "results", tmp_path / "runs"
    _proxies(results)
    for i, (arm, depth) in enumerate(p.CELLS):
        best = (1e-3, 2e-3, 4e-3)[i // 4]  # the proxy's rate order; interior to the grid
        edge = i == 0  # the first cell's best rate sits on the grid's edge: not finished (not bracketed)
        for lr in p.GRID:
            loss = 0.4 if (lr == 5e-4 if edge else lr == best) else 0.5 + abs(math.log2(lr / best)) / 10
            _run(runs, "depth_budget_grid", f"{arm}_depth{depth}_lr{lr:g}_seed0", seed=0, val_loss=loss,
                 test_acc=0.99 if lr == 8e-3 else 0.5)  # a rate chosen on the test set would be 8e-3
    assert p.rows(runs, results)[1]["status"] == "pending (11 of 12 cells finished in phase 1)"
    _run(runs, "depth_budget_grid", "vit_depth6_lr0.00025_seed0", seed=0, val_loss=0.6)  # the bracketing rate
    rates = p.phase1_rates(runs)
    assert rates[("vit", 6)] == 5e-4 and rates[("deepvit", 24)] == 4e-3
    row = p.rows(runs, results)[1]
    assert row["status"] == "complete" and float(row["spearman"]) > 0.9


# ------------------------------------------------------------------------------------------------ the probes


def test_the_probes_csv_holds_a_cells_medians_once_it_has_its_seeds_and_the_figure_once_phase_two_ends(tmp_path):
    d = load_script("probes_depth")
    for arm in ARMS:
        for depth in (6, 12, 24):
            for seed in range(5):
                if (arm, depth, seed) == ("cait", 12, 4):
                    continue
                probes = {"token_similarity": [0.1] * (depth - 1) + [0.5 + 0.1 * seed],
                          "effective_rank_uncentred": [9.0] * (depth - 1) + [float(seed)],
                          "attn_entropy": [2.0] * depth,
                          "max_logit": [10.0 * seed + depth + (50.0 if b == 1 else 0.0) for b in range(depth)]}
                _run(tmp_path, "depth_budget", f"{arm}_depth{depth}_seed{seed}", seed=seed, depth=depth,
                     probes=probes)
    text = d.table(tmp_path)
    rows = list(csv.DictReader(text.splitlines()))
    assert len(rows) == 15 and d.figure(text, tmp_path / "f.png") is None  # a cell is pending: no figure
    pending = [r for r in rows if r["status"] != "complete"]
    assert [(r["variant"], r["depth"], r["status"]) for r in pending] == [("cait", "12", "pending (4 of 5 seeds)")]
    assert all(pending[0][c] == "" for c in d.COLUMNS[3:-1])  # no median from part of a cell
    vit6 = next(r for r in rows if (r["variant"], r["depth"]) == ("vit", "6"))
    assert float(vit6["max_logit_max"]) == pytest.approx(20.0 + 6 + 50.0)  # a finished cell has its numbers
    _run(tmp_path, "depth_budget", "cait_depth12_seed4", seed=4, depth=12,
         probes={"token_similarity": [0.9] * 12, "effective_rank_uncentred": [4.0] * 12, "attn_entropy": [2.0] * 12,
                 "max_logit": [1.0] * 12})
    text = d.table(tmp_path)
    rows = {(r["variant"], int(r["depth"])): r for r in csv.DictReader(text.splitlines())}
    vit = rows[("vit", 24)]
    assert vit["status"] == "complete" and vit["seeds"] == "5/5"
    assert float(vit["token_similarity_last"]) == pytest.approx(0.7)  # the last block's, median over seeds 0..4
    assert float(vit["effective_rank_uncentred_last"]) == pytest.approx(2.0)
    assert float(vit["max_logit_max"]) == pytest.approx(20.0 + 24 + 50.0)  # block 1's, the max over blocks
    assert float(rows[("cait", 12)]["token_similarity_last"]) == pytest.approx(0.7)  # seeds 0-3 and the new one
    drawn = d.figure(text, tmp_path / "f.png")
    assert drawn is not None and drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------ proxy rows


def _arms(root: Path, study: str, a: str, b: str, a_acc: float, b_acc: float, seeds: int) -> None:
    """``seeds`` runs of arms ``a`` and ``b`` (run prefixes) whose per-seed difference is ``a_acc - b_acc`` points
    give or take a little noise, so that 5 seeds decide it."""
    for seed in range(seeds):
        noise = 0.0005 * (-1) ** seed
        _run(root, study, f"{a}_seed{seed}", seed=seed, test_acc=a_acc + 0.001 * seed + noise)
        _run(root, study, f"{b}_seed{seed}", seed=seed, test_acc=b_acc + 0.001 * seed)


def test_every_proxy_row_names_a_real_section_10_claim():
    v = load_script("verdicts")
    claims = {c.id: c for c in v.CLAIMS}
    assert v.AT_BUDGET and set(v.PROXY_SECTIONS) == {"7", "8"}
    for proxy, (answer, sign) in v.AT_BUDGET.items():
        assert claims[proxy].section in v.PROXY_SECTIONS and claims[answer].section == "10", proxy
        assert sign in (1, -1) and claims[proxy].measure == claims[answer].measure, proxy
    with Path(v.OUT).open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:  # the committed CSV: every proxy row says so, and names its answer where there is one
        if r["section"] in v.PROXY_SECTIONS:
            assert r["standing"].startswith(v.PROXY), r["id"]
            assert r["at_budget"].startswith(v.AT_BUDGET[r["id"]][0]) if r["id"] in v.AT_BUDGET else not r["at_budget"]
        else:
            assert r["standing"] == (v.BUDGET if r["part"] == "II" else "") and not r["at_budget"], r["id"]


def test_a_decided_budget_claim_supersedes_the_proxy_it_conflicts_with(tmp_path):
    v = load_script("verdicts")
    proxy, answer = _claim(v, "fashion-ls-24-6"), _claim(v, "budget-ls-24-6")
    # the proxy: LayerScale at 24 blocks 3 points below 6 blocks over 3 seeds (decided against the claim)
    _arms(tmp_path, "depth_fashion", "layerscale_depth24", "layerscale_depth6", 0.84, 0.87, 3)
    _arms(tmp_path, "depth_budget", "layerscale_depth24", "layerscale_depth6", 0.90, 0.88, 4)
    rows = v.rows([proxy, answer], tmp_path)
    assert rows[0]["verdict"] == "contradicted" and rows[1]["verdict"] == v.PENDING
    assert (rows[0]["standing"], rows[0]["at_budget"]) == (v.PROXY, "budget-ls-24-6: pending")
    assert (rows[1]["standing"], rows[1]["at_budget"]) == (v.BUDGET, "")
    _run(tmp_path, "depth_budget", "layerscale_depth24_seed4", seed=4, test_acc=0.904)
    _run(tmp_path, "depth_budget", "layerscale_depth6_seed4", seed=4, test_acc=0.884)
    rows = v.rows([proxy, answer], tmp_path)  # at the budget 24 blocks beat 6: the proxy's verdict is replaced
    assert rows[1]["verdict"] == "reproduced"
    assert (rows[0]["standing"], rows[0]["at_budget"]) == (v.SUPERSEDED, "budget-ls-24-6: reproduced")


def test_an_agreeing_budget_claim_confirms_the_proxy_read_the_same_way_round(tmp_path):
    v = load_script("verdicts")
    # "the plain ViT saturates: 24 falls short of 12" (proxy) against "24 beats 12" (section 10): reversed
    proxy, answer = _claim(v, "fashion-vit-12-24"), _claim(v, "budget-vit-24-12")
    assert v.AT_BUDGET[proxy.id] == (answer.id, -1)
    _arms(tmp_path, "depth_fashion", "vit_depth12", "vit_depth24", 0.87, 0.84, 3)
    _arms(tmp_path, "depth_budget", "vit_depth12", "vit_depth24", 0.89, 0.87, 5)
    rows = v.rows([proxy, answer], tmp_path)
    assert rows[0]["verdict"] == "reproduced" and rows[1]["verdict"] == "contradicted"
    assert (rows[0]["standing"], rows[0]["at_budget"]) == (v.CONFIRMED, "budget-vit-24-12: contradicted")
    # the same budget runs read the other way round would conflict
    v.AT_BUDGET[proxy.id] = (answer.id, 1)
    try:
        assert v.rows([proxy, answer], tmp_path)[0]["standing"] == v.SUPERSEDED
    finally:
        v.AT_BUDGET[proxy.id] = (answer.id, -1)


# ------------------------------------------------------------------------------------------------ progress


def _timed(run: Path, seconds: float) -> None:
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "wall_time_s": seconds}))


def test_progress_counts_each_phases_runs_finished_planned_copied_and_to_train(tmp_path):
    """The page's progress table from run records: the plain ViT and QK-layernorm have run the grid at 6 blocks (both
    best at 2e-3; QK-layernorm added 1.6e-2 beyond the edge), the ViT one rate at 12 and 24 blocks; phase 2 has the
    ViT's 5 seeds at 6 blocks and QK-layernorm's seeds 1-2."""
    p = load_script("budget_progress")
    for arm in ("vit", "qknorm"):
        for lr in p.GRID + ((1.6e-2,) if arm == "qknorm" else ()):
            run = _run(tmp_path, "depth_budget_grid", f"{arm}_depth6_lr{lr:g}_seed0", seed=0,
                       val_loss=0.4 + abs(math.log2(lr / 2e-3)) * 0.05)
            _timed(run, 100.0)
    _timed(_run(tmp_path, "depth_budget_grid", "vit_depth12_lr0.001_seed0", seed=0, depth=12), 400.0)
    _timed(_run(tmp_path, "depth_budget_grid", "vit_depth24_lr0.001_seed0", seed=0, depth=24), 1000.0)
    for seed in range(5):
        _run(tmp_path, "depth_budget", f"vit_depth6_seed{seed}", seed=seed)
    for seed in (1, 2):
        _run(tmp_path, "depth_budget", f"qknorm_depth6_seed{seed}", seed=seed)
    rows = {r["runs"]: r for r in p.rows(tmp_path)}

    def counts(folder):
        r = rows[folder]
        return tuple(int(r[k]) for k in ("finished", "planned", "to_copy", "train_6", "train_12", "train_24"))

    # phase 1: 15 cells x 5 rates and the rate added beyond an edge; 13 finished
    assert counts("depth_budget_grid") == (13, 76, 0, 15, 24, 24)
    # phase 2: QK-layernorm's seed 0 is copied from its grid run at its best rate, not trained; the ViT's cells at
    # 12 and 24 blocks have not finished their grids, so their best rate (and run to copy) is not known yet
    assert counts("depth_budget") == (7, 75, 1, 17, 25, 25)
    # phase 3: QK-layernorm's rate at 6 blocks is the ViT's, so its phase-2 runs (seeds 1-2) are copies
    assert counts("depth_budget_same_rate") == (0, 60, 2, 18, 20, 20)
    # phase 5: seed 0 at the grid's own rates is copied (the ViT and QK-layernorm at 6 blocks, the ViT's one 24-block
    # run), not QK-layernorm's 1.6e-2
    assert counts("depth_budget_wortsman") == (0, 60, 11, 20, 0, 29)
    # phase 4 waits for phase 2's best arm; its cells count as 24-block runs all the same
    assert counts("depth_budget_dp_uniform") == (0, 5, 0, 0, 0, 5)
    assert rows["depth_budget_dp_linear"]["status"] == "waits for phase 2 to choose its arm"
    assert [rows[f]["status"] for f in ("depth_budget_grid", "depth_budget_same_rate")] == ["under way", "not started"]
    # the cost: the runs to train at each depth times the median wall time of the finished runs there
    assert rows["depth_budget_same_rate"]["hours"] == f"{(18 * 100 + 20 * 400 + 20 * 1000) / 3600:.1f}"
    total = rows["depth_budget*"]
    assert int(total["finished"]) == 20 and int(total["planned"]) == 76 + 75 + 60 + 5 + 5 + 60
    assert int(total["train_24"]) == 24 + 25 + 20 + 5 + 5 + 29 and int(total["to_copy"]) == 1 + 2 + 11
    assert "100 s at 6, 400 s at 12, 1000 s at 24 blocks" in total["what"]
    # no finished run at 24 blocks to time: no cost where 24-block runs are left
    (tmp_path / "depth_budget_grid" / "vit_depth24_lr0.001_seed0" / "summary.json").unlink()
    rows = {r["runs"]: r for r in p.rows(tmp_path)}
    assert rows["depth_budget_same_rate"]["hours"] == "" and rows["depth_budget_grid"]["hours"] == ""


def test_progress_of_a_finished_phase_and_the_best_arm(tmp_path, monkeypatch):
    p = load_script("budget_progress")
    monkeypatch.setattr(p, "best_arm", lambda runs: "qknorm")
    for seed in range(5):
        _timed(_run(tmp_path, "depth_budget_dp_linear", f"qknorm_depth24_seed{seed}", seed=seed, depth=24), 900.0)
        _run(tmp_path, "depth_budget_dp_uniform", f"vit_depth24_seed{seed}", seed=seed, depth=24)  # not the arm
    rows = {r["runs"]: r for r in p.rows(tmp_path)}
    linear, uniform = rows["depth_budget_dp_linear"], rows["depth_budget_dp_uniform"]
    assert (linear["finished"], linear["status"], linear["hours"]) == ("5", "complete", "0.0")
    assert "the best arm (QK-layernorm)" in linear["what"]
    assert (uniform["finished"], uniform["train_24"], uniform["status"]) == ("0", "5", "not started")
    assert uniform["hours"] == f"{5 * 900 / 3600:.1f}"


def test_progress_names_the_machines_each_phases_finished_runs_trained_on(tmp_path, monkeypatch):
    """A time compares only within one CPU: each phase's row counts its finished runs per processor, as their
    records name it (a GPU run by its GPU), most first; a run outside the phase's plan is not counted."""
    p = load_script("budget_progress")
    monkeypatch.setattr(p, "best_arm", lambda runs: "qknorm")
    xeon, epyc = "Intel(R) Xeon(R) Processor @ 2.80GHz (cpu family 6, model 106)", "AMD EPYC (cpu family 25, model 1)"
    for seed, where in enumerate([{"cpu": xeon}, {"cpu": epyc}, {"cpu": xeon}, {},
                                  {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "cpu": epyc}]):
        run = _run(tmp_path, "depth_budget_dp_linear", f"qknorm_depth24_seed{seed}", seed=seed, depth=24)
        summary = {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k not in ("cpu", "gpu")}
        (run / "summary.json").write_text(json.dumps({**summary, **where}))
    extra = _run(tmp_path, "depth_budget_dp_linear", "vit_depth24_seed0", seed=0, depth=24)  # not the best arm's
    (extra / "summary.json").write_text(json.dumps({**json.loads((extra / "summary.json").read_text()), "cpu": epyc}))
    rows = {r["runs"]: r for r in p.rows(tmp_path)}
    assert rows["depth_budget_dp_linear"]["machines"] == (
        "Intel Xeon @ 2.80GHz (family 6, model 106): 2; AMD EPYC (family 25, model 1): 1; NVIDIA H100 80GB HBM3: 1; "
        "unrecorded: 1")
    assert rows["depth_budget_dp_uniform"]["machines"] == ""  # nothing finished there
    assert rows["depth_budget*"]["machines"] == rows["depth_budget_dp_linear"]["machines"]


def test_the_committed_progress_table_is_computed_from_the_run_records():
    """docs/results/depth_budget/progress.csv is what the kept records give: a hand edit, or records committed
    without rerunning the script, fail here."""
    p = load_script("budget_progress")
    assert p.table() == p.OUT.read_text()
