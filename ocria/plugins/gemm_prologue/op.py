"""``torch.library`` operator ``ocria::prologue_gemm`` and the function the decoder layers call. The function
returns None when the kernel does not take a call (the execution policy does not use ``gemm_prologue``, the GEMM's
kernel or the op's own kernel; more than ``MAX_M`` rows outside a batch-invariant step;
shapes and dtypes it has no code for), and the caller runs the op and its GEMM apart, as before."""

import torch
from torch import Tensor

from ocria.plugins.decode_gemm.kernel import MAX_M
from ocria.plugins.gemm_prologue.kernel import check_call, prologue_config, prologue_gemm_triton
from ocria.plugins.gemm_prologue.reference import Prologue
from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch

OP_KERNELS = {Prologue.SILU_MUL: "silu_quant", Prologue.SIGMOID_GATE: "sigmoid_gate", Prologue.GATED_NORM: "rms_norm"}


@torch.library.custom_op("ocria::prologue_gemm", mutates_args=())
def _prologue_gemm_op(a: Tensor, b: Tensor, weight: Tensor, norm_weight: Tensor | None, eps: float, kind: int,
                      x_mode: str, x_scale: Tensor | None, w_scale: Tensor | None, launch: int) -> Tensor:
    return prologue_gemm_triton(Prologue(kind), a, b, weight, norm_weight, eps, x_mode, x_scale, w_scale,
                                launch=Launch(launch))


@_prologue_gemm_op.register_fake
def _(a: Tensor, b: Tensor, weight: Tensor, norm_weight: Tensor | None, eps: float, kind: int, x_mode: str,
      x_scale: Tensor | None, w_scale: Tensor | None, launch: int) -> Tensor:
    return a.new_empty(*a.shape[:2], weight.shape[0], dtype=torch.bfloat16)


def prologue_gemm(kind: Prologue, a: Tensor, b: Tensor, weight: Tensor, norm_weight: Tensor | None = None,
                  eps: float = 0.0, x_mode: str = "bf16", x_scale: Tensor | None = None, w_scale: Tensor | None = None,
                  policy: ExecutionPolicy = AUTO) -> Tensor | None:
    """A decoder layer's output GEMM with the op before it in one launch (``reference.prologue_gemm_reference``),
    or None when the kernel does not take the call.

    Args:
        kind: the op (``Prologue``: SiLU-multiply, sigmoid gate or gated norm).
        a, b: [B, T, H, D] the op's inputs, one dtype.
        weight: [N, H * D] bf16, or float8_e4m3fn with ``w_scale``.
        norm_weight: [D] (``GATED_NORM`` only).
        eps: the norm's epsilon (``GATED_NORM`` only).
        x_mode: the GEMM input's format: ``bf16``, ``fp8_static`` (with ``x_scale``) or ``fp8_dynamic``.
        x_scale: fp32 per-tensor scale of ``fp8_static``.
        w_scale: fp32 scale of an FP8 weight, per tensor or per row.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        [B, T, N] bf16, or None.
    """
    rows = a.shape[0] * a.shape[1] if a.dim() == 4 else 0
    if rows > MAX_M and not policy.invariant_rows:
        return None
    gemm = "decode_gemm" if x_mode == "bf16" else "decode_gemm_fp8"
    if not all(policy.uses(name, a.device) for name in ("gemm_prologue", gemm, OP_KERNELS[kind])):
        return None
    if weight.dim() != 2 or check_call(kind, a, b, weight, norm_weight, x_mode, x_scale, w_scale,
                                       prologue_config(*weight.shape)) is not None:
        return None
    return torch.ops.ocria.prologue_gemm(a, b, weight, norm_weight, eps, int(kind), x_mode, x_scale, w_scale,
                                         int(policy.launch))
