"""Batches that survive bad items, divergence and impossible schedules said out loud: `vitlab predict` over many
files (one unreadable file never sinks the others), a run whose loss explodes (marked diverged, the last good
checkpoint kept), schedules that cannot be run, and one line instead of a traceback for odd metadata and names."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from _helpers import run_args
from vitlab.checkpoint import load_model, read_config, save_weights
from vitlab.cli import main
from vitlab.errors import CheckpointError, DataError
from vitlab.inference.predict import predict_files

TINY = {"epochs": 1, "limit_train": 64, "limit_test": 32, "batch_size": 32, "no_augment": True, "progress": False}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def write_image(path: Path, size: int, mode: str, seed: int) -> Path:
    """A real image file of random pixels (PNG or JPEG by its suffix)."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, mode="RGB").convert(mode).save(path)
    return path


def write_corrupt(path: Path, seed: int) -> Path:
    """Random bytes under an image name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, 500, dtype=np.uint8).tobytes())
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ck") / "run"
    assert main(["train", *run_args(**TINY, output=str(out))]) == 0
    return out


def predicted(out: str) -> dict[str, str]:
    """{path: the rest of its line} of `vitlab predict`'s output."""
    rows = {}
    for line in lines(out):
        path, _, rest = line.rpartition(": ")
        rows[path] = rest
    return rows


# ------------------------------------------------------------------------------------------ predict


def test_predict_predicts_every_readable_file_and_names_each_unreadable_one(checkpoint, tmp_path, capsys):
    good = [write_image(tmp_path / f"g{i}.png", 20 + 7 * i, "RGB" if i % 2 else "L", i) for i in range(5)]
    good.append(write_image(tmp_path / "g5.jpg", 40, "RGB", 5))
    bad = [write_corrupt(tmp_path / "bad1.png", 1), write_corrupt(tmp_path / "bad2.png", 2)]
    missing = tmp_path / "missing.png"
    order = [good[0], bad[0], good[1], good[2], missing, good[3], bad[1], good[4], good[5]]
    assert main(["predict", "--checkpoint", str(checkpoint), *map(str, order), "--topk", "2"]) == 2
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    errors = lines(cap.err)
    assert len(errors) == 3
    for line, path in zip(errors, [bad[0], missing, bad[1]]):
        assert line.startswith("vitlab predict: error: ") and str(path) in line
    assert "does not exist" in errors[1] and "not a readable image" in errors[0]
    rows = predicted(cap.out)
    assert list(rows) == [str(p) for p in good]  # every good file, in the order given
    model = load_model(checkpoint)
    expected = predict_files(model, read_config(checkpoint), good, k=2)
    for path, top in zip(good, expected):
        assert rows[str(path)] == ", ".join(f"{name} ({p:.4f})" for name, p in top)


def test_predict_strict_stops_at_the_first_unreadable_file(checkpoint, tmp_path, capsys):
    a, b = write_image(tmp_path / "a.png", 28, "L", 0), write_image(tmp_path / "b.png", 28, "L", 1)
    bad, bad2 = write_corrupt(tmp_path / "bad.png", 3), write_corrupt(tmp_path / "bad2.png", 4)
    assert main(["predict", "--checkpoint", str(checkpoint), str(a), str(bad), str(b), str(bad2), "--strict"]) == 2
    cap = capsys.readouterr()
    assert list(predicted(cap.out)) == [str(a)]  # the files before the first bad one, nothing after it
    errors = lines(cap.err)
    assert len(errors) == 1 and str(bad) in errors[0] and "Traceback" not in cap.err


def test_predict_files_api_still_raises_on_the_first_unreadable_file(checkpoint, tmp_path):
    a, bad = write_image(tmp_path / "a.png", 28, "L", 0), write_corrupt(tmp_path / "bad.png", 3)
    with pytest.raises(DataError, match="bad.png"):
        predict_files(load_model(checkpoint), read_config(checkpoint), [a, bad])


def test_predict_a_folder_predicts_its_images_recursively(checkpoint, tmp_path, capsys):
    folder = tmp_path / "pics"
    files = [write_image(folder / "b.png", 30, "RGB", 0), write_image(folder / "a.JPG", 30, "RGB", 1),
             write_image(folder / "sub" / "deeper" / "c.bmp", 28, "L", 2)]
    (folder / "notes.txt").write_text("not an image, not named by the user: skipped")
    write_image(folder / ".hidden.png", 28, "L", 3)
    single = write_image(tmp_path / "single.png", 28, "L", 4)
    assert main(["predict", "--checkpoint", str(checkpoint), str(single), str(folder)]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert list(predicted(cap.out)) == [str(single), *sorted(str(p) for p in files)]
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    assert main(["predict", "--checkpoint", str(checkpoint), str(empty), str(single)]) == 2
    cap = capsys.readouterr()
    assert list(predicted(cap.out)) == [str(single)]
    err = lines(cap.err)
    assert len(err) == 1 and str(empty) in err[0] and "no image files" in err[0]


# ------------------------------------------------------------------------------------------ divergence


# loss 41, 261, 797 per epoch (the warm-up of the whole run, as the recipe gave it before it was fitted to the run)
DIVERGING = {**TINY, "epochs": 3, "limit_train": 128, "lr": 10, "clip_grad": 0, "warmup_epochs": 3}


def test_a_loss_past_100x_chance_marks_the_run_diverged_and_keeps_the_last_good_checkpoint(tmp_path):
    from _helpers import run_config
    from vitlab.train import NonFiniteLoss, RunConfig, train

    out = tmp_path / "run"
    hashes = {}

    def on_epoch(epoch: int, row: dict) -> bool:
        hashes[epoch] = {f: sha(out / f) for f in ("model.safetensors", "state.pt")}
        return False

    options = {k: v for k, v in DIVERGING.items() if k not in ("no_augment", "progress")}
    cfg = RunConfig(**run_config(**options, output=str(out)), **{"degrees": 0.0, "scale": (1.0, 1.0), "shear": 0.0,
                                                                 "translate": 0.0})
    with pytest.raises(NonFiniteLoss) as exc:
        train(cfg, on_epoch=on_epoch)
    msg = str(exc.value)
    assert "\n" not in msg and "diverged" in msg and "100 times" in msg and "epoch 2" in msg
    assert f"the last good checkpoint in {out} is kept" in msg
    assert list(hashes) == [1]  # epoch 2 never reached its save
    assert {f: sha(out / f) for f in hashes[1]} == hashes[1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] is True and summary["diverged_at"]["epoch"] == 2 and summary["epochs"] == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1] and rows[0]["test_loss"] < 100 * math.log(10)


def test_a_diverging_run_exits_2_in_one_line_with_summary_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *run_args(**DIVERGING, output=str(out))]) == 2
    cap = capsys.readouterr()
    err = lines(cap.err)
    assert len(err) == 1 and "Traceback" not in cap.err
    assert err[0].startswith("vitlab train: error: the run diverged:") and "--lr" in err[0]
    assert json.loads((out / "summary.json").read_text())["diverged"] is True


# ------------------------------------------------------------------------------------------ impossible schedules


def test_min_lr_above_lr_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *run_args(**TINY, lr=1e-3, min_lr=5, output=str(out))]) == 2
    err = lines(capsys.readouterr().err)
    assert len(err) == 1 and "min_lr 5" in err[0] and "lr 0.001" in err[0] and "--min-lr" in err[0]
    assert not out.exists()


def test_a_warmup_longer_than_the_run_is_warned_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *run_args(**{**TINY, "epochs": 2}, warmup_epochs=4, output=str(out))]) == 0
    err = lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("vitlab train: warning: the warm-up (4 epochs) is longer than the run")
    assert "--warmup-epochs 2" in err[0] and "50%" in err[0]


def write_folder_data(root: Path, classes: list[bytes | str], per_class: int = 4) -> Path:
    for split in ("train", "val"):
        for c, name in enumerate(classes):
            d = os.path.join(os.fsencode(root / split), os.fsencode(name))
            for i in range(per_class):
                write_image(Path(os.fsdecode(os.path.join(d, b"%d.png" % i))), 28, "L", 100 * c + i)
    return root


def test_a_one_class_data_set_is_refused(tmp_path, capsys):
    data = write_folder_data(tmp_path / "data", ["cats"])
    out = tmp_path / "run"
    args = ["train", "--dataset", "imagefolder", "--data-dir", str(data), "--depth", "1", "--embed-dim", "16",
            "--num-heads", "2", "--epochs", "1", "--batch-size", "4", "--no-progress", "--output", str(out)]
    assert main(args) == 2
    err = lines(capsys.readouterr().err)
    assert len(err) == 1 and "one class (cats)" in err[0] and "at least two" in err[0]
    assert not (out / "model.safetensors").exists()


# ------------------------------------------------------------------------------------------ one line, not a traceback


@pytest.mark.parametrize("meta", ["[1, 2]", "not json {", '"a string"', '{"embed_dim": "wide"}'])
def test_vitlab_config_metadata_that_is_not_a_config_is_one_line(checkpoint, tmp_path, capsys, meta):
    from vitlab.interop import read_weights

    state = load_model(checkpoint).state_dict()
    f = save_weights(state, tmp_path / "w.safetensors", metadata={"vitlab_config": meta})
    with pytest.raises(CheckpointError) as exc:
        read_weights(f)
    assert str(f) in str(exc.value) and "vitlab_config" in str(exc.value) and "\n" not in str(exc.value)
    assert main(["convert", str(f), str(tmp_path / "out.safetensors")]) == 2
    cap = capsys.readouterr()
    assert len(lines(cap.err)) == 1 and "vitlab_config" in cap.err and "Traceback" not in cap.err


def test_eval_on_a_class_folder_whose_name_is_not_utf8(tmp_path, capsys):
    data = write_folder_data(tmp_path / "data", [b"caf\xe9", b"plain"])
    out = tmp_path / "run"
    assert main(["train", "--dataset", "imagefolder", "--data-dir", str(data), "--depth", "1", "--embed-dim", "16",
                 "--num-heads", "2", "--epochs", "1", "--batch-size", "4", "--no-progress", "--output", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out)]) == 0
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and re.search(r"test_acc [\d.]+%", cap.out)
    with Image.open(out / "confusion_matrix.png") as img:
        assert img.format == "PNG"
    assert main(["predict", "--checkpoint", str(out), str(data / "val" / "plain" / "0.png"), "--topk", "2"]) == 0
    cap = capsys.readouterr()
    assert "caf\ufffd (" in cap.out and "plain (" in cap.out and cap.err == ""
