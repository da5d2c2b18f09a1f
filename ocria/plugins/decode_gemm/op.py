"""``torch.library`` operator ``ocria::decode_gemm`` and the function callers use. ``use_kernel`` is the
plugins' switch (None: the Triton kernel on CUDA tensors, the reference elsewhere; True on CPU runs the
kernel in Triton's interpreter); what the kernel does not take (more than MAX_M rows outside a batch-invariant
step, as in prefill; other dtypes than bf16, N or K not a multiple of 16) runs the reference ``F.linear``."""

import torch
from torch import Tensor

from ocria.plugins.decode_gemm.kernel import MAX_M, decode_gemm_fp8_triton, decode_gemm_norm_triton, decode_gemm_triton
from ocria.plugins.decode_gemm.reference import decode_gemm_reference
from ocria.plugins.switch import batch_invariant, kernel_enabled


def _kernel_takes(x: Tensor, weight: Tensor, dtype: torch.dtype = torch.bfloat16) -> bool:
    """The kernel's shapes: x [..., K] of at most MAX_M rows (any number in a batch-invariant step) and weight
    [N, K] in ``dtype`` (bf16, or E4M3 for the FP8 form), N and K multiples of 16."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return ((rows <= MAX_M or batch_invariant()) and x.dtype == weight.dtype == dtype and weight.dim() == 2
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0)


@torch.library.custom_op("ocria::decode_gemm", mutates_args=())
def _decode_gemm_op(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_fp32: bool = False) -> Tensor:
    return decode_gemm_triton(x, weight, bias, out_fp32=out_fp32)


@_decode_gemm_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_fp32: bool = False) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32 if out_fp32 else x.dtype)


def decode_gemm(x: Tensor, weight: Tensor, bias: Tensor | None = None, use_kernel: bool | None = None,
                out_fp32: bool = False) -> Tensor:
    """``F.linear(x, weight, bias)`` in one launch whose rows are batch invariant (see ``kernel``), for up to MAX_M
    rows (any number in ``batch_invariant_rows()``); anything else through the reference.

    Args:
        x: [..., K] bf16.
        weight: [N, K] bf16.
        bias: [N] or None.
        use_kernel: None picks by ``kernel_enabled`` (the kernel on CUDA unless switched off); True / False force
            the kernel / the reference.
        out_fp32: return the fp32 sums, not rounded (logits).

    Returns:
        [..., N] in x's dtype, or float32 with ``out_fp32``.
    """
    if _kernel_takes(x, weight) and kernel_enabled(x.device, use_kernel, "decode_gemm"):
        return torch.ops.ocria.decode_gemm(x, weight, bias, out_fp32)
    return decode_gemm_reference(x, weight, bias, out_fp32)


@torch.library.custom_op("ocria::decode_gemm_norm", mutates_args=())
def _decode_gemm_norm_op(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float,
                         weight: Tensor) -> tuple[Tensor, Tensor]:
    return decode_gemm_norm_triton(x, residual, norm_weight, eps, weight)


@_decode_gemm_norm_op.register_fake
def _(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor) -> tuple[Tensor, Tensor]:
    return x.new_empty(*x.shape[:-1], weight.shape[0]), torch.empty_like(x, memory_format=torch.contiguous_format)


def decode_gemm_norm(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                     use_kernel: bool | None = None) -> tuple[Tensor, Tensor] | None:
    """``(zero-centred RMSNorm(s) @ weight.T, s)`` with ``s = x + residual`` in one launch, when the kernel
    takes the call (bf16, at most MAX_M rows, N and K multiples of 16; none of ``decode_gemm_norm``,
    ``decode_gemm``, ``rms_norm`` set aside); None otherwise, and the caller runs its norm and its GEMM.

    Args:
        x: [..., K] bf16.
        residual: [..., K] bf16, or None (s = x).
        norm_weight: [K] bf16, the zero-centred norm's weight (``norm(s) * (1 + norm_weight)``).
        eps: the norm's epsilon.
        weight: [N, K] bf16.
        use_kernel: None picks by ``kernel_enabled`` (the kernel on CUDA unless switched off); True / False force
            the kernel / the reference.

    Returns:
        (output [..., N] bf16, s [..., K] bf16), or None.
    """
    fits = (_kernel_takes(x, weight) and x.numel() > 0 and norm_weight.dtype == torch.bfloat16
            and norm_weight.shape == (x.shape[-1],) and weight.shape[1] == x.shape[-1]
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype)))
    if fits and all(kernel_enabled(x.device, use_kernel, name) for name in ("decode_gemm_norm", "decode_gemm",
                                                                             "rms_norm")):
        return torch.ops.ocria.decode_gemm_norm(x, residual, norm_weight, eps, weight)
    return None


@torch.library.custom_op("ocria::decode_gemm_fp8", mutates_args=())
def _decode_gemm_fp8_op(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor,
                        bias: Tensor | None = None, out_fp32: bool = False) -> Tensor:
    return decode_gemm_fp8_triton(q, weight, x_scale, w_scale, bias, out_fp32=out_fp32)


@_decode_gemm_fp8_op.register_fake
def _(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Tensor | None = None,
      out_fp32: bool = False) -> Tensor:
    return q.new_empty(*q.shape[:-1], weight.shape[0], dtype=torch.float32 if out_fp32 else torch.bfloat16)


def decode_gemm_fp8(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Tensor | None = None,
                    use_kernel: bool | None = None, out_fp32: bool = False) -> Tensor | None:
    """The FP8 layer's ``(q * x_scale) @ (weight * w_scale).T`` in one decode-GEMM launch, when the kernel takes
    the call (E4M3 q of at most MAX_M rows or a batch-invariant step, N and K multiples of 16, CUDA,
    ``decode_gemm_fp8`` not in ``OCRIA_DISABLE_KERNELS``); None otherwise, and the caller runs ``_scaled_mm``.

    Args:
        q: [..., K] float8_e4m3fn activations.
        weight: [N, K] float8_e4m3fn.
        x_scale: fp32, per tensor or per row ([..., 1]).
        w_scale: fp32, per tensor or per output column.
        bias: [N] or None.
        use_kernel: None picks by ``kernel_enabled`` (the kernel on CUDA unless switched off); True / False force
            the kernel / the reference.
        out_fp32: return the fp32 sums (logits).

    Returns:
        [..., N] bf16 (float32 with ``out_fp32``), or None.
    """
    if _kernel_takes(q, weight, torch.float8_e4m3fn) and kernel_enabled(q.device, use_kernel, "decode_gemm_fp8"):
        return torch.ops.ocria.decode_gemm_fp8(q, weight, x_scale, w_scale, bias, out_fp32)
    return None
