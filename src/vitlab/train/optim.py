"""AdamW with weight decay on matrices only, and a per-step warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def no_decay_names(model: nn.Module) -> set[str]:
    """Parameters kept out of weight decay: ``model.no_weight_decay()`` (vitlab: gammas, norms, biases,
    tokens, position embeddings; timm: its token list, matched as prefixes) plus every 0-d/1-d tensor."""
    listed = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    names = set()
    for name, p in model.named_parameters():
        if p.ndim <= 1 or name in listed or any(name.startswith(f"{n}.") for n in listed):
            names.add(name)
    return names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``decay`` (weight_decay) and ``no_decay`` (0), trainable parameters only."""
    skip = no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay, name="decay"),
            dict(params=no_decay, weight_decay=0.0, name="no_decay")]


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, with the fastest kernel this torch has for the parameters' device
    (``vitlab.perf.adamw``: fused on CPU and CUDA, else multi-tensor ``foreach``; the same update)."""
    from vitlab.perf import adamw

    return adamw(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.999))


class WarmupCosine:
    """Linear warm-up from ``lr / warmup_steps`` to ``lr``, then cosine decay to ``min_lr`` at ``total_steps``.

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
            group["lr"] = lr

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "base_lr": self.base_lr, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = int(state["last_step"])
        self._apply()
