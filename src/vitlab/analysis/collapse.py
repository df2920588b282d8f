"""Attention collapse (DeepViT, Zhou et al. 2021): how similar the attention maps of different layers are.

For layers ``p`` and ``q``, head ``h`` and token ``t`` the seed defines

    M[p, q, h, t] = cos(A^p[h, :, t], A^q[h, :, t])

the cosine similarity of the same head's attention *column* for token ``t`` (the attention every query pays
to ``t``). :func:`cross_layer_similarity` averages it over heads, tokens and the batch into an ``(L, L)``
matrix; :func:`similar_blocks` counts, per layer, the other layers whose similarity exceeds a threshold.

Only maps of the same ``(T_q, T_k)`` shape compare. :func:`collapse_groups` splits a model's maps into
groups: self-attention layers (``T_q == T_k``) compare by columns as in the seed; CaiT's class-attention
layers (``T_q == 1``, keys ``[cls, patches]``) have a one-entry column whose cosine is always 1, so they
compare by their single query row (the class token's attention over all keys) among themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vitlab.errors import ConfigError

AXES = ("column", "row")


def _check_maps(maps: list[Tensor]) -> None:
    if len(maps) == 0:
        raise ConfigError("no attention maps to compare; pass model.attention_maps(x) of a model with attention")
    shape = tuple(maps[0].shape)
    if len(shape) != 4:
        raise ConfigError(f"attention maps must be (B, heads, T_q, T_k), got shape {shape}")
    for i, m in enumerate(maps):
        if tuple(m.shape) != shape:
            raise ConfigError(f"attention map {i} has shape {tuple(m.shape)} but map 0 has {shape}; only maps of "
                              "one shape compare, split them with collapse_groups(maps) first")


def _unit(m: Tensor, along: str) -> Tensor:
    """Normalise ``(B, H, T_q, T_k)`` to unit vectors along the query axis (columns) or key axis (rows)."""
    dim = -2 if along == "column" else -1
    return m / m.norm(dim=dim, keepdim=True).clamp_min(1e-12)


def cross_layer_similarity(maps: list[Tensor], *, along: str = "column") -> Tensor:
    """``(L, L)`` mean cosine similarity between the attention maps of every pair of layers.

    ``maps``: ``L`` tensors ``(B, heads, T_q, T_k)`` of one shape. ``along='column'`` compares, for each head
    and key token, the attention that all queries pay to it (Zhou et al. 2021); ``'row'`` compares, for each head and
    query, its attention over the keys (used for class-attention, where ``T_q == 1``). The mean runs over
    batch, heads and tokens. Identical maps give 1; zero vectors count as similarity 0.
    """
    if along not in AXES:
        raise ConfigError(f"unknown similarity axis {along!r}; choose one of {', '.join(AXES)}")
    _check_maps(maps)
    units = torch.stack([_unit(m.detach().float(), along) for m in maps]).flatten(1)  # (L, B*H*T_q*T_k)
    count = maps[0].shape[0] * maps[0].shape[1] * maps[0].shape[-1 if along == "column" else -2]  # vectors per map
    # the mean of per-vector cosines is the dot product of the flattened unit vectors over their count
    return (units @ units.T).cpu() / count


def similar_blocks(sim: Tensor, threshold: float = 0.9) -> Tensor:
    """``(L,)`` int64: for each layer, how many *other* layers have similarity above ``threshold``."""
    if sim.dim() != 2 or sim.shape[0] != sim.shape[1]:
        raise ConfigError(f"similarity must be a square (L, L) matrix, got shape {tuple(sim.shape)}")
    if not -1.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold {threshold} is not a cosine similarity; pass a value in [-1, 1], e.g. 0.9")
    above = sim > threshold
    above.fill_diagonal_(False)
    return above.sum(dim=1)


def adjacent_similarity(sim: Tensor) -> Tensor:
    """``(L,)``: similarity of each layer with the previous one (NaN for the first)."""
    prev = torch.full((sim.shape[0],), float("nan"))
    if sim.shape[0] > 1:
        prev[1:] = torch.diagonal(sim, offset=-1)
    return prev


@dataclass
class CollapseGroup:
    """Layers whose maps share a shape, and their cross-layer similarity.

    ``layers`` are indices into the model's list of attention maps; ``similarity`` is ``(len(layers),)*2``.
    """

    name: str
    layers: list[int]
    along: str
    similarity: Tensor
    similar: Tensor
    threshold: float

    def mean_off_diagonal(self) -> float:
        """Mean similarity over pairs of distinct layers (NaN with one layer)."""
        n = len(self.layers)
        if n < 2:
            return float("nan")
        return float((self.similarity.sum() - self.similarity.diagonal().sum()) / (n * (n - 1)))


def group_name(t_q: int, t_k: int) -> str:
    if t_q == 1 and t_k > 1:
        return "class_attention"
    if t_q == t_k:
        return "self_attention"
    return f"attention_{t_q}x{t_k}"


def collapse_groups(maps: list[Tensor], threshold: float = 0.9) -> list[CollapseGroup]:
    """Split ``maps`` by shape and compute each group's similarity and similar-block counts.

    Self-attention groups compare columns (Zhou et al. 2021), class-attention groups (``T_q == 1``) rows.
    Groups come in order of their first layer.
    """
    if len(maps) == 0:
        raise ConfigError("no attention maps to compare; pass model.attention_maps(x) of a model with attention")
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(maps):
        by_shape.setdefault(tuple(m.shape), []).append(i)
    groups = []
    for shape, layers in by_shape.items():
        t_q, t_k = shape[-2], shape[-1]
        along = "row" if t_q == 1 else "column"
        sim = cross_layer_similarity([maps[i] for i in layers], along=along)
        groups.append(CollapseGroup(group_name(t_q, t_k), layers, along, sim, similar_blocks(sim, threshold),
                                    threshold))
    return groups


def is_probability_rows(m: Tensor, atol: float = 1e-3) -> bool:
    """Whether ``(..., T_k)`` maps are softmax rows: non-negative, each summing to 1 (within ``atol``)."""
    m = m.detach().float()
    return bool(m.min() >= -atol and torch.allclose(m.sum(-1), torch.ones((), device=m.device), atol=atol))


def attention_entropy(maps: list[Tensor]) -> Tensor:
    """``(L,)`` normalised entropy of each layer's attention rows: ``H(row) / log(T_k)``, averaged over batch,
    heads and queries; 1 for uniform attention (every key weighted ``1 / T_k``), 0 when each query attends to
    one key. Near-uniform maps are alike whatever the layer, so a high cross-layer similarity of maps whose
    entropy is near 1 says the layers do not focus, not that they focus on the same tokens.

    ``maps``: ``(B, heads, T_q, T_k)`` softmax maps, ``T_k > 1``. Maps mixed over heads after the softmax
    (re-attention, talking heads) are not probability rows and are refused: record them before the mix with
    :func:`vitlab.layers.record_pre_mix`."""
    if len(maps) == 0:
        raise ConfigError("no attention maps; pass model.attention_maps(x) of a model with attention")
    out = []
    for i, m in enumerate(maps):
        if m.dim() != 4 or m.shape[-1] < 2:
            raise ConfigError(f"attention map {i} has shape {tuple(m.shape)}; expected (B, heads, T_q, T_k) with "
                              "T_k > 1")
        if not is_probability_rows(m):
            raise ConfigError(f"attention map {i} is not softmax rows (negative entries or rows not summing to 1), "
                              "e.g. mixed over heads after the softmax; record the maps before the mix with "
                              "vitlab.layers.record_pre_mix")
        p = m.detach().float().clamp_min(0)
        h = -(p * p.clamp_min(1e-12).log()).sum(-1)  # (B, H, T_q), 0 log 0 = 0
        out.append(h.mean() / torch.log(torch.tensor(float(m.shape[-1]))))
    return torch.stack(out)


class SimilarityMeter:
    """Running batch-weighted mean of :func:`collapse_groups` over chunks of one data set."""

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold
        self._sums: list[Tensor] | None = None
        self._groups: list[CollapseGroup] | None = None
        self.count = 0

    def update(self, maps: list[Tensor]) -> None:
        groups = collapse_groups(maps, self.threshold)
        b = maps[0].shape[0]
        if self._groups is None:
            self._groups, self._sums = groups, [g.similarity * b for g in groups]
        else:
            if [g.layers for g in groups] != [g.layers for g in self._groups]:
                raise ConfigError("attention layers changed between batches; analyse one model at a time")
            self._sums = [s + g.similarity * b for s, g in zip(self._sums, groups)]
        self.count += b

    def compute(self) -> list[CollapseGroup]:
        if self._groups is None:
            raise ConfigError("SimilarityMeter saw no batch; call update(maps) first")
        out = []
        for g, s in zip(self._groups, self._sums):
            sim = s / self.count
            out.append(CollapseGroup(g.name, g.layers, g.along, sim, similar_blocks(sim, self.threshold),
                                     self.threshold))
        return out
