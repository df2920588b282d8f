"""sigma-Reparam (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse"):
every linear layer of the blocks uses the weight

    W_hat = gamma / sigma(W) * W,

with ``sigma(W)`` the spectral norm (largest singular value) of ``W`` and ``gamma`` a learnable scalar.

As the authors' released code (``apple/ml-sigma-reparam``, ``SNLinear``): at initialisation ``u``, ``v`` are the
top right/left singular vectors of ``W`` (an SVD) and ``gamma = sigma(W)``, so ``W_hat = W`` and the model starts
as the plain one; each training forward takes one power-iteration step without gradient,
``v = normalize(W u)``, ``u = normalize(W^T v)``, stores ``u``, ``v`` in buffers, and uses
``sigma = v^T W u``, through which the gradient flows into ``W`` (``u``, ``v`` held constant). In eval mode the
buffers are not updated: ``sigma = v^T W u`` with the stored vectors, so evaluation is deterministic and two
evaluations of the same weights agree.

Data parallel: the step is a function of the weights and the stored vectors only (no randomness, no batch
statistics). DDP starts every rank from rank 0's parameters and buffers and all-reduces the gradients, so every
rank holds the same weights and computes the same ``u``, ``v`` at every step; DDP's default
``broadcast_buffers=True`` also re-sends rank 0's buffers before each forward. The buffers are saved with the
weights, so a resumed run continues the iteration where it stopped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the linear layers of a block that are reparameterised (called as modules; talking heads' mixes are read as
# weights and keep their plain form)
REPARAM_NAMES = ("qkv", "proj", "fc1", "fc2", "fc1_g", "fc1_x")


class SigmaReparamLinear(nn.Linear):
    """``nn.Linear`` computing with ``W_hat = gamma / sigma(W) * W``; buffers ``u`` (in), ``v`` (out)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.gamma = nn.Parameter(torch.ones(()))
        self.gamma._no_weight_decay = True
        self.register_buffer("u", torch.zeros(in_features))
        self.register_buffer("v", torch.zeros(out_features))
        self.reset_sigma()

    @classmethod
    def like(cls, linear: nn.Linear) -> SigmaReparamLinear:
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            m.weight.copy_(linear.weight)
            if linear.bias is not None:
                m.bias.copy_(linear.bias)
        m.reset_sigma()
        return m.to(device=linear.weight.device, dtype=linear.weight.dtype)

    @torch.no_grad()
    def reset_sigma(self) -> None:
        """``u``, ``v`` the top singular vectors of the current ``W`` and ``gamma = sigma(W)``, so ``W_hat = W``."""
        if self.weight.is_meta:
            return
        U, S, Vh = torch.linalg.svd(self.weight.float(), full_matrices=False)
        self.u.copy_(Vh[0])
        self.v.copy_(U[:, 0])
        self.gamma.fill_(S[0])

    def sigma(self) -> Tensor:
        """``v^T W u``; in training mode after one power-iteration step that updates ``u``, ``v``."""
        w = self.weight
        u, v = self.u, self.v
        if self.training:
            with torch.no_grad():
                v = F.normalize(torch.mv(w, u), dim=0)
                u = F.normalize(torch.mv(w.t(), v), dim=0)
                self.u.copy_(u)
                self.v.copy_(v)
        return torch.dot(v, torch.mv(w, u))

    def reparam_weight(self) -> Tensor:
        return self.weight * (self.gamma / self.sigma())

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.reparam_weight(), self.bias)

    def weight_flops(self) -> int:
        """Multiplies per forward outside the token matmul: ``W u`` and ``v . (W u)``, ``gamma / sigma`` times
        ``W`` (training adds the power step, ``W u`` and ``W^T v``)."""
        o, i = self.out_features, self.in_features
        return 2 * o * i + o

    def extra_repr(self) -> str:
        return super().extra_repr() + ", sigma_reparam=True"


def apply_sigma_reparam(module: nn.Module) -> int:
    """Swap every ``nn.Linear`` of ``module`` named in :data:`REPARAM_NAMES` for a :class:`SigmaReparamLinear`
    with the same weights; returns how many were swapped."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if name in REPARAM_NAMES and type(child) is nn.Linear:
                setattr(parent, name, SigmaReparamLinear.like(child))
                count += 1
    return count


def sigma_reparam_flops(module: nn.Module) -> int:
    """The weight-side multiplies of every :class:`SigmaReparamLinear` in ``module`` (once per forward)."""
    return sum(m.weight_flops() for m in module.modules() if isinstance(m, SigmaReparamLinear))
