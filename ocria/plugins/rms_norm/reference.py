"""PyTorch references of the fused norms (what the model layers compute, operation by operation).

Eagerly each is several kernels (casts, ``1 + w``, the norm, the gate); the decode step runs
four to five norms per layer, so they are a large share of its launches.
"""

import torch.nn.functional as F
from torch import Tensor


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    """``rms_norm(x) * (offset + w)`` in fp32, cast to x's dtype (offset 1: Qwen3.5's zero-centred norm)."""
    return F.rms_norm(x.float(), (x.shape[-1],), offset + weight.float(), eps).to(x.dtype)


def add_rms_norm_reference(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
                           ) -> tuple[Tensor, Tensor]:
    """The decoder's residual add followed by its norm: ``(x + residual, rms_norm(x + residual))``."""
    s = x + residual
    return s, rms_norm_reference(s, weight, eps, offset)


def gated_rms_norm_reference(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    """GDN output norm ``w * norm(x) * silu(z)``, rounded where the model rounds: the norm to x's dtype,
    its product with w to their common dtype, the gated result to x's dtype."""
    out = weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    return (out * F.silu(z.float())).to(x.dtype)
