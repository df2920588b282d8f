"""Model-level FLOP accounting: per-module multiplies, per-type totals and a cross-check against torch.

Convention (docs/flops.md): every count is of **multiplies** for one image at the configured
size, one per multiply-add, i.e. MACs. ``FLOPs = 2 x MACs``. Paper tables (DeiT, CaiT) print MACs and
call them FLOPs: CaiT-S24 at 224 is "9.4 G" there and 9.36 GMACs here. Additions (biases, residuals,
position embeddings) are free; softmax, norms, GELU, LayerScale and the attention scale count one
multiply per element they multiply. ``matmul_macs`` keeps only the matmul-like ops (linear layers,
convolutions, ``Q K^T``, ``A V``, head mixing), which is what :func:`cross_check` compares with
``torch.utils.flop_counter.FlopCounterMode``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitlab.layers import (
    Attention,
    ClassAttention,
    ClassAttentionBlock,
    ConvStem,
    DepthScale,
    LayerScale,
    Mlp,
    PatchEmbed,
    ReAttention,
    ScalarGate,
    SwiGLU,
)
from vitlab.layers.block import ResidualGates
from vitlab.layers.fixup import FixupGate
from vitlab.models.base import FlopRow, VitlabModel, module_flops

TYPES = ("patch_embed", "attention", "reattention", "class_attention", "mlp", "norm", "layerscale", "gate",
         "block_other", "head", "pos_embed", "tokens")  # block_other: sigma-Reparam's weight work, DeepNorm's alpha


@dataclass(frozen=True)
class FlopEntry:
    """One row of a summary: a module (or LayerScale parameter) and its cost for one image."""

    name: str
    type: str  # one of TYPES
    module: str  # class name
    params: int
    tokens: int
    macs: int
    matmul_macs: int


@dataclass
class FlopSummary:
    """Per-module rows and totals of one model (MACs = multiplies; FLOPs = 2 x MACs)."""

    model: str
    img_size: int
    patch_size: int
    in_chans: int
    num_tokens: int
    rows: list[FlopEntry] = field(default_factory=list)

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.rows)

    @property
    def flops(self) -> int:
        return 2 * self.macs

    @property
    def matmul_macs(self) -> int:
        return sum(r.matmul_macs for r in self.rows)

    @property
    def params(self) -> int:
        return sum(r.params for r in self.rows)

    @property
    def by_type(self) -> dict[str, dict[str, int]]:
        """``{type: {"params", "macs", "matmul_macs"}}`` in :data:`TYPES` order, types present only."""
        out: dict[str, dict[str, int]] = {}
        for kind in TYPES:
            rows = [r for r in self.rows if r.type == kind]
            if rows:
                out[kind] = {"params": sum(r.params for r in rows), "macs": sum(r.macs for r in rows),
                             "matmul_macs": sum(r.matmul_macs for r in rows)}
        return out

    def to_dict(self) -> dict:
        return {"model": self.model, "img_size": self.img_size, "patch_size": self.patch_size,
                "in_chans": self.in_chans, "num_tokens": self.num_tokens, "params": self.params,
                "macs": self.macs, "flops": self.flops, "matmul_macs": self.matmul_macs,
                "convention": "macs = multiplies (one per multiply-add) for one image; flops = 2 * macs",
                "by_type": self.by_type, "rows": [vars(r) for r in self.rows]}


def module_type(module: nn.Module, name: str = "") -> str:
    """The summary type of an arithmetic module."""
    kinds = ((PatchEmbed, "patch_embed"), (ConvStem, "patch_embed"), (ReAttention, "reattention"),
             (ClassAttention, "class_attention"), (Attention, "attention"), (Mlp, "mlp"), (SwiGLU, "mlp"),
             (LayerScale, "layerscale"), (ScalarGate, "gate"), (FixupGate, "gate"), (DepthScale, "gate"),
             (nn.LayerNorm, "norm"), (nn.RMSNorm, "norm"))
    for cls, kind in kinds:
        if isinstance(module, cls):
            return kind
    if isinstance(module, nn.Linear) and name.split(".")[-1] == "head":
        return "head"
    raise TypeError(f"no FLOP type for {type(module).__name__} {name!r}")


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _entry(name: str, module: nn.Module, tokens: int, **kwargs) -> FlopEntry:
    return FlopEntry(name, module_type(module, name), type(module).__name__, _params(module), tokens,
                     module_flops(module, tokens, False, **kwargs), module_flops(module, tokens, True, **kwargs))


def _gate(block: ResidualGates, i: int, name: str, tokens: int) -> Iterator[FlopEntry]:
    """Gate ``i`` of a block, the module ``ls{i}``: LayerScale, a scalar gate or nothing (identity)."""
    gate = getattr(block, f"ls{i}")
    if isinstance(gate, LayerScale):
        yield _entry(f"{name}.ls{i}", gate, tokens)
    elif isinstance(gate, ScalarGate | FixupGate | DepthScale):  # a scalar times every element (Fixup: + a bias)
        yield FlopEntry(f"{name}.ls{i}", "gate", type(gate).__name__, _params(gate), tokens, tokens * block.dim, 0)
    elif _params(gate):
        raise TypeError(f"no FLOP rule for the {type(gate).__name__} gate {name}.ls{i}")


def _expand(row: FlopRow) -> Iterator[FlopEntry]:
    """A block row becomes its parts (norms, attention, gates, MLP); any other row stays one entry."""
    block, name, t = row.module, row.name, row.num_tokens
    if not isinstance(block, ResidualGates):
        yield _entry(name, block, t, **row.kwargs)
        return
    t_out = 1 if isinstance(block, ClassAttentionBlock) else t  # class-attention updates the class token only
    for part, tokens, kwargs in (("norm1", t, {}), ("attn", t, row.kwargs), (1, t_out, None),
                                 ("norm2", t_out, {}), ("mlp", t_out, {}), (2, t_out, None)):
        if kwargs is None:
            yield from _gate(block, part, name, tokens)
            continue
        module = getattr(block, part)
        if hasattr(module, "flop_count"):  # ReZero's Identity norms cost nothing
            yield _entry(f"{name}.{part}", module, tokens, **kwargs)
    other = block.extra_flops(t) if hasattr(block, "extra_flops") else 0
    if other:  # no parameters of its own: sigma-Reparam's gammas stay with their layers' rows
        yield FlopEntry(f"{name}.other", "block_other", type(block).__name__, 0, t, other, 0)


def summarize(model: VitlabModel) -> FlopSummary:
    """Per-module multiplies and parameters of ``model`` for one image at its configured size.

    Parameters outside any arithmetic module (class/register tokens, position embedding) get rows of
    their own with 0 MACs, so ``summary.params`` is the model's parameter count.
    """
    cfg = model.cfg
    rows = [entry for row in model.flop_rows() for entry in _expand(row)]
    counted = {id(p) for row in model.flop_rows() for p in row.module.parameters()}
    for name, p in model.named_parameters():
        if id(p) not in counted:
            kind = "pos_embed" if name.endswith("pos_embed") else "tokens"
            rows.append(FlopEntry(name, kind, "Parameter", p.numel(), 0, 0, 0))
    total = sum(p.numel() for p in model.parameters())
    if sum(r.params for r in rows) != total:  # a module of a block that no row covers: never a silent undercount
        raise RuntimeError(f"the FLOP summary of {cfg.name or cfg.arch} counts {sum(r.params for r in rows):,} of its "
                           f"{total:,} parameters; a block part has no row in vitlab.flops._expand")
    tokens = max((r.num_tokens for r in model.flop_rows()), default=0)
    return FlopSummary(cfg.name or cfg.arch, cfg.img_size, cfg.patch_size, cfg.in_chans, tokens, rows)


def torch_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs ``FlopCounterMode`` reports for ``model(x)`` in eval mode with the MATH attention backend
    (the fused CPU kernel is otherwise not counted). Works on the meta device."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        # FlopCounterMode's module tracker fails on views of parameters made under no_grad, so keep grad on
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops()


def cross_check(model: VitlabModel) -> tuple[int, int]:
    """``(2 x model.flop_count(matmul_only=True), FlopCounterMode's FLOPs)`` for one image; equal when the
    accounting is exact."""
    cfg = model.cfg
    p = next(model.parameters())
    x = torch.randn(1, cfg.in_chans, cfg.img_size, cfg.img_size, device=p.device, dtype=p.dtype)
    return 2 * model.flop_count(matmul_only=True), torch_flops(model, x)


def human(n: float, unit: str = "") -> str:
    """``human(1234567, "MACs") -> '1.23 MMACs'`` (prefixes K, M, G, T)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def format_table(summary: FlopSummary) -> str:
    """The per-module table, the per-type totals and the totals, as plain text."""
    s = summary
    width = max([len(r.name) for r in s.rows] + [6])
    head = f"{'module':<{width}}  {'type':<15}  {'params':>12}  {'tokens':>6}  {'MACs':>15}  {'matmul MACs':>15}"
    lines = [f"{s.model}: img_size {s.img_size}, patch_size {s.patch_size}, in_chans {s.in_chans}, "
             f"{s.num_tokens} tokens; counts are per image", "", head, "-" * len(head)]
    for r in s.rows:
        lines.append(f"{r.name:<{width}}  {r.type:<15}  {r.params:>12,}  {r.tokens:>6}  {r.macs:>15,}  "
                     f"{r.matmul_macs:>15,}")
    lines += ["", f"{'type':<15}  {'params':>12}  {'MACs':>15}  {'share':>6}", "-" * 53]
    for kind, t in s.by_type.items():
        share = 100.0 * t["macs"] / s.macs if s.macs else 0.0
        lines.append(f"{kind:<15}  {t['params']:>12,}  {t['macs']:>15,}  {share:>5.1f}%")
    lines += ["", f"params       {s.params:,} ({s.params / 1e6:.2f} M)",
              f"MACs         {s.macs:,} ({human(s.macs, 'MACs')})  multiplies, one per multiply-add",
              f"FLOPs        {s.flops:,} ({human(s.flops, 'FLOPs')})  = 2 x MACs (papers print MACs as \"FLOPs\")",
              f"matmul MACs  {s.matmul_macs:,} ({human(s.matmul_macs, 'MACs')})  linear, conv, QK^T, AV, head mixing"]
    return "\n".join(lines)


def format_cross_check(ours: int, theirs: int) -> str:
    verdict = "OK, equal" if ours == theirs else f"MISMATCH by {theirs - ours:+,}"
    return (f"cross-check  2 x matmul MACs = {ours:,}; torch FlopCounterMode (eval, MATH attention, 1 image) = "
            f"{theirs:,}: {verdict}")


def model_cost(preset: str, overrides: dict[str, Any]) -> tuple[int, int]:
    """``(parameters, MACs per image)`` of a vitlab preset with ``overrides``, built on the meta device."""
    from vitlab.models import create_model

    with torch.device("meta"):
        model = create_model(preset, **overrides)
    return sum(p.numel() for p in model.parameters()), model.flop_count()


def model_macs(model: nn.Module, img_size: int, in_chans: int) -> int:
    """Multiply-accumulates per image of any model (on any device, meta included): vitlab's ``flop_count()``, else
    ``FlopCounterMode``'s matmul FLOPs / 2 (:func:`torch_flops`)."""
    if hasattr(model, "flop_count"):
        return int(model.flop_count())
    x = torch.zeros(1, in_chans, img_size, img_size, device=next(model.parameters()).device)
    return torch_flops(model, x) // 2


def token_count(model: nn.Module) -> int | None:
    """Tokens per image of a ViT-like model (patches + prefix tokens, vitlab's or timm's attributes), else None."""
    patches = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    if not isinstance(patches, int) or patches <= 0:
        return None
    return patches + int(getattr(model, "num_prefix_tokens", 0) or 0)
