"""Post-norm blocks: the original Transformer's (Vaswani et al. 2017) and DeepNorm (Wang et al. 2022).

Post-norm (``block='postnorm'``): the norm follows the residual sum,

    x = LN(x + attn(x)),   x = LN(x + mlp(x)).

DeepNorm (``block='deepnorm'``), Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers": the residual
is up-weighted before the norm and the branches start small,

    x = LN(alpha * x + attn(x)),   x = LN(alpha * x + mlp(x)),

for an encoder-only stack of ``N`` blocks ``alpha = (2N)^(1/4)`` and the value projection, the output projection
and both MLP weights are drawn Xavier-normal with gain ``beta = (8N)^(-1/4)``; the query and key projections are
Xavier-normal with gain 1 (the paper's Figure 2 pseudo-code), every bias zero. Both blocks keep timm's parameter
names (``norm1`` after the attention branch, ``norm2`` after the MLP branch); the model's final ``norm`` stays.
"""

from __future__ import annotations

from torch import Tensor, nn

from vitlab.layers.block import Block


def deepnorm_alpha(depth: int) -> float:
    """DeepNorm's residual scale for an encoder of ``depth`` blocks: ``(2N)^(1/4)``."""
    return (2 * depth) ** 0.25


def deepnorm_beta(depth: int) -> float:
    """DeepNorm's init gain for an encoder of ``depth`` blocks: ``(8N)^(-1/4)``."""
    return (8 * depth) ** -0.25


class PostNormBlock(Block):
    """``x = norm1(x + gate(attn(x)))``, ``x = norm2(x + gate(mlp(x)))`` (post-LN, Vaswani et al. 2017)."""

    alpha = 1.0  # the residual's weight before the norm

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        y = self.attn(x, rope=rope) if rope is not None else self.attn(x)
        x = self.norm1(self._residual(1, self._skip(x), y))
        return self.norm2(self._residual(2, self._skip(x), self.mlp(x)))

    def _skip(self, x: Tensor) -> Tensor:
        return x if self.alpha == 1.0 else x * self.alpha

    def extra_flops(self, num_tokens: int) -> int:
        scale = 0 if self.alpha == 1.0 else 2 * num_tokens * self.dim  # alpha * x, on each branch's residual
        return super().extra_flops(num_tokens) + scale


class DeepNormBlock(PostNormBlock):
    """``x = norm(alpha * x + gate(f(x)))`` with ``alpha = (2 depth)^(1/4)`` (DeepNorm, Wang et al. 2022);
    :meth:`reset_parameters` draws the paper's initialisation with ``beta = (8 depth)^(-1/4)``."""

    def __init__(self, dim: int, num_heads: int, *, depth: int = 1, **kwargs) -> None:
        super().__init__(dim, num_heads, depth=depth, **kwargs)
        self.alpha = deepnorm_alpha(depth)
        self.beta = deepnorm_beta(depth)

    def reset_parameters(self) -> None:
        """Xavier-normal: gain ``beta`` on v, the output projection and the MLP, gain 1 on q and k; biases 0."""
        init_deepnorm_(self.attn, self.mlp, self.beta)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"


def init_deepnorm_(attn: nn.Module, mlp: nn.Module, beta: float) -> None:
    """DeepNorm's init of one block: the fused ``qkv`` is drawn as three ``d x d`` matrices (q, k: gain 1;
    v: gain ``beta``), ``proj`` and every MLP linear with gain ``beta``; every bias of them zero."""
    qkv = attn.qkv
    d = qkv.in_features
    for i, gain in enumerate((1.0, 1.0, beta)):
        nn.init.xavier_normal_(qkv.weight.data[i * d:(i + 1) * d], gain=gain)
    linears = [attn.proj, *(m for m in mlp.children() if isinstance(m, nn.Linear))]
    for m in linears:
        nn.init.xavier_normal_(m.weight, gain=beta)
    for m in (qkv, *linears):
        if m.bias is not None:
            nn.init.zeros_(m.bias)
