"""Fixup (Zhang et al. 2019) and T-Fixup (Huang et al. 2020) for the ViT block: norm-free residual
branches made trainable by their initialisation.

Both remove the block's pre-norms (``norm1``/``norm2`` become identities). The final norm before the head
stays: it sits after the residual stack, outside the signal-propagation argument of either paper.

**Fixup** (``gate='fixup'``), adapted to the transformer as Touvron et al. 2021 (CaiT) compare it. A
ViT of ``depth`` blocks has ``L = 2 * depth`` residual branches, each of ``m = 2`` linear layers on the value
path: attention ``attn.qkv`` -> ``attn.proj`` and MLP ``mlp.fc1`` -> ``mlp.fc2``. Fixup's three rules (Zhang et
al. 2019), the third split in two here:

1. the classification layer (``head``) and the last layer of each branch (``attn.proj``, ``mlp.fc2``) start
   at zero, so every block is the identity at initialisation;
2. the other layers of a branch (``attn.qkv``, ``mlp.fc1``) take a standard fan-in initialisation scaled by
   ``L ** (-1 / (2m - 2))`` (``L ** -0.5`` here): normal with std ``gain / sqrt(fan_in)``, gain 1 for
   ``qkv`` (a linear map) and ``sqrt(2)`` for ``fc1`` (He et al.'s gain; GELU is ReLU-like);
3. a scalar multiplier (``ls1.scale`` / ``ls2.scale``, init 1) ends each branch, followed by a scalar bias
   (``ls*.bias``, init 0);
4. a scalar bias (init 0) comes before every linear layer of a branch (``in_bias`` of ``qkv``, ``proj``,
   ``fc1``, ``fc2``) and before the MLP's activation (``mlp.act.bias``; SwiGLU has no separate activation).

**T-Fixup** (``gate='tfixup'``): Huang et al. 2020, "Improving Transformer Optimization Through Better
Initialization", for an encoder-only stack of ``N = depth`` blocks. No gate, no pre-norms, and no learning-rate
warm-up (a recipe matter: ``vitlab depth-study`` sets ``warmup_epochs=0`` for its ``tfixup`` variant). The
paper's procedure (Section 3.3), for embedding width ``d``:

1. Xavier initialisation of every parameter except the input embeddings, which are Gaussian ``N(0, d^-1/2)``;
2. the input embeddings ``x`` (and in the decoder ``y``, with the decoder's ``v_d``, ``w_d`` and MLP weights)
   are scaled by ``(9N) ** -1/4``;
3. in each encoder block the value and output projections ``v_e``, ``w_e`` of the attention and the MLP
   weights are scaled by ``0.67 * N ** -1/4``. The query and key projections are not scaled: they reach the
   output only through the softmax, whose rows stay probabilities whatever their size.

vitlab follows the authors' released code (``layer6ai-labs/T-Fixup``, fairseq: ``TransformerEncoder`` and
``TransformerEncoderLayer.fixup_initialization``), which fixes what the equations leave open:

- ``q`` and ``k`` (rows ``0:d`` and ``d:2d`` of ``qkv``): Xavier-uniform with gain ``1/sqrt(2)`` on each
  ``d x d`` matrix, std ``(2d) ** -1/2`` (fairseq's attention init, the same std as Xavier over the fused
  ``3d x d`` matrix); unscaled.
- ``v`` (rows ``2d:3d``): the code multiplies fairseq's gain-``1/sqrt(2)`` draw by ``sqrt(2)``, so Xavier with
  gain 1, then ``0.67 * N ** -1/4``; ``proj``, ``fc1`` (SwiGLU: ``fc1_g``, ``fc1_x``) and ``fc2``: Xavier
  times ``0.67 * N ** -1/4``.
- The code's token embedding is ``N(0, std d^-1/2)`` times ``(9N) ** -1/4``, and the encoder multiplies it by
  ``sqrt(d)`` in the forward pass (fairseq's ``embed_scale``): a token enters the first block with per-element
  std ``(9N) ** -1/4``. Position embeddings (fairseq's fixed sinusoids) are added unscaled.

Where a ViT differs from the translation model, vitlab's choices:

- the **patch projection** plays the token embedding: it is a linear map of pixels, not a lookup table, so it
  keeps Xavier (fan-in ``C p^2``, fan-out ``d``), which gives a standardised patch a per-element std near 1,
  and is scaled by ``(9N) ** -1/4``, as the code's token embedding ends up;
- the **class and register tokens** are learned token embeddings (rows of a table) without fairseq's
  ``sqrt(d)`` multiplier, so they are drawn at the std the code's tokens reach after it: ``N(0, (9N) ** -1/2)``,
  i.e. std ``(9N) ** -1/4``;
- the **position embedding** stays outside the rule, as in the code: a fixed sin-cos table is unchanged and a
  learned one keeps vitlab's default init (truncated normal, std 0.02);
- **biases** are zero (the code leaves the ``q``/``k``/``v`` biases at PyTorch's default uniform draw, a fairseq
  detail outside the paper's rule), and the classification **head** is Xavier with zero bias (the code's output
  layer is tied to the decoder embedding, which an encoder-only classifier does not have).

Touvron et al. 2021 found that neither trains DeiT off the shelf and re-introduced LayerNorm and warm-up
to make them converge; the gates here are the papers' own norm-free versions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FIXUP_GATES = ("fixup", "tfixup")
TFIXUP_ENCODER = 0.67  # Huang et al. 2020: encoder weights scaled by 0.67 N^(-1/4)
TFIXUP_QK_GAIN = 2 ** -0.5  # the authors' code (fairseq): Xavier gain of the d x d query and key projections


def fixup_scale(num_branches: int, layers_per_branch: int = 2) -> float:
    """Fixup's scale ``L ** (-1 / (2m - 2))`` of the non-last layers of a branch of ``m`` layers."""
    return num_branches ** (-1.0 / (2 * layers_per_branch - 2))


def tfixup_scales(depth: int) -> tuple[float, float]:
    """``(encoder weights, input embedding)`` scales of T-Fixup: ``0.67 N^-1/4`` and ``(9N)^-1/4``."""
    return TFIXUP_ENCODER * depth ** -0.25, (9 * depth) ** -0.25


def _scalar(value: float) -> nn.Parameter:
    p = nn.Parameter(torch.tensor(float(value)))
    p._no_weight_decay = True
    return p


class FixupGate(nn.Module):
    """Fixup's branch end: ``x * scale + bias`` with one scalar each (init 1 and 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = _scalar(1.0)
        self.bias = _scalar(0.0)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale + self.bias


class BiasedLinear(nn.Linear):
    """``nn.Linear`` with Fixup's scalar bias ``in_bias`` (init 0) added to its input."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.in_bias = _scalar(0.0)

    @classmethod
    def like(cls, linear: nn.Linear) -> BiasedLinear:
        return cls(linear.in_features, linear.out_features, bias=linear.bias is not None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x + self.in_bias, self.weight, self.bias)


class BiasedActivation(nn.Module):
    """``act(x + bias)``: Fixup's scalar bias before an element-wise activation."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.bias = _scalar(0.0)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return self.act(x + self.bias)


BRANCH_LINEARS = {"attn": ("qkv", "proj"), "mlp": ("fc1", "fc1_g", "fc1_x", "fc2")}


def add_fixup_biases(attn: nn.Module, mlp: nn.Module) -> None:
    """Give ``attn`` and ``mlp`` Fixup's scalar biases in place: before each linear layer of the branch and
    before the MLP's activation. Parameter names stay timm's (``qkv.weight``...), plus ``in_bias``."""
    for module, names in ((attn, BRANCH_LINEARS["attn"]), (mlp, BRANCH_LINEARS["mlp"])):
        for name in names:
            layer = getattr(module, name, None)
            if isinstance(layer, nn.Linear) and not isinstance(layer, BiasedLinear):
                setattr(module, name, BiasedLinear.like(layer))
    if isinstance(getattr(mlp, "act", None), nn.Module) and not isinstance(mlp.act, BiasedActivation):
        mlp.act = BiasedActivation(mlp.act)


def _fan_in_normal_(weight: Tensor, gain: float, scale: float) -> None:
    nn.init.normal_(weight, std=gain * scale / math.sqrt(weight.shape[1]))


def _xavier_(weight: Tensor, fan_in: int, fan_out: int, scale: float = 1.0) -> None:
    """Xavier uniform with explicit fans (std ``sqrt(2 / (fan_in + fan_out))``), times ``scale``."""
    bound = scale * math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


def _zero_(layer: nn.Module) -> None:
    nn.init.zeros_(layer.weight)
    if getattr(layer, "bias", None) is not None:
        nn.init.zeros_(layer.bias)


def _first_layers(mlp: nn.Module) -> list[nn.Linear]:
    return [getattr(mlp, n) for n in ("fc1", "fc1_g", "fc1_x") if isinstance(getattr(mlp, n, None), nn.Linear)]


def init_fixup(blocks: list[nn.Module], head: nn.Module | None) -> None:
    """Fixup's initialisation (module docstring, rules 1-3) of ``blocks`` and the classification ``head``."""
    scale = fixup_scale(2 * len(blocks), 2)
    with torch.no_grad():
        for blk in blocks:
            _fan_in_normal_(blk.attn.qkv.weight, 1.0, scale)
            for fc1 in _first_layers(blk.mlp):
                _fan_in_normal_(fc1.weight, math.sqrt(2.0), scale)
            for layer in (blk.attn.qkv, *_first_layers(blk.mlp)):
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
            _zero_(blk.attn.proj)
            _zero_(blk.mlp.fc2)
            for m in blk.modules():
                if isinstance(m, FixupGate):
                    m.reset_parameters()
                elif isinstance(m, BiasedLinear | BiasedActivation):
                    nn.init.zeros_(m.in_bias if isinstance(m, BiasedLinear) else m.bias)
        if isinstance(head, nn.Linear):
            _zero_(head)


def init_tfixup(model: nn.Module) -> None:
    """T-Fixup's initialisation (module docstring) of a ViT-like ``model``: ``blocks``, ``patch_embed.proj``,
    ``cls_token``, ``reg_token`` and ``head``; a learned ``pos_embed`` keeps the init it has."""
    blocks = list(model.blocks)
    weights, embedding = tfixup_scales(len(blocks))
    with torch.no_grad():
        for blk in blocks:
            d = blk.attn.qkv.in_features
            qkv = blk.attn.qkv.weight  # (3d, d): q, k, v rows
            for i, scale in enumerate((TFIXUP_QK_GAIN, TFIXUP_QK_GAIN, weights)):
                _xavier_(qkv[i * d:(i + 1) * d], d, d, scale)
            for layer in (blk.attn.proj, *_first_layers(blk.mlp), blk.mlp.fc2):
                _xavier_(layer.weight, layer.in_features, layer.out_features, weights)
            for layer in (blk.attn.qkv, blk.attn.proj, *_first_layers(blk.mlp), blk.mlp.fc2):
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
        proj = model.patch_embed.proj
        _xavier_(proj.weight, proj.weight[0].numel(), proj.weight.shape[0], embedding)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        for name in ("cls_token", "reg_token"):
            p = getattr(model, name, None)
            if isinstance(p, nn.Parameter):
                nn.init.normal_(p, std=embedding)  # the code's N(0, d^-1/2) * sqrt(d) * (9N)^-1/4
        head = getattr(model, "head", None)
        if isinstance(head, nn.Linear):
            _xavier_(head.weight, head.in_features, head.out_features)
            nn.init.zeros_(head.bias)
