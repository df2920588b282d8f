"""The CUDA path of train, eval, analyze and the depth study (marked ``gpu``: ``pytest -m gpu`` on a machine
with a GPU; CI has none).

``VITLAB_TEST_DEVICE=cpu pytest -m gpu tests/test_cuda.py`` runs the same checks on the CPU, which is how their
logic is checked where no GPU is lent; on a GPU they run on ``cuda``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from _helpers import run_args
from vitlab import create_model
from vitlab.checkpoint import load_model
from vitlab.cli import main

DEVICE = os.environ.get("VITLAB_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TINY = run_args(limit_train=128, limit_test=64, batch_size=32, progress=False, device=DEVICE)


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda") / "run"
    assert main(["train", *TINY, "--epochs", "2", "--output", str(out)]) == 0
    return out


def test_train_on_the_device_and_load_anywhere(cuda_run: Path):
    summary = json.loads((cuda_run / "summary.json").read_text())
    assert summary["device"].startswith(DEVICE) and summary["epochs"] == 2
    assert 0.0 <= summary["final_test_acc"] <= 1.0 and summary["train_cpu_s"] > 0
    model = load_model(cuda_run)  # weights saved from the device load on the CPU
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_eval_on_the_device_matches_the_run(cuda_run: Path, capsys):
    summary = json.loads((cuda_run / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(cuda_run), "--device", DEVICE]) == 0
    acc = float(re.search(r"test_acc ([0-9.]+)%", capsys.readouterr().out).group(1))
    assert acc == pytest.approx(100 * summary["final_test_acc"], abs=0.006)  # printed to 0.01 %


def test_resume_on_the_device_continues_the_run(cuda_run: Path, tmp_path: Path):
    import shutil

    again = tmp_path / "again"
    shutil.copytree(cuda_run, again)
    assert main(["train", "--resume", str(again), "--epochs", "3", "--device", DEVICE]) == 0
    lines = (again / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]


def test_analyze_on_the_device(cuda_run: Path, tmp_path: Path):
    out = tmp_path / "analysis"
    assert main(["analyze", "--checkpoint", str(cuda_run), "--output", str(out), "--num-images", "8", "--show", "2",
                 "--device", DEVICE]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_images"] == 8 and (out / "index.html").is_file()


@pytest.mark.parametrize("overrides", [{}, {"gate": "layerscale", "init_values": 0.1}, {"attn": "reattention"},
                                       {"gate": "fixup"}, {"gate": "tfixup"}], ids=str)
def test_the_device_computes_what_the_cpu_computes(overrides):
    torch.manual_seed(0)
    model = create_model("vit_mnist", depth=3, **overrides).eval()
    with torch.no_grad():
        for p in model.parameters():  # zero-initialised gates and heads would hide a wrong branch
            p.add_(0.05 * torch.randn_like(p))
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # fp32 patch conv too
        expected = model(x)
        got = model.to(DEVICE)(x.to(DEVICE)).cpu()
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


def test_depth_study_on_the_device(tmp_path: Path):
    out = tmp_path / "depth"
    assert main(["depth-study", "--depths", "2", "--variants", "layerscale,deepvit", "--num-images", "8",
                 "--epochs", "1", "--limit-train", "64", "--limit-test", "32", "--batch-size", "32", "--no-progress",
                 "--device", DEVICE, "--output", str(out)]) == 0
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and (out / "similar_blocks.png").is_file()
    diag = json.loads((out / "deepvit_depth2_seed0" / "diagnostics.json").read_text())
    assert diag["collapse_pre_mix"] and diag["num_images"] == 8
    summary = json.loads((out / "deepvit_depth2_seed0" / "summary.json").read_text())
    assert summary["device"].startswith(DEVICE)
