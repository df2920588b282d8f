"""Reliability, in process: every bad input ends in one clear line (CLI exit 2, API ValueError with the same
text), no write leaves a half file, a non-finite step never reaches a checkpoint, no loader unpickles code.

The table in docs/reliability.md lists each case with the test that shows it; the real-process faults
(SIGKILL, SIGTERM, torchrun) are in test_faults.py and the generated inputs in test_properties.py.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn

import vitlab
from _helpers import cli_error, option_args, run_args, run_config
from vitlab import atomic as atomic_module
from vitlab.checkpoint import load_model, load_train_state, read_config, save_checkpoint
from vitlab.cli import main
from vitlab.data import load_dataset, load_image
from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.interop import load_pretrained, read_weights, save_weights
from vitlab.train import engine
from vitlab.train.config import RunConfig, load_yaml
from vitlab.train.logging import RunLogger

SMALL = dict(limit_train=64, limit_test=32, batch_size=16, device="cpu", threads=1)
TINY = run_args(model="vit_mnist", depth=1, embed_dim=16, num_heads=2, **SMALL, progress=False)
RUN = option_args(**SMALL, progress=False)  # the run options without the model flags
TINY_CFG = run_config(depth=1, embed_dim=16, num_heads=2, **SMALL)



def api_error(kind: type[VitlabError], fn, *args, **kwargs) -> str:
    with pytest.raises(kind) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ------------------------------------------------------------------------------------------- models

MODEL_CASES = [  # (ModelConfig overrides of vit_mnist, words of the message that name problem and fix)
    ({"num_heads": 3}, "num_heads 3 does not divide embed_dim 64; pick num_heads from"),
    ({"img_size": 30}, "img_size 30 is not a multiple of patch_size 7; use img_size 28 or 35"),
    ({"img_size": 0}, "img_size must be a positive integer, got 0"),
    ({"patch_size": -7}, "patch_size must be a positive integer, got -7"),
    ({"depth": 0}, "depth must be a positive integer"),
    ({"embed_dim": -64}, "embed_dim must be a positive integer"),
    ({"num_classes": -1}, "num_classes must be an integer >= 0"),
    ({"mlp_ratio": 0.001}, "gives an MLP with no hidden units at embed_dim 64; use mlp_ratio >="),
    ({"drop_path_rate": 1.0}, "drop_path_rate must be in [0, 1)"),
    ({"gate": "layerscal"}, "unknown gate 'layerscal' (did you mean 'layerscale'?)"),
    ({"attn": "reattention", "rope": True}, "RoPE is not supported with attn='reattention'; use attn='mhsa'"),
    ({"rope": True, "num_heads": 32}, "RoPE needs a head dim divisible by 4, got 2; change embed_dim/num_heads"),
    ({"class_token": False}, "global_pool='token' needs a class token; set class_token=True or global_pool='avg'"),
    ({"stem": "conv"}, "stem='conv' needs an even patch_size, got 7"),
    ({"pos_embed": "sincos2d", "embed_dim": 66, "num_heads": 2}, "pos_embed='sincos2d' needs embed_dim divisible by 4"),
    ({"rope_theta": 0.0, "rope": True}, "rope_theta and reg_rope_theta must be > 0"),
    ({"depth": "8"}, "depth must be an integer, got '8'"),
    ({"depth": 2.5}, "depth must be an integer, got 2.5"),
    ({"qkv_bias": "yes"}, "qkv_bias must be true or false"),
    ({"drop_rate": float("nan")}, "drop_rate must be a finite number"),
    ({"dept": 4}, "unknown model option 'dept' (did you mean depth?)"),
]


@pytest.mark.parametrize("overrides, words", MODEL_CASES,
                         ids=[",".join(f"{k}={v}" for k, v in c[0].items()) for c in MODEL_CASES])
def test_bad_model_options_one_line_api_and_cli(capsys, tmp_path, overrides: dict, words: str) -> None:
    api = api_error(ConfigError, vitlab.create_model, "vit_mnist", **overrides)
    assert words in api
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v).replace('NaN', '.nan')}")]
    argv = ["train", "--model", "vit_mnist", *RUN, *sets, "--output", str(tmp_path / "o")]
    assert cli_error(capsys, argv) == api
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_cait_options_that_do_not_combine() -> None:
    assert "keep class_token=True" in api_error(ConfigError, vitlab.create_model, "cait_xxs24", class_token=False)
    assert "set pos_embed_cls=False" in api_error(ConfigError, vitlab.create_model, "cait_xxs24", pos_embed_cls=True)
    assert "no registers" in api_error(ConfigError, vitlab.create_model, "cait_xxs24", reg_tokens=1)
    msg = api_error(ConfigError, vitlab.create_model, "cait_xxs24", depth_token_only=0)
    assert "depth_token_only >= 1 or global_pool='avg'" in msg
    vitlab.get_config("cait_xxs24", depth_token_only=0, global_pool="avg")  # that combination is fine


def test_unknown_preset_api_and_cli_say_the_same(capsys) -> None:
    api = api_error(ConfigError, vitlab.create_model, "vit_tiy")
    assert "unknown model 'vit_tiy'; did you mean vit_tiny" in api and "`vitlab models`" in api
    assert cli_error(capsys, ["flops", "vit_tiy"]) == api
    assert cli_error(capsys, ["flops", "vit_mnist", "--img-size", "30"]) == api_error(
        ConfigError, vitlab.create_model, "vit_mnist", img_size=30)


def test_wrong_input_shape_at_forward() -> None:
    model = vitlab.create_model("vit_mnist", depth=1)
    msg = api_error(ConfigError, model, torch.zeros(1, 3, 28, 28))
    assert "expected images of shape (B, 1, 28, 28)" in msg and "create the model with matching" in msg


# ---------------------------------------------------------------------------------------------- data

IDX = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
       "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def idx_bytes(array: np.ndarray) -> bytes:
    return struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


@pytest.fixture
def mnist_dir(tmp_path: Path) -> Path:
    """A valid MNIST-format folder (four .gz idx files, 32 train / 16 test digits)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "mnist"
    folder.mkdir()
    for split, n in (("train", 32), ("test", 16)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        (folder / f"{IDX[split + '_images']}.gz").write_bytes(gzip.compress(idx_bytes(images)))
        (folder / f"{IDX[split + '_labels']}.gz").write_bytes(gzip.compress(idx_bytes(labels)))
    return folder


def _rewrite(folder: Path, role: str, change) -> None:
    path = folder / f"{IDX[role]}.gz"
    path.write_bytes(change(path.read_bytes()))


IDX_FAULTS = {  # name: (change to the folder, words of the message)
    "wrong-magic": (lambda d: _rewrite(d, "train_images", lambda b: gzip.compress(
        b"\x00\x00\x08\x01" + gzip.decompress(b)[4:])), "wrong magic number 0x00000801; expected an idx3 image file"),
    "truncated-idx": (lambda d: _rewrite(d, "test_images", lambda b: gzip.compress(gzip.decompress(b)[:-100])),
                      "is truncated: shape (16, 28, 28) needs 12544 data bytes but only 12444"),
    "truncated-gzip": (lambda d: _rewrite(d, "train_labels", lambda b: b[: len(b) // 2]),
                       "is a damaged or truncated gzip file"),
    "trailing-bytes": (lambda d: _rewrite(d, "test_labels", lambda b: gzip.compress(gzip.decompress(b) + b"xx")),
                       "has 2 bytes beyond its declared shape"),
    "count-mismatch": (lambda d: _rewrite(d, "train_labels", lambda b: gzip.compress(idx_bytes(
        np.zeros(31, np.uint8)))), "has 32 images but"),
    "label-range": (lambda d: _rewrite(d, "test_labels", lambda b: gzip.compress(idx_bytes(
        np.full(16, 12, np.uint8)))), "holds label 12, but mnist has 10 classes"),
    "missing-file": (lambda d: (d / f"{IDX['test_labels']}.gz").unlink(), "was not found under"),
}


@pytest.mark.parametrize("fault", list(IDX_FAULTS))
def test_damaged_mnist_folder_one_line_api_and_cli(capsys, tmp_path, mnist_dir: Path, fault: str) -> None:
    train, test = load_dataset("mnist", data_dir=mnist_dir, img_size=28, in_chans=1, download=False)
    assert len(train) == 32 and len(test) == 16  # the intact folder loads: the fault below is what is refused
    change, words = IDX_FAULTS[fault]
    change(mnist_dir)
    api = api_error(DataError, load_dataset, "mnist", data_dir=mnist_dir, img_size=28, in_chans=1,
                    download=False)
    assert words in api and ("replace it with the original" in api or "pass --data-dir" in api
                             or "use the matching" in api)
    cli = cli_error(capsys, ["train", *TINY, "--dataset", "mnist", "--data-dir", str(mnist_dir), "--no-download",
                             "--output", str(tmp_path / "o")])
    assert cli == api and not (tmp_path / "o").exists()


def _image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / split / cls / "a.png")
    return root


def _empty_class(root: Path) -> None:
    (root / "val" / "dog" / "a.png").unlink()


IMAGEFOLDER_FAULTS = {
    "empty-class": (_empty_class, "class folder {r}/val/dog holds no images"),
    "unreadable-image": (lambda r: (r / "train" / "cat" / "a.png").write_bytes(b"not a png"),
                         "{r}/train/cat/a.png is not a readable image; remove it or replace it"),
    "truncated-image": (lambda r: _truncate(r / "train" / "dog" / "a.png", 0.5),
                        "cannot read image {r}/train/dog/a.png"),
    "no-train": (lambda r: shutil.rmtree(r / "train"), "image folder {r}/train does not exist; arrange the images"),
    "extra-val-class": (lambda r: shutil.copytree(r / "val" / "cat", r / "val" / "cow"),
                        "class folder {r}/val/cow has no counterpart in {r}/train"),
}


@pytest.mark.parametrize("fault", list(IMAGEFOLDER_FAULTS))
def test_damaged_image_folder_one_line_api_and_cli(capsys, tmp_path, fault: str) -> None:
    root = _image_folder(tmp_path / "images")
    train, _ = load_dataset("imagefolder", data_dir=root, img_size=8, in_chans=3)
    assert train.classes == ["cat", "dog"]
    change, words = IMAGEFOLDER_FAULTS[fault]
    change(root)
    api = api_error(DataError, load_dataset, "imagefolder", data_dir=root, img_size=8, in_chans=3)
    assert words.format(r=root) in api
    cli = cli_error(capsys, ["train", *TINY, "--dataset", "imagefolder", "--data-dir", str(root),
                             "--batch-size", "1", "--output", str(tmp_path / "o")])  # the plan fits the 2 images
    assert cli == api


def test_unknown_dataset_and_missing_folder(capsys, tmp_path) -> None:
    api = api_error(DataError, load_dataset, "mnits", img_size=28, in_chans=1)
    assert "unknown data set 'mnits'; choose one of" in api
    assert cli_error(capsys, ["train", *TINY, "--dataset", "mnits", "--output", str(tmp_path / "o")]) == api
    msg = cli_error(capsys, ["train", *TINY, "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere"),
                             "--output", str(tmp_path / "o")])
    assert "does not exist; pass --data-dir an existing folder" in msg
    assert "image file" in api_error(DataError, load_image, tmp_path / "x.png", img_size=8, in_chans=1)


# ---------------------------------------------------------------------------------------------- YAML

YAML_FAULTS = {
    "syntax": (b"epochs: [1, 2\nlr: 0.1\n", "is not valid YAML"),
    "not-a-mapping": (b"- 1\n- 2\n", "must hold a mapping of options (key: value), got list"),
    "unknown-key": (b"epoch: 3\n", "unknown option 'epoch' (did you mean epochs?)"),
    "wrong-type": (b"epochs: three\n", "epochs must be int, got 'three'"),
    "not-finite": (b"lr: .nan\n", "lr must be a finite number"),
    "binary": (b"\xff\xfe\x00\x81garbage", "cannot be read as UTF-8 text"),
    "bad-model-option": (b"model_overrides: {num_heads: 5}\n", "num_heads 5 does not divide embed_dim"),
}


@pytest.mark.parametrize("fault", list(YAML_FAULTS))
def test_bad_yaml_config_one_line(capsys, tmp_path, fault: str) -> None:
    data, words = YAML_FAULTS[fault]
    path = tmp_path / "run.yaml"
    path.write_bytes(data)
    msg = cli_error(capsys, ["train", "--config", str(path), "--no-progress", "--output", str(tmp_path / "o")])
    assert words in msg
    if fault != "bad-model-option":
        assert msg == api_error(ConfigError, load_yaml, path) and str(path) in msg
    assert not (tmp_path / "o").exists()


def test_yaml_cannot_run_code(capsys, tmp_path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "run.yaml"
    path.write_text(f'epochs: !!python/object/apply:os.system ["touch {marker}"]\n')
    assert "is not valid YAML" in cli_error(capsys, ["train", "--config", str(path)])
    assert not marker.exists()


OUT_OF_RANGE = {  # flags: the words of the one-line message (each names the allowed range)
    "--lr 3e38": "lr must be in (0, 10], got 3e+38; fix --lr",
    "--weight-decay 50": "weight_decay must be in [0, 10), got 50",
    "--epochs 1000000": "epochs must be in [1, 100000], got 1000000",
    "--batch-size 0": "batch_size must be in [1, 1000000], got 0",
    "--degrees 720": "degrees must be in [0, 180], got 720",
    "--scale 0.5 50": "scale must be in (0, 10], got 50",
    "--erase-prob 2": "erase_prob must be in [0, 1], got 2",
    "--mixup 1e9": "mixup must be in [0, 100], got 1000000000",
}


@pytest.mark.parametrize("flags", list(OUT_OF_RANGE))
def test_a_number_out_of_range_is_refused_before_any_data_is_read(capsys, tmp_path, flags: str) -> None:
    empty = tmp_path / "no-data"  # loading data from here would fail: the range check must come first
    empty.mkdir()
    out = tmp_path / "o"
    argv = ["train", *TINY, *flags.split(), "--dataset", "mnist", "--data-dir", str(empty), "--no-download",
            "--output", str(out)]
    assert OUT_OF_RANGE[flags] in cli_error(capsys, argv)
    assert not out.exists()


def test_a_number_out_of_range_in_yaml_is_refused(capsys, tmp_path) -> None:
    (tmp_path / "run.yaml").write_text("lr: 3e38\n")
    assert "lr must be in (0, 10], got 3e+38" in cli_error(capsys, ["train", "--config", str(tmp_path / "run.yaml")])


# --------------------------------------------------------------------------------------- checkpoints

def damaged(trained: Path, tmp_path: Path, change) -> Path:
    out = tmp_path / "ck"
    shutil.copytree(trained, out)
    change(out)
    return out


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _edit_config(d: Path, edit) -> None:
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


CHECKPOINT_FAULTS = {  # name: (damage, words of the message of load_model / `vitlab eval`)
    "truncated-weights": (lambda d: _truncate(d / "model.safetensors", 0.5), "is not a readable safetensors file"),
    "corrupt-weights-header": (lambda d: (d / "model.safetensors").write_bytes(
        b"\xff" * 8 + (d / "model.safetensors").read_bytes()[8:]), "is not a readable safetensors file"),
    "random-bytes": (lambda d: (d / "model.safetensors").write_bytes(os.urandom(300)), "re-save it"),
    "missing-weights": (lambda d: (d / "model.safetensors").unlink(), "has no model.safetensors"),
    "missing-config": (lambda d: (d / "config.json").unlink(), "has no config.json, so its architecture is unknown"),
    "config-not-json": (lambda d: (d / "config.json").write_text("{'model':"), "is not valid JSON"),
    "config-other-format": (lambda d: _edit_config(d, lambda c: c.update(format="other/9")),
                            "is not a vitlab-checkpoint/1 config"),
    "config-impossible-model": (lambda d: _edit_config(d, lambda c: c["model"].update(num_heads=3)),
                                "num_heads 3 does not divide embed_dim 16"),
    "config-other-architecture": (lambda d: _edit_config(d, lambda c: c["model"].update(depth=2)),
                                  "config.json does not match the SHA-256 recorded in"),  # unchecked: "does not fit"
}


@pytest.mark.parametrize("fault", list(CHECKPOINT_FAULTS))
def test_damaged_checkpoint_one_line_api_and_cli(capsys, tmp_path, trained: Path, fault: str) -> None:
    change, words = CHECKPOINT_FAULTS[fault]
    out = damaged(trained, tmp_path, change)
    api = api_error(CheckpointError, load_model, out)
    assert words in api and str(out) in api
    cli = cli_error(capsys, ["eval", "--checkpoint", str(out), "--device", "cpu"])
    assert words in cli
    if fault != "config-other-format":  # interop reads the model config whatever the format tag says
        api_error(VitlabError, load_pretrained, None, out)  # the second loader of checkpoint folders


def test_checkpoint_of_another_architecture_names_both(capsys, trained: Path) -> None:
    api = api_error(CheckpointError, load_model, trained, model="vit_tiny")
    assert "holds a vit (vit_mnist) model but a vit (vit_tiny) model was asked for" in api
    assert "embed_dim 16 vs 192" in api and "pass the matching --model" in api
    assert cli_error(capsys, ["eval", "--checkpoint", str(trained), "--model", "vit_tiny", "--device", "cpu"]) == api
    msg = cli_error(capsys, ["train", "--resume", str(trained), "--embed-dim", "32", "--epochs", "2"])
    assert f"cannot resume {trained}" in msg and "start a new run" in msg


@pytest.mark.parametrize("fault", ["truncated", "missing", "garbage"])
def test_damaged_training_state_refuses_resume(capsys, tmp_path, trained: Path, fault: str) -> None:
    change = {"truncated": lambda d: _truncate(d / "state.pt", 0.6), "missing": lambda d: (d / "state.pt").unlink(),
              "garbage": lambda d: (d / "state.pt").write_bytes(b"PK\x03\x04" + os.urandom(200))}[fault]
    out = damaged(trained, tmp_path, change)
    api = api_error(CheckpointError, load_train_state, out)
    assert "start a new run" in api
    assert cli_error(capsys, ["train", "--resume", str(out), "--epochs", "2"]) == api
    load_model(out)  # the weights themselves are still usable


# --------------------------------------------------------------------------------------- checksums

def _flip_last_byte(path: Path) -> None:
    """Flip one bit of the last byte of a safetensors file: tensor data, so the file still parses."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_the_weights_is_refused_in_one_line(capsys, tmp_path, trained: Path) -> None:
    out = damaged(trained, tmp_path, lambda d: _flip_last_byte(d / "model.safetensors"))
    edited = load_model(out, verify=False)  # the control: the damaged file parses, one value differs
    good = load_model(trained)
    diff = [k for k, v in edited.state_dict().items() if not torch.equal(v, good.state_dict()[k])]
    assert len(diff) == 1
    words = f"{out / 'model.safetensors'} does not match the SHA-256 recorded in {out / 'manifest.json'}"
    for load in (lambda: load_model(out), lambda: read_weights(out), lambda: load_pretrained(None, out),
                 lambda: read_weights(out / "model.safetensors")):
        msg = api_error(CheckpointError, load)
        assert words in msg and "--no-verify" in msg
    for argv in (["eval", "--checkpoint", str(out), "--device", "cpu"],
                 ["predict", "--checkpoint", str(out), "x.png"],
                 ["analyze", "--checkpoint", str(out), "--output", str(tmp_path / "a")],
                 ["convert", str(out), str(tmp_path / "c.safetensors")]):
        assert words in cli_error(capsys, argv)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c.safetensors").exists()
    assert main(["eval", "--checkpoint", str(out), "--device", "cpu", "--no-verify"]) == 0
    assert main(["convert", str(out), str(tmp_path / "c.safetensors"), "--no-verify"]) == 0


def test_a_changed_training_state_is_refused_on_resume(capsys, tmp_path, trained: Path) -> None:
    def edit_state(d: Path) -> None:  # a well-formed state.pt of other content (another run's, or edited)
        state = torch.load(d / "state.pt", weights_only=True)
        state["progress"]["best_test_acc"] = 0.99
        torch.save(state, d / "state.pt")

    out = damaged(trained, tmp_path, edit_state)
    msg = api_error(CheckpointError, load_train_state, out)
    assert f"{out / 'state.pt'} does not match the SHA-256" in msg and "--no-verify" in msg
    assert cli_error(capsys, ["train", "--resume", str(out), "--epochs", "2"]) == msg
    load_model(out)  # the weights are whole
    assert load_train_state(out, verify=False)["progress"]["best_test_acc"] == 0.99
    assert main(["train", "--resume", str(out), "--epochs", "2", "--no-verify"]) == 0
    assert load_train_state(out)["progress"]["epoch"] == 2  # the next save records the new state


def test_without_a_manifest_files_load_as_before_and_a_damaged_manifest_is_named(capsys, tmp_path,
                                                                                 trained: Path) -> None:
    out = damaged(trained, tmp_path, lambda d: (d / "manifest.json").unlink())
    load_model(out)
    load_train_state(out)  # timm-style folders and checkpoints of older vitlab versions carry no manifest
    (out / "manifest.json").write_text('{"format": "vitlab-manifest/1", "files": ')
    msg = api_error(CheckpointError, load_model, out)
    assert f"{out / 'manifest.json'} is damaged" in msg and "--no-verify" in msg
    assert cli_error(capsys, ["eval", "--checkpoint", str(out), "--device", "cpu"]) == msg
    load_model(out, verify=False)


# ----------------------------------------------------------------------------------- untrusted pickles

class Payload:
    """Unpickling this runs ``touch MARKER`` (what an attacker's checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def payload_file(path: Path, marker: Path, kind: str) -> Path:
    obj = {"model": {"patch_embed.proj.weight": torch.zeros(1)}, "evil": Payload(marker)}
    if kind == "zip":
        torch.save(obj, path)
    elif kind == "legacy":
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(obj))
    return path


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("kind", ["zip", "legacy", "raw-pickle"])
def test_a_crafted_pickle_is_refused_by_every_loader(capsys, tmp_path, trained: Path, kind: str) -> None:
    control = tmp_path / "control"
    with contextlib.suppress(Exception):  # torch's legacy reader complains after unpickling a raw pickle
        torch.load(payload_file(tmp_path / "control.pth", control, kind), weights_only=False)
    assert control.exists()  # the payload is live: plain unpickling runs it
    marker = tmp_path / "pwned"
    weights = payload_file(tmp_path / "weights.pth", marker, kind)
    state_dir = damaged(trained, tmp_path, lambda d: payload_file(d / "state.pt", marker, kind))
    for load in (lambda: read_weights(weights), lambda: load_pretrained(None, weights),
                 lambda: load_pretrained("vit_mnist", weights), lambda: load_train_state(state_dir)):
        msg = api_error(CheckpointError, load)
        assert "cannot be read with weights_only=True" in msg or "cannot be read safely" in msg
    assert "cannot be read" in cli_error(capsys, ["convert", str(weights), str(tmp_path / "out.safetensors")])
    assert "cannot be read safely" in cli_error(capsys, ["train", "--resume", str(state_dir), "--epochs", "2"])
    assert not marker.exists() and not (tmp_path / "out.safetensors").exists()


def _torch_bytes(legacy: bool) -> bytes:
    buf = io.BytesIO()
    torch.save({"patch_embed.proj.weight": torch.zeros(2, 1, 7, 7)}, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


TORCH_FILE_FAULTS = {  # damaged .pth files that made torch.load raise IndexError, struct.error, OSError...
    "empty": lambda: b"",
    "legacy-cut-1": lambda: _torch_bytes(True)[:1],
    "legacy-cut-18": lambda: _torch_bytes(True)[:18],
    "legacy-flip-2": lambda: bytes([b ^ 0xFF if i == 2 else b for i, b in enumerate(_torch_bytes(True))]),
    "zip-flip-28": lambda: bytes([b ^ 0xFF if i == 28 else b for i, b in enumerate(_torch_bytes(False))]),
    "zip-half": lambda: _torch_bytes(False)[:400],
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("fault", list(TORCH_FILE_FAULTS))
def test_damaged_torch_files_raise_checkpoint_error(capsys, tmp_path, fault: str) -> None:
    path = tmp_path / "weights.pth"
    path.write_bytes(TORCH_FILE_FAULTS[fault]())
    assert "cannot be read with weights_only=True" in api_error(CheckpointError, read_weights, path)
    assert "cannot be read" in cli_error(capsys, ["convert", str(path), str(tmp_path / "out.safetensors")])
    (tmp_path / "state.pt").write_bytes(path.read_bytes())
    assert "cannot be read safely" in api_error(CheckpointError, load_train_state, tmp_path)


# ------------------------------------------------------------------------------------ atomic writes

def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, trained: Path, monkeypatch) -> None:
    out = damaged(trained, tmp_path, lambda d: None)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real_write = atomic_module.atomic_write

    def half_then_die(path, write):
        if Path(path).name != "model.safetensors":
            return real_write(path, write)

        def torn(tmp):
            Path(tmp).write_bytes(b"\x00" * 1000)  # half a file on disk when the process is interrupted
            raise KeyboardInterrupt

        return real_write(path, torn)

    monkeypatch.setattr(atomic_module, "atomic_write", half_then_die)
    model = vitlab.create_model("vit_mnist", depth=1, embed_dim=16, num_heads=2)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(out, model, run_config={"x": 1}, train_state={"progress": {"epoch": 9}})
    assert leftovers(out) == []
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after["model.safetensors"] == before["model.safetensors"]
    assert after["config.json"] == before["config.json"]
    load_model(out)
    load_train_state(out)  # state.pt is either the old or the new one, whole


def test_stale_temporaries_of_a_killed_write_are_removed(tmp_path, trained: Path) -> None:
    out = damaged(trained, tmp_path, lambda d: None)
    stale = [out / ".model.safetensors.abc123.tmp", out / ".state.pt.x.tmp", out / ".config.json.y.tmp"]
    for p in stale:
        p.write_bytes(b"half")
    save_checkpoint(out, load_model(out), run_config=read_config(out)["run"])
    assert leftovers(out) == []


def test_a_torn_metrics_line_from_a_kill_is_dropped_on_resume(tmp_path, trained: Path) -> None:
    """Also: a copied run resumes in the copy; the folder it was first written to is not touched."""
    from vitlab.train.logging import read_metrics

    original = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    out = damaged(trained, tmp_path, lambda d: None)
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"epoch": 2, "train_loss": 2.2')  # killed in the middle of appending epoch 2's row
    assert [r["epoch"] for r in read_metrics(out)] == [1]
    assert main(["train", "--resume", str(out), "--epochs", "2"]) == 0
    assert [r["epoch"] for r in read_metrics(out)] == [1, 2] and load_train_state(out)["progress"]["epoch"] == 2
    assert all(line.endswith("}") for line in (out / "metrics.jsonl").read_text().splitlines())
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == original


def _disk_full(*args, **kwargs) -> None:
    raise OSError("disk full")


def test_a_failed_summary_write_keeps_the_previous_summary(tmp_path, monkeypatch) -> None:
    logger = RunLogger(tmp_path, progress=False)
    logger.write_summary({"ok": 1})
    monkeypatch.setattr(atomic_module.os, "fsync", _disk_full)  # the new text is in the temporary file, unsynced
    with pytest.raises(OSError, match="disk full"):
        logger.write_summary({"ok": 2})
    monkeypatch.undo()
    logger.close()
    assert json.loads((tmp_path / "summary.json").read_text()) == {"ok": 1} and leftovers(tmp_path) == []


def test_a_failed_weights_export_keeps_the_previous_file(tmp_path, monkeypatch) -> None:
    import safetensors.torch

    target = tmp_path / "w.safetensors"
    save_weights({"a": torch.ones(3)}, target)

    def half_then_fail(tensors, filename, metadata=None) -> None:
        Path(filename).write_bytes(b"\x08\x00")
        _disk_full()

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_weights({"a": torch.zeros(3)}, target)
    assert torch.equal(load_file(str(target))["a"], torch.ones(3)) and leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------- a full disk

FULL_RUN = [*TINY, "--epochs", "1", "--checkpoint-every", "2", "--seed", "3"]  # saves after steps 2, 4 and epoch 1


@pytest.fixture(scope="module")
def full_run_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    assert main(["train", *FULL_RUN, "--output", str(out)]) == 0
    return out


def fill_disk_at(monkeypatch, name: str, nth: int) -> None:
    """From the ``nth`` fsync of a file called ``name`` (or its temporary) on, every fsync fails with ENOSPC, as
    on a disk that filled up while the data sat in the page cache."""
    real_fsync, seen = os.fsync, {"n": 0, "full": False}

    def fsync(fd: int) -> None:
        target = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        if target == name or target.startswith(f".{name}."):
            seen["n"] += 1
            seen["full"] |= seen["n"] >= nth
        if seen["full"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


FULL_DISK = {  # the write that finds the disk full: (file name, its n-th fsync)
    "first-state": ("state.pt", 1),  # no checkpoint complete yet: the run starts again
    "second-weights": ("model.safetensors", 2),  # state.pt of step 4 in place, the weights still of step 2
    "manifest-commit": ("manifest.json", 4),  # every file of step 4 in place, the manifest still says "previous"
    "metrics-row": ("metrics.jsonl", 2),  # the epoch's row (the first fsync is the rewrite at the start)
    "summary": ("summary.json", 1),
}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
@pytest.mark.parametrize("case", list(FULL_DISK))
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_folder_consistent(
        capsys, tmp_path, monkeypatch, full_run_reference: Path, case: str) -> None:
    from vitlab.checkpoint.manifest import read_manifest, verify
    from vitlab.train.logging import read_metrics

    out = tmp_path / "run"
    fill_disk_at(monkeypatch, *FULL_DISK[case])
    msg = cli_error(capsys, ["train", *FULL_RUN, "--output", str(out)])
    monkeypatch.undo()  # space was freed
    assert msg.startswith("cannot write ") and f" in {out} (No space left on device): it needs about " in msg
    assert " MB is free there; free some space there" in msg
    saved = (out / "config.json").is_file()
    assert (f"then continue with --resume {out}" if saved else "then start the run again (no checkpoint yet)") in msg
    assert saved == (case != "first-state") and leftovers(out) == []
    assert all(line.endswith("}") for line in (out / "metrics.jsonl").read_text().splitlines())
    if saved:  # the folder is consistent: every file its manifest lists verifies, the checkpoint loads
        for name in read_manifest(out)["files"]:
            verify(out / name)
        load_model(out)
        load_train_state(out)
        assert main(["train", "--resume", str(out)]) == 0
    else:
        assert main(["train", *FULL_RUN, "--output", str(out)]) == 0
    for a, b in ((load_file(str(out / "model.safetensors")), load_file(str(full_run_reference / "model.safetensors"))),
                 (load_train_state(out)["model"], load_train_state(full_run_reference)["model"])):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["epoch"] for r in read_metrics(out)] == [1]
    assert json.loads((out / "summary.json").read_text())["steps"] == 4


# --------------------------------------------------------------------------------- numerical faults

class _NanGrad(torch.autograd.Function):
    """Identity forward, NaN gradient: a finite loss whose backward overflows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


def poison_step(monkeypatch, at: int, kind: str) -> None:
    """Make the training loss of global step ``at`` NaN (``loss``) or its gradients NaN (``grad``)."""
    make = engine.Trainer._criterion
    calls = []

    def criterion(self) -> nn.Module:
        base = make(self)

        class Poisoned(nn.Module):
            def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                calls.append(1)
                loss = base(logits, target)
                if len(calls) == at:
                    return loss * float("nan") if kind == "loss" else _NanGrad.apply(loss)
                return loss

        return Poisoned()

    monkeypatch.setattr(engine.Trainer, "_criterion", criterion)


def finite(out: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(str(out / "model.safetensors")).values()) and all(
        torch.isfinite(t).all() for t in load_train_state(out)["model"].values())


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_a_non_finite_step_stops_the_run_and_keeps_the_last_good_checkpoint(capsys, tmp_path, monkeypatch,
                                                                          kind: str) -> None:
    out = tmp_path / "o"
    poison_step(monkeypatch, 7, kind)  # epoch 2, step 3; checkpoints after steps 3, 4 (epoch end) and 6
    msg = cli_error(capsys, ["train", *TINY, "--epochs", "3", "--checkpoint-every", "3", "--clip-grad", "0",
                             "--output", str(out)])
    assert "at epoch 2 step 3 (global step 7)" in msg
    assert ("non-finite loss (nan)" if kind == "loss" else "non-finite gradient norm (loss ") in msg
    assert "likely a learning rate too high" in msg and "try --clip-grad 1.0" in msg
    assert f"the last good checkpoint in {out} is kept" in msg and "--skip-nonfinite" in msg
    assert load_train_state(out)["progress"]["global_step"] == 6 and finite(out)


def test_skip_nonfinite_skips_the_bad_step_and_finishes(tmp_path, monkeypatch) -> None:
    out = tmp_path / "o"
    poison_step(monkeypatch, 5, "grad")
    result = engine.train(RunConfig(**TINY_CFG, epochs=2, skip_nonfinite=True, clip_grad=0.0, output=str(out)))
    assert result.exit_code == 0 and result.summary["skipped_steps"] == 1 and result.summary["steps"] == 8
    assert finite(out)
