"""vitlab.inference sits beside vitlab.train (the trainer evaluates with it, it reads vitlab.train's process
context): each imports in a fresh interpreter whichever comes first."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("first", ["vitlab.inference.evaluate", "vitlab.inference.predict", "vitlab.commands.eval",
                                   "vitlab.train"])
def test_imports_in_any_order(first: str) -> None:
    code = f"import {first}\nimport vitlab.train, vitlab.inference.evaluate, vitlab.inference.predict\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_trainer_and_vitlab_train_evaluate_with_inference() -> None:
    from vitlab import train
    from vitlab.inference.evaluate import evaluate
    from vitlab.train import engine

    assert train.evaluate is evaluate and engine.evaluate is evaluate
