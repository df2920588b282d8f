"""ViT-5 components on the ViT: RMSNorm, QK-norm, no qkv bias, LayerScale 1e-4, four registers after the
patches, a learned position embedding on the patches plus 2-D RoPE on the patches and a second 2-D RoPE
(2x2 grid, theta 100) on the registers. A configuration of :class:`vitlab.models.vit.VisionTransformer`.
"""

from __future__ import annotations

_VIT5 = dict(norm="rmsnorm", qk_norm=True, qkv_bias=False, reg_tokens=4, reg_position="end",
             gate="layerscale", init_values=1e-4, pos_embed="learned", pos_embed_cls=False, rope=True,
             rope_theta=10000.0, reg_rope_theta=100.0, drop_path_rule="uniform")

PRESETS: dict[str, dict] = {
    "vit5_small": dict(_VIT5, embed_dim=384, depth=12, num_heads=6),
    "vit5_base": dict(_VIT5, embed_dim=768, depth=12, num_heads=12),
    "vit5_large": dict(_VIT5, embed_dim=1024, depth=24, num_heads=16),
    "vit5_xlarge": dict(_VIT5, embed_dim=1152, depth=28, num_heads=16),
}
