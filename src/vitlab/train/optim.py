"""The optimiser stage of a run: AdamW (torch's, or LAMB, DeiT III's, timm's) with weight decay on matrices only,
optional layer-wise learning-rate decay (timm's parameter groups), and timm's per-step warm-up + cosine schedule.
The rates and the steps are the plan's (:class:`vitlab.train.plan.Schedule`); nothing here picks a value. AdamW runs
the fastest kernel this torch has for the parameters' device (:func:`adamw`, :func:`fused_adamw_supported`): fused
on CPU and CUDA in torch >= 2.4, else the multi-tensor ``foreach`` one; on CPU torch's own default is the slow
per-parameter loop. The kernels compute the same update."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable

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
    ``layer_decay`` below 1, timm's ``param_groups_layer_decay`` (BEiT's layer-wise decay: one such pair per
    layer of :func:`layer_ids`, ``lr_scale = layer_decay ** (num_layers - 1 - id)``, so the head learns at the
    full rate and each layer below at ``layer_decay`` times the one above), each group named
    ``layer_{id}_{decay|no_decay}``. The schedule multiplies the scale in."""
    check_layer_decay(layer_decay)
    skip = no_decay_names(model)
    if layer_decay in (None, 1.0):
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (no_decay if name in skip else decay).append(p)
        return [dict(params=decay, weight_decay=weight_decay, name="decay"),
                dict(params=no_decay, weight_decay=0.0, name="no_decay")]
    from timm.optim._param_groups import param_groups_layer_decay

    layers = layer_ids(model)
    groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=sorted(skip),
                                      layer_decay=layer_decay)
    names = {id(p): n for n, p in model.named_parameters()}
    for g in groups:
        first = names[id(g["params"][0])]
        g["name"] = f"layer_{layers[first]}_{'no_decay' if first in skip else 'decay'}"
    return groups


def check_layer_decay(layer_decay: float | None) -> None:
    if layer_decay is not None and not 0 < layer_decay <= 1:
        raise ConfigError(f"layer_decay must be in (0, 1], got {layer_decay}; e.g. --layer-decay 0.75 "
                          f"(1 or unset: off)")


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Parameter name -> layer index, as timm reads ``model.group_matcher()`` for layer decay."""
    if not hasattr(model, "group_matcher"):
        raise ConfigError(f"{type(model).__name__} has no group_matcher(), so its layers are unknown; drop "
                          f"--layer-decay or use a model that has one (every vitlab preset and timm ViT does)")
    from timm.models import group_parameters

    return group_parameters(model, model.group_matcher(coarse=False), reverse=True)


def fused_adamw_supported(device: torch.device | str) -> bool:
    """Whether ``torch.optim.AdamW(fused=True)`` runs on ``device`` in this torch."""
    return _fused_adamw(torch.device(device).type)


@functools.cache
def _fused_adamw(kind: str) -> bool:
    if kind == "cuda":
        return True
    if kind != "cpu":
        return False
    try:
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def adamw(params: Iterable, *, impl: str = "auto", **kwargs) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with its fastest implementation: ``impl`` is ``auto`` (fused where supported,
    else foreach), ``fused``, ``foreach`` or ``loop`` (torch's per-parameter reference loop)."""
    params = list(params)
    if params and isinstance(params[0], dict):  # parameter groups
        params = [{**group, "params": list(group["params"])} for group in params]
        tensors = [p for group in params for p in group["params"]]
    else:
        tensors = params
    if impl == "auto":
        device = tensors[0].device if tensors else torch.device("cpu")
        impl = "fused" if fused_adamw_supported(device) else "foreach"
    if impl == "fused":
        return torch.optim.AdamW(params, fused=True, **kwargs)
    if impl == "foreach":
        return torch.optim.AdamW(params, foreach=True, **kwargs)
    if impl == "loop":
        return torch.optim.AdamW(params, foreach=False, **kwargs)
    raise ConfigError(f"unknown AdamW implementation {impl!r}; choose auto, fused, foreach or loop")


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, layer_decay: float | None = None,
                    optimizer: str | None = None) -> torch.optim.Optimizer:
    """The ``optimizer`` (``adamw``, the default, or ``lamb``) over :func:`param_groups`.

    AdamW is torch's with the fastest kernel this torch has for the parameters' device (fused on CPU and CUDA where
    supported, :func:`fused_adamw_supported`, else multi-tensor ``foreach``; the same update). LAMB (You
    et al. 2020) is timm's ``Lamb`` as DeiT III trains with it (the authors' ``--opt fusedlamb`` through timm's
    ``create_optimizer``: betas (0.9, 0.999), eps 1e-8, the gradients clipped to a global norm of 1 inside the
    optimiser, the layer-wise trust ratio on the groups with weight decay only)."""
    groups = param_groups(model, weight_decay, layer_decay)
    if optimizer in (None, "adamw"):
        device = next((p.device for g in groups for p in g["params"]), torch.device("cpu"))
        kernel = {"fused": True} if fused_adamw_supported(device) else {"foreach": True}
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), **kernel)
    if optimizer == "lamb":
        from timm.optim import Lamb

        return Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, max_grad_norm=1.0)
    raise ConfigError(f"unknown optimizer {optimizer!r}; choose adamw or lamb")


class WarmupCosine:
    """Linear warm-up from ``lr / warmup_steps`` to ``lr`` over ``warmup_steps`` steps, then cosine decay to
    ``min_lr`` at ``total_steps``; a group with an ``lr_scale`` gets that multiple of the rate.

    The rates are timm's ``CosineLRScheduler`` (per step, warm-up as a prefix from 0). timm's warm-up starts at
    its ``warmup_lr_init`` (0) on update 0; here the first step already takes ``lr / warmup_steps`` and the last
    warm-up step the peak, so during warm-up the schedule is read one update ahead (:meth:`lr_at`).

    Stateless apart from the step counter, so a resumed run gets exactly the same rates. ``step()`` sets the
    rate of the *next* optimiser step on every group.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, lr: float, min_lr: float, warmup_steps: int,
                 total_steps: int) -> None:
        from timm.scheduler import CosineLRScheduler

        self.optimizer = optimizer
        self.base_lr, self.min_lr = lr, min(min_lr, lr)
        self.warmup_steps, self.total_steps = max(0, warmup_steps), max(1, total_steps)
        for group in optimizer.param_groups:  # the peak, before any lr_scale (timm reads initial_lr)
            group["initial_lr"] = lr
        # timm warns that a one-step cosine "has no effect": a run that ends right after its warm-up
        with _quiet("timm.scheduler.cosine_lr"):
            self.timm = CosineLRScheduler(optimizer, t_initial=max(1, self.total_steps - self.warmup_steps),
                                          lr_min=self.min_lr, warmup_t=self.warmup_steps, warmup_lr_init=0.0,
                                          warmup_prefix=True, t_in_epochs=False)
        self.last_step = 0
        self._apply()

    def _update(self, step: int) -> int:
        """The timm update count whose rate step ``step`` (0-based) takes."""
        return step + 1 if step < self.warmup_steps else step

    def lr_at(self, step: int) -> float:
        return self.timm._get_lr(self._update(step))[0]

    def get_last_lr(self) -> float:
        return self.lr_at(self.last_step)

    def _apply(self) -> None:
        self.timm.step_update(self._update(self.last_step))  # timm multiplies each group's lr_scale in

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"last_step": self.last_step, "base_lr": self.base_lr, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = int(state["last_step"])
        self._apply()


@contextlib.contextmanager
def _quiet(name: str):
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
