"""Register tokens in the attention maps: hidden by default, drawn and measured per layer on request."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from _helpers import read_rows
from vitlab.analysis import TokenLayout, analyze_model, readout_register_attention
from vitlab.analysis.analyze import NO_REGISTERS
from vitlab.cli import main

SMALL = dict(depth=2, embed_dim=32, num_heads=4)
N = 16  # 28 / 7 = 4 patches a side


def tiny(**kw) -> vitlab.models.VitlabModel:
    torch.manual_seed(0)
    return vitlab.create_model("vit_mnist", **SMALL, **kw).eval()


def direct_register_share(model, x: torch.Tensor, regs: list[int], class_row: bool) -> list[float]:
    """The registers' share of the read row per layer, straight from ``model.attention_maps``."""
    front = model.num_front
    out = []
    with torch.no_grad():
        for a in model.attention_maps(x):
            rows = a[:, :, 0, :] if class_row else a[:, :, front:front + N, :].mean(dim=2)
            out.append(float(rows[..., regs].sum(dim=-1).mean()))
    return out


@pytest.mark.parametrize(("position", "pool", "regs"), [
    ("front", "token", [1, 2]),  # timm: right after the class token
    ("end", "token", [1 + N, 2 + N]),  # ViT-5: after the patches
    ("front", "avg", [0, 1]),  # no class token: the registers lead, the patch rows are read
])
def test_register_share_per_layer_matches_the_attention_rows(tmp_path, position, pool, regs):
    kw = dict(reg_tokens=2, reg_position=position)
    if pool == "avg":
        kw.update(class_token=False, global_pool="avg", pos_embed="learned")
    model = tiny(**kw)
    x = torch.rand(5, 1, 28, 28)
    assert TokenLayout.of(model).registers == regs
    res = analyze_model(model, x, tmp_path / "on", num_show=2, batch_size=3, show_registers=True)
    want = direct_register_share(model, x, regs, class_row=pool == "token")
    got = [d["share"] for d in res.register_attention["layers"]]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert min(want) > 0  # a random model puts some attention on its registers
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["register_attention"]["tokens"] == regs
    assert [d["share"] for d in summary["register_attention"]["layers"]] == pytest.approx(want, rel=1e-5, abs=1e-7)
    rows = read_rows(tmp_path / "on" / "attention_registers.csv")
    assert [float(r["register_share"]) for r in rows] == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert float(rows[0]["register0"]) + float(rows[0]["register1"]) == pytest.approx(want[0], rel=1e-5)
    assert (tmp_path / "on" / "attention_registers.png").stat().st_size > 0
    assert "Register tokens" in (tmp_path / "on" / "index.html").read_text()
    # the patches' share drawn, the registers' share and the class token's own entry make up the whole row
    with torch.no_grad():
        last = model.attention_maps(x)[-1][:2]
    reg = readout_register_attention(last, TokenLayout.of(model))
    assert reg.shape == (2, 4, 2)
    own = last[:, :, 0, 0] if pool == "token" else 0.0
    total = res.cls_attention.sum(dim=(-2, -1)) + reg.sum(dim=-1) + own
    assert torch.allclose(total, torch.ones_like(total), atol=1e-5)


def test_default_hides_the_registers_and_writes_what_it_wrote_before(tmp_path):
    model = tiny(reg_tokens=2, reg_position="end")
    x = torch.rand(4, 1, 28, 28)
    off = analyze_model(model, x, tmp_path / "off", num_show=2)
    on = analyze_model(model, x, tmp_path / "on", num_show=2, show_registers=True)
    assert off.register_attention is None and "register_attention" not in off.summary
    assert not {"attention_registers.png", "attention_registers.csv"} & set(off.files)
    assert set(on.files) - set(off.files) == {"attention_registers.png", "attention_registers.csv"}
    assert torch.equal(off.cls_attention, on.cls_attention)
    for name in ("attention_maps.csv", "probes_layers.csv", "residual_ratios.csv"):
        assert (tmp_path / "off" / name).read_text() == (tmp_path / "on" / name).read_text()
    assert {k: v for k, v in on.summary.items() if k != "register_attention"} == off.summary
    assert "Register tokens" not in (tmp_path / "off" / "index.html").read_text()


def test_a_model_without_registers_draws_nothing_extra(tmp_path):
    res = analyze_model(tiny(), torch.rand(3, 1, 28, 28), tmp_path / "a", num_show=1, show_registers=True)
    assert res.register_attention is None and res.summary["register_attention"] == NO_REGISTERS
    assert not any(name.startswith("attention_registers") for name in res.files)


def test_cli_show_registers(tmp_path, capsys):
    from vitlab.checkpoint import save_checkpoint

    model = tiny(reg_tokens=2, reg_position="front")
    ckpt = save_checkpoint(tmp_path / "ckpt", model, run_config={"dataset": "mnist-5k"})
    out = tmp_path / "analysis"
    rc = main(["analyze", "--checkpoint", str(ckpt), "--output", str(out), "--num-images", "4", "--show", "2",
               "--device", "cpu", "--show-registers"])
    assert rc == 0
    assert (out / "attention_registers.png").stat().st_size > 0
    assert "--show-registers" in (out / "index.html").read_text()
    assert "registers' share per layer: " in capsys.readouterr().out
    plain = save_checkpoint(tmp_path / "plain", tiny(), run_config={"dataset": "mnist-5k"})
    rc = main(["analyze", "--checkpoint", str(plain), "--output", str(tmp_path / "b"), "--num-images", "2",
               "--show", "1", "--device", "cpu", "--show-registers"])
    assert rc == 0 and not (tmp_path / "b" / "attention_registers.png").exists()
    assert capsys.readouterr().out.count(NO_REGISTERS) == 1
