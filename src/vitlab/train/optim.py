"""AdamW with weight decay on matrices only, optional layer-wise learning-rate decay, and a per-step
warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
from torch import nn

from vitlab.errors import ConfigError


def no_decay_names(model: nn.Module) -> set[str]:
    """Parameters kept out of weight decay: ``model.no_weight_decay()`` (vitlab: gammas, norms, biases,
    tokens, position embeddings; timm: its token list, matched as prefixes) plus every 0-d/1-d tensor."""
    listed = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    names = set()
    for name, p in model.named_parameters():
        if p.ndim <= 1 or name in listed or any(name.startswith(f"{n}.") for n in listed):
            names.add(name)
    return names


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """AdamW groups of the trainable parameters: ``decay`` (weight_decay) and ``no_decay`` (0); with a
    ``layer_decay`` below 1, one such pair per layer of :func:`layer_ids`, named ``layer_{id}_{decay|no_decay}``
    and carrying ``lr_scale = layer_decay ** (num_layers - 1 - id)`` (BEiT's layer-wise decay, as timm's
    ``param_groups_layer_decay``: the head learns at the full rate, each layer below at ``layer_decay`` times
    the one above). :class:`WarmupCosine` multiplies the scale in."""
    check_layer_decay(layer_decay)
    skip = no_decay_names(model)
    if layer_decay in (None, 1.0):
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (no_decay if name in skip else decay).append(p)
        return [dict(params=decay, weight_decay=weight_decay, name="decay"),
                dict(params=no_decay, weight_decay=0.0, name="no_decay")]
    layers = layer_ids(model)
    top = max(layers.values())
    groups: dict[str, dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        kind, layer = "no_decay" if name in skip else "decay", layers[name]
        key = f"layer_{layer}_{kind}"
        if key not in groups:
            groups[key] = dict(params=[], weight_decay=0.0 if kind == "no_decay" else weight_decay, name=key,
                               lr_scale=layer_decay ** (top - layer))
        groups[key]["params"].append(p)
    return list(groups.values())


def check_layer_decay(layer_decay: float | None) -> None:
    if layer_decay is not None and not 0 < layer_decay <= 1:
        raise ConfigError(f"layer_decay must be in (0, 1], got {layer_decay}; e.g. --layer-decay 0.75 "
                          f"(1 or unset: off)")


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Parameter name -> layer index from ``model.group_matcher()`` with timm's rules: a regex spec gives each
    match an ordinal (group position, captured numbers, suffix), an unmatched name comes last, ordinals are
    numbered in sorted order, and one ending in 99999 joins the layer before (a callable matcher returns the
    ordinal itself)."""
    if not hasattr(model, "group_matcher"):
        raise ConfigError(f"{type(model).__name__} has no group_matcher(), so its layers are unknown; drop "
                          f"--layer-decay or use a model that has one (every vitlab preset and timm ViT does)")
    ordinal = _ordinal_fn(model.group_matcher(coarse=False))
    by_ordinal: dict[tuple[float, ...], list[str]] = {}
    for name, _ in model.named_parameters():
        by_ordinal.setdefault(ordinal(name), []).append(name)
    out, layer = {}, -1
    for key in sorted(by_ordinal):
        if layer < 0 or key[-1] != _JOIN_PREVIOUS:
            layer += 1
        out.update(dict.fromkeys(by_ordinal[key], layer))
    return out


_JOIN_PREVIOUS = 99999.0


def _ordinal_fn(matcher: dict | Callable) -> Callable[[str], tuple[float, ...]]:
    if callable(matcher):
        def from_callable(name: str) -> tuple[float, ...]:
            o = matcher(name)
            return tuple(float(v) for v in o) if isinstance(o, tuple | list) else (float(o),)
        return from_callable
    specs = []
    for position, spec in enumerate(matcher.values()):
        if spec is None:
            continue
        for pattern, suffix in (spec if isinstance(spec, list | tuple) else [(spec, None)]):
            specs.append((re.compile(pattern), float(position), tuple(suffix or ())))

    def from_specs(name: str) -> tuple[float, ...]:
        for pattern, position, suffix in specs:
            m = pattern.match(name)
            if m:
                return (position, *(float(g) for g in m.groups() if g is not None), *map(float, suffix))
        return (math.inf,)
    return from_specs


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float,
                    layer_decay: float | None = None) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, with the fastest kernel this torch has for the parameters' device
    (``vitlab.perf.adamw``: fused on CPU and CUDA, else multi-tensor ``foreach``; the same update)."""
    from vitlab.perf import adamw

    return adamw(param_groups(model, weight_decay, layer_decay), lr=lr, betas=(0.9, 0.999))


class WarmupCosine:
    """Linear warm-up from ``lr / warmup_steps`` to ``lr``, then cosine decay to ``min_lr`` at ``total_steps``;
    a group with an ``lr_scale`` gets that multiple of the rate.

    Stateless apart from the step counter: ``lr_at(step)`` is a pure function, so a resumed run gets
    exactly the same rates. ``step()`` sets the rate of the *next* optimiser step on every group.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, lr: float, min_lr: float, warmup_steps: int,
                 total_steps: int) -> None:
        self.optimizer = optimizer
        self.base_lr, self.min_lr = lr, min(min_lr, lr)
        self.warmup_steps, self.total_steps = max(0, warmup_steps), max(1, total_steps)
        self.last_step = 0
        self._apply()

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (self.base_lr - self.min_lr) * (1 + math.cos(math.pi * t))

    def get_last_lr(self) -> float:
        return self.lr_at(self.last_step)

    def _apply(self) -> None:
        lr = self.lr_at(self.last_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # lr_scale: layer-wise decay (param_groups)

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "base_lr": self.base_lr, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = int(state["last_step"])
        self._apply()
