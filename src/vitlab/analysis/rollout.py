"""Attention rollout and gradient-weighted rollout: which input patches the head's readout draws on.

Per layer the heads' maps ``(B, H, T, T)`` are fused into one ``Ā`` ``(B, T, T)``, then the layers are
chained with the identity standing for the residual path:

- ``method="attention"`` (Abnar & Zuidema, 2020): ``Ā = fuse_h(A)`` (``head_fusion`` mean, max or min),
  negatives clipped to 0 (only re-attention, DeepViT, and talking heads, CaiT, have any), then
  ``R = Ã_L ... Ã_1`` with ``Ã = rownorm(Ā + I)``.
- ``method="gradient"`` (Chefer et al., 2021, "Generic Attention-model Explainability"):
  ``Ā = fuse_h(max(∂y_c/∂A ⊙ A, 0))`` for the target class score ``y_c`` (the logit; default the predicted
  class), and ``R = I``, ``R += Ā R`` per layer, i.e. ``R = (I + Ā_L) ... (I + Ā_1)`` without normalising.

``discard_ratio`` (as in the widely used vit-explain code) sets the lowest ``int(ratio * entries)`` of each
fused map to 0 before the identity is added, the class token's own entry ``(0, 0)`` excepted.

``R[i, j]`` is how much output token ``i`` draws on input token ``j``. It is read as the head reads the
model (:mod:`vitlab.analysis.attention_maps`): the class token's row, or the mean of the patch rows when the
head averages the patches. CaiT: the self-attention layers roll out over the patches (``R_sa``, ``(N, N)``);
each class-attention layer ``j`` then updates the class token's relevance ``r`` over ``[cls, patches]`` as
``r_j = Ã_j[0] r_{j-1} + [0, Ã_j[1:]]`` (``Ã_j = row_j + e_0``, row-normalised for attention rollout;
``r_0 = e_0``), which is the same rule on a sequence whose patch rows stay put, and the patch part is carried
back to the input patches through ``R_sa``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.analysis.attention_maps import TokenLayout, to_grid
from vitlab.errors import ConfigError
from vitlab.layers.attention import record_attention
from vitlab.models.eval_mode import analysis_mode

HEAD_FUSIONS = ("mean", "max", "min")
METHODS = ("attention", "gradient")


def check_options(head_fusion: str = "mean", discard_ratio: float = 0.0, method: str = "attention") -> None:
    """Raise a one-line :class:`ConfigError` for an unknown fusion or method or a ratio outside ``[0, 1)``."""
    if head_fusion not in HEAD_FUSIONS:
        raise ConfigError(f"head fusion {head_fusion!r} is not one of {', '.join(HEAD_FUSIONS)}; e.g. 'mean'")
    if not 0.0 <= discard_ratio < 1.0:
        raise ConfigError(f"discard ratio {discard_ratio} is not in [0, 1); pass e.g. 0.9 to drop the lowest 90%")
    if method not in METHODS:
        raise ConfigError(f"rollout method {method!r} is not one of {', '.join(METHODS)}")


def fuse_heads(values: Tensor, head_fusion: str = "mean") -> Tensor:
    """``(B, H, T_q, T_k)`` -> ``(B, T_q, T_k)``: the mean, max or min over heads."""
    check_options(head_fusion)
    v = values.detach().float()
    if head_fusion == "mean":
        return v.mean(dim=1)
    return v.amax(dim=1) if head_fusion == "max" else v.amin(dim=1)


def discard_lowest(fused: Tensor, discard_ratio: float, keep_first: bool = True) -> Tensor:
    """Zero the lowest ``int(discard_ratio * entries)`` entries of each ``(B, T_q, T_k)`` map; with
    ``keep_first`` entry ``(0, 0)`` (the class token's own) is never dropped nor counted."""
    check_options(discard_ratio=discard_ratio)
    if discard_ratio == 0.0:
        return fused
    flat = fused.flatten(1).clone()  # (B, T_q * T_k)
    score = flat.clone()
    if keep_first:
        score[:, 0] = float("inf")
    k = int(discard_ratio * (flat.shape[1] - int(keep_first)))
    if k:
        flat.scatter_(1, score.topk(k, dim=1, largest=False).indices, 0.0)
    return flat.view_as(fused)


def fused_layer(attn: Tensor, grad: Tensor | None = None, *, head_fusion: str = "mean",
                discard_ratio: float = 0.0, keep_first: bool = True) -> Tensor:
    """One layer's ``Ā`` ``(B, T_q, T_k)``: fused attention (clipped at 0), or with ``grad`` the fused
    ``max(grad * attn, 0)``; then ``discard_lowest``."""
    if grad is None:
        a = fuse_heads(attn, head_fusion).clamp_min(0)
    else:
        if grad.shape != attn.shape:
            raise ConfigError(f"gradient {tuple(grad.shape)} does not match its map {tuple(attn.shape)}")
        a = fuse_heads((grad.detach().float() * attn.detach().float()).clamp_min(0), head_fusion)
    return discard_lowest(a, discard_ratio, keep_first)


def _chain(maps: list[Tensor], grads: list[Tensor] | None, head_fusion: str, discard_ratio: float,
           keep_first: bool) -> Tensor:
    if not maps:
        raise ConfigError("rollout needs at least one self-attention map")
    if grads is not None and len(grads) != len(maps):
        raise ConfigError(f"{len(grads)} gradients for {len(maps)} attention maps; pass one per map")
    shape = tuple(maps[0].shape)
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise ConfigError(f"rollout needs square self-attention maps (B, H, T, T), got shape {shape}")
    eye = torch.eye(shape[-1], device=maps[0].device)
    result = None
    for i, m in enumerate(maps):
        if tuple(m.shape) != shape:
            raise ConfigError(f"rollout maps differ in shape ({tuple(m.shape)} vs {shape}); roll out one stage")
        a = fused_layer(m, None if grads is None else grads[i], head_fusion=head_fusion,
                        discard_ratio=discard_ratio, keep_first=keep_first) + eye
        if grads is None:
            a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result  # later layers act on the left
    return result


def rollout(maps: list[Tensor], *, head_fusion: str = "mean", discard_ratio: float = 0.0,
            keep_first: bool = True) -> Tensor:
    """Attention rollout ``(B, T, T)`` of self-attention maps ``(B, H, T, T)`` in forward order; rows sum
    to 1. ``keep_first``: spare entry ``(0, 0)`` from ``discard_ratio`` (set it when token 0 is the class
    token)."""
    return _chain(maps, None, head_fusion, discard_ratio, keep_first)


def gradient_rollout(maps: list[Tensor], grads: list[Tensor], *, head_fusion: str = "mean",
                     discard_ratio: float = 0.0, keep_first: bool = True) -> Tensor:
    """Gradient-weighted rollout ``(B, T, T)`` (Chefer et al., 2021) of self-attention maps and the
    gradients of the target score with respect to them."""
    return _chain(maps, grads, head_fusion, discard_ratio, keep_first)


def class_attention_rollout(ca_maps: list[Tensor], patch_rollout: Tensor | None = None, *,
                            grads: list[Tensor] | None = None, head_fusion: str = "mean",
                            discard_ratio: float = 0.0) -> Tensor:
    """Relevance ``(B, 1 + N)`` of ``[class token, input patches]`` for the class token after CaiT's
    class-attention layers ``(B, H, 1, 1 + N)``; ``patch_rollout`` ``(B, N, N)`` maps the patches back
    through the self-attention stage (None: identity); ``grads`` makes it gradient-weighted."""
    if not ca_maps:
        raise ConfigError("class-attention rollout needs at least one class-attention map")
    if grads is not None and len(grads) != len(ca_maps):
        raise ConfigError(f"{len(grads)} gradients for {len(ca_maps)} class-attention maps; pass one per map")
    r = None
    for i, m in enumerate(ca_maps):
        if m.dim() != 4 or m.shape[-2] != 1:
            raise ConfigError(f"class-attention maps must be (B, H, 1, T), got shape {tuple(m.shape)}")
        a = fused_layer(m, None if grads is None else grads[i], head_fusion=head_fusion,
                        discard_ratio=discard_ratio)[:, 0]  # (B, 1 + N)
        a = torch.cat([a[:, :1] + 1.0, a[:, 1:]], dim=1)  # + e_0, the residual path
        if grads is None:
            a = a / a.sum(dim=-1, keepdim=True)
        r = a if r is None else a[:, :1] * r + torch.cat([torch.zeros_like(a[:, :1]), a[:, 1:]], dim=1)
    if patch_rollout is not None:
        if patch_rollout.shape[-1] != r.shape[-1] - 1:
            raise ConfigError(f"patch rollout over {patch_rollout.shape[-1]} tokens does not match class "
                              f"attention over {r.shape[-1] - 1} patches")
        patches = (r[:, None, 1:] @ patch_rollout.float())[:, 0]  # (B, 1, N) @ (B, N, N) -> (B, N)
        r = torch.cat([r[:, :1], patches], dim=1)
    return r


@dataclass
class Rollout:
    """Relevance of the input patches ``(B, g, g)``, their share of the read row's relevance ``(B,)`` (the
    rest lies on the class token and registers) and, for gradient rollout, the target classes ``(B,)``."""

    relevance: Tensor
    patch_mass: Tensor
    target: Tensor | None = None


def model_rollout(maps: list[Tensor], layout: TokenLayout, *, grads: list[Tensor] | None = None,
                  head_fusion: str = "mean", discard_ratio: float = 0.0) -> Rollout:
    """Rollout of a whole model's maps (forward order), read as its head reads the model; with ``grads``
    (one per map, from :func:`attention_gradients`) gradient-weighted."""
    if grads is not None and len(grads) != len(maps):
        raise ConfigError(f"{len(grads)} gradients for {len(maps)} attention maps; pass one per map")
    sa = [i for i, m in enumerate(maps) if m.shape[-2] == m.shape[-1]]
    ca = [i for i, m in enumerate(maps) if m.shape[-2] == 1 and m.shape[-1] > 1]
    if len(sa) + len(ca) != len(maps):
        raise ConfigError("attention maps are neither self-attention (T_q == T_k) nor class-attention (T_q == 1)")
    keys = layout.for_map(maps[sa[0]]) if sa else layout

    def pick(idx: list[int]) -> tuple[list[Tensor], list[Tensor] | None]:
        return [maps[i] for i in idx], None if grads is None else [grads[i] for i in idx]

    def chain(idx: list[int]) -> Tensor:
        m, g = pick(idx)
        return _chain(m, g, head_fusion, discard_ratio, keys.class_token)

    if ca and layout.reads_class_token:
        ca_maps, ca_grads = pick(ca)
        row = class_attention_rollout(ca_maps, chain(sa) if sa else None, grads=ca_grads,
                                      head_fusion=head_fusion, discard_ratio=discard_ratio)  # (B, 1 + N)
        rel = row[:, 1:]
    elif not sa:
        raise ConfigError("the head averages the patch tokens but the model recorded no self-attention maps; "
                          "pass the maps of every layer")
    else:
        R = chain(sa)  # (B, T, T); class-attention maps (CaiT with global_pool='avg') do not reach the head
        if keys.reads_class_token:
            row = R[:, 0]
        else:
            row = R[:, keys.patches].mean(dim=1)  # (B, N, T) -> (B, T): average pooling of the patch rows
        rel = row[:, keys.patches]
    return Rollout(to_grid(rel, layout.grid_size), rel.sum(dim=-1) / row.sum(dim=-1))


@dataclass
class AttentionGradients:
    """One forward and backward pass: the maps ``(B, H, T_q, T_k)`` (detached), the gradients of the
    target logits with respect to them (zero for a map the output does not depend on), the logits and the
    target class of each image."""

    maps: list[Tensor]
    grads: list[Tensor]
    logits: Tensor
    target: Tensor


def attention_gradients(model: nn.Module, x: Tensor, target_class: int | None = None) -> AttentionGradients:
    """Record ``model``'s attention maps on ``x`` and the gradient of each image's target logit (default:
    its predicted class) with respect to them. Works under ``torch.no_grad()``; parameters get no ``.grad``.
    Runs in eval mode and puts the caller's mode back (:func:`~vitlab.models.eval_mode.analysis_mode`)."""
    with torch.enable_grad(), analysis_mode(model):
        with record_attention(model.modules()) as maps:
            logits = model(x.detach().requires_grad_(True))  # an input that needs grad: maps join the graph
        target = _targets(logits, target_class)
        score = logits.gather(1, target[:, None]).sum()  # images are independent in eval mode
        if not maps:
            raise ConfigError("the model recorded no attention maps; analyse a vitlab model")
        grads = torch.autograd.grad(score, maps, allow_unused=True)
    grads = [torch.zeros_like(m) if g is None else g.detach() for m, g in zip(maps, grads)]
    return AttentionGradients([m.detach() for m in maps], grads, logits.detach(), target)


def _targets(logits: Tensor, target_class: int | None) -> Tensor:
    """``(B,)`` target class per image: ``target_class`` for all, or each image's predicted class."""
    if logits.dim() != 2 or logits.shape[-1] < 1:
        raise ConfigError(f"gradient rollout needs class logits (B, classes), got shape {tuple(logits.shape)}; "
                          "use a model with a classifier head, or --rollout attention")
    num_classes = logits.shape[-1]
    if target_class is None:
        target = logits.detach().argmax(dim=-1)
    elif 0 <= target_class < num_classes:
        target = torch.full((len(logits),), target_class, dtype=torch.long, device=logits.device)
    else:
        raise ConfigError(f"target class {target_class} does not exist; the model has {num_classes} classes "
                          f"(0..{num_classes - 1})")
    return target


def explain(model: nn.Module, x: Tensor, *, method: str = "attention", target_class: int | None = None,
            head_fusion: str = "mean", discard_ratio: float = 0.0) -> Rollout:
    """Rollout of ``model`` on ``x`` ``(B, C, H, W)`` read as its head reads it. ``method="gradient"`` is
    specific to ``target_class`` (default: each image's predicted class). Runs in eval mode, so an image's
    relevance does not depend on the other images of ``x``, and puts the caller's mode back."""
    check_options(head_fusion, discard_ratio, method)
    if target_class is not None and method != "gradient":
        raise ConfigError("a target class applies to gradient rollout only; pass method='gradient'")
    layout = TokenLayout.of(model)
    if method == "gradient":
        ag = attention_gradients(model, x, target_class)
        r = model_rollout(ag.maps, layout, grads=ag.grads, head_fusion=head_fusion, discard_ratio=discard_ratio)
        r.target = ag.target
        return r
    with torch.no_grad(), analysis_mode(model), record_attention(model.modules()) as maps:
        model(x)
    return model_rollout(maps, layout, head_fusion=head_fusion, discard_ratio=discard_ratio)
