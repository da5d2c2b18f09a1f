"""Triton kernel for the decode GEMM ``x [M, K] @ weight[N, K].T`` with M <= 16 (a decode step of
up to 16 rows, or a speculative verify block): one launch, split-K optional and reduced in that launch.

Why: at M = 1 cuBLAS picks split-K GEMV kernels plus a separate reduce kernel, and the pair streams
the weights well below the copy bandwidth (the H200 profile of a batch-1 ``ar`` step). Here each
program owns BLOCK_N output columns for all rows and streams its [BLOCK_N, K] weight slab once, in
[BLOCK_N, BLOCK_K] tiles contiguous along K (16-byte vector loads, pipelined ``num_stages`` deep), while
the x tile [16, BLOCK_K] comes from L2. The product runs on the tensor cores (``tl.dot`` with the row
dimension padded to 16): at M = 16 the CUDA cores would need 16 FMAs per weight element, more than
they issue at HBM speed. ``SWAP`` computes the transposed product ``weight_tile @ x_tile.T`` so the
weight tile is the MMA's A operand (the skinny-GEMM "swap AB" form).

Split-K (``split_k`` S > 1) is for narrow outputs, where N / BLOCK_N programs are too few to keep the
memory system busy: S programs per column tile each stream K / S of the slab, reduced in the same launch
(``ocria.plugins.splitk``).

Norm prologue (``decode_gemm_norm_triton``): the decoder's ``s = x + residual; norm(s) @ W.T`` in the same
launch, which saves the RMSNorm kernel before every input projection. ``norm(s) = s * rstd * (1 + w)``
with rstd a per-row scalar, so the K loop feeds ``bf16(s * (1 + w))`` to the MMA, accumulates s^2 lane by
lane from the same tiles (summed across lanes once, after the loop: a row sum per K tile put barriers and
shuffles into every iteration), and scales the accumulator by rstd at the end. The product differs from the
separate norm's (which rounds ``s * rstd * (1 + w)`` to bf16) by the placement of one rounding. Program 0
also writes s, the residual stream. No split-K here: each program needs the whole row for rstd.

FP8 (``decode_gemm_fp8_triton``): x and the weight as float8 E4M3 bytes, the MMA on them (exact products,
fp32 sums), and the epilogue multiplies by the activation scale (per tensor or per row) and the weight scale
(per tensor or per column) before its one bf16 rounding: ``_scaled_mm``'s math at decode shapes, where
cuBLAS's FP8 kernels take 128-row tiles (seen in the H200 profile of the mixed recipe's step). The interpreter decodes
the bytes to fp32 exactly and multiplies in fp32.

Batch invariance: the row tile is always 16 rows (padded, masked) and the configuration depends on
(N, K) only, never on M, so every row runs the same instruction sequence and the same reduction order
over K, and an MMA computes each output element from its own row alone. Row m's output is therefore
bit-identical whether it is decoded alone (M = 1) or inside a 16-row verify block, whatever the other
rows hold. More than 16 rows (the op sends them here under ``policy.for_steps()``: verify blocks of
several sequences; elsewhere, as in prefill, cuBLAS is faster) run as 16-row tiles, up to ``MAX_ROW_TILES`` per
program: each weight tile it loads feeds one MMA of the 16-row shape per row tile, the instruction a 16-row call
runs, so a row keeps its bits, and the weights are read once per four row tiles instead of once per tile. One
wide MMA over 64 or 128 rows reads them less often still, and gave the same bits for every bf16 shape of
ocria-1-sim on the H200, but not for an FP8 one: not taken.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.launch import pdl_args, pdl_enter, prefetch_l2
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import bf16_as_int16, bf16_bits, round_to_dtype, widen, widen_e4m3
from ocria.plugins.splitk import scratch, sum_splits

MAX_M = 16  # rows one launch takes: the MMA's smallest row tile
BLOCK_M = 16
MAX_ROW_TILES = 4  # 16-row tiles one program computes from each weight tile it loads (more than 16 rows)
PREFETCH_LINES = 8  # with PDL: 128-byte lines per weight row (1 KiB of K) sent to L2 before the wait


@triton.jit
def zero_accumulator(SWAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A row tile's fp32 accumulator: [BLOCK_N, BLOCK_M] when SWAP (the weight tile is the MMA's left operand),
    else [BLOCK_M, BLOCK_N]."""
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    return acc


@triton.jit
def _epilogue(acc, b_ptr, o_ptr, sx_ptr, sw_ptr, rows, cols, mrow, mcol, stride_om, HAS_BIAS: tl.constexpr,
              AS_BITS: tl.constexpr, OUT_F32: tl.constexpr, FP8: tl.constexpr, SX_ROWS: tl.constexpr,
              SW_COLS: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] fp32 (FP8: times the activation and weight scales) (+ bias) stored in fp32
    (OUT_F32) or rounded once to bf16."""
    if FP8:
        sx = tl.load(sx_ptr + rows, mask=mrow, other=0) if SX_ROWS else tl.load(sx_ptr + rows * 0)
        sw = tl.load(sw_ptr + cols, mask=mcol, other=0) if SW_COLS else tl.load(sw_ptr + cols * 0)
        acc = acc * sx[:, None] * sw[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=mcol, other=0)
        if AS_BITS:
            acc = acc + widen(bias, True)[None, :]
        else:
            acc = acc + bias.to(tl.float32)[None, :]
    o_ptrs = o_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    if OUT_F32:
        tl.store(o_ptrs, acc, mask=mrow[:, None] & mcol[None, :])
    elif AS_BITS:
        tl.store(o_ptrs, bf16_bits(acc), mask=mrow[:, None] & mcol[None, :])
    else:
        tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mrow[:, None] & mcol[None, :])


@triton.jit
def _mma(acc, x, w, SWAP: tl.constexpr, AS_BITS: tl.constexpr):
    """``acc + x @ w.T`` on the tensor cores; SWAP computes it as ``w @ x.T`` (the weight tile as the A operand).
    The interpreter has no bf16 arithmetic: its operands come widened to fp32 and multiply in IEEE fp32."""
    if AS_BITS:
        if SWAP:
            out = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
        else:
            out = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        if SWAP:
            out = tl.dot(w, tl.trans(x), acc)
        else:
            out = tl.dot(x, tl.trans(w), acc)
    return out


@triton.jit
def _x_tile(x_ptr, rows, k, mk, M, stride_xm, FP8: tl.constexpr, AS_BITS: tl.constexpr):
    """Rows ``rows`` of x at columns ``k`` as the MMA takes them (zeros past M or K)."""
    zero = 0.0 if FP8 and not AS_BITS else 0  # float8 takes no integer fill
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + k[None, :], mask=(rows < M)[:, None] & mk[None, :],
                other=zero)
    if AS_BITS:
        if FP8:
            x = widen_e4m3(x)
        else:
            x = widen(x, True)
    return x


@triton.jit
def _finish(acc, sumsq, rows, cols, mcol, tile, split, M, K, eps, b_ptr, o_ptr, ws_ptr, count_ptr, sx_ptr, sw_ptr,
            stride_om, HAS_BIAS: tl.constexpr, SWAP: tl.constexpr, AS_BITS: tl.constexpr, SPLIT_K: tl.constexpr,
            NORM: tl.constexpr, OUT_F32: tl.constexpr, FP8: tl.constexpr, SX_ROWS: tl.constexpr,
            SW_COLS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """One row tile's accumulator to the output: norm scale, then the epilogue, or with split-K the partial to the
    workspace [tiles, SPLIT_K, BLOCK_M, BLOCK_N] and the epilogue by the tile's last program."""
    if SWAP:
        acc = tl.trans(acc)
    if NORM:
        acc = acc * (1.0 / tl.sqrt_rn(tl.sum(sumsq, 1) / K + eps))[:, None]
    mrow = rows < M
    if SPLIT_K == 1:
        _epilogue(acc, b_ptr, o_ptr, sx_ptr, sw_ptr, rows, cols, mrow, mcol, stride_om, HAS_BIAS, AS_BITS, OUT_F32,
                  FP8, SX_ROWS, SW_COLS)
    else:
        last, total = sum_splits(acc, ws_ptr, count_ptr, tile, split, SPLIT_K, BLOCK_M, BLOCK_N)
        if last:
            _epilogue(total, b_ptr, o_ptr, sx_ptr, sw_ptr, rows, cols, mrow, mcol, stride_om, HAS_BIAS, AS_BITS,
                      OUT_F32, FP8, SX_ROWS, SW_COLS)


@triton.jit(do_not_specialize=["M"])  # M = 1 runs the binary M = 16 runs: the same code for every row count
def _decode_gemm_kernel(
    x_ptr, w_ptr, b_ptr, o_ptr, ws_ptr, count_ptr, r_ptr, nw_ptr, s_ptr, sx_ptr, sw_ptr, eps,
    M, N, K, K_SPLIT, stride_xm, stride_wn, stride_om, stride_rm,
    HAS_BIAS: tl.constexpr, SWAP: tl.constexpr, AS_BITS: tl.constexpr, SPLIT_K: tl.constexpr,
    NORM: tl.constexpr, RESIDUAL: tl.constexpr, OUT_F32: tl.constexpr,
    FP8: tl.constexpr, SX_ROWS: tl.constexpr, SW_COLS: tl.constexpr, ROW_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, PF_LINES: tl.constexpr,
):  # fmt: skip
    ON_GPU: tl.constexpr = not AS_BITS
    # More than 16 rows (batch-invariant steps): each program takes ROW_TILES 16-row tiles and feeds every weight
    # tile it loads to each of them, one MMA of the 16-row shape per tile; row groups vary fastest in the grid,
    # so the programs that share a weight slab run side by side and read it from L2 after the first.
    group = tl.program_id(0)
    split = tl.program_id(1)
    pid = tl.program_id(2)
    rows = group * (ROW_TILES * BLOCK_M) + tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    if PDL:  # no kernel writes the weights: pull this program's first K lines toward L2 while the one before drains
        pf_k = tl.minimum(split * K_SPLIT + tl.arange(0, PF_LINES) * 64, K - 1)  # one address per 128-byte line
        prefetch_l2(w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * stride_wn + pf_k[None, :])
    pdl_enter(PDL)
    mrow = rows < M
    mcol = cols < N
    w_base = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    acc = zero_accumulator(SWAP, BLOCK_M, BLOCK_N)
    acc1, acc2, acc3 = acc, acc, acc  # the further row tiles' (ROW_TILES 2 and 4)
    sumsq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # NORM: lane sums, reduced once after the loop
    k_end = tl.minimum(K, (split + 1) * K_SPLIT)
    for k0 in range(split * K_SPLIT, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < k_end
        zero = 0.0 if FP8 and not AS_BITS else 0  # float8 takes no integer fill
        w = tl.load(w_base + k[None, :], mask=mcol[:, None] & mk[None, :], other=zero)
        if AS_BITS:
            if FP8:
                w = widen_e4m3(w)
            else:
                w = widen(w, True)
        if NORM:  # s = x (+ residual) in bf16; the MMA gets bf16(s * (1 + w_norm)); sum(s^2) for rstd
            mx = mrow[:, None] & mk[None, :]
            x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + k[None, :], mask=mx, other=0)
            s = widen(x, True) if AS_BITS else x.to(tl.float32)
            if RESIDUAL:
                r = tl.load(r_ptr + rows.to(tl.int64)[:, None] * stride_rm + k[None, :], mask=mx, other=0)
                s = round_to_dtype(s + (widen(r, True) if AS_BITS else r.to(tl.float32)), True, ON_GPU, tl.bfloat16)
            s_ptrs = s_ptr + rows.to(tl.int64)[:, None] * K + k[None, :]
            first = (tl.zeros([BLOCK_M], dtype=tl.int32) + pid) == 0  # program 0 writes s
            tl.store(s_ptrs, bf16_bits(s) if AS_BITS else s.to(tl.bfloat16), mask=mx & first[:, None])
            sumsq += s * s
            nw = tl.load(nw_ptr + k, mask=mk, other=0)
            x = round_to_dtype(s * (1.0 + (widen(nw, True) if AS_BITS else nw.to(tl.float32)))[None, :], True,
                               ON_GPU, tl.bfloat16)
            if not AS_BITS:
                x = x.to(tl.bfloat16)
            acc = _mma(acc, x, w, SWAP, AS_BITS)
        else:
            acc = _mma(acc, _x_tile(x_ptr, rows, k, mk, M, stride_xm, FP8, AS_BITS), w, SWAP, AS_BITS)
            if ROW_TILES > 1:
                acc1 = _mma(acc1, _x_tile(x_ptr, rows + BLOCK_M, k, mk, M, stride_xm, FP8, AS_BITS), w, SWAP, AS_BITS)
            if ROW_TILES > 2:
                acc2 = _mma(acc2, _x_tile(x_ptr, rows + 2 * BLOCK_M, k, mk, M, stride_xm, FP8, AS_BITS), w, SWAP,
                            AS_BITS)
                acc3 = _mma(acc3, _x_tile(x_ptr, rows + 3 * BLOCK_M, k, mk, M, stride_xm, FP8, AS_BITS), w, SWAP,
                            AS_BITS)
    tile = (pid * tl.num_programs(0) + group) * ROW_TILES  # split-K workspace slot of the first row tile
    for r in tl.static_range(ROW_TILES):  # one epilogue per row tile (the loop is unrolled: r is a constant)
        acc_r = acc if r == 0 else acc1 if r == 1 else acc2 if r == 2 else acc3
        _finish(acc_r, sumsq, rows + r * BLOCK_M, cols, mcol, tile + r, split, M, K, eps, b_ptr, o_ptr, ws_ptr,
                count_ptr, sx_ptr, sw_ptr, stride_om, HAS_BIAS=HAS_BIAS, SWAP=SWAP, AS_BITS=AS_BITS, SPLIT_K=SPLIT_K,
                NORM=NORM, OUT_F32=OUT_F32, FP8=FP8, SX_ROWS=SX_ROWS, SW_COLS=SW_COLS, BLOCK_M=BLOCK_M,
                BLOCK_N=BLOCK_N)  # fmt: skip


def default_config(N: int, K: int) -> dict:
    """Columns per program, K tile, warps, pipeline depth, operand order and split-K for a weight [N, K].
    A function of the weight's shape only (never of M): that is what keeps rows batch invariant.
    Narrow outputs (N <= 4096) have too few column tiles to keep HBM busy: with a long K they split it
    four ways, with a short one they take 16-column programs. Each branch is the fastest configuration
    of a sweep on the H200 (``python -m bench.ops.run --op decode_gemm``) for the ocria-1-sim weights of its class,
    best over every M (gdn_out_proj and mlp_down, attn_o_proj, and the wide in-projections with the LM head)."""
    if N <= 4096 and K >= 4096:
        return {"block_n": 32, "block_k": 256, "num_warps": 4, "num_stages": 4, "swap": True, "split_k": 4}
    if N <= 4096:
        return {"block_n": 16, "block_k": 256, "num_warps": 4, "num_stages": 4, "swap": False, "split_k": 1}
    return {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "swap": True, "split_k": 1}


def _kernel_for(device: torch.device):
    """The compiled kernel on CUDA; on CPU the interpreter, which Triton only builds when
    ``TRITON_INTERPRET=1`` was set before ``triton`` itself was imported."""
    if device.type != "cuda" and not isinstance(_decode_gemm_kernel, InterpretedFunction):
        raise OcriaError("decode_gemm kernel on CPU needs TRITON_INTERPRET=1 set before triton is imported")
    return _decode_gemm_kernel


def check_shapes(x: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype = torch.bfloat16) -> None:
    """The kernel's contract, as one-line errors: x [..., K] (any row count) and weight [N, K] in
    ``dtype`` (bf16, or float8 E4M3 for the FP8 form), K and N multiples of 16, optional bf16 bias [N]."""
    if x.dtype != dtype or weight.dtype != dtype or (bias is not None and bias.dtype != torch.bfloat16):
        only = "bf16 only" if dtype == torch.bfloat16 else f"{dtype} x and weight, bf16 bias"
        raise OcriaError(f"decode_gemm kernel: {only}, got x {x.dtype}, weight {weight.dtype}"
                         + (f", bias {bias.dtype}" if bias is not None else ""))
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise OcriaError(f"decode_gemm kernel: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not chain "
                         "(weight [N, K], x [..., K])")
    N, K = weight.shape
    if K % 16 or N % 16:
        raise OcriaError(f"decode_gemm kernel: weight [N={N}, K={K}]: N and K must be multiples of 16")
    if bias is not None and tuple(bias.shape) != (N,):
        raise OcriaError(f"decode_gemm kernel: bias {tuple(bias.shape)}, expected ({N},)")


def decode_gemm_triton(x: Tensor, weight: Tensor, bias: Tensor | None = None, config: dict | None = None,
                       out_fp32: bool = False, launch: Launch = DEFAULT_LAUNCH) -> Tensor:
    """``x @ weight.T (+ bias)`` for x [..., K] (16-row tiles), fp32 accumulation, one bf16
    rounding (none with ``out_fp32``: the fp32 sums, as logits want them); ``config`` (keys of
    ``default_config``) overrides the shape's default."""
    check_shapes(x, weight, bias)
    return _launch(x, weight, bias, config, out_fp32=out_fp32, launch=launch)[0]


def decode_gemm_fp8_triton(q: Tensor, weight: Tensor, x_scale: Tensor, w_scale: Tensor, bias: Tensor | None = None,
                           config: dict | None = None, out_fp32: bool = False,
                           launch: Launch = DEFAULT_LAUNCH) -> Tensor:
    """``(q * x_scale) @ (weight * w_scale).T (+ bias)`` in bf16 (``out_fp32``: the fp32 sums, as logits want
    them) for float8 E4M3 ``q`` [..., K] (16-row tiles) and ``weight`` [N, K]; ``x_scale`` fp32, one per tensor or
    per row ([..., 1]), ``w_scale`` fp32, one per tensor or per column ([N])."""
    check_shapes(q, weight, bias, torch.float8_e4m3fn)
    rows, N = q.numel() // q.shape[-1], weight.shape[0]
    sx, sw = x_scale.float().reshape(-1), w_scale.float().reshape(-1)
    if sx.numel() not in (1, rows) or sw.numel() not in (1, N):
        raise OcriaError(f"decode_gemm kernel: x_scale {tuple(x_scale.shape)} must hold 1 or {rows} values, "
                         f"w_scale {tuple(w_scale.shape)} 1 or {N}")
    return _launch(q, weight, bias, config, out_fp32=out_fp32, scales=(sx.contiguous(), sw.contiguous()),
                   launch=launch)[0]


def decode_gemm_norm_triton(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                            bias: Tensor | None = None, config: dict | None = None,
                            launch: Launch = DEFAULT_LAUNCH) -> tuple[Tensor, Tensor]:
    """``(norm(s) @ weight.T (+ bias), s)`` with ``s = x + residual`` (x when residual is None) and the
    zero-centred RMSNorm ``norm(s) = s * rstd * (1 + norm_weight)``, in one launch (see the module doc)."""
    check_shapes(x, weight, bias)
    K = weight.shape[1]
    if (residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype)) \
            or norm_weight.shape != (K,) or norm_weight.dtype != torch.bfloat16:
        raise OcriaError(f"decode_gemm_norm kernel: residual {None if residual is None else tuple(residual.shape)} "
                         f"must match x {tuple(x.shape)} {x.dtype}, norm weight {tuple(norm_weight.shape)} "
                         f"{norm_weight.dtype} must be bf16 [{K}]")
    return _launch(x, weight, bias, config or norm_config(*weight.shape), residual, norm_weight, eps,
                   launch=launch)


def norm_config(N: int, K: int) -> dict:
    """``default_config`` adapted to the norm prologue. rstd needs each program's whole row: no split-K. The
    prologue's x, s and u tiles cost registers and barriers: compiled for sm_90a as launched, with Triton 3.6 (the
    H200 machine's), 512-wide K tiles spill in the column form, and the swap-AB form's K loop has 5 barriers at
    4 warps but 3 at 8 (the plain kernel's has 2). So K tiles of at most 128, 8 warps for swap-AB."""
    config = default_config(N, K)
    return dict(config, split_k=1, block_k=min(config["block_k"], 128),
                num_warps=8 if config["swap"] else config["num_warps"])


def launch_plan(M: int, N: int, K: int, cfg: dict, one_row_tile: bool, out: Tensor) -> tuple:
    """The grid and split of a decode-GEMM-shaped launch of ``M`` rows, ``N`` columns and ``K`` depth under ``cfg``
    (``one_row_tile``: each program one 16-row tile, for ops that need a whole row first).

    Returns:
        split_k, column tiles, block_m, row tiles per program, row groups, pipeline stages, K per split, and the
        split-K workspace and counters (``out`` stands in for both when ``split_k`` is 1)."""
    split_k, tiles, block_m = cfg.get("split_k", 1), triton.cdiv(N, cfg["block_n"]), cfg.get("block_m", BLOCK_M)
    row_tiles = 1 if one_row_tile else cfg.get("row_tiles", min(MAX_ROW_TILES, triton.next_power_of_2(triton.cdiv(
        M, block_m))))
    groups = triton.cdiv(M, row_tiles * block_m)
    stages = cfg["num_stages"] if row_tiles < MAX_ROW_TILES else min(cfg["num_stages"], 3)  # shared memory
    k_split = triton.cdiv(triton.cdiv(K, split_k), cfg["block_k"]) * cfg["block_k"]
    slots = groups * row_tiles * tiles
    ws, count = scratch(out.device, slots * split_k * block_m * cfg["block_n"], slots) if split_k > 1 else (out, out)
    return split_k, tiles, block_m, row_tiles, groups, stages, k_split, ws, count


def _launch(x: Tensor, weight: Tensor, bias: Tensor | None, config: dict | None, residual: Tensor | None = None,
            norm_weight: Tensor | None = None, eps: float = 0.0, out_fp32: bool = False,
            scales: tuple[Tensor, Tensor] | None = None,
            launch: Launch = DEFAULT_LAUNCH) -> tuple[Tensor, Tensor | None]:
    N, K = weight.shape
    lead = x.shape[:-1]
    x2, r2 = (t.reshape(-1, K) if t is not None else None for t in (x, residual))  # 2-D keeps its row stride
    x2, r2 = (t.contiguous() if t is not None and t.stride(-1) != 1 else t for t in (x2, r2))
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    M = x2.shape[0]
    fp8 = scales is not None
    out = torch.empty(M, N, dtype=torch.float32 if out_fp32 else torch.bfloat16 if fp8 else x.dtype, device=x.device)
    norm = norm_weight is not None
    s = torch.empty(M, K, dtype=x.dtype, device=x.device) if norm else None
    if M == 0 or N == 0:
        return out.reshape(*lead, N), s.reshape(*lead, K) if norm else None
    cfg = config or default_config(N, K)
    if norm and cfg.get("split_k", 1) != 1:
        raise OcriaError("decode_gemm_norm kernel: split_k must be 1 (each program needs the whole row for rstd)")
    split_k, tiles, block_m, row_tiles, groups, stages, k_split, ws, count = launch_plan(M, N, K, cfg, norm, out)
    # In the interpreter bf16 travels as int16 bits and is computed in fp32 (as the other plugins do).
    as_bits = x.device.type == "cpu"
    x_, w_, out_, r_, nw_, s_ = (bf16_as_int16(t) if as_bits and t is not None and t.dtype == torch.bfloat16 else t
                                 for t in (x2, weight, out, r2, norm_weight, s))
    if fp8 and as_bits:  # float8 bytes as uint8: the interpreter decodes them (``widen_e4m3``)
        x_, w_ = x2.view(torch.uint8), weight.view(torch.uint8)
    b_ = bf16_as_int16(bias.contiguous()) if bias is not None and as_bits else bias
    _kernel_for(x.device)[(groups, split_k, tiles)](
        x_, w_, b_ if bias is not None else out_, out_, ws, count, r_ if r_ is not None else out_,
        nw_ if norm else out_, s_ if norm else out_, scales[0] if fp8 else out_, scales[1] if fp8 else out_, eps,
        M, N, K, k_split,
        x2.stride(0), weight.stride(0), out.stride(0), r2.stride(0) if r2 is not None else 0,
        HAS_BIAS=bias is not None, SWAP=cfg["swap"], AS_BITS=as_bits, SPLIT_K=split_k,
        NORM=norm, RESIDUAL=r2 is not None, OUT_F32=out_fp32,
        FP8=fp8, SX_ROWS=fp8 and scales[0].numel() > 1, SW_COLS=fp8 and scales[1].numel() > 1, ROW_TILES=row_tiles,
        BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
        num_warps=cfg["num_warps"], num_stages=stages, **pdl_args(x.device, launch),
        PF_LINES=max(1, min(PREFETCH_LINES, triton.next_power_of_2(k_split // 64 + 1) // 2)),
    )  # fmt: skip
    return out.reshape(*lead, N), s.reshape(*lead, K) if norm else None
