"""The pre-norm transformer block: ``x += gate(attn(norm1(x)))``, ``x += gate(mlp(norm2(x)))``.

Any attention kind (plain, talking heads, re-attention, QK-norm, RoPE) and any residual gate (none,
LayerScale, ReZero, SkipInit, small-eps scalar, depth-muP, Fixup, T-Fixup) are arguments, not forks. Fixup and
T-Fixup are norm-free: their initialisation is applied to the whole model (see :mod:`vitlab.layers.fixup`).
The other block layouts (post-norm, DeepNorm, parallel) subclass :class:`Block`: see
:mod:`vitlab.layers.block_variants`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from torch import Tensor, nn

from vitlab.layers.attention import Attention
from vitlab.layers.depth_scale import DepthScale
from vitlab.layers.drop_path import DropPath
from vitlab.layers.fixup import FIXUP_GATES, FixupGate, add_fixup_biases
from vitlab.layers.layer_scale import LayerScale, ScalarGate, make_gate
from vitlab.layers.mlp import Mlp
from vitlab.layers.norm import LayerNorm
from vitlab.layers.sigma_reparam import sigma_reparam_flops


class ResidualGates:
    """Mixin for blocks with two gated residual branches, the gate modules ``ls1``/``ls2`` (timm's ViT names;
    timm's ``Cait`` names LayerScale's gammas ``gamma_1``/``gamma_2``, a key map of
    :mod:`vitlab.interop.timm_convert`). :func:`record_residuals` makes every block record
    ``||branch|| / ||x||`` per sample.
    """

    _ratios: list[dict[str, Tensor]] | None = None

    def _init_gates(self, dim: int, gate: str, init_values: float | None, drop_path: float,
                    depth: int | None = None) -> None:
        self.gate = gate
        self.ls1 = _gate(gate, dim, init_values, depth)
        self.ls2 = _gate(gate, dim, init_values, depth)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _residual(self, i: int, x: Tensor, y: Tensor) -> Tensor:
        branch = (self.ls1 if i == 1 else self.ls2)(y)
        self._record(i, x, branch)
        return x + (self.drop_path1 if i == 1 else self.drop_path2)(branch)

    def _record(self, i: int, x: Tensor, branch: Tensor) -> None:
        """Under :func:`record_residuals`, the ratio ``||gated branch i|| / ||x||`` per sample."""
        if self._ratios is not None:
            ratio = branch.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1).clamp_min(1e-12)  # (B,)
            if i == 1:
                self._ratios.append({"attn": ratio.detach()})
            else:
                self._ratios[-1]["mlp"] = ratio.detach()

    def _gate_flops(self, num_tokens: int) -> int:
        if isinstance(self.ls1, LayerScale | ScalarGate | FixupGate | DepthScale):  # one multiply per element
            return num_tokens * self.dim
        return 0


NORM_FREE = ("rezero", *FIXUP_GATES)  # gates whose blocks have no pre-norms


def _gate(kind: str, dim: int, init_values: float | None, depth: int | None = None) -> nn.Module:
    """:func:`make_gate`, plus Fixup's scalar multiplier and bias; T-Fixup has no gate; depth-muP's fixed
    ``1/sqrt(depth)``."""
    if kind == "depth_mup":
        return DepthScale(depth)  # type: ignore[arg-type]  (DepthScale names the fix for a missing depth)
    if kind == "fixup":
        return FixupGate()
    if kind == "tfixup":
        return nn.Identity()
    return make_gate(kind, dim, init_values)


@contextlib.contextmanager
def record_residuals(modules: Iterable[nn.Module]) -> Iterator[list[dict[str, Tensor]]]:
    """Within the block, each gated block appends ``{"attn": (B,), "mlp": (B,)}`` residual ratios."""
    ratios: list[dict[str, Tensor]] = []
    mods = [m for m in modules if isinstance(m, ResidualGates)]
    for m in mods:
        m._ratios = ratios
    try:
        yield ratios
    finally:
        for m in mods:
            m._ratios = None


class Block(ResidualGates, nn.Module):
    """Pre-norm block; ``attn`` is built by ``attn_layer(dim, num_heads, **attn_kwargs)``. ``depth``: the
    number of blocks of the stack (the depth-muP gate's ``L``); ``scale_mlp_norm``: a norm inside the MLP after
    its activation (timm's name; NormFormer, Shleifer et al. 2021)."""

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4.0,
                 attn_layer: type[nn.Module] = Attention, attn_kwargs: dict | None = None,
                 mlp_layer: type[nn.Module] = Mlp, norm_layer: type[nn.Module] = LayerNorm,
                 gate: str = "none", init_values: float | None = 1e-4, drop_path: float = 0.0,
                 proj_drop: float = 0.0, gates_first: bool = False, depth: int | None = None,
                 scale_mlp_norm: bool = False) -> None:
        super().__init__()
        self.dim = dim
        # gates_first: ls1/ls2 before the layers, CaiT's parameter order (timm's Cait yields gamma_1/gamma_2 first,
        # as vitlab's CaiT did before its gates became modules), so a saved optimiser state resumes onto the same
        # parameters; every other block registers its gates last
        if gates_first:
            self._init_gates(dim, gate, init_values, drop_path, depth)
        # ReZero, Fixup and T-Fixup drop the pre-norms; every other gate keeps them
        self.norm1 = nn.Identity() if gate in NORM_FREE else norm_layer(dim)
        self.attn = attn_layer(dim, num_heads, proj_drop=proj_drop, **(attn_kwargs or {}))
        self.norm2 = nn.Identity() if gate in NORM_FREE else norm_layer(dim)
        mlp_kwargs = {"norm_layer": norm_layer} if scale_mlp_norm else {}
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), drop=proj_drop, **mlp_kwargs)
        if gate == "fixup":
            add_fixup_biases(self.attn, self.mlp)
        if not gates_first:
            self._init_gates(dim, gate, init_values, drop_path, depth)

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        y = self.attn(self.norm1(x), rope=rope) if rope is not None else self.attn(self.norm1(x))
        x = self._residual(1, x, y)
        return self._residual(2, x, self.mlp(self.norm2(x)))

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False, rope: bool = False) -> int:
        t = num_tokens
        f = self.attn.flop_count(t, matmul_only=matmul_only, rope=rope) + self.mlp.flop_count(
            t, matmul_only=matmul_only)
        if not matmul_only:
            for norm in (self.norm1, self.norm2):
                f += norm.flop_count(t) if hasattr(norm, "flop_count") else 0
            f += 2 * self._gate_flops(t) + self.extra_flops(t)
        return f

    def extra_flops(self, num_tokens: int) -> int:
        """Multiplies outside the block's norms, attention, MLP and gates (a row of its own in
        :func:`vitlab.flops.summarize`): sigma-Reparam's weight-side work; DeepNorm adds its residual scale."""
        return sigma_reparam_flops(self)
