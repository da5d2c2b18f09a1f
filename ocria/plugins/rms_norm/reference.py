"""PyTorch references of the fused norms (what the model layers compute, operation by operation).

Eagerly each is several kernels (casts, ``1 + w``, the norm, the gate); the decode step runs
four to five norms per layer, so they are a large share of its launches.
"""

import torch
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


def plain_rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Qwen3's plain norm (the DFlash drafter's), rounded where it rounds: ``norm(x)`` in fp32 rounded to x's
    dtype, its product with w rounded to their common dtype."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def add_plain_rms_norm_reference(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The drafter's residual add followed by its plain norm: ``(x + residual, plain_rms_norm(x + residual))``."""
    s = x + residual
    return s, plain_rms_norm_reference(s, weight, eps)


def gated_rms_norm_reference(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    """GDN output norm ``w * norm(x) * silu(z)``, rounded where the model rounds: the norm to x's dtype,
    its product with w to their common dtype, the gated result to x's dtype."""
    return (plain_rms_norm_reference(x, weight, eps) * F.silu(z.float())).to(x.dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The models' eager rotary embedding: ``x * cos + rotate_half(x) * sin`` on the first
    ``cos.shape[-1]`` channels of x (partial rotary; cos, sin broadcast over x), the rest passing through."""
    R = cos.shape[-1]
    x_rot, x_pass = x[..., :R], x[..., R:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, x_pass), dim=-1)


def rotary_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., H, D] rotated by cos, sin [..., R]: one row per token, shared by its H heads."""
    return apply_rotary(x, cos[..., None, :], sin[..., None, :])


def rms_norm_rope_reference(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, offset: float,
                            plain: bool) -> Tensor:
    """An attention's q/k norm (plain, or ``* (offset + w)``) followed by its rotary embedding."""
    normed = plain_rms_norm_reference(x, weight, eps) if plain else rms_norm_reference(x, weight, eps, offset)
    return rotary_reference(normed, cos, sin)
