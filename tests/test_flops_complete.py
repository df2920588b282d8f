"""The FLOP/parameter summary covers every parameter once, for every preset and every gate / attention / MLP variant,
and its totals agree with ``model.flop_count`` and, for the matmul-like part, with ``FlopCounterMode``."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab import flops
from vitlab.layers import GATES
from vitlab.layers.fixup import FIXUP_GATES
from vitlab.models.config import ATTNS

SMALL = dict(img_size=32, patch_size=8, depth=2)


def _variants() -> list[tuple[str, dict]]:
    out = [(name, {}) for name in vitlab.list_models()]
    for gate in GATES + FIXUP_GATES:
        out += [("vit_mnist", dict(gate=gate, attn=attn)) for attn in ATTNS]
        out += [("vit_mnist", dict(gate=gate, mlp="swiglu")), ("vit_mnist", dict(gate=gate, reg_tokens=2, rope=True))]
        out += [("deepvit_s", dict(gate=gate)), ("deepvit_16b", dict(gate=gate)), ("vit5_small", dict(gate=gate))]
        if gate not in FIXUP_GATES:  # Fixup and T-Fixup initialise a ViT only (a ConfigError for CaiT)
            out += [("cait_xxs24", dict(gate=gate, attn=attn)) for attn in ("talking_heads", "mhsa")]
    # block layouts, NormFormer's norms, sigma-Reparam and the depth-muP gate (ViT only), alone and combined
    for block in ("prenorm", "postnorm", "deepnorm", "parallel"):
        out += [("vit_mnist", dict(block=block)),
                ("vit_mnist", dict(block=block, gate="layerscale", sigma_reparam=True)),
                ("vit_mnist", dict(block=block, gate="depth_mup", mlp="swiglu", reg_tokens=2, rope=True))]
    out += [("vit_mnist", dict(scale_attn_norm=True, scale_mlp_norm=True)),
            ("vit_mnist", dict(scale_attn_norm=True, scale_mlp_norm=True, mlp="swiglu", block="deepnorm")),
            ("vit_mnist", dict(sigma_reparam=True, attn="talking_heads")),
            ("deepvit_s", dict(sigma_reparam=True, scale_mlp_norm=True, gate="depth_mup"))]
    return out


VARIANTS = _variants()


def _ids(v: tuple[str, dict]) -> str:
    return v[0] + "".join(f",{k}={x}" for k, x in v[1].items())


def _meta(name: str, overrides: dict) -> vitlab.models.VitlabModel:
    with torch.device("meta"):
        return vitlab.create_model(name, **{**SMALL, **overrides})


@pytest.mark.parametrize("variant", VARIANTS, ids=[_ids(v) for v in VARIANTS])
def test_summary_counts_every_parameter_once_and_every_multiply(variant: tuple[str, dict]) -> None:
    model = _meta(*variant)
    s = flops.summarize(model)
    assert s.params == sum(p.numel() for p in model.parameters())
    # each parameter lies under exactly one row, and each row holds exactly its parameters
    held = {r.name: 0 for r in s.rows}
    for pname, p in model.named_parameters():
        owners = [r.name for r in s.rows if pname == r.name or pname.startswith(r.name + ".")]
        assert len(owners) == 1, f"{pname} is counted by {owners}"
        held[owners[0]] += p.numel()
    assert held == {r.name: r.params for r in s.rows}
    assert s.macs == model.flop_count() and s.matmul_macs == model.flop_count(matmul_only=True)
    ours, theirs = flops.cross_check(model)
    assert ours == theirs > 0


def test_fixup_gates_are_rows_with_one_multiply_per_element() -> None:
    t, d, depth = 17, 64, 8
    fixup, tfixup = _meta("vit_mnist", dict(gate="fixup", img_size=28, patch_size=7, depth=depth)), _meta(
        "vit_mnist", dict(gate="tfixup", img_size=28, patch_size=7, depth=depth))
    rows = {r.name: r for r in flops.summarize(fixup).rows}
    for i in range(depth):
        for g in ("ls1", "ls2"):
            r = rows[f"blocks.{i}.{g}"]
            assert (r.type, r.module, r.params, r.macs, r.matmul_macs) == ("gate", "FixupGate", 2, t * d, 0)
    # both are norm-free; Fixup adds a scale (and free additions) on every branch, T-Fixup no gate at all
    assert flops.summarize(fixup).macs - flops.summarize(tfixup).macs == 2 * depth * t * d
    # per block: two gates of 2 scalars, 4 in_bias, the activation bias
    assert flops.summarize(fixup).params - flops.summarize(tfixup).params == depth * (2 * 2 + 4 + 1)
