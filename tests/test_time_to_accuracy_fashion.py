"""benchmarks/time_to_accuracy.py on Fashion-MNIST: its thresholds, the budget verdict, the validation rows, clothing's
augmentation on the timm side, a --quick run on tiny idx files (its own result files), and the one-line refusals."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import vitlab.train.config as run_config
from _scripts import load_script

IDX_NAMES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def _module():
    return load_script("time_to_accuracy")


def tiny_fashion(folder: Path, n_train: int = 200, n_test: int = 50) -> Path:
    """Four gzipped idx files in Fashion-MNIST's format (random 28x28 images, labels 0-9)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train_labels": (np.arange(n_train) % 10).astype(np.uint8),
              "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
              "test_labels": (np.arange(n_test) % 10).astype(np.uint8)}
    for role, a in arrays.items():
        head = struct.pack(">I", 0x0800 | a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
        (folder / f"{IDX_NAMES[role]}.gz").write_bytes(gzip.compress(head + a.tobytes()))
    return folder


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_fashion_thresholds_and_budget_verdict_from_train_time():
    m = _module()
    assert m.THRESHOLDS["fashion-mnist"] == (0.90, 0.925) and m.THRESHOLDS["mnist-5k"] == (0.975, 0.98)
    assert m.BUDGET_S["fashion-mnist"] == 900.0
    assert m.within_budget(899.9, 900) and m.within_budget(900.0, 900) and not m.within_budget(900.1, 900)
    rows = [{"epoch": 1, "test_acc": 0.88, "seconds": 400.0}, {"epoch": 2, "test_acc": 0.91, "seconds": 300.0},
            {"epoch": 3, "test_acc": 0.926, "seconds": 250.0}]
    got = m.milestones(rows, m.THRESHOLDS["fashion-mnist"], 900.0)
    assert (got["s_to_0.9"], got["epoch_to_0.9"], got["s_to_0.925"]) == (700.0, 2, 950.0)
    assert got["total_s"] == 950.0 and got["within_budget"] is False
    assert m.milestones(rows[:2], m.THRESHOLDS["fashion-mnist"], 900.0)["within_budget"] is True
    assert "within_budget" not in m.milestones(rows)  # mnist-5k: no budget unless asked


def test_validation_rows_time_thresholds_on_val_and_report_the_last_test_accuracy():
    rows = [{"epoch": 1, "val_acc": 0.91, "seconds": 2.0}, {"epoch": 2, "val_acc": 0.93, "seconds": 3.0,
                                                             "test_acc": 0.905}]
    got = _module().milestones(rows, (0.90, 0.925))
    assert (got["s_to_0.9"], got["s_to_0.925"], got["epoch_to_0.925"]) == (2.0, 5.0, 2)
    assert (got["final_acc"], got["final_val_acc"], got["best_acc"]) == (0.905, 0.93, 0.93)


def test_markdown_says_per_side_whether_the_budget_held():
    m = _module()
    side = lambda totals: {"milestones": [m.milestones([{"epoch": 1, "test_acc": 0.9, "seconds": t}],  # noqa: E731
                                                       m.THRESHOLDS["fashion-mnist"], 900.0) for t in totals]}
    report = {"dataset": "fashion-mnist", "thresholds": [0.9, 0.925], "budget_s": 900.0, "val_split": None,
              "command": "c", "cpu": "cpu", "cores": 2, "device": "cpu", "torch": "t", "load_before": 1,
              "load_after": 1, "seeds": [0, 1], "timm_epochs": 20,
              "sides": {"vitlab": {**side([500.0, 600.0]), "model": "vit_x"}, "timm": side([800.0, 901.0])}}
    text = m.markdown(report)
    assert "- vitlab: yes (2 of 2 seeds)" in text and "- timm: no (1 of 2 seeds)" in text
    assert "s to 90 % | epoch to 90 % | s to 92.5 %" in text and "model `vit_x`" in text


def test_clothing_augmentation_flips_or_shifts_whole_pixels():
    m, x = _module(), 1 + torch.rand(16, 1, 28, 28)  # every pixel in [1, 2)
    y = m.flip_shift(x, torch.Generator().manual_seed(0), {"hflip": True, "pad_crop": 0})
    same = [torch.allclose(a, b, atol=1e-5) for a, b in zip(x, y)]
    flipped = [torch.allclose(a.flip(-1), b, atol=1e-5) for a, b in zip(x, y)]
    assert all(s != f for s, f in zip(same, flipped)) and any(same) and any(flipped)
    y = m.flip_shift(x, torch.Generator().manual_seed(1), {"hflip": False, "pad_crop": 2})
    for a, b in zip(x, y):
        kept = b[b > 0.5]  # a shift of at most 2 pixels per axis keeps at least 26 x 26 pixels...
        assert 26 * 26 <= len(kept) <= 28 * 28
        assert (kept[:, None] - a.flatten()[None]).abs().min(1).values.max() < 1e-4  # ... unblended
    assert not torch.allclose(x, y)
    assert m.augment is not None and "pad_crop" in m.TIMM_RECIPES["fashion-mnist"]


@pytest.mark.full  # the benchmark script end to end, both sides
def test_quick_fashion_run_writes_markdown_and_json(tmp_path):
    data = tiny_fashion(tmp_path / "fashion")
    out = tmp_path / "out"
    assert _module().main(["--dataset", "fashion-mnist", "--data-dir", str(data), "--quick", "--timm-threads", "1",
                           "--out", str(out)]) == 0
    assert sorted(f.name for f in out.iterdir()) == ["time_to_accuracy_fashion-mnist.json",
                                                     "time_to_accuracy_fashion-mnist.md"]  # mnist-5k's untouched
    report = json.loads((out / "time_to_accuracy_fashion-mnist.json").read_text())
    assert report["dataset"] == "fashion-mnist" and report["thresholds"] == [0.9, 0.925]
    assert report["budget_s"] == 900.0 and Path(report["data_dir"]) == data.resolve()
    assert set(report["sides"]) == {"vitlab", "timm"}
    for side in report["sides"].values():
        assert len(side["runs"]) == 1 and len(side["runs"][0]["rows"]) == 1
        (m,) = side["milestones"]
        assert "s_to_0.925" in m and m["within_budget"] == (m["total_s"] <= 900.0) == side["within_budget"]
    model = report["sides"]["vitlab"]["model"]
    assert model == "vit_fashion_conv_patch14"  # the default on clothing, with its recipe (flip, 1-pixel shift)
    recipe = report["sides"]["vitlab"]["recipe"]
    assert (recipe["hflip"], recipe["pad_crop"], recipe["warmup_epochs"], recipe["epochs"]) == (True, 1, 1, 1)
    assert (recipe["ema_decay"], recipe["label_smoothing"], recipe["weight_decay"]) == (0.999, 0.1, 0.05)
    text = (out / "time_to_accuracy_fashion-mnist.md").read_text()
    assert "on fashion-mnist" in text and "| vitlab | 1 |" in text and "| timm | 1 |" in text
    assert "s to 92.5 %" in text and "within the budget of 900 s" in text and f"model `{model}`" in text


def test_unknown_dataset_is_one_line_exit_2(capsys, tmp_path):
    assert _module().main(["--dataset", "cifar10", "--quick", "--out", str(tmp_path)]) == 2
    assert "unknown --dataset 'cifar10'" in one_error_line(capsys)


def test_missing_data_dir_names_the_package_and_the_flag(capsys, tmp_path, monkeypatch):
    m = _module()
    assert m.main(["--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "nowhere"), "--quick",
                   "--out", str(tmp_path)]) == 2
    err = one_error_line(capsys)
    assert "apt-get install dataset-fashion-mnist" in err and "--data-dir" in err and "nowhere" in err
    monkeypatch.setattr(m, "FASHION_DIR", tmp_path / "not-installed")  # the default folder missing (a CI machine)
    assert m.main(["--dataset", "fashion-mnist", "--quick", "--out", str(tmp_path)]) == 2
    err = one_error_line(capsys)
    assert "apt-get install dataset-fashion-mnist" in err and "--data-dir" in err and "not-installed" in err
    assert not list(tmp_path.glob("time_to_accuracy*"))


@pytest.mark.full  # the benchmark script end to end, twice
def test_keep_reuses_the_runs_it_kept_and_refuses_those_of_another_cpu(tmp_path, capsys, monkeypatch):
    """--keep DIR: a second invocation reads the kept runs instead of training them again (a marker written into a
    kept file reaches the report), lists them in the report, and refuses a run kept on another CPU in one line."""
    m = _module()
    data, keep = tiny_fashion(tmp_path / "fashion"), tmp_path / "keep"
    args = ["--dataset", "fashion-mnist", "--data-dir", str(data), "--quick", "--timm-threads", "1",
            "--keep", str(keep)]
    assert m.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert sorted(f.name for f in keep.iterdir()) == ["timm_0.json", "vitlab_0.json"]  # no .tmp left behind
    kept = json.loads((keep / "timm_0.json").read_text())
    assert kept["cpu"] == m.cpu_id() and kept["options"]["dataset"] == "fashion-mnist" and kept["options"]["quick"]
    first = json.loads((tmp_path / "a" / "time_to_accuracy_fashion-mnist.json").read_text())
    assert first["kept_runs"] == []
    kept["rows"][-1]["test_acc"] = 0.4321  # what a retrained run could not produce
    (keep / "timm_0.json").write_text(json.dumps(kept))
    capsys.readouterr()
    assert m.main([*args, "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "time_to_accuracy_fashion-mnist.json").read_text())
    assert report["kept_runs"] == ["vitlab seed 0", "timm seed 0"]
    assert report["sides"]["timm"]["milestones"][0]["final_acc"] == 0.4321
    assert report["sides"]["vitlab"]["model"] == "vit_fashion_conv_patch14"  # read back with the run
    assert "Read from `--keep`" in (tmp_path / "b" / "time_to_accuracy_fashion-mnist.md").read_text()
    kept["cpu"] = "another CPU"
    (keep / "timm_0.json").write_text(json.dumps(kept))
    capsys.readouterr()
    assert m.main([*args, "--out", str(tmp_path / "c")]) == 2
    err = one_error_line(capsys)
    assert "another CPU" in err and "another --keep folder" in err
    assert not (tmp_path / "c").exists()
    # vitlab's defaults changed since its run was kept (a new recipe): that run is refused, timm's is not the issue
    kept["cpu"] = m.cpu_id()
    (keep / "timm_0.json").write_text(json.dumps(kept))
    clothing = run_config.DEFAULT_RECIPES["clothing"]
    monkeypatch.setitem(run_config.DEFAULT_RECIPES, "clothing", {**clothing, "epochs": 99})
    assert m.main([*args, "--out", str(tmp_path / "c")]) == 2
    err = one_error_line(capsys)
    assert "vitlab_0.json" in err and '"epochs": 99' in err and "timm_0.json" not in err
    assert not (tmp_path / "c").exists()
    monkeypatch.undo()
    (keep / "timm_0.json").write_text("{not json")
    assert m.main([*args, "--out", str(tmp_path / "c")]) == 2
    assert "remove it" in one_error_line(capsys)


def test_cpu_id_adds_family_and_model_to_the_name(tmp_path):
    m = _module()
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
                    "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n")
    assert m.cpu_id(str(info)) == "AMD EPYC (cpu family 25, model 1)"
    info.write_text("model name\t: Some CPU\n")
    assert m.cpu_id(str(info)) == "Some CPU"
