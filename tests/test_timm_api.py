"""timm 1.x's model API on vitlab models, against timm on converted weights: forward_intermediates,
prune_intermediate_layers, set_grad_checkpointing, group_matcher and layer-wise learning-rate decay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm.optim
import torch
from timm.models._manipulate import group_parameters
from timm.optim._param_groups import param_groups_layer_decay
from torch import nn

import vitlab
from _helpers import perturb
from _scripts import load_script
from vitlab.checkpoint import load_train_state
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.interop.timm_convert import conversion_rules
from vitlab.perf import sliced_backward
from vitlab.train.config import RunConfig
from vitlab.train.optim import WarmupCosine, build_optimizer, layer_ids, no_decay_names, param_groups

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=4, num_classes=5)

# vitlab models timm can express (converted with vitlab.to_timm)
TIMM_CASES = {
    "vit": ("vit_tiny", {}),
    "vit_layerscale_registers": ("vit_tiny", dict(gate="layerscale", init_values=0.1, reg_tokens=2)),
    "vit_no_class_token": ("vit_tiny", dict(class_token=False, global_pool="avg")),
    # registers after the patches, unrotated: rope_layout='vit5' would rotate them even with rope=False
    "vit5_end_registers": ("vit5_small", dict(rope=False, rope_layout="halves")),
    "cait": ("cait_xxs24", {}),
    "cait_avg": ("cait_xxs24", dict(global_pool="avg", depth_token_only=3)),
}
# and those it cannot (re-attention with batch norm, RoPE, the convolutional stem)
VITLAB_ONLY = {"deepvit": ("deepvit_16b", {}), "vit5": ("vit5_small", {}), "deepvit_s": ("deepvit_s", {})}

INTERMEDIATE_ARGS = [
    dict(),
    dict(indices=2, norm=True),
    dict(indices=[0, -1], output_fmt="NLC"),
    dict(indices=[-3], stop_early=True),
    dict(indices=[1, 2], stop_early=True, intermediates_only=True),
    dict(indices=1, return_prefix_tokens=True, output_fmt="NLC"),
]


def pair(case: str) -> tuple[vitlab.VitlabModel, nn.Module]:
    name, kwargs = TIMM_CASES[case]
    model = perturb(vitlab.create_model(name, **{**SMALL, **kwargs})).eval()
    return model, vitlab.to_timm(model).eval()


def timm_token_order(model: vitlab.VitlabModel, x: torch.Tensor) -> torch.Tensor:
    """vitlab's final tokens in timm's order: end registers move in front of the patches."""
    if model.cfg.arch != "vit" or not model.num_end:
        return x
    front, n = model.num_front, model.num_patches
    return torch.cat([x[:, :front], x[:, front + n:], x[:, front:front + n]], dim=1)


def block_outputs(model: vitlab.VitlabModel, x: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output ``(B, T, D)`` of a vitlab ViT, the blocks run by hand."""
    t, rope = model._embed(x)
    out = []
    for blk in model.blocks:
        t = blk(t, rope)
        out.append(t)
    return out


def assert_close_nested(a, b) -> None:
    if isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            assert_close_nested(u, v)
    else:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------ forward_intermediates

@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_forward_intermediates_match_timm(case: str) -> None:
    model, tm = pair(case)
    x = torch.randn(2, 3, 32, 32)
    for args in INTERMEDIATE_ARGS:
        if model.cfg.arch == "cait" and "return_prefix_tokens" in args:
            args = {k: v for k, v in args.items() if k != "return_prefix_tokens"}  # timm's Cait has no such flag
        with torch.no_grad():
            ours, theirs = model.forward_intermediates(x, **args), tm.forward_intermediates(x, **args)
        if not args.get("intermediates_only"):
            (final, ours), (their_final, theirs) = ours, theirs
            torch.testing.assert_close(timm_token_order(model, final), their_final, rtol=1e-4, atol=1e-4)
        assert_close_nested(ours, theirs)


def test_forward_intermediates_shapes_and_prefix_tokens() -> None:
    model = vitlab.create_model("vit5_small", **SMALL).eval()  # class token, 4 registers after the patches, RoPE
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        blocks = [block_outputs(model, x)[i] for i in (1, 3)]  # (B, 1 + 16 + 4, D)
        final, maps = model.forward_intermediates(x, indices=[1, -1])
        pairs = model.forward_intermediates(x, indices=[1, 3], output_fmt="NLC", return_prefix_tokens=True,
                                            intermediates_only=True)
        torch.testing.assert_close(final, model.forward_features(x))
        assert_close_nested(model.get_intermediate_layers(x, n=[1, 3], return_prefix_tokens=True), pairs)
    assert [m.shape for m in maps] == [(2, 32, 4, 4)] * 2
    for (patches, prefix), y in zip(pairs, blocks):
        torch.testing.assert_close(patches, y[:, 1:17])
        torch.testing.assert_close(prefix, torch.cat([y[:, :1], y[:, 17:]], dim=1))  # class token + registers
    torch.testing.assert_close(maps[0], blocks[0][:, 1:17].reshape(2, 4, 4, 32).permute(0, 3, 1, 2))


@pytest.mark.parametrize("case", list(VITLAB_ONLY))
def test_forward_intermediates_on_models_timm_lacks(case: str) -> None:
    name, kwargs = VITLAB_ONLY[case]
    model = vitlab.create_model(name, **{**SMALL, **kwargs}).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=2, norm=True)
        torch.testing.assert_close(final, model.forward_features(x))
        want = [model.norm(y) for y in block_outputs(model, x)[-2:]]  # (B, T, D)
        patches = model.get_intermediate_layers(x, n=2, norm=True)  # timm's: the patch tokens (B, N, D)
    front, end = model.num_front, model.num_end
    for got, y, p in zip(maps, want, patches, strict=True):
        torch.testing.assert_close(got.flatten(2).transpose(1, 2), y[:, front:y.shape[1] - end])
        torch.testing.assert_close(p, y[:, front:y.shape[1] - end])


@pytest.mark.parametrize("kwargs,match", [
    (dict(indices=5), "use 1 to 4"),
    (dict(indices=0), "use 1 to 4"),
    (dict(indices=[4]), r"out of range for 4 blocks; use indices in -4..3"),
    (dict(indices=[-5]), "out of range"),
    (dict(output_fmt="NHWC"), "output_fmt must be 'NCHW' or 'NLC'"),
])
def test_forward_intermediates_bad_arguments_name_the_fix(kwargs: dict, match: str) -> None:
    model = vitlab.create_model("vit_tiny", **SMALL)
    with pytest.raises(ConfigError, match=match):
        model.forward_intermediates(torch.randn(1, 3, 32, 32), **kwargs)
    assert len(model.blocks) == 4 and not any(b._forward_hooks for b in model.blocks)


@pytest.mark.parametrize("case", ["vit", "vit_layerscale_registers", "cait"])
@pytest.mark.parametrize("prune_norm", [False, True])
def test_prune_intermediate_layers_matches_timm(case: str, prune_norm: bool) -> None:
    model, tm = pair(case)
    x = torch.randn(2, 3, 32, 32)
    kept = model.prune_intermediate_layers([0, -3], prune_norm=prune_norm)
    assert kept == tm.prune_intermediate_layers([0, -3], prune_norm=prune_norm) == [0, 1]
    assert len(model.blocks) == 2 and model.num_classes == 0 and isinstance(model.head, nn.Identity)
    with torch.no_grad():
        (final, ours), (their_final, theirs) = model.forward_intermediates(x), tm.forward_intermediates(x)
    torch.testing.assert_close(timm_token_order(model, final), their_final, rtol=1e-4, atol=1e-4)
    assert_close_nested(ours, theirs)
    if model.cfg.arch == "cait":  # the class-attention stage went with the head, as in timm
        assert model.blocks_token_only is None and final.shape[1] == model.num_patches


# ------------------------------------------------------------------------------------ gradient checkpointing

def loss_and_grads(model: nn.Module, x: torch.Tensor, checkpointing: bool, seed: int = 0
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.set_grad_checkpointing(checkpointing)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(x).logsumexp(dim=1).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(model: nn.Module, x: torch.Tensor, **kwargs) -> None:
    loss, grads = loss_and_grads(model, x, False, **kwargs)
    loss_ckpt, grads_ckpt = loss_and_grads(model, x, True, **kwargs)
    assert model.grad_checkpointing
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=0)
    assert grads.keys() == grads_ckpt.keys() and len(grads) == len(list(model.parameters()))
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("name,kwargs", [*TIMM_CASES.values(), *VITLAB_ONLY.values()],
                         ids=[*TIMM_CASES, *VITLAB_ONLY])
def test_grad_checkpointing_gives_the_same_loss_and_gradients(name: str, kwargs: dict) -> None:
    model = perturb(vitlab.create_model(name, **{**SMALL, **kwargs})).train()
    assert not model.grad_checkpointing
    assert_same_step(model, torch.randn(2, 3, 32, 32))


def test_grad_checkpointing_with_drop_path_replays_the_masks() -> None:
    model = perturb(vitlab.create_model("cait_xxs24", **SMALL, drop_path_rate=0.5)).train()
    x = torch.randn(4, 3, 32, 32)
    assert_same_step(model, x, seed=3)
    assert not torch.equal(loss_and_grads(model, x, True, seed=3)[0], loss_and_grads(model, x, True, seed=4)[0])


def test_grad_checkpointing_in_sliced_steps_replays_each_slices_generator() -> None:
    model = perturb(vitlab.create_model("vit_tiny", **SMALL, drop_path_rate=0.5)).train()
    x = torch.randn(4, 3, 32, 32)

    def step(checkpointing: bool) -> dict[str, torch.Tensor]:
        model.set_grad_checkpointing(checkpointing)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        sliced_backward(lambda a, b: model(x[a:b]).logsumexp(dim=1).mean(), 4, model.parameters(), slices=2)
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, ckpt = step(False), step(True)
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_grad_checkpointing_updates_batch_norm_statistics_once() -> None:
    model = perturb(vitlab.create_model("deepvit_16b", **SMALL)).train()  # re-attention with batch norm
    x = torch.randn(2, 3, 32, 32)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    stats = {}
    for checkpointing in (False, True):
        model.load_state_dict(start)
        loss_and_grads(model, x, checkpointing)
        stats[checkpointing] = {k: v.clone() for k, v in model.state_dict().items() if "running" in k
                                or "num_batches" in k}
    assert stats[False] and stats[False].keys() == stats[True].keys()
    for k in stats[False]:
        torch.testing.assert_close(stats[True][k], stats[False][k], msg=k)


def test_grad_checkpointing_keeps_fewer_activations() -> None:
    bench = _bench_module()
    model = vitlab.create_model("cait_xxs24", **SMALL).train()
    x = torch.randn(2, 3, 32, 32)
    plain = bench.saved_activation_bytes(model, x, checkpointing=False)
    ckpt = bench.saved_activation_bytes(model, x, checkpointing=True)
    assert 0 < ckpt < plain / 2


def test_no_grad_forward_ignores_checkpointing() -> None:
    model = vitlab.create_model("vit_tiny", **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        model.set_grad_checkpointing()
        torch.testing.assert_close(model(x), want, rtol=0, atol=0)


# ------------------------------------------------------------------------------------ group_matcher, layer decay

@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_group_matcher_gives_timms_layers(case: str) -> None:
    model, tm = pair(case)
    ours = group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    theirs = as_vitlab_names(group_parameters(tm, tm.group_matcher(coarse=False), reverse=True), model)
    if model.cfg.arch == "vit" and model.num_end:
        theirs = {k: v for k, v in theirs.items() if k in ours}  # same names; vitlab has no extra ones
    assert ours == theirs
    assert layer_ids(model) == ours  # vitlab's reading of a matcher is timm's
    assert ours["head.weight"] == max(ours.values()) and ours["patch_embed.proj.weight"] == 0
    assert len(set(ours.values())) == model.cfg.depth + 2  # stem, one per block, head


def as_vitlab_names(by_name: dict, model: vitlab.VitlabModel) -> dict:
    """timm's parameter names under vitlab's (the key map of ``to_timm``: CaiT's ``gamma_{j}`` is ``ls{j}.gamma``)."""
    names = {r.timm_key: r.vitlab_key for r in conversion_rules(model) if r.vitlab_key}
    return {names.get(k, k): v for k, v in by_name.items()}


def lr_scales(groups: list[dict], model: nn.Module) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}


@pytest.mark.parametrize("case", ["vit", "vit5_end_registers", "cait"])
def test_layer_decay_groups_follow_timm(case: str) -> None:
    model, tm = pair(case)
    groups = param_groups(model, 0.05, layer_decay=0.75)
    ours = lr_scales(groups, model)
    assert ours == pytest.approx(lr_scales(param_groups_layer_decay(model, 0.05, layer_decay=0.75), model))
    theirs = as_vitlab_names(lr_scales(param_groups_layer_decay(tm, 0.05, layer_decay=0.75), tm), model)
    assert ours == pytest.approx({k: v for k, v in theirs.items() if k in ours})
    layers = layer_ids(model)
    top = max(layers.values())
    assert all(ours[n] == pytest.approx(0.75 ** (top - layers[n])) for n in ours)
    assert ours["head.weight"] == 1.0 and ours["patch_embed.proj.weight"] == pytest.approx(0.75 ** top)
    skip = no_decay_names(model)
    for g in groups:  # weight decay as without layer decay
        names = {n for n, p in model.named_parameters() if any(p is q for q in g["params"])}
        assert names and (names <= skip if g["weight_decay"] == 0 else not names & skip), g["name"]


def test_timm_create_optimizer_applies_layer_decay_to_vitlab_models() -> None:
    model = vitlab.create_model("cait_xxs24", **SMALL)
    opt = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    scales = sorted({g["lr_scale"] for g in opt.param_groups})
    assert scales == pytest.approx([0.5 ** k for k in range(model.cfg.depth + 1, -1, -1)])


def test_scheduler_multiplies_the_layer_scale_in() -> None:
    model = vitlab.create_model("vit_tiny", **SMALL)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    sched = WarmupCosine(opt, lr=1e-3, min_lr=1e-5, warmup_steps=2, total_steps=10)
    for _ in range(3):
        sched.step()
        for g in opt.param_groups:
            assert g["lr"] == pytest.approx(sched.get_last_lr() * g["lr_scale"])
    assert min(g["lr"] for g in opt.param_groups) == pytest.approx(sched.get_last_lr() * 0.5 ** 5)


def test_layer_decay_off_keeps_the_two_groups() -> None:
    model = vitlab.create_model("vit_tiny", **SMALL)
    for off in (None, 1.0):
        assert [g["name"] for g in param_groups(model, 0.05, off)] == ["decay", "no_decay"]


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_bad_layer_decay_names_the_fix(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"layer_decay must be in \(0, 1\].*--layer-decay 0.75"):
        RunConfig(layer_decay=bad).validate()
    with pytest.raises(ConfigError, match="--layer-decay 0.75"):
        build_optimizer(vitlab.create_model("vit_tiny", **SMALL), lr=1e-3, weight_decay=0.05, layer_decay=bad)


def test_layer_decay_needs_a_group_matcher() -> None:
    with pytest.raises(ConfigError, match="has no group_matcher.*drop --layer-decay"):
        param_groups(nn.Linear(2, 2), 0.05, layer_decay=0.75)


def test_train_cli_with_layer_decay(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", "--model", "vit_mnist", "--depth", "2", "--layer-decay", "0.75", "--epochs", "1",
                 "--limit-train", "64", "--limit-test", "64", "--batch-size", "32", "--no-progress",
                 "--output", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["run"]["layer_decay"] == 0.75
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    groups = load_train_state(out)["optimizer"]["param_groups"]  # stem, 2 blocks, head: 0.75^3 .. 1
    assert sorted({g["lr_scale"] for g in groups}) == pytest.approx([0.75 ** 3, 0.75 ** 2, 0.75, 1.0])
    assert all(g["lr"] == pytest.approx(g["lr_scale"] * groups[-1]["lr"]) for g in groups)


def test_train_cli_refuses_a_bad_layer_decay(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--layer-decay", "2", "--epochs", "1", "--limit-train", "64",
                 "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layer_decay must be in (0, 1]" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------ the benchmark script


def _bench_module():
    return load_script("grad_checkpointing")


def test_grad_checkpointing_benchmark_smoke(tmp_path: Path) -> None:
    bench = _bench_module()
    report = bench.run(model="cait_xxs24", img_size=32, batch=2, steps=1, out=tmp_path,
                       overrides=dict(depth=4, embed_dim=32, num_heads=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grad_checkpointing.json", "grad_checkpointing.md"]
    saved = json.loads((tmp_path / "grad_checkpointing.json").read_text())
    assert saved == json.loads(json.dumps(report))
    for side in ("vitlab", "timm"):
        r = saved[side]
        assert 0 < r["checkpointed"]["saved_mb"] < r["plain"]["saved_mb"] and r["plain"]["step_s"] > 0
        assert r["memory_ratio"] == pytest.approx(r["checkpointed"]["saved_mb"] / r["plain"]["saved_mb"])
    assert "| vitlab |" in (tmp_path / "grad_checkpointing.md").read_text()


def test_readme_timm_api_snippet_runs() -> None:
    """The README's timm-API block (resolve_data_config, set_input_size, dynamic size, forward_intermediates,
    layer decay through create_optimizer_v2) runs as printed."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "forward_intermediates" in b)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert [tuple(t.shape) for t in scope["inter"]] == [(2, 64, 8, 8), (2, 64, 8, 8)]
    assert scope["cfg"]["input_size"] == (1, 28, 28)
    assert len({g["lr_scale"] for g in scope["opt"].param_groups}) > 2  # per-block learning rates
    assert scope["backbone"].feature_info.channels() == [64, 64] and len(scope["backbone"].model.blocks) == 8
