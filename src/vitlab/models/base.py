"""What every vitlab model offers beyond ``forward``: timm's contract plus analysis hooks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vitlab.errors import ConfigError
from vitlab.layers.attention import AttentionBase, record_attention
from vitlab.layers.block import record_residuals
from vitlab.models.config import ModelConfig
from vitlab.models.eval_mode import analysis_mode
from vitlab.models.spec import ModelSpec


@dataclass
class FlopRow:
    """One arithmetic module of a model and the number of tokens it processes per image."""

    name: str
    module: nn.Module
    num_tokens: int
    kwargs: dict


class VitlabModel(nn.Module):
    """Base class: ``forward_features`` / ``forward_head`` / ``no_weight_decay`` / ``reset_classifier``
    (timm's names) and ``attention_maps`` / ``residual_ratios`` / ``flop_rows`` for analysis."""

    cfg: ModelConfig
    num_prefix_tokens: int = 1
    grad_checkpointing: bool = False

    def forward_features(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, T, D)
        raise NotImplementedError

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    @property
    def num_features(self) -> int:
        return self.cfg.embed_dim

    @property
    def embed_dim(self) -> int:
        return self.cfg.embed_dim

    @property
    def vitlab_spec(self) -> ModelSpec:
        """What a checkpoint stores to rebuild this model (:class:`vitlab.models.spec.ModelSpec`): its config as
        it is now, after any ``set_input_size`` / ``reset_classifier``."""
        return ModelSpec(config=self.cfg)

    def attention_maps(self, x: Tensor) -> list[Tensor]:
        """One ``(B, heads, T_query, T_key)`` map per attention layer, in forward order. Class-attention
        layers give ``T_query == 1``. Runs in eval mode (:func:`~vitlab.models.eval_mode.analysis_mode`: no
        dropout, batch norms untouched) and puts the caller's mode back; gradients flow unless the caller wraps
        the call in ``torch.no_grad()``."""
        with analysis_mode(self), record_attention(self.modules()) as maps:
            self.forward(x)
        return list(maps)

    def residual_ratios(self, x: Tensor) -> list[dict[str, Tensor]]:
        """Per gated block, ``{"attn": (B,), "mlp": (B,)}`` = ``||gate(branch(x))||_2 / ||x||_2`` (CaiT), in
        eval mode as :meth:`attention_maps`."""
        with analysis_mode(self), record_residuals(self.modules()) as ratios:
            self.forward(x)
        return list(ratios)

    def attention_layers(self) -> list[AttentionBase]:
        return [m for m in self.modules() if isinstance(m, AttentionBase)]

    def no_weight_decay(self) -> set[str]:
        """Parameters kept out of weight decay: LayerScale gammas and scalar gates, norm weights, biases,
        class/register tokens and position embeddings (every 0-d/1-d parameter, plus tagged ones)."""
        names = set()
        for name, p in self.named_parameters():
            if p.ndim <= 1 or getattr(p, "_no_weight_decay", False) or name.split(".")[-1] in (
                    "cls_token", "reg_token", "pos_embed", "dist_token"):
                names.add(name)
        return names

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head (freshly initialised) with one for ``num_classes`` (0: identity)."""
        self.cfg = self.cfg.replace(num_classes=num_classes, **({"global_pool": global_pool} if global_pool else {}))
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        if isinstance(self.head, nn.Linear):
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def flop_rows(self) -> list[FlopRow]:
        """The arithmetic modules and their token counts at the configured image size."""
        raise NotImplementedError

    def flop_count(self, *, matmul_only: bool = False) -> int:
        """Multiplies for one image at the configured size (see :mod:`vitlab.flops`)."""
        return sum(module_flops(r.module, r.num_tokens, matmul_only, **r.kwargs) for r in self.flop_rows())

    def get_intermediate_layers(self, x: Tensor, n: int | list[int] | tuple[int, ...] = 1, reshape: bool = False,
                                return_prefix_tokens: bool = False, norm: bool = False) -> list:
        """timm's (and DINO's) name for :meth:`forward_intermediates` with ``intermediates_only=True``: the patch
        tokens ``(B, N, D)`` (``reshape``: ``(B, D, H/p, W/p)``) of the last ``n`` self-attention blocks or of the
        blocks at indices ``n``, in block order; ``return_prefix_tokens`` pairs each with its prefix tokens."""
        return self.forward_intermediates(x, n, return_prefix_tokens=return_prefix_tokens, norm=norm,
                                          output_fmt="NCHW" if reshape else "NLC", intermediates_only=True)

    @property
    def feature_info(self) -> list[dict]:
        """timm's feature metadata, one entry per self-attention block (as timm's ``VisionTransformer``): read by
        ``timm.create_model(..., features_only=True)``'s feature extractor."""
        p = self.patch_embed.patch_size
        reduction = p[0] if isinstance(p, tuple) else p
        return [dict(module=f"blocks.{i}", num_chs=self.embed_dim, reduction=reduction)
                for i in range(len(self.blocks))]

    # ------------------------------------------------------------------ timm 1.x: features, checkpointing, groups

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's name): the
        same loss and gradients for less activation memory and about one more block forward per step."""
        self.grad_checkpointing = enable

    def _run_block(self, blk: nn.Module, x: Tensor, *args) -> Tensor:
        """``blk(x, *args)``, checkpointed when gradient checkpointing is on and autograd records."""
        if not (self.grad_checkpointing and torch.is_grad_enabled()):
            return blk(x, *args)
        return checkpoint(_recomputable(blk), x, *args, use_reentrant=False)

    def forward_intermediates(self, x: Tensor, indices: int | list[int] | None = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False
                              ) -> list | tuple[Tensor, list]:
        """timm's feature API: the outputs of the blocks at ``indices`` (int: the last n; list: these indices,
        negative counting from the end; None: all), in block order and each block once, as timm's (``[2, 0]`` gives
        blocks 0 and 2, ``[-1, -1]`` the last block once), and, unless ``intermediates_only``, the final features
        (``forward_features``). ``norm`` applies the final norm to each; ``output_fmt='NCHW'`` gives the patch
        tokens as ``(B, D, H/p, W/p)`` maps, ``'NLC'`` as ``(B, N, D)``; ``return_prefix_tokens`` pairs each with
        its ``(B, P, D)`` class and register tokens (registers after the patches included). ``stop_early`` runs
        only the blocks up to the last index taken (then the final features come from there, as in timm)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ConfigError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, last = feature_take_indices(len(self.blocks), indices)
        captured: dict[int, Tensor] = {}
        hooks = [self.blocks[i].register_forward_hook(_capture(captured, i)) for i in set(take)]
        try:
            with self._truncated_blocks(last + 1 if stop_early else len(self.blocks)):
                final = self.forward_features(x)
        finally:
            for h in hooks:
                h.remove()
        front, end = self._token_layout()
        out = []
        for i in sorted(set(take)):  # timm appends block i's output when i is taken, as the blocks run
            y = self.norm(captured[i]) if norm else captured[i]  # (B, T, D)
            patches = y[:, front:y.shape[1] - end]  # (B, N, D)
            if output_fmt == "NCHW":
                h, w = self._feature_grid(x, patches.shape[1])
                patches = patches.reshape(y.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()  # (B, D, h, w)
            if return_prefix_tokens and front + end:
                patches = (patches, torch.cat([y[:, :front], y[:, y.shape[1] - end:]], dim=1))  # (B, P, D)
            out.append(patches)
        return out if intermediates_only else (final, out)

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last of ``indices`` (timm's semantics), the final norm if ``prune_norm``
        and the classifier if ``prune_head``; returns the absolute indices kept for ``forward_intermediates``."""
        take, last = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self._prune_head()
        return take

    def group_matcher(self, coarse: bool = False) -> dict[str, str | list]:
        """timm's parameter grouping (``coarse`` is accepted for timm's signature; a ViT has no coarser stages):
        ``stem`` (embeddings and tokens) is layer 0, block ``i`` layer ``i + 1``, the final norm joins the last
        block, anything unmatched (head, fc_norm) comes last. Drives layer-wise learning-rate decay in
        ``timm.optim.create_optimizer_v2(model, layer_decay=...)`` and ``vitlab train --layer-decay``."""
        return dict(stem=r"^cls_token|^reg_token|^pos_embed|^patch_embed",
                    blocks=[(r"^blocks\.(\d+)", None), *self._extra_block_groups(), (r"^norm\.", MATCH_PREV_GROUP)])

    # per-model hooks of the methods above
    def _token_layout(self) -> tuple[int, int]:
        """How many tokens sit before and after the patch tokens in the blocks' input."""
        return self.num_prefix_tokens, 0

    def _prune_head(self) -> None:
        if hasattr(self, "fc_norm"):
            self.fc_norm = nn.Identity()
        self.reset_classifier(0)

    def _extra_block_groups(self) -> list[tuple[str, tuple[int, ...] | None]]:
        """More ``(regex, ordinal)`` entries of the ``blocks`` group (CaiT: its class-attention blocks)."""
        return []

    def _feature_grid(self, x: Tensor, num_patches: int) -> tuple[int, int]:
        p = self.patch_embed.patch_size
        ph, pw = p if isinstance(p, tuple) else (p, p)
        h, w = x.shape[-2] // ph, x.shape[-1] // pw
        if h * w != num_patches:
            raise ConfigError(f"{num_patches} patch tokens do not form the {h}x{w} grid of a {tuple(x.shape[-2:])} "
                              f"image; use output_fmt='NLC'")
        return h, w

    @contextlib.contextmanager
    def _truncated_blocks(self, n: int) -> Iterator[None]:
        """Within the block, ``self.blocks`` holds its first ``n`` blocks only."""
        full = self.blocks
        if n < len(full):
            self.blocks = full[:n]
        try:
            yield
        finally:
            self.blocks = full


# timm's marker (``timm.models._manipulate.MATCH_PREV_GROUP``): a group ordinal ending in it joins the group before
MATCH_PREV_GROUP = (99999,)


def feature_take_indices(num_blocks: int, indices: int | list[int] | tuple[int, ...] | None) -> tuple[list[int], int]:
    """Absolute block indices for ``indices`` (None: all; int n: the last n; a sequence: these, negative ones
    counting from the end) and the largest of them."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ConfigError(f"indices={indices} asks for the last {indices} blocks of {num_blocks}; "
                              f"use 1 to {num_blocks}")
        take = list(range(num_blocks - indices, num_blocks))
    else:
        take = [num_blocks + i if i < 0 else i for i in indices]
        bad = [i for i, t in zip(indices, take) if not 0 <= t < num_blocks]
        if bad or not take:
            raise ConfigError(f"block indices {list(indices)} are out of range for {num_blocks} blocks; "
                              f"use indices in {-num_blocks}..{num_blocks - 1}")
    return take, max(take)


def _capture(into: dict[int, Tensor], index: int) -> Callable:
    def hook(_module: nn.Module, _inputs: tuple, output: Tensor) -> None:
        into[index] = output
    return hook


def _recomputable(blk: nn.Module) -> Callable:
    """``blk`` for checkpointing, its recomputation in the backward pass made a true replay of the first pass:
    inside a sliced step (:func:`vitlab.slice_rng.slice_generator`) it redraws the slice generator's numbers
    (checkpoint restores only torch's global RNG), so drop-path masks match, and batch norms in training
    (DeepViT's re-attention) keep the running statistics of the first pass instead of updating them twice."""
    from vitlab.slice_rng import slice_generator

    gen = slice_generator()
    norms = [m for m in blk.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
             and m.track_running_stats]
    if gen is None and not norms:
        return blk
    start, calls = (gen.get_state() if gen is not None else None), [0]

    def run(*args) -> Tensor:
        calls[0] += 1
        if calls[0] == 1:
            return blk(*args)
        resume = gen.get_state() if gen is not None else None
        stats = [[b.clone() for b in m.buffers(recurse=False)] for m in norms]
        if gen is not None:
            gen.set_state(start)
        try:
            return blk(*args)
        finally:
            if gen is not None:
                gen.set_state(resume)
            with torch.no_grad():
                for m, saved in zip(norms, stats):
                    for b, v in zip(m.buffers(recurse=False), saved):
                        b.copy_(v)
    return run


def build_placed(build: Callable[[], nn.Module], device: torch.device | str | None = None,
                 dtype: torch.dtype | str | None = None) -> nn.Module:
    """``build()`` with its parameters and buffers created on ``device`` (``'meta'``: shapes only, no memory) and
    cast to the floating-point ``dtype``: timm 1.0's ``device=`` / ``dtype=`` construction arguments."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), dtype)  # "bfloat16" -> torch.bfloat16
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(f"dtype must be a floating-point torch dtype (torch.float32, torch.bfloat16, ...), "
                          f"got {dtype!r}")
    try:
        device = None if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device must be a torch device ('cpu', 'cuda', 'cuda:1', 'meta'), got {device!r}") from exc
    with device if device is not None else contextlib.nullcontext():
        model = build()
    return model if dtype is None else model.to(dtype=dtype)


def module_flops(module: nn.Module, num_tokens: int, matmul_only: bool = False, **kwargs) -> int:
    """Multiplies of ``module`` over ``num_tokens`` tokens (plain ``nn.Linear`` heads included)."""
    if isinstance(module, nn.Linear):
        return num_tokens * module.in_features * module.out_features
    return module.flop_count(num_tokens, matmul_only=matmul_only, **kwargs)


def head_linear(dim: int, num_classes: int) -> nn.Module:
    return nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()


def init_vit_weights(model: nn.Module, mode: str = "trunc_normal") -> None:
    """Linears with zero bias: ``trunc_normal`` is timm's default ViT init (std 0.02); ``xavier`` draws every
    linear but the classifier ``head`` Xavier-uniform, as the original ViT's JAX code does for attention and
    MLP layers (timm's ``weight_init='jax'`` too). At std 0.02 the query-key products of a small model start
    near zero, so attention starts uniform and learns to look at content only slowly; Xavier's larger queries
    and keys let it attend from the first steps."""
    head = getattr(model, "head", None)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            if mode == "xavier" and m is not head:
                nn.init.xavier_uniform_(m.weight)
            else:
                nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
