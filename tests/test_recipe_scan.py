"""scripts/recipe_scan.py: the tables come from the run folders (medians over finished runs; a run stopped early
is listed but left out), and the scan's summary in docs/results is what its runs give."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from _scripts import load_script

scan = load_script("recipe_scan")


def fake_run(folder: Path, val_accs: list[float], planned: int, test_acc: float | None) -> None:
    folder.mkdir(parents=True)
    rows = [{"epoch": i + 1, "val_acc": a, "seconds": 1.0} for i, a in enumerate(val_accs)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.json").write_text(json.dumps({"run": {"epochs": planned}}))
    if test_acc is not None:
        (folder / "summary.json").write_text(json.dumps({"final_test_acc": test_acc}))


def test_medians_over_finished_runs_and_the_first_epoch_at_the_threshold(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fake_run(runs / "m_conv14_0", [0.90, 0.976, 0.98], 3, 0.97)
    fake_run(runs / "m_conv14_1", [0.80, 0.95, 0.97], 3, 0.96)  # never reaches 97.5 %
    fake_run(runs / "m_conv14_2", [0.97, 0.99, 0.985], 3, 0.99)
    fake_run(runs / "m_p14_0", [0.5], 3, None)  # stopped after epoch 1 of 3
    summary = {r["arm"]: r for r in scan.summarize(runs, tmp_path / "tables")}
    conv = summary["m_conv14"]
    assert (conv["runs"], conv["complete"], conv["final_val_acc_median"]) == (3, 3, 0.98)
    assert (conv["final_val_acc_min"], conv["final_val_acc_max"], conv["final_test_acc_median"]) == (0.97, 0.985, 0.97)
    assert conv["first_epoch_at_threshold_median"] == 2 and conv["reached"] == "2/3"  # epochs 2, 2, never
    p14 = summary["m_p14"]
    assert (p14["runs"], p14["complete"], p14["final_val_acc_median"]) == (1, 0, None)
    with open(tmp_path / "tables" / "runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["arm"], r["seed"], r["epochs_run"]) for r in rows] == [
        ("m_p14", "0", "1"), ("m_conv14", "0", "3"), ("m_conv14", "1", "3"), ("m_conv14", "2", "3")]


def test_a_median_that_never_reached_the_threshold_is_empty(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fake_run(runs / "m_conv14_0", [0.96], 1, 0.96)
    fake_run(runs / "m_conv14_1", [0.98], 1, 0.98)
    (row,) = scan.summarize(runs, tmp_path / "tables")
    assert row["first_epoch_at_threshold_median"] is None and row["reached"] == "1/2"


def test_summarize_refuses_a_missing_folder(tmp_path: Path, capsys) -> None:
    assert scan.main(["--summarize", str(tmp_path / "nope")]) == 2
    assert "is not a folder of runs" in capsys.readouterr().err


def test_the_cpu_scan_table_matches_its_runs_table() -> None:
    """docs/results/recipe_scan_cpu: each arm's summary row is the median of its runs' rows (no hand edit)."""
    root = Path(__file__).resolve().parents[1] / "docs" / "results" / "recipe_scan_cpu"
    with open(root / "runs.csv", newline="") as fh:
        runs = list(csv.DictReader(fh))
    with open(root / "summary.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    assert summary and {r["arm"] for r in summary} == {r["arm"] for r in runs} <= set(scan.ARMS)
    for s in summary:
        mine = [float(r["final_val_acc"]) for r in runs
                if r["arm"] == s["arm"] and r["epochs_run"] == r["epochs_planned"]]
        assert int(s["complete"]) == len(mine), s["arm"]
        if mine:
            assert abs(float(s["final_val_acc_median"]) - statistics.median(mine)) < 1e-5, s["arm"]
