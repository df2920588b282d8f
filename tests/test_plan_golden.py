"""Tiny runs and a resumed one give the numbers they gave before the run plan (issue 44): the metrics of every
epoch, the summary's figures, the stored run config and model, and the final weights.

The expected values in ``tests/data/plan_golden.json`` were recorded by this file's ``record`` with the trainer of
before the plan (commit 691b752), on one CPU thread, by ``python tests/test_plan_golden.py``. On the machine and
torch that recorded them (``fingerprint``) every number must be bit-equal; elsewhere other CPU kernels round
differently, so the floats are compared to 1e-3 and the weights' digest is not compared.

Each run sets its warm-up (``--warmup-epochs``): a warm-up the recipe chooses for a shortened run is the one thing
the plan changes on purpose (tests/test_plan.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).parent / "data" / "plan_golden.json"
SIZES = ["--device", "cpu", "--threads", "1", "--no-progress"]
CASES: dict[str, list[str]] = {
    # the digits recipe (augmentation, pooling defaults) with drop-path and EMA, then resumed for one more epoch
    "digits": ["--model", "vit_mnist", "--depth", "2", "--embed-dim", "32", "--num-heads", "4", "--limit-train",
               "256", "--limit-test", "128", "--batch-size", "64", "--epochs", "2", "--warmup-epochs", "1",
               "--drop-path", "0.1", "--ema-decay", "0.9", *SIZES],
    # DeiT III's recipe (LAMB, BCE, mixup/cutmix, 3-Augment, repeated augmentation, LayerScale), a validation
    # hold-out, layer decay and two slices of each batch
    "deit3": ["--model", "vit_mnist", "--depth", "1", "--embed-dim", "32", "--num-heads", "2", "--recipe", "deit3",
              "--warmup-epochs", "1", "--limit-train", "256", "--limit-test", "64", "--val-size", "64",
              "--batch-size", "48", "--epochs", "1", "--layer-decay", "0.75", "--slices", "2", *SIZES],
    # no --model on clothing: the command's default model and recipe (channels-last, EMA, flip), idx files on disk
    "clothing": ["--dataset", "fashion-mnist", "--data-dir", "{fashion}", "--limit-train", "128", "--limit-test",
                 "32", "--batch-size", "32", "--epochs", "1", "--warmup-epochs", "1", *SIZES],
}
RESUMED = {"digits": ["--epochs", "3", "--no-progress"]}
PATHS = ("output", "data_dir")  # where things are, not what was computed
# options added after the recording, at the default that leaves every run as it was (stratify: False draws as before)
LATER = {"stratify": False}


def fingerprint() -> dict[str, str]:
    import torch

    from vitlab import perf

    return {"torch": torch.__version__, "cpu": perf.cpu_id()}


def digest(out: Path) -> dict[str, Any]:
    """What a run computed: its rows (but the wall time), summary figures, run config, model and weights."""
    from safetensors.torch import load_file

    rows = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    figures = {k: summary[k] for k in sorted(summary) if k.startswith(("final_", "best_")) or k in (
        "epochs", "steps", "params", "macs", "skipped_steps", "slices", "threads", "model", "dataset")}
    config = json.loads((out / "config.json").read_text())
    run = {k: v for k, v in config["run"].items() if k not in PATHS and (k, v) not in LATER.items()}
    weights = load_file(str(out / "model.safetensors"))
    sha = hashlib.sha256()
    for key in sorted(weights):
        sha.update(key.encode())
        sha.update(weights[key].contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return {"rows": rows, "summary": figures, "run": run, "model": config["model"], "weights": sha.hexdigest()}


def run_cases(tmp: Path) -> dict[str, Any]:
    """Train every case (and the resumed one) in this process; their digests by name."""
    from test_time_to_accuracy_fashion import tiny_fashion
    from vitlab.cli import main

    fashion = tiny_fashion(tmp / "fashion")
    out: dict[str, Any] = {}
    for name, argv in CASES.items():
        folder = tmp / name
        argv = [a.replace("{fashion}", str(fashion)) for a in argv]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["train", *argv, "--output", str(folder)]) == 0
        out[name] = digest(folder)
        if name in RESUMED:
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["train", "--resume", str(folder), *RESUMED[name]]) == 0
            out[f"{name}+resumed"] = digest(folder)
    return out


def same(want: Any, got: Any, exact: bool, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, sorted(set(got) ^ set(want)))
        for k in want:
            same(want[k], got[k], exact, f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(want, got)):
            same(a, b, exact, f"{where}[{i}]")
    elif isinstance(want, float) and not exact:
        assert math.isclose(want, got, rel_tol=1e-3, abs_tol=1e-6), (where, want, got)
    else:
        assert want == got, (where, want, got)


def test_tiny_and_resumed_runs_are_bit_equal_to_before(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    exact = golden["fingerprint"] == fingerprint()
    got = run_cases(tmp_path)
    assert set(got) == set(golden["runs"])
    for name, want in golden["runs"].items():
        if not exact:
            want, got[name] = {k: v for k, v in want.items() if k != "weights"}, \
                {k: v for k, v in got[name].items() if k != "weights"}
        same(want, got[name], exact, name)
    if not exact:
        pytest.skip(f"compared to 1e-3: recorded on {golden['fingerprint']}, this is {fingerprint()}")


if __name__ == "__main__":  # record the expected values (with the trainer the comparison is against)
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        record = {"fingerprint": fingerprint(), "runs": run_cases(Path(tmp))}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
