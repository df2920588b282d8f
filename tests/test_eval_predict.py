"""`vitlab eval` and `vitlab predict` on a checkpoint trained here on part of mnist-5k."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitlab.checkpoint import load_model, read_config
from vitlab.cli import main
from vitlab.data import load_dataset, load_image, normalize


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ck") / "run"
    args = ["train", "--model", "vit_mnist", "--limit-train", "256", "--limit-test", "200", "--depth", "2",
            "--embed-dim", "32", "--num-heads", "4", "--batch-size", "64", "--epochs", "2", "--no-augment",
            "--lr", "3e-3", "--no-progress", "--output", str(out)]
    assert main(args) == 0
    return out


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"vitlab {command}: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_eval_matches_the_summary_and_writes_the_confusion_matrix(checkpoint, capsys):
    summary = json.loads((checkpoint / "summary.json").read_text())
    assert main(["eval", "--checkpoint", str(checkpoint), "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    assert f"test_loss {summary['final_test_loss']:.4f}" in out
    assert f"test_acc {100 * summary['final_test_acc']:.2f}%" in out and "(200 images, mnist-5k test)" in out
    png = checkpoint / "confusion_matrix.png"
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 200
    assert not [p for p in checkpoint.iterdir() if p.name.startswith(".")]


def test_eval_output_folder_and_other_test_subset(checkpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(checkpoint / "model.safetensors"), "--limit-test", "50",
                 "--output", str(out)]) == 0
    acc = float(re.search(r"test_acc ([\d.]+)%", capsys.readouterr().out).group(1))
    assert (out / "confusion_matrix.png").is_file()
    model = load_model(checkpoint).eval()
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    from vitlab.train.batches import subset

    test = subset(test, 50)
    run = read_config(checkpoint)["run"]["data"]
    with torch.no_grad():
        pred = model(normalize(test.images, run["mean"], run["std"])).argmax(1)
    assert acc == pytest.approx(100 * (pred == test.labels).float().mean().item(), abs=0.005)


def test_eval_of_another_architecture_is_one_line(checkpoint, capsys):
    assert main(["eval", "--checkpoint", str(checkpoint), "--model", "cait_xxs24"]) == 2
    err = one_error_line(capsys, "eval")
    assert "holds a vit (vit_mnist) model but a cait (cait_xxs24)" in err and "missing keys" in err


def test_eval_missing_checkpoint_and_config(tmp_path, checkpoint, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "does not exist" in one_error_line(capsys, "eval")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    assert main(["eval", "--checkpoint", str(bare)]) == 2
    assert "no config.json" in one_error_line(capsys, "eval")


def digit_files(folder: Path) -> list[tuple[Path, int]]:
    """Test digits saved as a 64x64 RGB PNG and a 40x40 grayscale JPEG."""
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    files = []
    for i, (size, mode, ext) in enumerate([(64, "RGB", "png"), (40, "L", "jpg")]):
        arr = test.images[i, 0].numpy()
        img = Image.fromarray(arr, mode="L").resize((size, size)).convert(mode)
        path = folder / f"digit{i}.{ext}"
        img.save(path)
        files.append((path, int(test.labels[i])))
    return files


def test_predict_prints_topk_consistent_with_the_model(checkpoint, tmp_path, capsys):
    files = digit_files(tmp_path)
    assert main(["predict", "--checkpoint", str(checkpoint), *[str(p) for p, _ in files], "--topk", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    model = load_model(checkpoint).eval()
    data = read_config(checkpoint)["run"]["data"]
    for line, (path, _) in zip(lines, files):
        assert line.startswith(f"{path}: ")
        top = re.findall(r"(\d) \(([\d.]+)\)", line)
        probs = [float(p) for _, p in top]
        assert len(top) == 3 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0001
        x = normalize(load_image(path, img_size=28, in_chans=1)[None], data["mean"], data["std"])
        with torch.no_grad():
            p = model(x).softmax(-1)[0]
        assert int(top[0][0]) == int(p.argmax()) and probs[0] == pytest.approx(float(p.max()), abs=1e-4)


def test_predict_topk_larger_than_classes_is_clipped(checkpoint, tmp_path, capsys):
    (path, _), _ = digit_files(tmp_path)
    assert main(["predict", "--checkpoint", str(checkpoint), str(path), "--topk", "50"]) == 0
    line = capsys.readouterr().out.strip()
    assert len(re.findall(r"\d \([\d.]+\)", line)) == 10


def test_predict_unreadable_image_is_one_line(checkpoint, tmp_path, capsys):
    bad = tmp_path / "broken.png"
    bad.write_text("not an image")
    good, _ = digit_files(tmp_path)[0]
    assert main(["predict", "--checkpoint", str(checkpoint), str(good), str(bad)]) == 2
    err = one_error_line(capsys, "predict")
    assert str(bad) in err and capsys.readouterr().out == ""
    assert main(["predict", "--checkpoint", str(checkpoint), str(tmp_path / "missing.png")]) == 2
    assert "does not exist" in one_error_line(capsys, "predict")
    assert main(["predict", "--checkpoint", str(checkpoint), str(good), "--topk", "0"]) == 2
    assert "--topk" in one_error_line(capsys, "predict")
