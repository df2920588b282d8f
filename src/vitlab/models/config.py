"""One config dataclass describes every architecture; it is stored verbatim in each checkpoint."""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from dataclasses import dataclass
from typing import Any

from vitlab.errors import ConfigError, UnknownOptionError
from vitlab.layers import (
    BLOCKS,
    DEPTH_GATES,
    DROP_PATH_RULES,
    GATES,
    MLPS,
    NORMS,
    POS_EMBEDS,
    REATTN_NORMS,
    cait_init_value,
)
from vitlab.layers.fixup import FIXUP_GATES

ARCHS = ("vit", "cait")
ATTNS = ("mhsa", "talking_heads", "reattention")
POOLS = ("token", "avg")
STEMS = ("patch", "conv")
REG_POSITIONS = ("front", "end")
ROPE_LAYOUTS = ("halves", "vit5")
DROP_RATE_AT = ("all", "head")
WEIGHT_INITS = ("trunc_normal", "xavier")


@dataclass
class ModelConfig:
    """Architecture of a vitlab model. ``arch='vit'`` covers ViT, DeepViT and ViT-5; ``'cait'`` is CaiT.

    ``init_values`` is the initial value of the LayerScale / small-eps scalar gates. An explicit value is
    always kept. ``None`` means the default: for ``arch='cait'`` the CaiT depth rule (Touvron et al. 2021:
    0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper) at this config's own ``depth``, so a depth change
    re-derives it; for ``arch='vit'`` 1e-4. :meth:`gate_init_value` gives the value a model is built with.
    The CaiT presets pin timm's values (``cait_xxs36``: 1e-5); overriding a CaiT preset's ``depth`` without
    ``init_values`` drops the pin and the depth rule applies at the new depth.
    """

    arch: str = "vit"
    name: str = ""
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_norm: bool = False
    attn: str = "mhsa"  # mhsa | talking_heads | reattention
    reattn_last: int | None = None  # re-attention only in the last k blocks (None: every block)
    reattn_norm: str = "batch"  # batch (official DeepViT) | layer (vit-pytorch)
    reattn_scale: bool = False
    rope: bool = False  # 2-D RoPE on patch tokens (and registers at the end)
    rope_theta: float = 10000.0
    reg_rope_theta: float = 100.0
    # halves: pairs (i, i + d/2), column angle first | vit5: the ViT-5 code's adjacent pairs (2i, 2i+1), row angle
    # first, and its register rule (a square count, rotated on their own grid whenever there are registers)
    rope_layout: str = "halves"
    gate: str = "none"  # none | layerscale | rezero | skipinit | scalar | depth_mup | fixup | tfixup (the last 3: vit)
    block: str = "prenorm"  # prenorm | postnorm | deepnorm | parallel (arch 'vit'; vitlab.layers.block_variants)
    scale_attn_norm: bool = False  # timm's name: a norm before attn.proj (NormFormer's attention norm)
    scale_mlp_norm: bool = False  # timm's name: a norm after the MLP's activation (NormFormer's FFN norm)
    sigma_reparam: bool = False  # sigma-Reparam (Zhai et al. 2023) on the blocks' linear layers (arch 'vit')
    init_values: float | None = None  # gate init (LayerScale / small-eps scalar)
    norm: str = "layernorm"  # layernorm | rmsnorm
    mlp: str = "gelu"  # gelu | swiglu
    class_token: bool = True
    reg_tokens: int = 0
    reg_position: str = "front"  # front: after the class token (timm) | end: after the patches (ViT-5)
    pos_embed: str = "learned"  # learned | sincos1d | sincos2d | none
    pos_embed_cls: bool = True  # position slots for the prefix tokens too (timm's no_embed_class=False)
    pos_resample_antialias: bool = True  # learned table to another grid: antialiased bicubic (timm) | plain (ViT-5)
    token_init_std: float | None = None  # class/register tokens: None N(0, 1e-6) (timm) | trunc-normal, this std
    global_pool: str = "token"  # token | avg
    fc_norm: bool | None = None  # None: as timm, norm after pooling when global_pool='avg'
    stem: str = "patch"  # patch | conv (DeepViT's convolutional stem)
    stem_chans: int = 64  # stem='conv': the channels of its three convolutions (DeepViT's: 64)
    weight_init: str = "trunc_normal"  # linears: trunc_normal (timm's std 0.02) | xavier (uniform, not the head)
    drop_rate: float = 0.0
    drop_rate_at: str = "all"  # all: timm's places (tokens, projections, MLP, head) | head: before the head only
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    drop_path_rule: str = "linear"  # linear | uniform
    depth_token_only: int = 2  # CaiT class-attention blocks
    mlp_ratio_token_only: float = 4.0
    dynamic_img_size: bool = False  # forward takes any H, W multiple of the patch; positions follow that grid
    dynamic_img_pad: bool = False  # pad the right/bottom edge to a multiple of the patch (needs dynamic_img_size)

    @property
    def rotates(self) -> bool:
        """Whether the model applies RoPE: ``rope``, or registers after the patches under the ViT-5 layout (rotated
        on their own grid even without patch RoPE, as the ViT-5 code does; registers in front are never rotated)."""
        return self.rope or (self.rope_layout == "vit5" and self.reg_tokens > 0 and self.reg_position == "end")

    def gate_init_value(self) -> float | None:
        """The gate init the model is built with: ``init_values`` when set, else CaiT's depth rule at ``depth``
        for ``arch='cait'``, else None (the gates' own default, 1e-4)."""
        if self.init_values is not None:
            return self.init_values
        return cait_init_value(self.depth) if self.arch == "cait" else None

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with ``overrides`` applied and validated: a name that is no field raises
        :class:`~vitlab.errors.UnknownOptionError` (a ``TypeError`` too, as timm's factory expects), a bad value
        :class:`~vitlab.errors.ConfigError`."""
        unknown = [k for k in overrides if k not in self.field_names()]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, self.field_names(), n=3)
                hints.append(f"{k!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
            raise UnknownOptionError(f"unknown model option {', '.join(hints)}; valid options: "
                                     f"{', '.join(self.field_names()[2:])}")
        cfg = dataclasses.replace(self, **overrides)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls().replace(**d)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the fix for any impossible combination."""
        _choice("arch", self.arch, ARCHS)
        _choice("attn", self.attn, ATTNS)
        _choice("gate", self.gate, GATES + DEPTH_GATES + FIXUP_GATES)
        _choice("block", self.block, BLOCKS)
        _choice("norm", self.norm, NORMS)
        _choice("mlp", self.mlp, MLPS)
        _choice("pos_embed", self.pos_embed, POS_EMBEDS)
        _choice("global_pool", self.global_pool, POOLS)
        _choice("stem", self.stem, STEMS)
        _choice("weight_init", self.weight_init, WEIGHT_INITS)
        _choice("reg_position", self.reg_position, REG_POSITIONS)
        _choice("reattn_norm", self.reattn_norm, REATTN_NORMS)
        _choice("drop_path_rule", self.drop_path_rule, DROP_PATH_RULES)
        _choice("rope_layout", self.rope_layout, ROPE_LAYOUTS)
        _choice("drop_rate_at", self.drop_rate_at, DROP_RATE_AT)
        _check_types(self)
        for key in ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "stem_chans"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{key} must be a positive integer, got {v!r}")
        if not isinstance(self.num_classes, int) or self.num_classes < 0:
            raise ConfigError(f"num_classes must be an integer >= 0 (0 gives features only), "
                              f"got {self.num_classes!r}")
        if self.mlp_ratio <= 0 or self.mlp_ratio_token_only <= 0:
            raise ConfigError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        for key in ("mlp_ratio", "mlp_ratio_token_only"):
            if int(self.embed_dim * getattr(self, key)) < 1:
                raise ConfigError(f"{key} {getattr(self, key)} gives an MLP with no hidden units at embed_dim "
                                  f"{self.embed_dim}; use {key} >= {1 / self.embed_dim:.3g}")
        if self.rope_theta <= 0 or self.reg_rope_theta <= 0:
            raise ConfigError(f"rope_theta and reg_rope_theta must be > 0, got {self.rope_theta} and "
                              f"{self.reg_rope_theta}; e.g. rope_theta=10000")
        if self.reg_tokens < 0 or self.depth_token_only < 0:
            raise ConfigError("reg_tokens and depth_token_only must be >= 0")
        for key in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
            v = getattr(self, key)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {v}")
        if self.img_size % self.patch_size:
            lo = self.img_size - self.img_size % self.patch_size
            raise ConfigError(
                f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}; use img_size "
                f"{lo or self.patch_size} or {lo + self.patch_size}, or a patch_size that divides {self.img_size}")
        if self.embed_dim % self.num_heads:
            ok = [h for h in range(1, min(self.embed_dim, 32) + 1) if self.embed_dim % h == 0]
            raise ConfigError(f"num_heads {self.num_heads} does not divide embed_dim {self.embed_dim}; pick "
                              f"num_heads from {ok} or an embed_dim that is a multiple of {self.num_heads}")
        if self.rope_layout == "vit5" and self.reg_tokens and self.reg_position == "end":
            side = math.isqrt(self.reg_tokens)
            if side * side != self.reg_tokens:
                raise ConfigError(f"rope_layout='vit5' rotates the registers after the patches on a square grid; use "
                                  f"a square reg_tokens (1, 4, 9, ...; got {self.reg_tokens}), reg_position='front' "
                                  f"(not rotated) or rope_layout='halves'")
        if self.rotates and (self.embed_dim // self.num_heads) % 4:
            raise ConfigError(f"RoPE needs a head dim divisible by 4, got {self.embed_dim // self.num_heads}"
                              f"; change embed_dim/num_heads or set rope=False (and rope_layout='halves')")
        if self.rotates and self.attn == "reattention":
            raise ConfigError("RoPE is not supported with attn='reattention'; use attn='mhsa' (or rope=False and "
                              "rope_layout='halves')")
        if self.token_init_std is not None and not self.token_init_std > 0:
            raise ConfigError(f"token_init_std must be > 0 (e.g. 0.02) or None, got {self.token_init_std}")
        if self.qk_norm and self.attn == "reattention":
            raise ConfigError("qk_norm=True is not supported with attn='reattention' (its blocks have no QK-norm); "
                              "set qk_norm=False or use attn='mhsa'")
        if self.global_pool == "token" and not self.class_token and self.arch == "vit":
            raise ConfigError("global_pool='token' needs a class token; set class_token=True or global_pool='avg'")
        if self.arch == "cait":
            if not self.class_token:
                raise ConfigError("CaiT's class-attention stage needs a class token; keep class_token=True")
            if self.reg_tokens or self.stem != "patch":
                raise ConfigError("CaiT presets take no registers and the patch stem; use a vit preset for those")
            if self.pos_embed_cls:
                raise ConfigError("CaiT adds its position embedding to the patches only; set pos_embed_cls=False")
            if self.depth_token_only < 1 and self.global_pool == "token":
                raise ConfigError("CaiT with depth_token_only=0 never lets the class token see the patches; use "
                                  "depth_token_only >= 1 or global_pool='avg'")
        if self.gate in FIXUP_GATES and self.arch != "vit":
            raise ConfigError(f"gate={self.gate!r} initialises a ViT's blocks and head; use a vit preset, or another "
                              f"gate ({', '.join(GATES)}) for {self.arch}")
        _check_block_variant(self)
        if self.stem == "conv" and self.patch_size % 2:
            raise ConfigError(f"stem='conv' needs an even patch_size, got {self.patch_size}")
        if self.pos_embed == "sincos2d" and self.embed_dim % 4:
            raise ConfigError(f"pos_embed='sincos2d' needs embed_dim divisible by 4, got {self.embed_dim}")
        if self.dynamic_img_pad and not self.dynamic_img_size:
            raise ConfigError("dynamic_img_pad pads inputs of any size, so it needs dynamic_img_size=True; set both")
        if self.reattn_last is not None and self.reattn_last < 0:
            raise ConfigError(f"reattn_last must be >= 0 (blocks at the end with re-attention; more than depth "
                              f"means all), got {self.reattn_last}")


def _check_block_variant(cfg: ModelConfig) -> None:
    """The block layouts, NormFormer norms, sigma-Reparam and the depth-muP gate: ViT only, and not with the
    norm-free gates (ReZero, Fixup, T-Fixup), whose blocks have no norms to move or add."""
    used = [f"block={cfg.block!r}" if cfg.block != "prenorm" else "", "sigma_reparam=True" if cfg.sigma_reparam else "",
            "gate='depth_mup'" if cfg.gate in DEPTH_GATES else "",
            "scale_attn_norm=True" if cfg.scale_attn_norm else "", "scale_mlp_norm=True" if cfg.scale_mlp_norm else ""]
    used = [u for u in used if u]
    if used and cfg.arch != "vit":
        raise ConfigError(f"{', '.join(used)} builds ViT blocks; use a vit preset (or the defaults block='prenorm', "
                          f"no scale norms, sigma_reparam=False and another gate for {cfg.arch})")
    if cfg.block != "prenorm" and cfg.gate in ("rezero", *FIXUP_GATES):
        raise ConfigError(f"block={cfg.block!r} places norms that gate={cfg.gate!r} removes; use gate none, "
                          f"layerscale, skipinit, scalar or depth_mup, or block='prenorm'")
    if cfg.sigma_reparam and cfg.gate in FIXUP_GATES:
        raise ConfigError(f"sigma_reparam=True rescales the weights that gate={cfg.gate!r} initialises; use one "
                          f"of the two")
    norms = [k for k in ("scale_attn_norm", "scale_mlp_norm") if getattr(cfg, k)]
    if norms and cfg.block == "parallel":
        raise ConfigError(f"{' and '.join(norms)} with block='parallel': the parallel block (timm's "
                          f"ParallelScalingBlock) has no such norms; set them False or use block='prenorm'")
    if cfg.scale_attn_norm and cfg.attn == "reattention":
        raise ConfigError("scale_attn_norm=True is not supported with attn='reattention'; use attn='mhsa'")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown {key} {value!r}{hint}; choose one of {', '.join(choices)}")


_INTS = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "reg_tokens",
         "depth_token_only", "reattn_last")
_BOOLS = ("qkv_bias", "qk_norm", "reattn_scale", "rope", "class_token", "pos_embed_cls", "fc_norm",
          "dynamic_img_size", "dynamic_img_pad", "pos_resample_antialias", "scale_attn_norm", "scale_mlp_norm",
          "sigma_reparam")
_FLOATS = ("mlp_ratio", "rope_theta", "reg_rope_theta", "init_values", "drop_rate", "attn_drop_rate",
           "drop_path_rate", "mlp_ratio_token_only", "token_init_std")
_OPTIONAL = ("reattn_last", "fc_norm", "init_values", "token_init_std")


def _check_types(cfg: ModelConfig) -> None:
    """Each numeric / flag field has its type (ints for sizes, finite numbers for ratios, booleans for flags)."""
    for keys, ok, kind in ((_INTS, lambda v: isinstance(v, numbers.Integral), "an integer"),
                           (_BOOLS, lambda v: isinstance(v, bool), "true or false"),
                           (_FLOATS, lambda v: isinstance(v, numbers.Real) and math.isfinite(v), "a finite number")):
        for key in keys:
            v = getattr(cfg, key)
            if v is None and key in _OPTIONAL:
                continue
            if isinstance(v, bool) is not (keys is _BOOLS) or not ok(v):
                raise ConfigError(f"{key} must be {kind}, got {v!r}; fix the {key} option")
