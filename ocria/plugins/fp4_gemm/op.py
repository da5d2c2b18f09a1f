"""``torch.library`` operator ``ocria::nvfp4_gemm`` (the Triton kernel, fake impl for graphs) and
``nvfp4_gemm``, the function callers use: the execution policy picks the kernel or the dequantize + fp32 matmul
reference, as for the other plugins."""

import torch
from torch import Tensor

from ocria.plugins.fp4_gemm.kernel import nvfp4_gemm_triton
from ocria.plugins.fp4_gemm.reference import nvfp4_gemm_reference
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch


@torch.library.custom_op("ocria::nvfp4_gemm", mutates_args=())
def _nvfp4_gemm_op(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor, launch: int) -> Tensor:
    return nvfp4_gemm_triton(x, weight, weight_scale, weight_scale_2, launch=Launch(launch))


@_nvfp4_gemm_op.register_fake
def _(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor, launch: int) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def nvfp4_gemm(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor,
               policy: ExecutionPolicy = AUTO) -> Tensor:
    """``x @ W^T`` with an NVFP4 weight (ModelOpt's layout; see ``reference``).

    Args:
        x: [..., K] bf16.
        weight: [N, K/2] uint8, two E2M1 codes per byte.
        weight_scale: [N, K/16] float8_e4m3fn block scales.
        weight_scale_2: fp32 scalar, the global scale.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [..., N] in x's dtype.
    """
    if not policy.uses("nvfp4_gemm", x.device):
        return nvfp4_gemm_reference(x, weight, weight_scale, weight_scale_2)
    return torch.ops.ocria.nvfp4_gemm(x, weight, weight_scale, weight_scale_2, int(policy.launch))
