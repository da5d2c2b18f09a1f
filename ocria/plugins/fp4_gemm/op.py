"""``torch.library`` operator ``ocria::nvfp4_gemm`` (the Triton kernel, fake impl for graphs) and
``nvfp4_gemm``, the function callers use, with the same switch as the other plugins:
``use_kernel`` None runs the kernel on CUDA tensors and the dequantize + fp32 matmul reference
elsewhere; True on CPU runs the kernel in Triton's interpreter (``TRITON_INTERPRET=1``)."""

import torch
from torch import Tensor

from ocria.plugins.fp4_gemm.kernel import nvfp4_gemm_triton
from ocria.plugins.fp4_gemm.reference import nvfp4_gemm_reference
from ocria.plugins.switch import kernel_enabled


@torch.library.custom_op("ocria::nvfp4_gemm", mutates_args=())
def _nvfp4_gemm_op(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor) -> Tensor:
    return nvfp4_gemm_triton(x, weight, weight_scale, weight_scale_2)


@_nvfp4_gemm_op.register_fake
def _(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def nvfp4_gemm(x: Tensor, weight: Tensor, weight_scale: Tensor, weight_scale_2: Tensor,
               use_kernel: bool | None = None) -> Tensor:
    """``x @ W^T`` with an NVFP4 weight (ModelOpt's layout; see ``reference``).

    Args:
        x: [..., K] bf16.
        weight: [N, K/2] uint8, two E2M1 codes per byte.
        weight_scale: [N, K/16] float8_e4m3fn block scales.
        weight_scale_2: fp32 scalar, the global scale.
        use_kernel: None picks by ``kernel_enabled`` (the kernel on CUDA unless switched off); True / False force
            the kernel / the reference.

    Returns:
        [..., N] in x's dtype.
    """
    if not kernel_enabled(x.device, use_kernel, "nvfp4_gemm"):
        return nvfp4_gemm_reference(x, weight, weight_scale, weight_scale_2)
    return torch.ops.ocria.nvfp4_gemm(x, weight, weight_scale, weight_scale_2)
