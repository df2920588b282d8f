"""Per-layer probes of why deep ViTs fail: over-smoothing, rank collapse, artifact tokens and attention logits.

Each probe is a pure function on one layer's tokens or attention, and :func:`probe_model` runs them all on every
self-attention block of a vitlab model (:func:`probe_model`). Patch statistics use the patch tokens only: the class
token and register tokens are left out (they are where Darcet et al. 2024 expect the artifacts to go).

- **token similarity** (over-smoothing): the mean cosine similarity of the patch tokens over all pairs ``i != j``
  of one image; 1 when every token is the same vector.
- **effective rank** (Roy & Vetterli 2007): ``exp(-sum_i p_i log p_i)`` with ``p_i = s_i / sum_j s_j`` the
  normalised singular values of the centred ``(N, D)`` patch-token matrix ``X - 1 mean(X)^T``; the number of
  directions the tokens spread in (k equal directions give k; identical tokens have no spread: 0).
- **rank residual** (Dong et al. 2021, "Attention is not all you need: pure attention loses rank doubly
  exponentially"): ``||X - 1 x^T||_F / ||X||_F`` with ``x`` the best rank-one fit of the form ``1 x^T``, which in
  the Frobenius norm is the mean token (the paper bounds the composite l1/l-inf norm; the Frobenius form is the
  one measured here). 0 when all tokens are equal: rank collapse.
- **artifact tokens** (Darcet et al. 2024, "Vision Transformers Need Registers"): per image, a patch token is a
  high-norm outlier when its L2 norm exceeds ``median + k * 1.4826 * MAD`` of that image's patch-token norms
  (``k`` robust standard deviations; :data:`ARTIFACT_K` = 6 by default; the MAD is floored at ``1e-6`` of the
  median so identical norms flag nothing but a larger one). Reported: the norm quantiles, the mean count of
  outliers per image and the attention mass they receive in the block that reads them (outliers of the block's
  *input*, the tokens its keys are made from): from the class-token query and averaged over all queries, and
  the same for the register tokens.
- **attention entropy** per head: ``-sum_j A_ij log A_ij`` in nats, averaged over queries and images; ``log T``
  for uniform attention over ``T`` keys. Maps mixed over heads after the softmax (talking heads, re-attention) are
  read before that mix.
- **max logit** (Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023): the largest pre-softmax attention logit
  ``q . k / sqrt(d)`` of the block over heads, queries, keys and images; its growth precedes divergence.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError

ARTIFACT_K = 6.0  # robust standard deviations above the median norm that make a token an outlier
MAD_TO_STD = 1.4826  # the MAD of a normal distribution times this is its standard deviation
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 1.0)
PROBES = ("token_similarity", "effective_rank", "rank_residual", "artifact_count", "artifact_mass_cls",
          "artifact_mass_all", "register_mass_cls", "register_mass_all", "attn_entropy", "max_logit")


def _tokens(x: Tensor) -> Tensor:
    if x.dim() == 2:
        x = x.unsqueeze(0)
    if x.dim() != 3 or x.shape[1] < 1:
        raise ConfigError(f"tokens must be (B, N, D) or (N, D) with N >= 1, got shape {tuple(x.shape)}")
    return x.detach().float()


def token_similarity(tokens: Tensor) -> Tensor:
    """``(B,)`` mean pairwise cosine similarity of the ``N`` tokens of each image (pairs ``i != j``; NaN for
    ``N < 2``). ``tokens``: ``(B, N, D)`` or ``(N, D)``."""
    x = _tokens(tokens)
    n = x.shape[1]
    if n < 2:
        return torch.full((x.shape[0],), float("nan"))
    u = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    total = u.sum(dim=1).pow(2).sum(-1)  # sum over all pairs (i, j) of u_i . u_j
    diag = u.pow(2).sum((1, 2))  # the n pairs (i, i)
    return ((total - diag) / (n * (n - 1))).cpu()


def effective_rank(tokens: Tensor, *, centre: bool = True) -> Tensor:
    """``(B,)`` effective rank (Roy & Vetterli 2007) of each image's ``(N, D)`` token matrix, centred over the
    tokens unless ``centre=False``; 0 for a zero matrix."""
    x = _tokens(tokens)
    if centre:
        x = x - x.mean(dim=1, keepdim=True)
    s = torch.linalg.svdvals(x.double())  # (B, min(N, D))
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(1e-300)
    h = -(p * p.clamp_min(1e-300).log()).sum(-1)
    scale = x.double().abs().amax((1, 2)).clamp_min(1e-300)
    zero = total.squeeze(-1) <= 1e-9 * scale * s.shape[-1]  # no spread at all (up to rounding)
    return torch.where(zero, torch.zeros_like(h), h.exp()).float().cpu()


def rank_residual(tokens: Tensor) -> Tensor:
    """``(B,)`` ``||X - 1 mean(X)^T||_F / ||X||_F``: the relative distance of each image's tokens from the nearest
    matrix of identical rows (Dong et al. 2021, Frobenius form); 0 when every token is the same."""
    x = _tokens(tokens)
    res = (x - x.mean(dim=1, keepdim=True)).flatten(1).norm(dim=1)
    return (res / x.flatten(1).norm(dim=1).clamp_min(1e-12)).cpu()


def token_norms(tokens: Tensor) -> Tensor:
    """``(B, N)`` L2 norm of every token."""
    return _tokens(tokens).norm(dim=-1)


def outlier_mask(norms: Tensor, k: float = ARTIFACT_K) -> Tensor:
    """``(B, N)`` bool: the tokens whose norm exceeds ``median + k * 1.4826 * MAD`` of their image's norms."""
    if norms.dim() != 2:
        raise ConfigError(f"norms must be (B, N), got shape {tuple(norms.shape)}")
    if not k > 0:
        raise ConfigError(f"the outlier threshold k must be > 0 robust standard deviations, got {k}; e.g. 6")
    med = norms.median(dim=1, keepdim=True).values
    mad = (norms - med).abs().median(dim=1, keepdim=True).values
    spread = torch.maximum(MAD_TO_STD * mad, 1e-6 * med.abs())
    return norms > med + k * spread


def attention_mass(attn: Tensor, keys: Tensor, query: int | None = None) -> Tensor:
    """``(B,)`` share of attention that goes to the keys in ``keys`` (``(B, T_k)`` or ``(T_k,)`` bool), averaged
    over heads and over all queries (``query=None``) or read at one query row (e.g. 0: the class token)."""
    if attn.dim() != 4:
        raise ConfigError(f"an attention map must be (B, heads, T_q, T_k), got shape {tuple(attn.shape)}")
    a = attn.detach().float()
    if query is not None:
        a = a[:, :, query:query + 1]
    keys = keys.to(a.device)
    if keys.dim() == 1:
        keys = keys.unsqueeze(0).expand(a.shape[0], -1)
    mass = (a * keys[:, None, None, :].float()).sum(-1)  # (B, H, T_q)
    return mass.mean((1, 2)).cpu()


def head_entropy(attn: Tensor) -> Tensor:
    """``(B, heads)`` entropy in nats of the attention rows, averaged over the queries; ``log T_k`` when uniform."""
    if attn.dim() != 4:
        raise ConfigError(f"an attention map must be (B, heads, T_q, T_k), got shape {tuple(attn.shape)}")
    p = attn.detach().float().clamp_min(0)
    return (-(p * p.clamp_min(1e-30).log()).sum(-1)).mean(-1).cpu()


def max_logit(logits: Tensor) -> float:
    """The largest pre-softmax logit of ``(B, heads, T_q, T_k)`` logits."""
    return float(logits.detach().float().max())


@dataclass
class Probes:
    """Per-layer probes of one model on a batch (one entry per self-attention block, in order; means over the
    images unless said). ``attn_entropy`` holds one list of per-head entropies per block; ``norm_quantiles`` one
    dict ``{q: norm}`` per block; ``token_norms`` the ``(L, B, N)`` patch-token norms and ``outliers`` their
    outlier masks (for figures); ``k`` the outlier rule's threshold."""

    layers: list[int]
    token_similarity: list[float]
    effective_rank: list[float]
    rank_residual: list[float]
    norm_quantiles: list[dict[float, float]]
    artifact_count: list[float]
    artifact_mass_cls: list[float]
    artifact_mass_all: list[float]
    register_mass_cls: list[float]
    register_mass_all: list[float]
    attn_entropy: list[list[float]]
    max_logit: list[float]
    num_images: int
    k: float = ARTIFACT_K
    token_norms: Tensor | None = field(default=None, repr=False)
    outliers: Tensor | None = field(default=None, repr=False)

    def rows(self) -> list[dict[str, Any]]:
        """One row per block: every probe (entropy as its mean and smallest head), the norm quantiles."""
        out = []
        for i, layer in enumerate(self.layers):
            ent = self.attn_entropy[i]
            row = {"layer": layer}
            for name in PROBES:
                if name == "attn_entropy":
                    row["attn_entropy"] = sum(ent) / len(ent) if ent else float("nan")
                    row["attn_entropy_min_head"] = min(ent) if ent else float("nan")
                else:
                    row[name] = getattr(self, name)[i]
            row.update({f"norm_q{round(100 * q):02d}" if q < 1 else "norm_max": v
                        for q, v in self.norm_quantiles[i].items()})
            out.append(row)
        return out

    def head_rows(self) -> list[dict[str, Any]]:
        """One row per block and head: its attention entropy (nats)."""
        return [{"layer": layer, "head": h, "entropy": e}
                for layer, ents in zip(self.layers, self.attn_entropy) for h, e in enumerate(ents)]

    def columns(self, prefix: str = "probe") -> dict[str, float]:
        """Flat ``{prefix}/{probe}/block{i}`` numbers (metrics rows and ``--logger`` trackers)."""
        out = {}
        for row in self.rows():
            layer = row.pop("layer")
            out.update({f"{prefix}/{name}/block{layer}": float(v) for name, v in row.items()})
        return out


def layer_columns(row: dict[str, Any], prefix: str = "probe") -> dict[int, dict[str, Any]]:
    """``{layer: {probe: value}}`` from the ``{prefix}/{probe}/block{i}`` columns of one metrics row: the inverse of
    :meth:`Probes.columns` (the studies read their runs' per-epoch probes back with it)."""
    out: dict[int, dict[str, Any]] = {}
    for name, value in row.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == prefix and parts[2].startswith("block") and parts[2][5:].isdigit():
            out.setdefault(int(parts[2][5:]), {})[parts[1]] = value
    return out


@contextlib.contextmanager
def _block_records(blocks: list[nn.Module]) -> Any:
    """Per block: its input and output tokens and its attention's maps, pre-mix maps and logits."""
    from vitlab.layers.attention import record_attention, record_logits, record_pre_mix

    recs: list[dict[str, Any]] = [{} for _ in blocks]

    def hook(i: int):  # noqa: ANN202
        def run(_m: nn.Module, args: tuple, output: Tensor) -> None:
            recs[i]["input"], recs[i]["output"] = args[0], output
        return run

    handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
    try:
        with contextlib.ExitStack() as stack:
            for i, b in enumerate(blocks):
                recs[i]["maps"] = stack.enter_context(record_attention(b.modules()))
                recs[i]["pre_mix"] = stack.enter_context(record_pre_mix(b.modules()))
                recs[i]["logits"] = stack.enter_context(record_logits(b.modules()))
            yield recs
    finally:
        for h in handles:
            h.remove()


def _layout(model: nn.Module) -> tuple[int, int, int | None]:
    """``(front, end, class-token index)`` of the tokens the blocks see."""
    front, end = model._token_layout() if hasattr(model, "_token_layout") else (model.num_prefix_tokens, 0)
    cls_index = 0 if getattr(model.cfg, "class_token", False) and front > 0 else None
    return front, end, cls_index


@torch.no_grad()
def probe_model(model: nn.Module, x: Tensor, *, k: float = ARTIFACT_K, batch_size: int = 64) -> Probes:
    """Every probe on every self-attention block of ``model`` for the model inputs ``x`` ``(B, C, H, W)``, in
    eval mode (:func:`~vitlab.models.eval_mode.analysis_mode`, the caller's mode put back), ``batch_size`` images
    per forward pass."""
    from vitlab.models.eval_mode import analysis_mode

    blocks = list(getattr(model, "blocks", None) or [])
    if not blocks:
        raise ConfigError(f"{type(model).__name__} has no transformer blocks to probe; probe a vitlab model")
    if x.dim() != 4 or len(x) == 0:
        raise ConfigError(f"images must be a non-empty (B, C, H, W) batch, got shape {tuple(x.shape)}")
    if not k > 0:
        raise ConfigError(f"the outlier threshold k must be > 0 robust standard deviations, got {k}; e.g. 6")
    front, end, cls_index = _layout(model)
    device = next(model.parameters()).device
    L = len(blocks)
    sums = {name: torch.zeros(L, dtype=torch.float64) for name in PROBES if name not in ("attn_entropy", "max_logit")}
    entropy: list[Tensor | None] = [None] * L
    logit = [float("-inf")] * L
    norms: list[list[Tensor]] = [[] for _ in range(L)]
    masks: list[list[Tensor]] = [[] for _ in range(L)]
    seen = 0
    with analysis_mode(model):
        for chunk in x.split(batch_size):
            with _block_records(blocks) as recs:
                model(chunk.to(device))
            b = chunk.shape[0]
            for i, rec in enumerate(recs):
                out, inp = rec["output"], rec["input"]
                patches = out[:, front:out.shape[1] - end]
                sums["token_similarity"][i] += float(token_similarity(patches).sum())
                sums["effective_rank"][i] += float(effective_rank(patches).sum())
                sums["rank_residual"][i] += float(rank_residual(patches).sum())
                n = token_norms(patches)
                m = outlier_mask(n, k)
                norms[i].append(n.cpu())
                masks[i].append(m.cpu())
                sums["artifact_count"][i] += float(m.sum())
                maps = [a for a in (list(rec["pre_mix"]) or list(rec["maps"])) if a.shape[-2] == a.shape[-1]]
                if maps:
                    a = maps[-1]
                    n_in = token_norms(inp[:, front:inp.shape[1] - end])
                    keys = torch.zeros(b, a.shape[-1], dtype=torch.bool)
                    keys[:, front:a.shape[-1] - end] = outlier_mask(n_in, k).cpu()
                    regs = torch.zeros(a.shape[-1], dtype=torch.bool)
                    regs[int(cls_index is not None):front] = True
                    if end:
                        regs[a.shape[-1] - end:] = True
                    sums["artifact_mass_all"][i] += float(attention_mass(a, keys).sum())
                    sums["register_mass_all"][i] += float(attention_mass(a, regs).sum())
                    if cls_index is not None:
                        sums["artifact_mass_cls"][i] += float(attention_mass(a, keys, query=cls_index).sum())
                        sums["register_mass_cls"][i] += float(attention_mass(a, regs, query=cls_index).sum())
                    e = head_entropy(a).sum(0).double()
                    entropy[i] = e if entropy[i] is None else entropy[i] + e
                if rec["logits"]:
                    logit[i] = max(logit[i], max_logit(rec["logits"][-1]))
            seen += b
    mean = {name: (s / seen).tolist() for name, s in sums.items()}
    nan = [float("nan")] * L
    if cls_index is None:
        mean["artifact_mass_cls"] = mean["register_mass_cls"] = nan
    if front - int(cls_index is not None) + end == 0:
        mean["register_mass_cls"] = mean["register_mass_all"] = nan
    if all(e is None for e in entropy):
        mean["artifact_mass_all"] = mean["artifact_mass_cls"] = nan
    all_norms = torch.stack([torch.cat(n) for n in norms])  # (L, B, N)
    q = torch.tensor(QUANTILES, dtype=torch.float32)
    quant = [dict(zip(QUANTILES, torch.quantile(all_norms[i].flatten(), q).tolist())) for i in range(L)]
    return Probes(
        layers=list(range(L)), norm_quantiles=quant,
        attn_entropy=[(e / seen).tolist() if e is not None else [] for e in entropy],
        max_logit=[v if math.isfinite(v) else float("nan") for v in logit], num_images=seen, k=k,
        token_norms=all_norms, outliers=torch.stack([torch.cat(m) for m in masks]), **mean)
