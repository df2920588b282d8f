"""LayerScale in one form: every block's gates are the modules ``ls1``/``ls2``; timm's CaiT names (``gamma_1``/
``gamma_2``) are a key map at the timm boundary, and vitlab checkpoints saved under those names still load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from timm.models.cait import Cait as TimmCait
from timm.utils import ModelEmaV3

import vitlab
from vitlab import flops
from vitlab.checkpoint import MANIFEST, WEIGHTS, load_model, save_checkpoint, weights_of
from vitlab.checkpoint.legacy import rename_legacy_keys
from vitlab.checkpoint.manifest import file_entry
from vitlab.interop.timm_convert import from_timm_state_dict, to_timm, to_timm_state_dict
from vitlab.layers import LayerScale
from vitlab.train.optim import WarmupCosine, build_optimizer
from vitlab.train.progress import Progress

TINY = dict(img_size=32, patch_size=8, embed_dim=32, num_heads=4, num_classes=10, depth=1, depth_token_only=1)


def _old_name(name: str) -> str:
    """A parameter name as vitlab's CaiT had it when its LayerScale gammas were block parameters."""
    return re.sub(r"^(blocks|blocks_token_only)\.(\d+)\.ls([12])\.gamma$", r"\1.\2.gamma_\3", name)


def _cait(**kw) -> torch.nn.Module:
    model = vitlab.create_model("cait_xxs24", **{**TINY, **kw})
    with torch.no_grad():  # distinct gammas, so a swapped gamma_1/gamma_2 changes the logits
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


# the parameter order of vitlab's CaiT before its gates became modules (the optimiser state of a run saved then
# is a list in this order)
_SA = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj_l.weight", "attn.proj_l.bias",
       "attn.proj_w.weight", "attn.proj_w.bias", "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
       "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]
_CA = ["norm1.weight", "norm1.bias", "attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "attn.v.weight",
       "attn.v.bias", "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight",
       "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]
_HEAD = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"]
_TAIL = ["norm.weight", "norm.bias", "head.weight", "head.bias"]
OLD_ORDER = {
    "layerscale": [*_HEAD, "blocks.0.gamma_1", "blocks.0.gamma_2", *(f"blocks.0.{n}" for n in _SA),
                   "blocks_token_only.0.gamma_1", "blocks_token_only.0.gamma_2",
                   *(f"blocks_token_only.0.{n}" for n in _CA), *_TAIL],
    "scalar": [*_HEAD, *(f"blocks.0.{n}" for n in _SA), "blocks.0.ls1.alpha", "blocks.0.ls2.alpha",
               *(f"blocks_token_only.0.{n}" for n in _CA), "blocks_token_only.0.ls1.alpha",
               "blocks_token_only.0.ls2.alpha", *_TAIL],
}


def test_every_cait_block_holds_the_layerscale_module() -> None:
    model = _cait()
    blocks = [*model.blocks, *model.blocks_token_only]
    assert all(isinstance(b.ls1, LayerScale) and isinstance(b.ls2, LayerScale) for b in blocks)
    assert not [n for n, _ in model.named_parameters() if "gamma_" in n]
    assert model.blocks_token_only[0].ls2.gamma.shape == (32,)


@pytest.mark.parametrize("name", vitlab.list_models())
def test_no_preset_has_a_second_form_of_layerscale(name: str) -> None:
    with torch.device("meta"):
        model = vitlab.create_model(name, depth=2)
    assert not [n for n, _ in model.named_parameters() if re.search(r"\.gamma_[12]$", n)]


@pytest.mark.parametrize("gate", sorted(OLD_ORDER))
def test_parameter_order_maps_one_to_one_onto_the_old_order(gate: str) -> None:
    """The optimiser state of a run saved before resumes onto the same parameters: same order, old names renamed."""
    names = [n for n, _ in vitlab.create_model("cait_xxs24", **TINY, gate=gate).named_parameters()]
    assert [_old_name(n) for n in names] == OLD_ORDER[gate]


def test_vit_layerscale_order_unchanged() -> None:
    names = [n for n, _ in vitlab.create_model("vit_mnist", gate="layerscale", depth=1).named_parameters()]
    assert names.index("blocks.0.ls1.gamma") == names.index("blocks.0.mlp.fc2.bias") + 1  # gates after the layers


def test_timm_boundary_maps_gamma_names_both_ways() -> None:
    model = _cait()
    state = to_timm_state_dict(model)
    assert {"blocks.0.gamma_1", "blocks.0.gamma_2", "blocks_token_only.0.gamma_1",
            "blocks_token_only.0.gamma_2"} <= set(state)
    assert not [k for k in state if ".ls1." in k or ".ls2." in k]
    torch.testing.assert_close(state["blocks_token_only.0.gamma_2"], model.blocks_token_only[0].ls2.gamma)
    back = from_timm_state_dict(state, model)
    ours = model.state_dict()
    assert set(back) == set(ours) and all(torch.equal(back[k], ours[k]) for k in ours)
    tm = to_timm(model)
    assert isinstance(tm, TimmCait)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), tm(x), atol=1e-5, rtol=1e-5)
    again = vitlab.from_timm(tm).eval()
    torch.testing.assert_close(again(x), model(x), atol=1e-5, rtol=1e-5)


def test_flop_summary_names_cait_gates_as_modules() -> None:
    model = _cait()
    rows = {r.name: r for r in flops.summarize(model).rows}
    assert rows["blocks.0.ls1"].type == "layerscale" and rows["blocks.0.ls1"].macs == 16 * 32
    assert rows["blocks_token_only.0.ls2"].macs == 32 and rows["blocks_token_only.0.ls2"].params == 32
    assert not [n for n in rows if "gamma" in n]


def _as_old_checkpoint(folder: Path) -> None:
    """Rewrite ``folder``'s weights under the old CaiT names, the manifest following (a checkpoint saved before)."""
    from safetensors.torch import load_file

    path = folder / WEIGHTS
    state = load_file(str(path))
    save_file({_old_name(k): v for k, v in state.items()}, str(path))
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][WEIGHTS] = file_entry(path)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_old_cait_checkpoint_loads(tmp_path: Path) -> None:
    model = _cait()
    save_checkpoint(tmp_path, model)
    _as_old_checkpoint(tmp_path)
    from safetensors.torch import load_file

    assert "blocks_token_only.0.gamma_2" in load_file(str(tmp_path / WEIGHTS))
    x = torch.randn(2, 3, 32, 32)
    for loaded in (load_model(tmp_path), vitlab.load_pretrained(None, tmp_path)):
        assert isinstance(loaded.blocks_token_only[0].ls2, LayerScale)
        torch.testing.assert_close(loaded.eval()(x), model(x))


def test_rename_touches_only_what_the_target_model_names_otherwise() -> None:
    timm_keys = TimmCait(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=4,
                         depth_token_only=1).state_dict()
    assert list(rename_legacy_keys(dict(timm_keys), timm_keys)) == list(timm_keys)  # a timm Cait keeps gamma_1
    ours = vitlab.create_model("cait_xxs24", **TINY).state_dict()
    old = {_old_name(k): v for k, v in ours.items()}
    assert list(rename_legacy_keys(old, ours)) == list(ours)


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model.train()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.randint(0, 10, (4,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_old_cait_training_state_resumes_onto_the_same_parameters(tmp_path: Path) -> None:
    """A ``state.pt`` under the old names: weights, EMA and each parameter's AdamW moments land on that parameter."""
    from vitlab.train.resume import restore

    torch.manual_seed(0)
    src = _cait()
    opt = build_optimizer(src, lr=1e-3, weight_decay=0.05)
    sched = WarmupCosine(opt, lr=1e-3, min_lr=0.0, warmup_steps=1, total_steps=10)
    ema = ModelEmaV3(src, decay=0.9)
    for _ in range(2):
        _train_step(src, opt)
        sched.step()
        ema.update(src)
    old = {"model": {_old_name(k): v for k, v in weights_of(src).items()}, "optimizer": opt.state_dict(),
           "scheduler": sched.state_dict(),
           "ema": {_old_name(k): v for k, v in weights_of(ema.module).items()},
           "progress": Progress().to_dict(), "rng": torch.get_rng_state()}
    assert "blocks.0.gamma_1" in old["model"] and "blocks_token_only.0.gamma_2" in old["ema"]
    save_checkpoint(tmp_path, src, train_state=old)

    dst = vitlab.create_model("cait_xxs24", **TINY)
    dst_opt = build_optimizer(dst, lr=1e-3, weight_decay=0.05)
    dst_sched = WarmupCosine(dst_opt, lr=1e-3, min_lr=0.0, warmup_steps=1, total_steps=10)
    dst_ema = ModelEmaV3(dst, decay=0.9)
    restore(tmp_path, verify=True, model=dst, optimizer=dst_opt, scheduler=dst_sched, ema=dst_ema,
            progress=Progress())
    src_params, dst_params = dict(src.named_parameters()), dict(dst.named_parameters())
    for name, p in dst_params.items():
        assert torch.equal(p, src_params[name]), name
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(dst_opt.state[p][moment], opt.state[src_params[name]][moment]), (name, moment)
    for name, v in dst_ema.module.state_dict().items():
        assert torch.equal(v, ema.module.state_dict()[name]), name
