"""ViT-5 (Wang et al., ViT-5) on the ViT: RMSNorm, QK-norm, no qkv bias, LayerScale 1e-4, four registers after the
patches, a learned position embedding on the patches plus 2-D RoPE on the patches and a second 2-D RoPE
(2x2 grid, theta 100) on the registers. A configuration of :class:`vitlab.models.vit.VisionTransformer`.

The presets follow the authors' code (wangf3014/ViT-5, ``models_vit5.py``, ``rope.py``, ``main.py``): its RoPE
channel layout (adjacent pairs, row angle first, registers on a square grid), class and register tokens drawn
trunc-normal with std 0.02, dropout only before the head, the same drop-path rate in every block, and plain
(not antialiased) bicubic resizing of the position table for another image size. Official checkpoints load
with :func:`vitlab.from_vit5`; ``tests/test_vit5_official.py`` checks equal logits against that code.
"""

from __future__ import annotations

_VIT5 = dict(norm="rmsnorm", qk_norm=True, qkv_bias=False, reg_tokens=4, reg_position="end",
             gate="layerscale", init_values=1e-4, pos_embed="learned", pos_embed_cls=False, rope=True,
             rope_theta=10000.0, reg_rope_theta=100.0, drop_path_rule="uniform", rope_layout="vit5",
             token_init_std=0.02, drop_rate_at="head", pos_resample_antialias=False)

PRESETS: dict[str, dict] = {
    "vit5_small": dict(_VIT5, embed_dim=384, depth=12, num_heads=6),
    "vit5_base": dict(_VIT5, embed_dim=768, depth=12, num_heads=12),
    "vit5_large": dict(_VIT5, embed_dim=1024, depth=24, num_heads=16),
    "vit5_xlarge": dict(_VIT5, embed_dim=1152, depth=28, num_heads=16),
}
