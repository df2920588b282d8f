"""The depth study's ``qknorm`` arm: the plain pre-norm ViT with a LayerNorm on each head's queries and keys
(Dehghani et al. 2023), the arm that tests Wortsman et al.'s claim that QK-layernorm lowers the LR sensitivity."""

from __future__ import annotations

import torch
from torch import nn

from vitlab.experiments.depth_study import DESCRIPTIONS, parse_variants, variant_model
from vitlab.models import create_model


def test_qknorm_is_the_plain_vit_plus_qk_layernorm() -> None:
    assert parse_variants("vit,qknorm") == ["vit", "qknorm"] and "qknorm" in DESCRIPTIONS
    base, plain = variant_model("vit", "vit_mnist", 6)
    base_q, qk = variant_model("qknorm", "vit_mnist", 6)
    assert base == base_q and qk == {**plain, "qk_norm": True}
    model = create_model(base, **qk)
    assert all(isinstance(b.attn.q_norm, nn.LayerNorm) and isinstance(b.attn.k_norm, nn.LayerNorm)
               for b in model.blocks)
    plain_model = create_model(base, **plain)
    assert all(isinstance(b.attn.q_norm, nn.Identity) for b in plain_model.blocks)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
