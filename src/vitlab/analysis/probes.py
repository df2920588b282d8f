"""Per-layer probes of why deep ViTs fail: over-smoothing, rank collapse, artifact tokens and attention logits.

Each probe is a pure function on one layer's tokens or attention, and :func:`probe_model` runs them all on every
self-attention block of a vitlab model. Patch statistics use the patch tokens only: the class token and register
tokens are left out (they are where Darcet et al. 2024 expect the artifacts to go).

- **token similarity** (over-smoothing): the mean cosine similarity of the patch tokens over all pairs ``i != j``
  of one image; 1 when every token is the same vector.
- **effective rank** (Roy & Vetterli 2007): ``exp(-sum_i p_i log p_i)`` with ``p_i = s_i / sum_j s_j`` the
  normalised singular values of an image's ``(N, D)`` patch-token matrix, in two forms:

  - *uncentred*, of ``X`` itself: rank collapse in the sense of Dong et al. 2021 ("Attention is not all you need:
    pure attention loses rank doubly exponentially with depth"): tokens that collapse to one vector give 1 (up to
    noise far below the tokens' size, which adds almost nothing), ``k`` orthogonal tokens of equal norm ``k``, a
    zero matrix 0.
  - *centred*, of ``X - 1 mean(X)^T``: the number of directions the tokens spread in around their mean (``N``
    orthogonal tokens of equal norm give ``N - 1``). It is scale-invariant, so it cannot see collapse: a spread a
    million times smaller than the tokens has the rank of its own shape. It is 0 when there is no spread, i.e.
    when ``||X - 1 mean(X)^T||_F <= ZERO_SPREAD * ||X||_F`` (:data:`ZERO_SPREAD` = 1e-6, about 8 float32 roundings;
    identical tokens give exactly 0). Read it beside the rank residual, which measures the spread's size.
- **rank residual** (Dong et al. 2021): ``||X - 1 x^T||_F / ||X||_F`` with ``x`` the best rank-one fit of the form
  ``1 x^T``, which in the Frobenius norm is the mean token (the paper bounds the composite l1/l-inf norm; the
  Frobenius form is the one measured here). 0 when all tokens are equal: rank collapse.
- **artifact tokens** (Darcet et al. 2024, "Vision Transformers Need Registers"): high-norm outlier tokens, found
  from the distribution of the patch-token L2 norms of one block *pooled over all the probed images*. Darcet et al.
  see that distribution split into two modes, the high one about 2 % of the tokens, and cut between them at a
  fixed norm (150 for DINOv2 ViT-g). vitlab's models differ in scale, so the cut is relative: a token is an
  artifact when its norm exceeds both ``ARTIFACT_RATIO`` (3) times the 90th percentile of the pooled norms and
  ``exp(m + k * 1.4826 * MAD)`` of the pooled log norms (median ``m``, ``k`` = :data:`ARTIFACT_K` = 6 robust
  standard deviations), so neither a narrow bulk nor a broad one puts a cut inside itself. The reference is the
  90th percentile, not the median, because at initialisation the norms of MNIST digits upsampled to 224 pixels are
  bimodal themselves: most patches are blank and the ink patches up to 6.6 times their norm (every preset's
  largest norm is at most 1.4 times the 90th percentile there, and on noise images). The rule therefore sees
  artifacts only while they are under 10 % of the tokens; an image needs :data:`MIN_ARTIFACT_TOKENS` = 16 patch
  tokens (one artifact per image is then at most 6.25 % of them). With fewer, e.g. the 4 patch tokens of
  ``vit_mnist_conv_patch14``, the artifact probes are NaN: not measurable. Reported: the norm quantiles, the cut
  (``artifact_threshold``), the mean count of artifacts per image and the attention mass they receive in the block
  that reads them (artifacts of the block's *input*, the tokens its keys are made from, by the same rule on the
  input's pooled norms): from the class-token query and averaged over all queries, and the same for the register
  tokens.
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

ARTIFACT_K = 6.0  # robust standard deviations of the pooled log norms above their median an artifact must reach
ARTIFACT_RATIO = 3.0  # ... and times the 90th percentile of the pooled norms
ARTIFACT_REFERENCE = 0.9  # that percentile: the rule sees artifacts while they are under 10 % of the tokens
MIN_ARTIFACT_TOKENS = 16  # patch tokens per image the artifact rule needs; fewer: NaN (not measurable)
MAD_TO_STD = 1.4826  # the MAD of a normal distribution times this is its standard deviation
ZERO_SPREAD = 1e-6  # ||X - 1 mean(X)^T||_F / ||X||_F at or below this is no spread: centred effective rank 0
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 1.0)
PROBES = ("token_similarity", "effective_rank_uncentred", "effective_rank_centred", "rank_residual",
          "artifact_count", "artifact_threshold", "artifact_mass_cls", "artifact_mass_all", "register_mass_cls",
          "register_mass_all", "attn_entropy", "max_logit")
# names in run records written before the two effective ranks: ``effective_rank`` was the centred one
RENAMED = {"effective_rank": "effective_rank_centred"}


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


def effective_rank(tokens: Tensor, *, centre: bool) -> Tensor:
    """``(B,)`` effective rank (Roy & Vetterli 2007) of each image's ``(N, D)`` token matrix ``X``.

    ``centre=False``: of ``X`` itself, rank collapse in Dong et al.'s sense (identical tokens 1, a zero matrix 0).
    ``centre=True``: of ``X - 1 mean(X)^T``, the directions of the spread around the mean token; exactly 0 when
    that spread is at most :data:`ZERO_SPREAD` of ``||X||_F``: identical tokens give exactly 0, not the rank of
    their rounding (computed in float64, that rounding is near 1e-16 of their size)."""
    x = _tokens(tokens).double()
    size = x.flatten(1).norm(dim=1)
    if centre:
        x = x - x.mean(dim=1, keepdim=True)
        zero = x.flatten(1).norm(dim=1) <= ZERO_SPREAD * size
    else:
        zero = size == 0
    s = torch.linalg.svdvals(x)  # (B, min(N, D))
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-300)
    h = -(p * p.clamp_min(1e-300).log()).sum(-1)
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


def _check_rule(k: float, ratio: float) -> None:
    if not k > 0:
        raise ConfigError(f"the artifact threshold k must be > 0 robust standard deviations, got {k}; e.g. 6")
    if not ratio >= 1:
        raise ConfigError(f"the artifact ratio must be >= 1 (times the 90th percentile norm), got {ratio}; e.g. 3")


def artifact_threshold(norms: Tensor, k: float = ARTIFACT_K, ratio: float = ARTIFACT_RATIO) -> float:
    """The norm above which a token is an artifact, from ``norms`` ``(B, N)`` (one block's patch-token norms, ``B``
    images) pooled: ``max(ratio * q90, exp(m + k * 1.4826 * MAD))`` with ``q90`` the 90th percentile of the pooled
    norms and ``m``, ``MAD`` the median and median absolute deviation of their logarithms. NaN (not measurable)
    when an image has fewer than :data:`MIN_ARTIFACT_TOKENS` patch tokens."""
    if norms.dim() != 2:
        raise ConfigError(f"norms must be (B, N), got shape {tuple(norms.shape)}")
    _check_rule(k, ratio)
    if norms.shape[1] < MIN_ARTIFACT_TOKENS or norms.shape[0] == 0:
        return float("nan")
    v = norms.detach().flatten().double().cpu().sort().values
    pos = ARTIFACT_REFERENCE * (len(v) - 1)  # linear interpolation between order statistics (torch.quantile's)
    lo = int(pos)
    reference = v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])
    logs = v.clamp_min(1e-300).log()
    m = logs[(len(v) - 1) // 2]  # the (lower) median, as torch.median
    spread = MAD_TO_STD * (logs - m).abs().median()
    return float(torch.maximum(ratio * reference, (m + k * spread).exp()))


def outlier_mask(norms: Tensor, k: float = ARTIFACT_K, ratio: float = ARTIFACT_RATIO) -> Tensor:
    """``(B, N)`` bool: the artifact tokens, those whose norm exceeds :func:`artifact_threshold` of all ``norms``
    pooled; all False when not measurable (fewer than :data:`MIN_ARTIFACT_TOKENS` tokens per image)."""
    return norms > artifact_threshold(norms, k, ratio)


def artifact_count(norms: Tensor, k: float = ARTIFACT_K, ratio: float = ARTIFACT_RATIO) -> float:
    """Mean number of artifact tokens per image of ``norms`` ``(B, N)`` (:func:`outlier_mask`); NaN when not
    measurable."""
    t = artifact_threshold(norms, k, ratio)
    return float((norms > t).sum()) / norms.shape[0] if t == t else float("nan")


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
    artifact masks (for figures); ``k`` and ``ratio`` the artifact rule's settings. The artifact probes are NaN
    (not measurable) with fewer than :data:`MIN_ARTIFACT_TOKENS` patch tokens per image."""

    layers: list[int]
    token_similarity: list[float]
    effective_rank_uncentred: list[float]
    effective_rank_centred: list[float]
    rank_residual: list[float]
    norm_quantiles: list[dict[float, float]]
    artifact_count: list[float]
    artifact_threshold: list[float]
    artifact_mass_cls: list[float]
    artifact_mass_all: list[float]
    register_mass_cls: list[float]
    register_mass_all: list[float]
    attn_entropy: list[list[float]]
    max_logit: list[float]
    num_images: int
    k: float = ARTIFACT_K
    ratio: float = ARTIFACT_RATIO
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
    :meth:`Probes.columns` (the studies read their runs' per-epoch probes back with it). Older records' names are
    read under their current ones (:func:`current_names`)."""
    out: dict[int, dict[str, Any]] = {}
    for name, value in row.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == prefix and parts[2].startswith("block") and parts[2][5:].isdigit():
            out.setdefault(int(parts[2][5:]), {})[parts[1]] = value
    return {layer: current_names(values) for layer, values in out.items()}


def current_names(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (one block's probes) with the names of older records (:data:`RENAMED`: ``effective_rank``, which was
    the centred rank) replaced by the current ones; a current name already there wins."""
    out = {name: value for name, value in row.items() if name not in RENAMED}
    for old, new in RENAMED.items():
        if old in row and new not in out:
            out[new] = row[old]
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
def probe_model(model: nn.Module, x: Tensor, *, k: float = ARTIFACT_K, ratio: float = ARTIFACT_RATIO,
                batch_size: int = 64) -> Probes:
    """Every probe on every self-attention block of ``model`` for the model inputs ``x`` ``(B, C, H, W)``, in
    eval mode (:func:`~vitlab.models.eval_mode.analysis_mode`, the caller's mode put back), ``batch_size`` images
    per forward pass. The artifact rule (``k``, ``ratio``: :func:`artifact_threshold`) pools each block's norms over
    all of ``x``, so the result does not depend on ``batch_size``."""
    from vitlab.models.eval_mode import analysis_mode

    blocks = list(getattr(model, "blocks", None) or [])
    if not blocks:
        raise ConfigError(f"{type(model).__name__} has no transformer blocks to probe; probe a vitlab model")
    if x.dim() != 4 or len(x) == 0:
        raise ConfigError(f"images must be a non-empty (B, C, H, W) batch, got shape {tuple(x.shape)}")
    _check_rule(k, ratio)
    front, end, cls_index = _layout(model)
    device = next(model.parameters()).device
    L = len(blocks)
    sums = {name: torch.zeros(L, dtype=torch.float64)
            for name in ("token_similarity", "effective_rank_uncentred", "effective_rank_centred", "rank_residual")}
    entropy: list[Tensor | None] = [None] * L
    logit = [float("-inf")] * L
    norms: list[list[Tensor]] = [[] for _ in range(L)]  # per block: (b, N) patch-token norms of its output
    in_norms: list[list[Tensor]] = [[] for _ in range(L)]  # ... and of its input
    # per block: (b, T_k) attention each key receives, averaged over heads and all queries / at the class query;
    # the masses of artifacts and registers are sums of these over their keys, taken once the rule has seen all x
    to_key_all: list[list[Tensor]] = [[] for _ in range(L)]
    to_key_cls: list[list[Tensor]] = [[] for _ in range(L)]
    seen = 0
    with analysis_mode(model):
        for chunk in x.split(batch_size):
            with _block_records(blocks) as recs:
                model(chunk.to(device))
            for i, rec in enumerate(recs):
                out, inp = rec["output"], rec["input"]
                patches = out[:, front:out.shape[1] - end]
                sums["token_similarity"][i] += float(token_similarity(patches).sum())
                sums["effective_rank_uncentred"][i] += float(effective_rank(patches, centre=False).sum())
                sums["effective_rank_centred"][i] += float(effective_rank(patches, centre=True).sum())
                sums["rank_residual"][i] += float(rank_residual(patches).sum())
                norms[i].append(token_norms(patches).cpu())
                in_norms[i].append(token_norms(inp[:, front:inp.shape[1] - end]).cpu())
                maps = [a for a in (list(rec["pre_mix"]) or list(rec["maps"])) if a.shape[-2] == a.shape[-1]]
                if maps:
                    a = maps[-1].detach().float()
                    to_key_all[i].append(a.mean((1, 2)).cpu())
                    if cls_index is not None:
                        to_key_cls[i].append(a[:, :, cls_index].mean(1).cpu())
                    e = head_entropy(a).sum(0).double()
                    entropy[i] = e if entropy[i] is None else entropy[i] + e
                if rec["logits"]:
                    logit[i] = max(logit[i], max_logit(rec["logits"][-1]))
            seen += chunk.shape[0]
    mean = {name: (s / seen).tolist() for name, s in sums.items()}
    all_norms = torch.stack([torch.cat(n) for n in norms])  # (L, B, N)
    thresholds = [artifact_threshold(all_norms[i], k, ratio) for i in range(L)]
    outliers = all_norms > torch.tensor(thresholds).view(L, 1, 1)  # NaN thresholds flag nothing
    mean["artifact_threshold"] = thresholds
    mean["artifact_count"] = [float(outliers[i].sum()) / seen if t == t else float("nan")
                              for i, t in enumerate(thresholds)]
    nan = float("nan")
    for name in ("artifact_mass_cls", "artifact_mass_all", "register_mass_cls", "register_mass_all"):
        mean[name] = [nan] * L
    for i in range(L):
        if not to_key_all[i]:
            continue
        t_k = to_key_all[i][0].shape[-1]
        n_in = torch.cat(in_norms[i])
        keys = torch.zeros(seen, t_k, dtype=torch.bool)
        keys[:, front:t_k - end] = n_in > artifact_threshold(n_in, k, ratio)
        regs = torch.zeros(seen, t_k, dtype=torch.bool)
        regs[:, int(cls_index is not None):front] = True
        if end:
            regs[:, t_k - end:] = True
        measurable = n_in.shape[1] >= MIN_ARTIFACT_TOKENS
        has_regs = front - int(cls_index is not None) + end > 0
        for query, parts in (("all", to_key_all[i]), ("cls", to_key_cls[i])):
            if not parts:
                continue
            to_key = torch.cat(parts)  # (B, T_k)
            if measurable:
                mean[f"artifact_mass_{query}"][i] = float((to_key * keys).sum(-1).mean())
            if has_regs:
                mean[f"register_mass_{query}"][i] = float((to_key * regs).sum(-1).mean())
    q = torch.tensor(QUANTILES, dtype=torch.float32)
    quant = [dict(zip(QUANTILES, torch.quantile(all_norms[i].flatten(), q).tolist())) for i in range(L)]
    return Probes(
        layers=list(range(L)), norm_quantiles=quant,
        attn_entropy=[(e / seen).tolist() if e is not None else [] for e in entropy],
        max_logit=[v if math.isfinite(v) else float("nan") for v in logit], num_images=seen, k=k, ratio=ratio,
        token_norms=all_norms, outliers=outliers, **mean)
