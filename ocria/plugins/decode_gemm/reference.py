"""Plain PyTorch references for the decode GEMM: what the models run today (``F.linear``, cuBLAS on
the GPU) and the exact-math target the kernel rounds to (fp32 products and sums, one bf16 rounding)."""

import torch
import torch.nn.functional as F
from torch import Tensor


def decode_gemm_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_fp32: bool = False) -> Tensor:
    """``x @ weight.T + bias`` as the models compute it: x [..., K], weight [N, K] -> [..., N]. With
    ``out_fp32`` the sums stay fp32 (CUDA: ``mm`` with ``out_dtype``, no fp32 copy of the weight)."""
    if not out_fp32 or x.dtype == torch.float32:
        out = F.linear(x, weight, bias)
        return out.float() if out_fp32 else out
    if x.is_cuda:
        flat = torch.mm(x.reshape(-1, x.shape[-1]), weight.t(), out_dtype=torch.float32)
        out = flat.view(*x.shape[:-1], -1)
    else:
        out = F.linear(x.float(), weight.float())
    return out if bias is None else out + bias.float()


def decode_gemm_fp32(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The same product in fp32 (bf16 products are exact there), rounded once to x's dtype."""
    out = x.float() @ weight.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def decode_gemm_norm_fp32(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                          bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The norm-prologue kernel's math (``decode_gemm_norm_triton``): ``s = x + residual`` rounded to x's dtype,
    ``u = s * (1 + norm_weight)`` rounded, the fp32 product ``u @ weight.T`` scaled by each row's
    ``rstd = 1 / sqrt(mean(s^2) + eps)`` (+ bias), rounded once. Returns (output, s)."""
    s = x if residual is None else x + residual
    sf = s.float()
    rstd = 1.0 / (sf.square().mean(-1, keepdim=True) + eps).sqrt()
    u = (sf * (1.0 + norm_weight.float())).to(x.dtype)
    out = (u.float() @ weight.float().T) * rstd
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype), s


def decode_gemm_fp8_fp32(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor,
                         bias: Tensor | None = None) -> Tensor:
    """The FP8 kernel's math: E4M3 ``q`` [..., K] and ``weight`` [N, K] decoded exactly, their fp32 product
    times ``x_scale`` (per tensor or per row) and ``w_scale`` (per tensor or per column) (+ bias), rounded once
    to bf16."""
    out = q.float() @ weight.float().T
    out = out * x_scale.float().reshape(*q.shape[:-1], 1) if x_scale.numel() > 1 else out * x_scale.float()
    out = out * w_scale.float().reshape(-1)
    if bias is not None:
        out = out + bias.float()
    return out.to(torch.bfloat16)
