"""Triton kernel: a decoder layer's output GEMM with the elementwise op before it (``reference.Prologue``) computed in
its K loop, so the op's output never goes through memory and the op costs no launch of its own.

Why: a decode step ran the op as a kernel of its own before each of these GEMMs (the MLP's SiLU-multiply before
``down_proj``, the attention's sigmoid gate before ``o_proj``, the GDN's gated norm before ``out_proj``): one launch
per decoder layer each, in a step whose non-GEMM kernels and the gaps between kernels took about 0.77 ms of its ~1.8 ms
(the H200 profile of ocria-1-sim's batch-1 ``ar`` step).

The GEMM is the decode GEMM's (``ocria.plugins.decode_gemm.kernel``): 16-row tiles (up to ``MAX_ROW_TILES`` per
program beyond 16 rows), a configuration of the weight's shape only (``prologue_config``: never of M, so rows stay
batch invariant), split-K reduced in the launch, the product on the tensor cores. Where it loads an x tile, this kernel
loads the op's two input tiles (a, b [B, T, H, D] read through their strides: views of fused GEMM outputs and
transposed attention outputs are read in place) and computes the op with the standalone kernels' rounding chains:
``silu_quant``'s bf16 silu-multiply, ``sigmoid_gate``'s ``o * bf16(1 / (1 + exp(-g)))``, and the gated RMSNorm of
``rms_norm`` per head of D channels (K tiles hold whole heads; the head's sum of squares is reduced inside the
tile). For an FP8 weight the op's output is quantized in the same place to E4M3 bytes (``fp8_codes.e4m3_bytes``,
ModelOpt's bytes) with the layer's static scale, or with per-token scales from a first pass over the row's K (each
program recomputes the row's amax: the op is cheap next to the weights it streams), and the epilogue applies
``acc * x_scale * w_scale`` as the FP8 decode GEMM does. bf16 travels as int16 bits into the op (exact in the
interpreter, which has no bf16 arithmetic), E4M3 as bytes.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.decode_gemm.kernel import (
    _epilogue,
    _mma,
    default_config,
    launch_plan,
    zero_accumulator,
)
from ocria.plugins.fp8_codes import abs_max, e4m3_bytes, max_nan, scale_of
from ocria.plugins.gemm_prologue.reference import Prologue
from ocria.plugins.launch import pdl_args, pdl_enter
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import bf16_as_int16, round_to_dtype, widen, widen_e4m3
from ocria.plugins.silu_quant.kernel import _activation_of
from ocria.plugins.splitk import sum_splits

X_MODES = {"bf16": 0, "fp8_static": 1, "fp8_dynamic": 2}


def prologue_config(N: int, K: int) -> dict:
    """``default_config`` of the weight [N, K] with K tiles of at most 128 and 8 warps: the op's two input tiles and
    its fp32 intermediates sit beside the GEMM's. Compiled for sm_90a (Triton's ptxas) at ocria-1-sim's shapes, the
    decode GEMM's 256-wide K tiles at 4 warps took 213-255 registers and spilled up to 1.5 KB with 4 row tiles; these
    take 59-255 and spill nothing in any variant."""
    config = default_config(N, K)
    return dict(config, block_k=min(config["block_k"], 128), num_warps=8)


@triton.jit
def _op(a, b, nw_ptr, d, mk, eps, PRO: tl.constexpr, ON_GPU: tl.constexpr, D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The op on tiles a, b [BLOCK_M, BLOCK_K] of bf16 bits (``d``: each column's channel in its head): fp32 values
    of the bf16 numbers the standalone kernel writes. One return: Triton compiles the code after a pruned branch's
    return, and the norm's reshape does not exist for the other ops' D."""
    if PRO == 1:  # silu(gate) * up, silu_quant's chain (the GPU's bf16x2 silu)
        h = _activation_of(a, b, True, True, ON_GPU, True, tl.float32)
    elif PRO == 2:  # o * sigmoid(gate), sigmoid_gate's chain
        x = widen(a, True)
        y = widen(b, True)
        e = libdevice.exp(-y) if ON_GPU else tl.exp(-y)
        s = round_to_dtype(tl.math.div_rn(tl.full(y.shape, 1.0, tl.float32), 1.0 + e), True, ON_GPU, tl.float32)
        h = round_to_dtype(x * s, True, ON_GPU, tl.float32)
    else:  # w * norm(o) * silu(z) per head of D channels, rms_norm's plain gated chain
        x = widen(a, True)
        y = widen(b, True)
        x3 = tl.reshape(x, [BLOCK_M, BLOCK_K // D, D])
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x3 * x3, 2) / D + eps)
        normed = tl.reshape(round_to_dtype(x3 * rstd[:, :, None], True, ON_GPU, tl.float32), [BLOCK_M, BLOCK_K])
        w = widen(tl.load(nw_ptr + d, mask=mk, other=0), True)
        g = round_to_dtype(normed * w[None, :], True, ON_GPU, tl.float32)
        e = libdevice.exp(-y) if ON_GPU else tl.exp(-y)
        h = round_to_dtype(g * tl.math.div_rn(y, 1.0 + e), True, ON_GPU, tl.float32)
    return h


@triton.jit
def _tile(ptr, rows, k, mask, T, s_b, s_t, s_h, D: tl.constexpr):
    """Rows ``rows`` (token b * T + t) and columns ``k`` (head k // D, channel k % D) of a [B, T, H, D] view."""
    r = rows.to(tl.int64)
    offs = ((r // T) * s_b + (r % T) * s_t)[:, None] + ((k // D).to(tl.int64) * s_h + k % D)[None, :]
    return tl.load(ptr + offs, mask=mask, other=0)


@triton.jit
def _op_tile(a_ptr, b_ptr, nw_ptr, rows, k, mk, M, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps,
             PRO: tl.constexpr, ON_GPU: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The op's output at rows x columns ``k`` (zeros past M and K)."""
    mask = (rows < M)[:, None] & mk[None, :]
    a = _tile(a_ptr, rows, k, mask, T, sa_b, sa_t, sa_h, D)
    b = _tile(b_ptr, rows, k, mask, T, sb_b, sb_t, sb_h, D)
    return _op(a, b, nw_ptr, k % D, mk, eps, PRO, ON_GPU, D, BLOCK_M, BLOCK_K)


@triton.jit
def _operand(a_ptr, b_ptr, nw_ptr, rows, k, mk, M, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps, x_scale,
             PRO: tl.constexpr, XQ: tl.constexpr, ON_GPU: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """The MMA's x operand: the op's output in bf16, or its E4M3 bytes under the rows' scales ``x_scale``."""
    h = _op_tile(a_ptr, b_ptr, nw_ptr, rows, k, mk, M, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps, PRO, ON_GPU, D,
                 BLOCK_M, BLOCK_K)
    # One return: Triton's code generator refuses a helper whose returns differ in type, pruned branches included.
    if XQ == 0:
        if ON_GPU:
            x = h.to(tl.bfloat16)
        else:
            x = h
    else:
        codes = e4m3_bytes(h, x_scale, ON_GPU)
        if ON_GPU:
            x = codes.to(tl.float8e4nv, bitcast=True)
        else:
            x = widen_e4m3(codes)
    return x


@triton.jit
def _row_scales(a_ptr, b_ptr, nw_ptr, rows, M, K, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps,
                PRO: tl.constexpr, ON_GPU: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """Per-token FP8 scales of the op's output rows: ``amax / 448`` over the whole row (ModelOpt's guard for
    all-zero rows), NaN for a row with a NaN."""
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < K
        h = _op_tile(a_ptr, b_ptr, nw_ptr, rows, k, mk, M, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps, PRO, ON_GPU, D,
                     BLOCK_M, BLOCK_K)
        amax = max_nan(amax, abs_max(tl.where((rows < M)[:, None] & mk[None, :], h, 0.0), 1))
    return scale_of(amax)


@triton.jit
def _store(acc, sx, sw_ptr, o_ptr, rows, cols, mrow, mcol, stride_om, XQ: tl.constexpr, AS_BITS: tl.constexpr,
           SW_COLS: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] (FP8: times the rows' scales ``sx``, then the weight scales, the FP8 decode GEMM's
    order) rounded once to bf16."""
    if XQ > 0:
        sw = tl.load(sw_ptr + cols, mask=mcol, other=0) if SW_COLS else tl.load(sw_ptr + cols * 0)
        acc = acc * sx[:, None] * sw[None, :]
    _epilogue(acc, o_ptr, o_ptr, o_ptr, o_ptr, rows, cols, mrow, mcol, stride_om, HAS_BIAS=False, AS_BITS=AS_BITS,
              OUT_F32=False, FP8=False, SX_ROWS=False, SW_COLS=False)


@triton.jit
def _finish(acc, sx, rows, cols, mcol, tile, split, M, o_ptr, ws_ptr, count_ptr, sw_ptr, stride_om,
            XQ: tl.constexpr, SWAP: tl.constexpr, AS_BITS: tl.constexpr, SPLIT_K: tl.constexpr,
            SW_COLS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One row tile's accumulator to the output, with split-K through the workspace (the tile's last program)."""
    if SWAP:
        acc = tl.trans(acc)
    mrow = rows < M
    if SPLIT_K == 1:
        _store(acc, sx, sw_ptr, o_ptr, rows, cols, mrow, mcol, stride_om, XQ, AS_BITS, SW_COLS)
    else:
        last, total = sum_splits(acc, ws_ptr, count_ptr, tile, split, SPLIT_K, BLOCK_M, BLOCK_N)
        if last:
            _store(total, sx, sw_ptr, o_ptr, rows, cols, mrow, mcol, stride_om, XQ, AS_BITS, SW_COLS)


@triton.jit(do_not_specialize=["M"])  # M = 1 runs the binary M = 16 runs: the same code for every row count
def _prologue_gemm_kernel(
    a_ptr, b_ptr, nw_ptr, w_ptr, o_ptr, ws_ptr, count_ptr, sx_ptr, sw_ptr, eps,
    M, N, K, K_SPLIT, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, stride_wn, stride_om,
    PRO: tl.constexpr, XQ: tl.constexpr, D: tl.constexpr, SW_COLS: tl.constexpr, ON_GPU: tl.constexpr,
    SWAP: tl.constexpr, SPLIT_K: tl.constexpr, ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    AS_BITS: tl.constexpr = not ON_GPU
    pdl_enter(PDL)
    group = tl.program_id(0)
    split = tl.program_id(1)
    pid = tl.program_id(2)
    rows = group * (ROW_TILES * BLOCK_M) + tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mcol = cols < N
    w_base = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    acc = zero_accumulator(SWAP, BLOCK_M, BLOCK_N)
    acc1, acc2, acc3 = acc, acc, acc  # the further row tiles' (ROW_TILES 2 and 4)
    if XQ == 2:  # per-token scales need the whole row first (one row tile per program)
        sx = _row_scales(a_ptr, b_ptr, nw_ptr, rows, M, K, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps, PRO, ON_GPU, D,
                         BLOCK_M, BLOCK_K)
    else:
        sx = tl.zeros([BLOCK_M], dtype=tl.float32) + (tl.load(sx_ptr) if XQ == 1 else 1.0)
    k_end = tl.minimum(K, (split + 1) * K_SPLIT)
    for k0 in range(split * K_SPLIT, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < k_end
        zero = 0.0 if XQ > 0 and ON_GPU else 0  # float8 takes no integer fill
        w = tl.load(w_base + k[None, :], mask=mcol[:, None] & mk[None, :], other=zero)
        if AS_BITS:
            if XQ > 0:
                w = widen_e4m3(w)
            else:
                w = widen(w, True)
        acc = _mma(acc, _operand(a_ptr, b_ptr, nw_ptr, rows, k, mk, M, T, sa_b, sa_t, sa_h, sb_b, sb_t, sb_h, eps, sx,
                                 PRO, XQ, ON_GPU, D, BLOCK_M, BLOCK_K), w, SWAP, AS_BITS)
        if ROW_TILES > 1:
            acc1 = _mma(acc1, _operand(a_ptr, b_ptr, nw_ptr, rows + BLOCK_M, k, mk, M, T, sa_b, sa_t, sa_h, sb_b, sb_t,
                                       sb_h, eps, sx, PRO, XQ, ON_GPU, D, BLOCK_M, BLOCK_K), w, SWAP, AS_BITS)
        if ROW_TILES > 2:
            acc2 = _mma(acc2, _operand(a_ptr, b_ptr, nw_ptr, rows + 2 * BLOCK_M, k, mk, M, T, sa_b, sa_t, sa_h, sb_b,
                                       sb_t, sb_h, eps, sx, PRO, XQ, ON_GPU, D, BLOCK_M, BLOCK_K), w, SWAP, AS_BITS)
            acc3 = _mma(acc3, _operand(a_ptr, b_ptr, nw_ptr, rows + 3 * BLOCK_M, k, mk, M, T, sa_b, sa_t, sa_h, sb_b,
                                       sb_t, sb_h, eps, sx, PRO, XQ, ON_GPU, D, BLOCK_M, BLOCK_K), w, SWAP, AS_BITS)
    tile = (pid * tl.num_programs(0) + group) * ROW_TILES  # split-K workspace slot of the first row tile
    for r in tl.static_range(ROW_TILES):  # one epilogue per row tile (the loop is unrolled: r is a constant)
        acc_r = acc if r == 0 else acc1 if r == 1 else acc2 if r == 2 else acc3
        _finish(acc_r, sx, rows + r * BLOCK_M, cols, mcol, tile + r, split, M, o_ptr, ws_ptr, count_ptr, sw_ptr,
                stride_om, XQ, SWAP, AS_BITS, SPLIT_K, SW_COLS, BLOCK_M, BLOCK_N)


def check_call(kind: Prologue, a: Tensor, b: Tensor, weight: Tensor, norm_weight: Tensor | None, x_mode: str,
               x_scale: Tensor | None, w_scale: Tensor | None, config: dict) -> str | None:
    """Why the kernel cannot take this call (one line), or None when it can."""
    fp8 = x_mode != "bf16"
    if x_mode not in X_MODES:
        return f"x_mode {x_mode!r}: one of {', '.join(X_MODES)}"
    if a.dim() != 4 or a.shape != b.shape or a.stride(-1) != 1 or b.stride(-1) != 1:
        return f"a {tuple(a.shape)} and b {tuple(b.shape)}: one shape [B, T, H, D], unit stride along D"
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        return f"a and b must be bf16, got {a.dtype} and {b.dtype}"
    H, D = a.shape[2:]
    if weight.dim() != 2 or weight.shape[1] != H * D or weight.shape[0] % 16 or weight.shape[1] % 16:
        return f"weight {tuple(weight.shape)}: [N, K = H * D = {H * D}], N and K multiples of 16"
    if weight.dtype != (torch.float8_e4m3fn if fp8 else torch.bfloat16):
        return f"x_mode {x_mode} needs a {'float8_e4m3fn' if fp8 else 'bf16'} weight, got {weight.dtype}"
    if fp8 and (w_scale is None or w_scale.numel() not in (1, weight.shape[0])):
        return f"an FP8 weight needs a w_scale of 1 or {weight.shape[0]} values"
    if (x_mode == "fp8_static") != (x_scale is not None and x_scale.numel() == 1):
        return f"x_mode {x_mode} with x_scale {None if x_scale is None else tuple(x_scale.shape)}"
    if kind == Prologue.GATED_NORM:
        if D & (D - 1) or config["block_k"] % D:
            return f"gated norm heads of {D}: a power of two dividing the K tile ({config['block_k']})"
        if norm_weight is None or norm_weight.shape != (D,) or norm_weight.dtype != torch.bfloat16:
            return f"gated norm weight must be bf16 [{D}]"
    return None


def prologue_gemm_triton(kind: Prologue, a: Tensor, b: Tensor, weight: Tensor, norm_weight: Tensor | None = None,
                         eps: float = 0.0, x_mode: str = "bf16", x_scale: Tensor | None = None,
                         w_scale: Tensor | None = None, config: dict | None = None,
                         launch: Launch = DEFAULT_LAUNCH) -> Tensor:
    """``reference.prologue_gemm_reference`` in one launch.

    Args:
        kind: the op before the GEMM.
        a, b: [B, T, H, D] bf16 inputs of the op (views with unit stride along D).
        weight: [N, H * D], bf16 (``x_mode`` bf16) or float8 E4M3 (``fp8_static`` / ``fp8_dynamic``).
        norm_weight, eps: the gated norm's weight [D] (bf16) and epsilon.
        x_scale: the static FP8 input scale (fp32 scalar), ``fp8_static`` only.
        w_scale: the FP8 weight's scales, fp32 scalar or [N].
        config: keys of ``decode_gemm.kernel.default_config`` (default: ``prologue_config`` of the weight's shape).
    Returns:
        [B, T, N] bf16.
    """
    cfg = config or prologue_config(*weight.shape)
    why = check_call(kind, a, b, weight, norm_weight, x_mode, x_scale, w_scale, cfg)
    if why is not None:
        raise OcriaError(f"prologue_gemm kernel: {why}")
    if a.device.type != "cuda" and not isinstance(_prologue_gemm_kernel, InterpretedFunction):
        raise OcriaError("prologue_gemm kernel on CPU needs TRITON_INTERPRET=1 set before triton is imported")
    B, T, H, D = a.shape
    N, K = weight.shape
    M = B * T
    out = torch.empty(B, T, N, dtype=torch.bfloat16, device=a.device)
    if M == 0 or N == 0:
        return out
    mode = X_MODES[x_mode]
    # per-token scales (mode 2) are computed for one row tile
    split_k, tiles, block_m, row_tiles, groups, stages, k_split, ws, count = launch_plan(M, N, K, cfg, mode == 2, out)
    on_gpu = a.device.type == "cuda"
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    w_arg = weight if on_gpu else (weight.view(torch.uint8) if mode else bf16_as_int16(weight))
    sx = x_scale.float().reshape(1).contiguous() if mode == 1 else out
    sw = w_scale.float().reshape(-1).contiguous() if mode else out
    nw = bf16_as_int16(norm_weight.contiguous()) if norm_weight is not None else out
    _prologue_gemm_kernel[(groups, split_k, tiles)](
        bf16_as_int16(a), bf16_as_int16(b), nw, w_arg, out if on_gpu else bf16_as_int16(out), ws, count, sx, sw, eps,
        M, N, K, k_split, T, *a.stride()[:3], *b.stride()[:3], weight.stride(0), N,
        PRO=int(kind), XQ=mode, D=D, SW_COLS=mode > 0 and sw.numel() > 1, ON_GPU=on_gpu, SWAP=cfg["swap"],
        SPLIT_K=split_k, ROW_TILES=row_tiles, BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
        num_warps=cfg["num_warps"], num_stages=stages, **pdl_args(a.device, launch),
    )  # fmt: skip
    return out
