"""The run folder's meaning: ``config.json`` under the manifest's checksum and validated on load, a resume that
continues exactly or refuses (naming the option and both values), and sizes checked before memory is spent (a
model's parameters and activations, data subset before it is resized).

The table in docs/reliability.md ("The run folder's meaning") lists each case with the test that holds it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

import vitlab
from vitlab.checkpoint import load_model, load_train_state, read_config, read_weights
from vitlab.checkpoint.manifest import CheckpointWarning
from vitlab.cli import main
from vitlab.data import datasets as datasets_module
from vitlab.data import load_dataset
from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop import load_pretrained
from vitlab.models import size_limits as budget
from vitlab.train import engine
from vitlab.train.batches import subset
from vitlab.train.config import RunConfig

MODEL = ["--model", "vit_mnist", "--depth", "1", "--embed-dim", "16", "--num-heads", "2"]
RUN = ["--limit-train", "64", "--limit-test", "32", "--batch-size", "16", "--device", "cpu", "--threads", "1",
       "--no-progress"]
TINY_CFG = dict(model="vit_mnist", model_overrides={"depth": 1, "embed_dim": 16, "num_heads": 2}, limit_train=64,
                limit_test=32, batch_size=16, device="cpu", threads=1, progress=False)


def cli_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """Run the CLI in process; assert exit 2 and one stderr line, no traceback; return the message."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.split(": error: ", 1)[1].rstrip("\n")


def hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def copy_of(trained: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


# ------------------------------------------------------------------------------ config.json under the checksum


def test_the_manifest_records_config_json(trained: Path) -> None:
    files = json.loads((trained / "manifest.json").read_text())["files"]
    assert set(files) == {"model.safetensors", "state.pt", "config.json"}
    assert files["config.json"]["sha256"] == hashlib.sha256((trained / "config.json").read_bytes()).hexdigest()


def test_an_edited_num_heads_is_refused_naming_config_json(capsys, tmp_path: Path, trained: Path) -> None:
    out = copy_of(trained, tmp_path)
    edit_config(out, lambda c: c["model"].update(num_heads=1))  # 16 dims: one head of 16, the same weight shapes
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():  # the control: the edit loads and changes what the checkpoint computes
        assert not torch.allclose(load_model(out, verify=False).eval()(x), load_model(trained).eval()(x))
    words = f"{out / 'config.json'} does not match the SHA-256 recorded in {out / 'manifest.json'}"
    for load in (lambda: load_model(out), lambda: read_config(out), lambda: read_weights(out),
                 lambda: load_pretrained(None, out)):
        with pytest.raises(CheckpointError) as info:
            load()
        assert words in str(info.value) and "--no-verify" in str(info.value)
    before = hashes(out)
    for argv in (["eval", "--checkpoint", str(out), "--device", "cpu"],
                 ["predict", "--checkpoint", str(out), "x.png"],
                 ["convert", str(out), str(tmp_path / "c.safetensors")],
                 ["train", "--resume", str(out), "--epochs", "2"]):
        assert words in cli_error(capsys, argv)
    assert hashes(out) == before and not (tmp_path / "c.safetensors").exists()
    assert main(["eval", "--checkpoint", str(out), "--device", "cpu", "--no-verify"]) == 0  # the explicit way out


def test_an_edited_architecture_loaded_unchecked_names_both_files(tmp_path: Path, trained: Path) -> None:
    out = copy_of(trained, tmp_path)
    edit_config(out, lambda c: c["model"].update(depth=2))
    with pytest.raises(CheckpointError, match="config.json does not match the SHA-256"):
        load_model(out)
    with pytest.raises(CheckpointError, match=r"model.safetensors does not fit the vit \(vit_mnist\) model its "
                                              r"config.json describes: 12 missing keys \(blocks\.1\."):
        load_model(out, verify=False)


def _set_data(key: str, value) -> callable:
    return lambda c: c["run"]["data"].update({key: value})


BAD_VALUES = {  # config.json edit: words of the message
    "std-zero": (_set_data("std", [0.0]), "std must be positive finite numbers"),
    "std-negative": (_set_data("std", [-0.3]), "std must be positive finite numbers"),
    "std-not-a-number": (_set_data("std", ["a"]), "std must be positive finite numbers"),
    "mean-per-channel": (_set_data("mean", [0.1, 0.2, 0.3]), "mean must be 1 finite number"),
    "classes-count": (_set_data("classes", ["a", "b"]), "2 class names for a model of 10 classes"),
    "classes-repeated": (_set_data("classes", ["a"] * 10), "class names must be distinct"),
    "classes-not-text": (_set_data("classes", list(range(10))), "class names must be non-empty text"),
    "data-not-a-mapping": (lambda c: c["run"].update(data=[1, 2]), "run.data must be a mapping"),
}


@pytest.mark.parametrize("fault", list(BAD_VALUES))
def test_impossible_values_in_config_json_are_refused_even_unverified(capsys, tmp_path: Path, trained: Path,
                                                                      fault: str) -> None:
    edit, words = BAD_VALUES[fault]
    out = copy_of(trained, tmp_path)
    edit_config(out, edit)
    with pytest.raises(CheckpointError) as info:
        load_model(out, verify=False)
    msg = str(info.value)
    assert words in msg and str(out / "config.json") in msg and "\n" not in msg
    assert words in cli_error(capsys, ["eval", "--checkpoint", str(out), "--device", "cpu", "--no-verify"])
    assert words in cli_error(capsys, ["predict", "--checkpoint", str(out), "--no-verify", "x.png"])


def test_an_older_manifest_without_config_json_loads_with_one_warning(capsys, tmp_path: Path,
                                                                        trained: Path) -> None:
    out = copy_of(trained, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["files"]["config.json"]  # as vitlab wrote it before config.json was checked
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(CheckpointWarning, match=r"config\.json is not in .*manifest\.json, so it is not checked"):
        load_model(out)
    assert main(["eval", "--checkpoint", str(out), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert err.count("config.json is not in") == 1 and "warning" in err and len(err.splitlines()) == 1, err
    edit_config(out, _set_data("std", [0.0]))  # unchecked, but still validated
    with pytest.raises(CheckpointError, match="std must be positive"):
        load_model(out)
    # the next save of a resumed run records config.json
    edit_config(out, _set_data("std", [0.3081]))
    assert main(["train", "--resume", str(out), "--epochs", "2", "--no-verify"]) == 0
    assert "config.json" in json.loads((out / "manifest.json").read_text())["files"]


# -------------------------------------------------------------------------------------- resume: exactly or not


RESUME_CHANGES = {  # flags: words the message must hold (the option, the stored value, the new value)
    "num-heads": (["--num-heads", "1"], ["num_heads", "2", "1"]),
    "global-pool": (["--set", "global_pool=token"], ["global_pool", "'avg'", "'token'"]),
    "mlp-ratio": (["--mlp-ratio", "2"], ["mlp_ratio", "4.0", "2.0"]),
    "pos-embed": (["--set", "pos_embed=sincos2d"], ["pos_embed", "'sincos1d'", "'sincos2d'"]),
    "img-size": (["--img-size", "35"], ["img_size", "28", "35"]),
    "drop-path-rate": (["--set", "drop_path_rate=0.1"], ["drop_path_rate", "0.0", "0.1"]),
    "qk-norm": (["--set", "qk_norm=true"], ["qk_norm", "False", "True"]),
    "model": (["--model", "vit_tiny"], ["vit_tiny"]),
    "dataset": (["--dataset", "mnist"], ["--dataset", "mnist-5k", "mnist"]),
    "degrees": (["--degrees", "5"], ["--degrees", "12.0", "5.0"]),
    "no-augment": (["--no-augment"], ["--degrees", "12.0", "0.0"]),
    "limit-train": (["--limit-train", "32"], ["--limit-train", "64", "32"]),
    "drop-path": (["--drop-path", "0.1"], ["--drop-path", "0.0", "0.1"]),
}


@pytest.mark.parametrize("change", list(RESUME_CHANGES))
def test_a_resume_that_changes_the_model_or_the_data_is_refused(capsys, tmp_path: Path, trained: Path,
                                                                change: str) -> None:
    flags, words = RESUME_CHANGES[change]
    out = copy_of(trained, tmp_path)
    before = hashes(out)
    msg = cli_error(capsys, ["train", "--resume", str(out), "--epochs", "2", *flags])
    assert all(w in msg for w in words), msg
    assert hashes(out) == before  # nothing of the run was written


def test_the_api_resume_compares_the_model_and_the_run(tmp_path: Path, trained: Path) -> None:
    out = copy_of(trained, tmp_path)
    before = hashes(out)
    heads = {**TINY_CFG, "model_overrides": {**TINY_CFG["model_overrides"], "num_heads": 1}}
    with pytest.raises(CheckpointError, match=r"num_heads 2 in the run, 1 now"):
        engine.train(RunConfig(**heads, epochs=2), resume=out)
    with pytest.raises(ConfigError, match=r"lr 0\.002 in the run, 0\.5 now"):
        engine.train(RunConfig(**TINY_CFG, epochs=2, lr=0.5), resume=out)
    assert hashes(out) == before


def test_a_resume_that_repeats_the_stored_options_continues(tmp_path: Path, trained: Path) -> None:
    out = copy_of(trained, tmp_path)
    assert main(["train", "--resume", str(out), "--epochs", "2", *MODEL, "--limit-train", "64"]) == 0
    assert load_train_state(out)["progress"]["epoch"] == 2


# ----------------------------------------------------------------------------------- sizes before memory


def test_a_huge_model_is_refused_before_anything_is_allocated(monkeypatch) -> None:
    from vitlab.models import spec as spec_module

    built = []
    monkeypatch.setattr(spec_module, "ARCHITECTURES", {k: lambda cfg, _k=k: built.append(cfg) or
                                                       pytest.fail("built") for k in spec_module.ARCHITECTURES})
    with pytest.raises(ConfigError) as info:
        vitlab.create_model("vit_mnist", depth=100_000, embed_dim=100_000, num_heads=4)
    msg = str(info.value)
    assert "1.2e+16 parameters" in msg and "budget of 2e+09 parameters" in msg
    assert "allow_large=True" in msg and "VITLAB_ALLOW_LARGE=1" in msg
    with pytest.raises(ConfigError, match=r"activations .* per image"):
        vitlab.create_model("vit_mnist", img_size=4096, patch_size=4)  # a million tokens of 4x4 pixels
    assert built == []


def test_a_checkpoint_of_a_huge_model_is_refused_in_one_line(capsys, tmp_path: Path, trained: Path) -> None:
    out = copy_of(trained, tmp_path)
    edit_config(out, lambda c: c["model"].update(depth=100_000, embed_dim=100_000))
    with pytest.raises(CheckpointError, match=r"cannot rebuild the model of .* 1\.2e\+16 parameters"):
        load_model(out, verify=False)
    for argv in (["eval", "--checkpoint", str(out), "--device", "cpu", "--no-verify"],
                 ["convert", str(out), str(tmp_path / "c.safetensors"), "--no-verify"]):
        assert "VITLAB_ALLOW_LARGE=1" in cli_error(capsys, argv)


def test_the_budget_gives_way_to_the_user_who_means_it(monkeypatch) -> None:
    monkeypatch.setattr(budget, "MAX_PARAMS", 1000)
    with pytest.raises(ConfigError, match="parameters"):
        vitlab.create_model("vit_mnist")
    assert vitlab.create_model("vit_mnist", allow_large=True).cfg.depth == 8
    assert vitlab.create_model("vit_mnist", device="meta").cfg.depth == 8  # shapes only: no memory spent
    monkeypatch.setenv("VITLAB_ALLOW_LARGE", "1")
    vitlab.create_model("vit_mnist")


@pytest.mark.parametrize("preset, overrides", [
    ("vit_tiny", {}), ("vit_mnist", {}), ("cait_xxs24", {}), ("deepvit_s", {}),
    ("vit_tiny", {"mlp": "swiglu", "reg_tokens": 4, "gate": "layerscale", "qk_norm": True}),
    ("vit_tiny", {"attn": "talking_heads", "stem": "conv", "pos_embed": "sincos2d", "class_token": False,
                  "global_pool": "avg"}),
])
def test_the_analytic_parameter_count_is_close(preset: str, overrides: dict) -> None:
    model = vitlab.create_model(preset, device="meta", **overrides)
    exact = sum(p.numel() for p in model.parameters())
    assert abs(budget.param_count(model.cfg) - exact) <= 0.02 * exact, (budget.param_count(model.cfg), exact)


def test_data_is_subset_before_it_is_resized(monkeypatch) -> None:
    sizes = []
    real = datasets_module.prepare_images

    def spy(images, **kw):
        sizes.append(len(images))
        return real(images, **kw)

    monkeypatch.setattr(datasets_module, "prepare_images", spy)
    train, test = load_dataset("mnist-5k", img_size=56, in_chans=1, limit_train=16, limit_test=8)
    assert sizes == [16, 8]
    monkeypatch.setattr(datasets_module, "prepare_images", real)
    full_train, full_test = load_dataset("mnist-5k", img_size=56, in_chans=1)
    assert torch.equal(train.images, subset(full_train, 16).images)  # the same images as subsetting afterwards
    assert torch.equal(test.labels, subset(full_test, 8).labels)


def test_a_training_run_resizes_only_its_subset(tmp_path: Path, monkeypatch) -> None:
    sizes = []
    real = datasets_module.prepare_images
    monkeypatch.setattr(datasets_module, "prepare_images", lambda images, **kw: sizes.append(len(images)) or
                        real(images, **kw))
    assert main(["train", *MODEL, *RUN, "--img-size", "35", "--epochs", "1", "--output", str(tmp_path / "o")]) == 0
    assert sizes == [64, 32]
