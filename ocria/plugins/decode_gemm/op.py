"""``torch.library`` operator ``ocria::decode_gemm`` and the function callers use. The execution policy picks the
Triton kernel or the reference (``policy.uses``); what the kernel does not take (more than MAX_M rows outside a
batch-invariant step, as in prefill; other dtypes than bf16, N or K not a multiple of 16) runs the reference
``F.linear``."""

import torch
from torch import Tensor

from ocria.plugins.decode_gemm.kernel import MAX_M, decode_gemm_fp8_triton, decode_gemm_norm_triton, decode_gemm_triton
from ocria.plugins.decode_gemm.reference import decode_gemm_reference
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch


def _kernel_takes(x: Tensor, weight: Tensor, policy: ExecutionPolicy, dtype: torch.dtype = torch.bfloat16) -> bool:
    """The kernel's shapes: x [..., K] of at most MAX_M rows (any number in a batch-invariant step) and weight
    [N, K] in ``dtype`` (bf16, or E4M3 for the FP8 form), N and K multiples of 16."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return ((rows <= MAX_M or policy.invariant_rows) and x.dtype == weight.dtype == dtype and weight.dim() == 2
            and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0)


@torch.library.custom_op("ocria::decode_gemm", mutates_args=())
def _decode_gemm_op(x: Tensor, weight: Tensor, bias: Tensor | None, out_fp32: bool, launch: int) -> Tensor:
    return decode_gemm_triton(x, weight, bias, out_fp32=out_fp32, launch=Launch(launch))


@_decode_gemm_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None, out_fp32: bool, launch: int) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32 if out_fp32 else x.dtype)


def decode_gemm(x: Tensor, weight: Tensor, bias: Tensor | None = None, policy: ExecutionPolicy = AUTO,
                out_fp32: bool = False) -> Tensor:
    """``F.linear(x, weight, bias)`` in one launch whose rows are batch invariant (see ``kernel``), for up to MAX_M
    rows (any number under ``policy.for_steps()``); anything else through the reference.

    Args:
        x: [..., K] bf16.
        weight: [N, K] bf16.
        bias: [N] or None.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.
        out_fp32: return the fp32 sums, not rounded (logits).

    Returns:
        [..., N] in x's dtype, or float32 with ``out_fp32``.
    """
    if _kernel_takes(x, weight, policy) and policy.uses("decode_gemm", x.device):
        return torch.ops.ocria.decode_gemm(x, weight, bias, out_fp32, int(policy.launch))
    return decode_gemm_reference(x, weight, bias, out_fp32)


@torch.library.custom_op("ocria::decode_gemm_norm", mutates_args=())
def _decode_gemm_norm_op(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float,
                         weight: Tensor, launch: int) -> tuple[Tensor, Tensor]:
    return decode_gemm_norm_triton(x, residual, norm_weight, eps, weight, launch=Launch(launch))


@_decode_gemm_norm_op.register_fake
def _(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
      launch: int) -> tuple[Tensor, Tensor]:
    return x.new_empty(*x.shape[:-1], weight.shape[0]), torch.empty_like(x, memory_format=torch.contiguous_format)


def decode_gemm_norm(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                     policy: ExecutionPolicy = AUTO) -> tuple[Tensor, Tensor] | None:
    """``(zero-centred RMSNorm(s) @ weight.T, s)`` with ``s = x + residual`` in one launch, when the kernel
    takes the call (bf16, at most MAX_M rows, N and K multiples of 16; none of ``decode_gemm_norm``,
    ``decode_gemm``, ``rms_norm`` set aside); None otherwise, and the caller runs its norm and its GEMM.

    Args:
        x: [..., K] bf16.
        residual: [..., K] bf16, or None (s = x).
        norm_weight: [K] bf16, the zero-centred norm's weight (``norm(s) * (1 + norm_weight)``).
        eps: the norm's epsilon.
        weight: [N, K] bf16.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        (output [..., N] bf16, s [..., K] bf16), or None.
    """
    fits = (_kernel_takes(x, weight, policy) and x.numel() > 0 and norm_weight.dtype == torch.bfloat16
            and norm_weight.shape == (x.shape[-1],) and weight.shape[1] == x.shape[-1]
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype)))
    if fits and all(policy.uses(name, x.device) for name in ("decode_gemm_norm", "decode_gemm", "rms_norm")):
        return torch.ops.ocria.decode_gemm_norm(x, residual, norm_weight, eps, weight, int(policy.launch))
    return None


@torch.library.custom_op("ocria::decode_gemm_fp8", mutates_args=())
def _decode_gemm_fp8_op(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor,
                        bias: Tensor | None, out_fp32: bool, launch: int) -> Tensor:
    return decode_gemm_fp8_triton(q, weight, x_scale, w_scale, bias, out_fp32=out_fp32, launch=Launch(launch))


@_decode_gemm_fp8_op.register_fake
def _(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Tensor | None,
      out_fp32: bool, launch: int) -> Tensor:
    return q.new_empty(*q.shape[:-1], weight.shape[0], dtype=torch.float32 if out_fp32 else torch.bfloat16)


def decode_gemm_fp8(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Tensor | None = None,
                    policy: ExecutionPolicy = AUTO, out_fp32: bool = False) -> Tensor | None:
    """The FP8 layer's ``(q * x_scale) @ (weight * w_scale).T`` in one decode-GEMM launch, when the kernel takes
    the call (E4M3 q of at most MAX_M rows or a batch-invariant step, N and K multiples of 16, CUDA,
    ``decode_gemm_fp8`` not disabled); None otherwise, and the caller runs ``_scaled_mm``.

    Args:
        q: [..., K] float8_e4m3fn activations.
        weight: [N, K] float8_e4m3fn.
        x_scale: fp32, per tensor or per row ([..., 1]).
        w_scale: fp32, per tensor or per output column.
        bias: [N] or None.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.
        out_fp32: return the fp32 sums (logits).

    Returns:
        [..., N] bf16 (float32 with ``out_fp32``), or None.
    """
    if _kernel_takes(q, weight, policy, torch.float8_e4m3fn) and policy.uses("decode_gemm_fp8", q.device):
        return torch.ops.ocria.decode_gemm_fp8(q, weight, x_scale, w_scale, bias, out_fp32, int(policy.launch))
    return None
