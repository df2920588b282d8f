"""A run's record says where it came from (git commit, the command) and keeps its per-image test predictions."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np

from vitlab import provenance
from vitlab.cli import main as vitlab

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "vit_mnist", "--dataset", "mnist-5k", "--set", "depth=1", "--epochs", "1", "--limit-train", "64",
        "--limit-test", "50", "--threads", "1", "--no-progress"]


def test_a_run_records_its_commit_command_and_predictions(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["train", *TINY, "--output", str(out)]
    assert vitlab(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{40}", summary["git_commit"]) and summary["git_commit"] == head
    assert summary["command"] == "vitlab " + " ".join(argv)
    record = json.loads((out / provenance.PREDICTIONS).read_text())
    labels, predicted = np.array(record["labels"]), np.array(record["predictions"])
    assert len(labels) == len(predicted) == 50 and len(record["classes"]) == 10
    assert predicted.min() >= 0 and predicted.max() < 10
    assert np.mean(labels == predicted) == summary["final_test_acc"]  # the predictions of the reported accuracy
    assert provenance.read_predictions(out) == (record["labels"], record["predictions"])
    assert provenance.read_predictions(tmp_path) is None
    assert not list(out.glob("*.tmp*"))


def test_the_command_is_quoted_for_the_shell() -> None:
    provenance.set_command(["train", "--output", "runs/a b"])
    try:
        assert provenance.command() == "vitlab train --output 'runs/a b'"
    finally:
        provenance.set_command([])
        provenance._command = None
    assert provenance.command() is None
