"""Plain PyTorch reference for the NVFP4 weight-only GEMM: dequantize, then an fp32 matmul.

Weight layout (ModelOpt unified NVFP4): ``weight`` uint8 [N, K/2], two E2M1 codes per byte along
the input dim (even index in the low nibble); ``weight_scale`` float8_e4m3fn [N, K/16];
``weight_scale_2`` fp32 scalar. ``W[n, k] = e2m1 * (float32(weight_scale[n, k // 16]) * weight_scale_2)``.
"""

import torch
from torch import Tensor

from ocria.plugins.numerics import dequantize_nvfp4


def nvfp4_gemm_reference(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor) -> Tensor:
    """``y = x @ W^T`` with fp32 accumulation; x [..., K] -> y [..., N] in x's dtype."""
    w = dequantize_nvfp4(weight, weight_scale, weight_scale_2, torch.float32)
    return (x.float() @ w.t()).to(x.dtype)
