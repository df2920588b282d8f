"""Checkpoints: the files and their contract, exact round trips, architecture checks, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

import vitlab
from _helpers import one_line
from vitlab.atomic import atomic_write_text
from vitlab.checkpoint import (
    FORMAT,
    load_model,
    load_train_state,
    read_config,
    save_checkpoint,
    spec_of,
    state_mismatch,
)
from vitlab.errors import CheckpointError


def tiny_vit(**overrides) -> torch.nn.Module:
    return vitlab.create_model("vit_mnist", **{"depth": 2, "embed_dim": 32, "num_heads": 4, **overrides})


def tiny_timm() -> torch.nn.Module:
    return vitlab.create_model("timm:vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10,
                               embed_dim=32, depth=1, num_heads=2)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_checkpoint_files_and_config_contract(tmp_path):
    model = tiny_vit()
    run = {"dataset": "mnist-5k", "lr": 0.002}
    state = {"step": torch.tensor(7), "epoch": 2, "rng": torch.get_rng_state()}
    out = save_checkpoint(tmp_path / "ck", model, run_config=run, train_state=state)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "manifest.json", "model.safetensors", "state.pt"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "vitlab-manifest/1" and "previous" not in manifest
    for name in ("model.safetensors", "state.pt"):
        data = (out / name).read_bytes()
        assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == FORMAT == "vitlab-checkpoint/1"
    assert config["model"] == model.cfg.to_dict() and config["run"] == run
    assert config["vitlab_version"] == vitlab.__version__
    assert read_config(out) == config == read_config(out / "model.safetensors")
    loaded = load_train_state(out)
    assert loaded["epoch"] == 2 and torch.equal(loaded["rng"], state["rng"]) and int(loaded["step"]) == 7
    assert (out / "config.json").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_without_state_no_state_file(tmp_path):
    out = save_checkpoint(tmp_path, tiny_vit())
    assert not (out / "state.pt").exists()
    with pytest.raises(CheckpointError, match="no state.pt") as exc:
        load_train_state(out)
    one_line(exc)


@pytest.mark.parametrize("builder", [tiny_vit, tiny_timm], ids=["vitlab", "timm"])
def test_round_trip_gives_identical_weights_and_logits(tmp_path, builder):
    model = builder().eval()
    save_checkpoint(tmp_path, model)
    for path in (tmp_path, tmp_path / "model.safetensors"):
        loaded = load_model(path).eval()
        assert type(loaded) is type(model)
        ref, got = model.state_dict(), loaded.state_dict()
        assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
        x = torch.randn(2, 1, 28, 28)
        assert torch.equal(model(x), loaded(x))


def test_timm_spec_is_name_and_kwargs(tmp_path):
    save_checkpoint(tmp_path, tiny_timm())
    spec = read_config(tmp_path)["model"]
    assert spec["timm"] == "vit_tiny_patch16_224"
    assert spec["kwargs"]["img_size"] == 28 and spec["kwargs"]["in_chans"] == 1


def test_overrides_that_keep_the_shapes_load(tmp_path):
    save_checkpoint(tmp_path, tiny_vit(drop_path_rate=0.1))
    assert load_model(tmp_path, drop_path_rate=0.0).cfg.drop_path_rate == 0.0


def test_missing_config_names_the_fix(tmp_path):
    save_checkpoint(tmp_path, tiny_vit())
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError) as exc:
        load_model(tmp_path)
    msg = one_line(exc)
    assert "config.json" in msg and "vitlab train --output" in msg


def test_missing_folder_and_wrong_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as exc:
        load_model(tmp_path / "nope")
    one_line(exc)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not a checkpoint") as exc:
        load_model(other)
    one_line(exc)


def test_checkpoint_of_another_architecture_lists_the_mismatch(tmp_path):
    save_checkpoint(tmp_path, tiny_vit())
    with pytest.raises(CheckpointError) as exc:
        load_model(tmp_path, model="cait_xxs24", depth=2, embed_dim=32, num_heads=4)
    msg = one_line(exc)
    assert "vit (vit_mnist)" in msg and "cait (cait_xxs24)" in msg
    assert "missing keys (blocks.0.attn.proj_l" in msg and "arch 'vit' vs 'cait'" in msg


def test_edited_config_depth_is_refused_with_key_names(tmp_path):
    save_checkpoint(tmp_path, tiny_vit())
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["model"]["depth"] = 3
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"config\.json does not match the SHA-256"):  # under the manifest
        load_model(tmp_path)
    with pytest.raises(CheckpointError, match=r"missing keys \(blocks\.2\.") as exc:
        load_model(tmp_path, verify=False)
    one_line(exc)


def test_shape_mismatch_is_reported(tmp_path):
    save_checkpoint(tmp_path, tiny_vit())
    with pytest.raises(CheckpointError, match="shape mismatches") as exc:
        load_model(tmp_path, num_classes=7)
    assert "head.weight (10, 32) vs (7, 32)" in one_line(exc)


def test_state_mismatch_is_empty_for_equal_layouts():
    a, b = tiny_vit().state_dict(), tiny_vit().state_dict()
    assert state_mismatch(a, b) == ""
    del b["norm.weight"]
    assert state_mismatch(a, b).startswith("1 missing keys (norm.weight)")


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from vitlab import atomic

    first = tiny_vit()
    save_checkpoint(tmp_path, first, run_config={"n": 1})
    real_write = atomic.atomic_write

    def half_then_die(path, write):
        if Path(path).name != "model.safetensors":
            return real_write(path, write)

        def torn(tmp):  # a torn write: the file is cut short, then the process "dies"
            write(tmp)
            os.truncate(tmp, 100)
            raise KeyboardInterrupt

        return real_write(path, torn)

    monkeypatch.setattr(atomic, "atomic_write", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, tiny_vit(), run_config={"n": 2})
    monkeypatch.undo()
    assert leftovers(tmp_path) == []
    loaded = load_model(tmp_path)
    assert all(torch.equal(v, first.state_dict()[k]) for k, v in loaded.state_dict().items())


def test_atomic_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "a.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and leftovers(tmp_path) == []


def test_state_file_with_pickled_objects_is_refused(tmp_path):
    save_checkpoint(tmp_path, tiny_vit(), train_state={"step": 1})
    torch.save({"step": 1, "obj": Path("x")}, tmp_path / "state.pt")  # an arbitrary class: needs unpickling code
    with pytest.raises(CheckpointError, match="cannot be read safely") as exc:
        load_train_state(tmp_path)
    one_line(exc)


def test_damaged_weights_file(tmp_path):
    save_checkpoint(tmp_path, tiny_vit())
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="not a readable safetensors") as exc:
        load_model(tmp_path)
    one_line(exc)


def test_spec_of_unknown_module_is_refused():
    with pytest.raises(CheckpointError, match="cannot describe") as exc:
        spec_of(torch.nn.Linear(2, 2))
    one_line(exc)
