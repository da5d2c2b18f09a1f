"""``torch.library`` operator ``ocria::nvfp4_gemm``: Triton on CUDA (and on CPU under
``TRITON_INTERPRET=1``), the dequantize + fp32 matmul reference otherwise; fake impl for graphs."""

import os

import torch
from torch import Tensor

from ocria.plugins.fp4_gemm.kernel import nvfp4_gemm_triton
from ocria.plugins.fp4_gemm.reference import nvfp4_gemm_reference


@torch.library.custom_op("ocria::nvfp4_gemm", mutates_args=())
def nvfp4_gemm(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor) -> Tensor:
    """``x @ W^T`` for bf16 ``x`` [..., K] and NVFP4 ``weight`` [N, K/2] (see ``reference``)."""
    if x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return nvfp4_gemm_triton(x, weight, weight_scale, weight_scale_2)
    return nvfp4_gemm_reference(x, weight, weight_scale, weight_scale_2)


@nvfp4_gemm.register_fake
def _(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])
