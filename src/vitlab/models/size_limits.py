"""The size limits (the size budget) a model config is checked against before any of it is allocated
(:func:`check_budget`, called by :meth:`vitlab.models.spec.ModelSpec.build`, the one place a model is instantiated).
Not :mod:`vitlab.experiments.budget`, the studies' training budget (epochs per run).

Two numbers, both computed from the config alone:

- **parameters** (:func:`param_count`, analytic: patch embedding, tokens, position table, blocks, head; within a few
  percent of the built model) must be at most :data:`MAX_PARAMS` = 2e9 (ViT-G/14 of Zhai et al. 2022 has 1.8e9);
- **activations per image** (:func:`activation_bytes`): what training keeps for the backward pass of one image in
  float32, with the attention maps of an unfused kernel, ``4 x depth x tokens x (12 x embed_dim + 2 x hidden +
  2 x heads x tokens)`` bytes, must be at most :data:`MAX_ACTIVATION_BYTES` = 64 GiB (ViT-L/16 at 1024 pixels
  needs about 31 GiB).

A config beyond either is refused in one line before memory is spent (a checkpoint's ``config.json`` edited to
``depth=100000, embed_dim=100000`` would ask for about 5 PB). The user who means it passes ``allow_large=True``
(``vitlab.create_model``) or sets ``VITLAB_ALLOW_LARGE=1`` (every command); models built on the ``meta`` device
take no memory and are not checked. timm models (``timm:NAME``) are timm's and are not checked.
"""

from __future__ import annotations

import os

from vitlab.errors import ConfigError
from vitlab.models.config import ModelConfig

MAX_PARAMS = 2e9
MAX_ACTIVATION_BYTES = 64 * 2**30
ALLOW_ENV = "VITLAB_ALLOW_LARGE"


def tokens(cfg: ModelConfig) -> int:
    """Tokens per image at the config's size: patches, class token and registers."""
    return (cfg.img_size // cfg.patch_size) ** 2 + int(cfg.class_token) + cfg.reg_tokens


def _block(d: int, hidden: int, cfg: ModelConfig) -> int:
    norm = d if cfg.norm == "rmsnorm" else 2 * d
    head_dim = d // cfg.num_heads
    attn = 3 * d * d + d * d + d + (3 * d if cfg.qkv_bias else 0) + (4 * head_dim if cfg.qk_norm else 0)
    if cfg.attn == "talking_heads":
        attn += 2 * (cfg.num_heads * cfg.num_heads + cfg.num_heads)
    elif cfg.attn == "reattention":
        attn += cfg.num_heads * cfg.num_heads + 2 * cfg.num_heads
    mlp = (3 * d * hidden + 2 * hidden + d) if cfg.mlp == "swiglu" else (2 * d * hidden + hidden + d)
    gates = 2 * d if cfg.gate == "layerscale" else 2 if cfg.gate != "none" else 0
    return 2 * norm + attn + mlp + gates


def param_count(cfg: ModelConfig) -> int:
    """The parameters of a model of ``cfg``, counted from the config (no model is built)."""
    d, c, p = cfg.embed_dim, cfg.in_chans, cfg.patch_size
    patches = (cfg.img_size // p) ** 2
    if cfg.stem == "conv":  # DeepViT's stem: three convolutions (stem_chans, 64), then a patch_size/2 projection
        k = cfg.stem_chans
        stem = c * k * 49 + 2 * k * k * 9 + 6 * k + k * d * (p // 2) ** 2 + d
    else:
        stem = c * p * p * d + d
    prefix = int(cfg.class_token) + cfg.reg_tokens
    pos = (patches + (prefix if cfg.pos_embed_cls else 0)) * d if cfg.pos_embed == "learned" else 0
    total = stem + prefix * d + pos + cfg.depth * _block(d, int(d * cfg.mlp_ratio), cfg)
    if cfg.arch == "cait":
        total += cfg.depth_token_only * _block(d, int(d * cfg.mlp_ratio_token_only), cfg)
    total += 2 * d * (1 + int(bool(cfg.fc_norm)))  # the final norm (and the norm after pooling)
    return total + cfg.num_classes * (d + 1)


def activation_bytes(cfg: ModelConfig) -> int:
    """Bytes training keeps for one image's backward pass (float32, unfused attention maps), estimated."""
    t, d = tokens(cfg), cfg.embed_dim
    blocks = cfg.depth + (cfg.depth_token_only if cfg.arch == "cait" else 0)
    return 4 * blocks * t * (12 * d + 2 * int(d * cfg.mlp_ratio) + 2 * cfg.num_heads * t)


def allowed(allow_large: bool = False) -> bool:
    """Whether the budget is lifted: ``allow_large`` or ``VITLAB_ALLOW_LARGE=1``."""
    return allow_large or os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def check_budget(cfg: ModelConfig, allow_large: bool = False) -> None:
    """Refuse ``cfg`` in one line when its parameters or activations per image exceed the budget (see above)."""
    if allowed(allow_large):
        return
    how = f"pass allow_large=True (vitlab.create_model) or set {ALLOW_ENV}=1 if you mean it"
    params = param_count(cfg)
    if params > MAX_PARAMS:
        raise ConfigError(f"a {cfg.arch} of depth {cfg.depth} and embed_dim {cfg.embed_dim} has {params:.2g} "
                          f"parameters ({4 * params / 2**30:.3g} GiB in float32), beyond the budget of "
                          f"{MAX_PARAMS:.0e} parameters; reduce depth / embed_dim, or {how}")
    act = activation_bytes(cfg)
    if act > MAX_ACTIVATION_BYTES:
        raise ConfigError(f"a {cfg.arch} at img_size {cfg.img_size} with patch_size {cfg.patch_size} sees "
                          f"{tokens(cfg)} tokens and needs about {act / 2**30:.3g} GiB of activations per image "
                          f"to train, beyond the budget of {MAX_ACTIVATION_BYTES / 2**30:.0f} GiB per image; "
                          f"reduce img_size, raise patch_size, or {how}")
