"""DeepViT (Zhou et al., 2021): a ViT whose blocks use re-attention to fight attention collapse.

A configuration of :class:`vitlab.models.vit.VisionTransformer`; ``deepvit_s``/``deepvit_l`` use the
official code's convolutional stem and re-attention only in their last blocks.
"""

from __future__ import annotations

_DEEPVIT = dict(embed_dim=384, num_heads=12, mlp_ratio=3.0, attn="reattention", reattn_norm="batch",
                drop_path_rule="linear")

PRESETS: dict[str, dict] = {
    "deepvit_16b": dict(_DEEPVIT, depth=16),
    "deepvit_24b": dict(_DEEPVIT, depth=24),
    "deepvit_32b": dict(_DEEPVIT, depth=32),
    "deepvit_s": dict(_DEEPVIT, embed_dim=396, depth=16, reattn_last=5, stem="conv"),
    "deepvit_l": dict(_DEEPVIT, embed_dim=420, depth=32, reattn_last=12, stem="conv"),
}
