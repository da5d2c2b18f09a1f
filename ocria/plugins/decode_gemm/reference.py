"""Plain PyTorch references for the decode GEMM: what the models run today (``F.linear``, cuBLAS on
the GPU) and the exact-math target the kernel rounds to (fp32 products and sums, one bf16 rounding)."""

import torch.nn.functional as F
from torch import Tensor


def decode_gemm_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` as the models compute it: x [..., K], weight [N, K] -> [..., N]."""
    return F.linear(x, weight, bias)


def decode_gemm_fp32(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The same product in fp32 (bf16 products are exact there), rounded once to x's dtype."""
    out = x.float() @ weight.float().T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
