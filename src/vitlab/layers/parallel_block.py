"""The parallel block of ViT-22B (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters"):

    y = LN(x),   x = x + gate(attn(y)) + gate(mlp(y)),

one norm feeds both branches, which run side by side (timm's ``ParallelScalingBlock``, whose fused ``in_proj``
is vitlab's ``attn.qkv`` and ``mlp.fc1`` stacked; :mod:`vitlab.interop.timm_convert` maps the two layouts).
One drop-path mask covers the sum of both branches, as timm's. ``norm2`` is an identity.
"""

from __future__ import annotations

from torch import Tensor, nn

from vitlab.layers.block import Block


class ParallelBlock(Block):
    """``x + gate(attn(norm1(x))) + gate(mlp(norm1(x)))`` (ViT-22B); ``attn`` and ``mlp`` as :class:`Block`'s."""

    def __init__(self, dim: int, num_heads: int, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.norm2 = nn.Identity()
        self.drop_path2 = nn.Identity()  # drop_path1 drops the sum of both branches

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        y = self.norm1(x)
        a = self.ls1(self.attn(y, rope=rope) if rope is not None else self.attn(y))
        m = self.ls2(self.mlp(y))
        self._record(1, x, a)
        self._record(2, x, m)
        return x + self.drop_path1(a + m)
