"""Crafted weight files against the converters (``vitlab convert --from vit5``, ``vitlab convert`` of timm weights,
``from_vit5``, ``load_pretrained``): each malformed file is one ``CheckpointError`` line naming the file, the key and
what was expected, exit 2, nothing written, and no model built beyond the meta device (no memory) before the check.
NaN weights are refused unless ``--allow-nonfinite`` / ``allow_nonfinite=True``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import Tensor

import vitlab
from _helpers import cli_error
from oracles.vit5_official import vit5_shape
from vitlab.cli import main
from vitlab.errors import CheckpointError
from vitlab.interop import from_vit5, load_pretrained

D = 24  # embed_dim of the crafted files: 2 heads of 12, 2 blocks, 32x32 images in 16x16 patches, 4 registers


def vit5_state() -> dict[str, Tensor]:
    torch.manual_seed(0)
    model = vit5_shape(img_size=32, embed_dim=D, depth=2, num_heads=2, num_classes=7)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def timm_state() -> dict[str, Tensor]:
    torch.manual_seed(0)
    model = TimmViT(img_size=32, patch_size=16, embed_dim=D, depth=2, num_heads=2, num_classes=7, qk_norm=True,
                    reg_tokens=4)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _deep(s: dict[str, Tensor]) -> None:  # a 5,000-block model named by one block's keys
    s.update({k.replace("blocks.0.", "blocks.4999.", 1): v.clone() for k, v in s.items() if k.startswith("blocks.0.")})


def _pop(key: str) -> Callable[[dict[str, Tensor]], None]:
    return lambda s: s.pop(key)


def _put(key: str, value: Callable[[Tensor], Tensor]) -> Callable[[dict[str, Tensor]], None]:
    return lambda s: s.__setitem__(key, value(s[key]))


# name: (damage, words the message must hold besides the file and "expected")
CASES = {
    "fc1-removed": (_pop("blocks.0.mlp.fc1.weight"), "blocks.0.mlp.fc1.weight"),
    "fc1-removed-later": (_pop("blocks.1.mlp.fc1.weight"), "blocks.1.mlp.fc1.weight"),
    "q-norm-empty": (_put("blocks.0.attn.q_norm.weight", lambda v: torch.ones(0)), "blocks.0.attn.q_norm.weight"),
    "patch-kernel-empty": (_put("patch_embed.proj.weight", lambda v: torch.zeros(0, 1, 7, 7)),
                           "patch_embed.proj.weight"),
    "pos-embed-1d": (_put("pos_embed", lambda v: v.flatten()), "pos_embed"),
    "reg-token-1d": (_put("reg_token", lambda v: v.flatten()), "reg_token"),
    "head-0d": (_put("head.weight", lambda v: torch.tensor(0.5)), "head.weight"),
    "5000-blocks": (_deep, "missing keys blocks.2.* to blocks.4998.*"),
    "integer-weights": (_put("blocks.0.norm1.weight", lambda v: v.to(torch.int32)), "blocks.0.norm1.weight"),
    "nan": (_put("blocks.1.mlp.fc2.weight", lambda v: v.index_fill(0, torch.tensor([3]), math.nan)),
            "blocks.1.mlp.fc2.weight"),
    "inf": (_put("cls_token", lambda v: v.fill_(math.inf)), "cls_token"),
}


def forbid_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, fail the test when a model is built anywhere but on the meta device (shapes only)."""
    from vitlab.models.spec import ModelSpec

    real = ModelSpec.build

    def build(self, *args, **kwargs):
        assert torch.empty(0).device.type == "meta", "a model was allocated before the file was checked"
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ModelSpec, "build", build)


def _refused(capsys: pytest.CaptureFixture, argv: list[str], src: Path, out: Path, needle: str,
             monkeypatch: pytest.MonkeyPatch | None = None) -> str:
    """The CLI's one line for ``argv`` (exit 2) naming ``src`` and ``needle``; no ``out`` written and, with
    ``monkeypatch``, no model allocated on the way."""
    if monkeypatch is not None:
        forbid_builds(monkeypatch)
    msg = cli_error(capsys, argv)
    assert str(src) in msg and needle in msg and "expected" in msg, msg
    assert not out.exists()
    return msg


@pytest.mark.parametrize("case", list(CASES))
def test_a_crafted_vit5_checkpoint_is_one_line_before_any_model(tmp_path, capsys, monkeypatch, case):
    damage, needle = CASES[case]
    state = vit5_state()
    damage(state)
    src, out = tmp_path / "checkpoint.pth", tmp_path / "out.safetensors"
    torch.save({"model": state, "epoch": 3}, src)  # as the authors' main.py saves it
    _refused(capsys, ["convert", "--from", "vit5", str(src), str(out)], src, out, needle, monkeypatch)


@pytest.mark.parametrize("case", list(CASES))
def test_crafted_timm_weights_are_one_line_before_any_model(tmp_path, capsys, monkeypatch, case):
    damage, needle = CASES[case]
    state = timm_state()
    damage(state)
    src, out = tmp_path / "timm.safetensors", tmp_path / "out.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(src))
    _refused(capsys, ["convert", str(src), str(out), "--global-pool", "token"], src, out, needle, monkeypatch)


@pytest.mark.parametrize("layout", ["vit5", "timm"])
def test_a_stride_0_view_is_refused_before_its_values_are_read(tmp_path, capsys, monkeypatch, layout):
    """A .pth can hold a tensor of shape (200000, 24) over 4 bytes (torch.save keeps an expanded view): refused from
    its storage size, before anything allocates its 19 MB (or, at a larger shape, gigabytes)."""
    state = vit5_state() if layout == "vit5" else timm_state()
    state["head.weight"] = torch.zeros(1).expand(200_000, D)
    state["head.bias"] = torch.zeros(1).expand(200_000)
    src, out = tmp_path / "w.pth", tmp_path / "out.safetensors"
    torch.save(state, src)
    argv = ["convert", "--from", "vit5", str(src), str(out)] if layout == "vit5" else [
        "convert", str(src), str(out), "--global-pool", "token"]
    msg = _refused(capsys, argv, src, out, "head.weight of shape (200000, 24) is a view over 4 bytes", monkeypatch)
    assert "19,200,000 bytes" in msg


def test_a_declared_depth_the_keys_do_not_hold_builds_nothing(tmp_path, capsys, monkeypatch):
    """A vitlab export whose vitlab_config says depth 5000 over the weights of 2 blocks."""
    model = vitlab.create_model("vit_mnist", depth=2, embed_dim=16, num_heads=2)
    src, out = tmp_path / "w.safetensors", tmp_path / "out.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src),
              metadata={"format": "vitlab", "vitlab_config": json.dumps(model.cfg.replace(depth=5000).to_dict())})
    msg = _refused(capsys, ["convert", str(src), str(out)], src, out, "missing keys blocks.2.* to blocks.4999.*",
                   monkeypatch)
    assert "the model has depth 5000, the weights hold 2 blocks" in msg


@pytest.mark.parametrize("layout", ["vit5", "timm"])
def test_nonfinite_weights_convert_only_when_asked(tmp_path, capsys, layout):
    state = vit5_state() if layout == "vit5" else timm_state()
    CASES["nan"][0](state)
    src, out = tmp_path / "w.pth", tmp_path / "out.safetensors"
    torch.save(state, src)
    argv = ["convert", "--from", "vit5", str(src), str(out)] if layout == "vit5" else [
        "convert", str(src), str(out), "--global-pool", "token"]
    msg = _refused(capsys, argv, src, out, "blocks.1.mlp.fc2.weight holds 96 non-finite values")
    assert "--allow-nonfinite" in msg
    assert main([*argv, "--allow-nonfinite"]) == 0
    weights = vitlab.load_pretrained(None, out, allow_nonfinite=True).state_dict()["blocks.1.mlp.fc2.weight"]
    assert weights[3].isnan().all() and weights[:3].isfinite().all()
    with pytest.raises(CheckpointError, match=f"{out}: blocks.1.mlp.fc2.weight holds 96 non-finite"):
        vitlab.load_pretrained(None, out)  # the exported file is refused the same way


def test_the_api_refuses_and_allows_the_same(tmp_path):
    state = vit5_state()
    CASES["nan"][0](state)
    with pytest.raises(CheckpointError, match="the state dict: blocks.1.mlp.fc2.weight holds 96 non-finite"):
        from_vit5(state)
    assert from_vit5(state, allow_nonfinite=True).state_dict()["blocks.1.mlp.fc2.weight"][3].isnan().all()
    timm = timm_state()
    CASES["q-norm-empty"][0](timm)
    save_file(timm, str(tmp_path / "t.safetensors"))
    with pytest.raises(CheckpointError, match=r"t.safetensors: blocks.0.attn.q_norm.weight has shape \(0,\)"):
        load_pretrained(None, tmp_path / "t.safetensors", global_pool="token")
    with pytest.raises(vitlab.errors.ConfigError, match="num_heads 0 does not divide"):
        from_vit5(vit5_state(), num_heads=0)


def test_good_files_still_convert(tmp_path):
    """The checks refuse nothing the converters read before: the official layout, timm's, a model passed in."""
    state = vit5_state()
    ours = from_vit5(state).eval()
    theirs = vit5_shape(img_size=32, embed_dim=D, depth=2, num_heads=2, num_classes=7).eval()
    theirs.load_state_dict(state)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-4)
    save_file(timm_state(), str(tmp_path / "t.safetensors"))
    model = load_pretrained(None, tmp_path / "t.safetensors", global_pool="token")
    assert load_pretrained(model, tmp_path / "t.safetensors") is model
