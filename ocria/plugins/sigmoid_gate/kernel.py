"""Triton kernel: the gated attention's output ``o * sigmoid(gate)`` in one launch.

Why: each attention layer of a decode step spent three kernels on it (the strided gate's copy, the sigmoid,
the multiply, in the H200 profile of a batch-1 ``ar`` step). The rounding chain is PyTorch's:
the sigmoid ``1 / (1 + exp(-g))`` in fp32 rounded to the input dtype, then the product rounded once. bf16
travels as int16 bits (exact in the interpreter, which has no bf16 arithmetic).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from ocria.errors import OcriaError
from ocria.plugins.launch import pdl_args, pdl_enter
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import bf16_as_int16, bf16_bits, round_to_dtype, widen


@triton.jit
def _sigmoid_gate_kernel(
    o_ptr, g_ptr, y_ptr, R, H, so_r, so_h, sg_r, sg_h,
    D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr,
    DT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # row = token * H + head
    d = tl.arange(0, BD)
    m = (rows < R)[:, None] & (d < D)[None, :]
    r64 = rows.to(tl.int64)
    tok, head = r64 // H, r64 % H
    o = widen(tl.load(o_ptr + (tok * so_r + head * so_h)[:, None] + d[None, :], mask=m, other=0), IS_BF16)
    g = widen(tl.load(g_ptr + (tok * sg_r + head * sg_h)[:, None] + d[None, :], mask=m, other=0), IS_BF16)
    e = libdevice.exp(-g) if ON_GPU else tl.exp(-g)
    s = round_to_dtype(tl.math.div_rn(tl.full(g.shape, 1.0, tl.float32), 1.0 + e), IS_BF16, ON_GPU, DT)
    y = o * s
    y_ptrs = y_ptr + r64[:, None] * D + d[None, :]
    if IS_BF16:
        tl.store(y_ptrs, bf16_bits(y), mask=m)
    else:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m)


def supports(o: Tensor, gate: Tensor) -> bool:
    """One dtype (bf16, fp16 or fp32), equal shapes [..., H, D], unit stride along D, tokens and heads
    addressable by one stride each (the layouts attention produces)."""
    return (o.dtype == gate.dtype and o.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and o.shape == gate.shape and o.dim() >= 2 and o.stride(-1) == 1 and gate.stride(-1) == 1)


def _rows(t: Tensor) -> tuple[Tensor, int, int]:
    """t [..., H, D] as [tokens, H, D] with its token and head strides (a copy only when the leading dims
    do not flatten into one stride)."""
    t3 = t.reshape(-1, t.shape[-2], t.shape[-1])
    return t3, t3.stride(0), t3.stride(1)


def sigmoid_gate_triton(o: Tensor, gate: Tensor, launch: Launch = DEFAULT_LAUNCH) -> Tensor:
    """``sigmoid_gate_reference`` in one launch."""
    if not supports(o, gate):
        raise OcriaError(f"sigmoid_gate kernel: o {tuple(o.shape)} {o.dtype}, gate {tuple(gate.shape)} "
                         f"{gate.dtype}: needs one float dtype, equal shapes [..., H, D], unit stride along D")
    H, D = o.shape[-2:]
    (o3, so_r, so_h), (g3, sg_r, sg_h) = _rows(o), _rows(gate)
    R = o3.shape[0] * H
    y = torch.empty(*o.shape[:-2], H * D, dtype=o.dtype, device=o.device)
    if R == 0:
        return y
    BD = triton.next_power_of_2(D)
    rows = max(1, min(16, 2048 // BD))
    is_bf16 = o.dtype == torch.bfloat16
    _sigmoid_gate_kernel[(triton.cdiv(R, rows),)](
        *(bf16_as_int16(t) for t in (o3, g3, y)), R, H, so_r, so_h, sg_r, sg_h,
        D=D, BD=BD, ROWS=rows, IS_BF16=is_bf16, ON_GPU=o.device.type == "cuda",
        DT=tl.float16 if o.dtype == torch.float16 else tl.float32, **pdl_args(o.device, launch),
    )  # fmt: skip
    return y
