"""What every vitlab model offers beyond ``forward``: timm's contract plus analysis hooks."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from vitlab.layers.attention import AttentionBase, record_attention
from vitlab.layers.block import record_residuals
from vitlab.models.config import ModelConfig


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

    def attention_maps(self, x: Tensor) -> list[Tensor]:
        """One ``(B, heads, T_query, T_key)`` map per attention layer, in forward order. Class-attention
        layers give ``T_query == 1``. ``forward``'s output is unchanged; gradients flow unless the caller
        wraps the call in ``torch.no_grad()``."""
        with record_attention(self.modules()) as maps:
            self.forward(x)
        return list(maps)

    def residual_ratios(self, x: Tensor) -> list[dict[str, Tensor]]:
        """Per gated block, ``{"attn": (B,), "mlp": (B,)}`` = ``||gate(branch(x))||_2 / ||x||_2`` (seed 000)."""
        with record_residuals(self.modules()) as ratios:
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

    def get_intermediate_layers(self, x: Tensor, n: int | list[int] = 1, norm: bool = False) -> list[Tensor]:
        """Outputs ``(B, T, D)`` of the last ``n`` self-attention blocks, or of the blocks at indices ``n``."""
        raise NotImplementedError


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
