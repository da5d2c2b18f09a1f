"""Triton kernel: one pass over ``gate_up`` that writes the quantized input of ``down_proj``.

In the CPU interpreter every rounding is spelled out in integer/fp32 arithmetic that mirrors
``ocria.plugins.numerics`` (IEEE ``div_rn``, round-half-even through ``+2^23 - 2^23``, E4M3/E2M1
bytes built by hand), because the interpreter's bf16 and fp8 casts do not round to nearest even.
On the GPU two steps come cheaper: the hardware RNE convert to bf16, and the quotients by a scale
(NVFP4 block scales; FP8 scales in [2^-64, 2^119]) as a multiply by the correctly rounded reciprocal
plus one FMA correction (exact by Markstein's theorem). E4M3 bytes are always built by hand. The
H200 run of a variant with the ``tl.float8e4nv`` convert (bench/results/silu_quant_h200_run2.json) shows
two faults: per-token rows whose scale was NaN or inf lost their NaN in ``min(q, 448)`` (all of rows 6
and 7 of the random input: 12287 bytes), and quotients just above an E4M3 midpoint rounded down (128 of
the 256 ``e2m1_ties`` at scale 0.02), as a convert through fp16 would. Hence the FMA quotient only for
tiles whose scales are all finite and in range (other tiles divide), and E4M3 bytes built by hand: PTX's
direct fp32 convert ``cvt.rn.satfinite.e4m3x2.f32`` gave the same bytes on the H200 but no speed (FP8
static 1.63-1.92x the memory floor with it, bench/results/silu_quant_h200_run5.json; 1.56-1.88x without, run4).
``exp`` is libdevice's ``expf`` on the GPU (what PyTorch's CUDA silu calls) and numpy's in the
interpreter; both agree with PyTorch after rounding silu to bf16 (the CPU tests and
bench/silu_quant.py on the H200 check every bf16 gate value).

Why the quantized modes are built as they are: they are compute-bound on the H200, by instruction issue and
by the quarter-rate unit (16 lanes per SM and clock) that runs ``ex2``, ``rcp`` and every float <-> int or
float -> bf16 convert. So the silu's two bf16 roundings convert two values per ``cvt.rn.bf16x2.f32``
(``round_bf16_pairs``), and the E4M3/E2M1 codes read their rounded integers from the mantissa bits of a sum
with 2^23 (E2M1: 2^22, 2^23 or 2^24 by binade) instead of converting floats to ints. That took FP8 static at
8192 x 6144 from 98.2 us (1.64x the floor, run5) to 79.1 us (1.32x) and NVFP4 from 116.5 us to 102.3 us, all
bytes still PyTorch's (bench/results/silu_quant_h200_run7.json).

Per-token FP8 needs a row's amax before its first byte. Rows up to 12288 wide are held in registers by
``_token_fp8_row_kernel`` (one pass: h computed once); wider ones walk the row twice in ``_silu_mul_quant_kernel``.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

from ocria.errors import OcriaError
from ocria.plugins.fp8_codes import e4m3_bytes, e4m3_code, quotient, scale_of, token_scale
from ocria.plugins.launch import pdl_args, pdl_enter
from ocria.plugins.numerics import NVFP4_BLOCK
from ocria.plugins.rounding import round_bf16_pairs, round_to_dtype, widen

MODE_IDS = {"bf16": 0, "fp8_static": 1, "fp8_dynamic": 2, "nvfp4": 3}


@triton.jit
def _e2m1_code(q, negative):
    """q >= 0 (or NaN) -> 4-bit E2M1 code (int32): RNE on {0, .5, 1, 1.5, 2, 3, 4, 6}, from 6 up and NaN -> 7; the
    sign bit (8) where ``negative`` and q > 0. One rounding add serves all three spacings: q + 2^22 rounds to
    halves ([0, 2)), q + 2^23 to units ([2, 4)), q + 2^24 to twos ([4, 6]), and the count of ulps above the
    magic number plus 0, 2 or 4 is the code."""
    c = tl.where(q < 6.0, q, 6.0)  # NaN too
    e = tl.maximum(c.to(tl.int32, bitcast=True) >> 23, 127)  # 127: c < 2, 128: [2, 4), 129: [4, 6]
    magic = (e + 22) << 23
    code = (c + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic + (e - 127) * 2
    return code | tl.where(negative & (q > 0.0), 8, 0)


@triton.jit
def _activation(x_ptr, x_offs, mask, N, GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr,
                FAST_EXP: tl.constexpr, DT: tl.constexpr):
    """h = silu(gate) * up (GATED) or x itself, in fp32, each op rounded to x's dtype as PyTorch rounds it."""
    if GATED:
        g = widen(tl.load(x_ptr + x_offs, mask=mask, other=0), IS_BF16)
        u = widen(tl.load(x_ptr + x_offs + N, mask=mask, other=0), IS_BF16)
        if ON_GPU:  # libdevice expf is what PyTorch's CUDA silu calls
            if FAST_EXP:
                e = libdevice.fast_expf(-g)
            else:
                e = libdevice.exp(-g)
        else:
            e = tl.exp(-g)
        if ON_GPU and IS_BF16:
            s = round_bf16_pairs(tl.math.div_rn(g, 1.0 + e))
            return round_bf16_pairs(s * u)
        s = round_to_dtype(tl.math.div_rn(g, 1.0 + e), IS_BF16, ON_GPU, DT)
        return round_to_dtype(s * u, IS_BF16, ON_GPU, DT)
    else:
        return widen(tl.load(x_ptr + x_offs, mask=mask, other=0), IS_BF16)


@triton.jit
def _silu_mul_quant_kernel(
    x_ptr, out_ptr, scale_ptr, out_scale_ptr,
    M, N, stride_xm, stride_om, stride_sm,
    MODE: tl.constexpr, GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr,
    FAST_EXP: tl.constexpr, NPASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_CHUNKS: tl.constexpr,
    PDL: tl.constexpr,
):
    # MODE: 0 plain, 1 fp8 static, 2 fp8 per-token dynamic, 3 nvfp4. IS_BF16: x (and the bf16 output) travel as
    # int16 bits, widened by a shift, exactly, also for subnormals where the interpreter's bf16 <-> fp32
    # conversions are wrong. MODE 2 with NPASS 2 walks its row twice (amax, then bytes); with NPASS 1 the whole
    # row is one tile (NUM_CHUNKS 1) and h is computed once.
    pdl_enter(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    col_start = pid_n * (BLOCK_N * NUM_CHUNKS)
    DT: tl.constexpr = tl.bfloat16 if IS_BF16 else x_ptr.dtype.element_ty
    scale = 1.0
    if MODE == 1 or MODE == 3:
        scale = tl.load(scale_ptr)
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    nan_rows = tl.zeros([BLOCK_M], dtype=tl.int32)
    row_scale = tl.zeros([BLOCK_M], dtype=tl.float32) + scale
    for p in tl.static_range(NPASS):
        for chunk in range(NUM_CHUNKS):
            cols = col_start + chunk * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            h32 = _activation(x_ptr, rows64[:, None] * stride_xm + cols[None, :], mask, N, GATED, IS_BF16, ON_GPU,
                              FAST_EXP, DT)
            if p == NPASS - 1:
                o_offs = rows64[:, None] * stride_om + cols[None, :]
                if MODE == 0:
                    if IS_BF16:
                        h = (h32.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
                    else:
                        h = h32.to(out_ptr.dtype.element_ty)
                    tl.store(out_ptr + o_offs, h, mask=mask)
                elif MODE == 1 or MODE == 2:
                    if MODE == 2 and NPASS == 1:  # the row is this one tile: its scale first
                        row_scale = token_scale(h32, mask)
                        tl.store(out_scale_ptr + rows64 * stride_sm, row_scale, mask=rmask)
                    tl.store(out_ptr + o_offs, e4m3_bytes(h32, row_scale, ON_GPU), mask=mask)
                else:
                    NB: tl.constexpr = BLOCK_N // 16
                    hb = tl.reshape(h32, [BLOCK_M, NB, 16])
                    bnan = tl.max(tl.reshape((h32 != h32).to(tl.int32), [BLOCK_M, NB, 16]), axis=2)
                    bamax = tl.max(tl.abs(hb), axis=2)
                    sc = tl.math.div_rn(bamax, tl.zeros_like(bamax) + 6.0 * scale)
                    sc = tl.minimum(tl.maximum(tl.where(sc == 0.0, 1.0, sc), 0.001953125), 448.0)
                    scode, sc8 = e4m3_code(sc)
                    scode = tl.where(bnan > 0, 0x7F, scode)
                    denom = tl.where(bnan > 0, float("nan"), sc8 * scale)[:, :, None]
                    inv = tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)
                    q = quotient(tl.abs(hb), denom, inv, denom * 8.0, ON_GPU)  # > 6 saturates anyway
                    code = _e2m1_code(q, hb < 0.0)
                    lo, hi = tl.split(tl.reshape(code, [BLOCK_M, BLOCK_N // 2, 2]))
                    pcols = (col_start + chunk * BLOCK_N) // 2 + tl.arange(0, BLOCK_N // 2)
                    pmask = rmask[:, None] & (pcols < N // 2)[None, :]
                    tl.store(out_ptr + rows64[:, None] * stride_om + pcols[None, :], (lo | (hi << 4)).to(tl.uint8),
                             mask=pmask)
                    scols = (col_start + chunk * BLOCK_N) // 16 + tl.arange(0, NB)
                    smask = rmask[:, None] & (scols < N // 16)[None, :]
                    tl.store(out_scale_ptr + rows64[:, None] * stride_sm + scols[None, :], scode.to(tl.uint8),
                             mask=smask)
            else:
                amax = tl.maximum(amax, tl.max(tl.where(mask, tl.abs(h32), 0.0), axis=1))
                nan_rows = tl.maximum(nan_rows, tl.max((h32 != h32).to(tl.int32), axis=1))
        if p == 0 and NPASS == 2:
            row_scale = scale_of(amax, nan_rows)
            tl.store(out_scale_ptr + rows64 * stride_sm, row_scale, mask=rmask)


@triton.jit
def _row_tile(x_ptr, row_off, START: tl.constexpr, W: tl.constexpr, N, GATED: tl.constexpr, IS_BF16: tl.constexpr,
              ON_GPU: tl.constexpr, FAST_EXP: tl.constexpr, DT: tl.constexpr):
    """h of columns [START, START + W) of one row, as a [1, W] tile (masked lanes load 0, so their h is 0)."""
    cols = START + tl.arange(0, W)
    return _activation(x_ptr, row_off + cols[None, :], (cols < N)[None, :], N, GATED, IS_BF16, ON_GPU, FAST_EXP, DT)


@triton.jit
def _row_stats(h, amax, nan_rows):
    return (tl.maximum(amax, tl.max(tl.abs(h), axis=1)),
            tl.maximum(nan_rows, tl.max((h != h).to(tl.int32), axis=1)))


@triton.jit
def _store_row_tile(out_ptr, out_off, h, row_scale, START: tl.constexpr, W: tl.constexpr, N, ON_GPU: tl.constexpr):
    cols = START + tl.arange(0, W)
    tl.store(out_ptr + out_off + cols[None, :], e4m3_bytes(h, row_scale, ON_GPU), mask=(cols < N)[None, :])


@triton.jit
def _token_fp8_row_kernel(
    x_ptr, out_ptr, out_scale_ptr, N, stride_xm, stride_om, stride_sm,
    GATED: tl.constexpr, IS_BF16: tl.constexpr, ON_GPU: tl.constexpr, FAST_EXP: tl.constexpr,
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, PDL: tl.constexpr,
):
    # Per-token FP8 in one pass, one program per row: the row's h is held in registers as up to four
    # power-of-two tiles W0, W1, ... (0 = absent; only the last one reaches past N), so the row is read and its
    # silu computed once; its amax gives the scale and the same registers give the bytes.
    pdl_enter(PDL)
    DT: tl.constexpr = tl.bfloat16 if IS_BF16 else x_ptr.dtype.element_ty
    O1: tl.constexpr = W0
    O2: tl.constexpr = W0 + W1
    O3: tl.constexpr = W0 + W1 + W2
    row = tl.program_id(0).to(tl.int64)
    x_off = row * stride_xm
    amax = tl.zeros([1], dtype=tl.float32)
    nan_rows = tl.zeros([1], dtype=tl.int32)
    h0 = _row_tile(x_ptr, x_off, 0, W0, N, GATED, IS_BF16, ON_GPU, FAST_EXP, DT)
    amax, nan_rows = _row_stats(h0, amax, nan_rows)
    if W1 > 0:
        h1 = _row_tile(x_ptr, x_off, O1, W1, N, GATED, IS_BF16, ON_GPU, FAST_EXP, DT)
        amax, nan_rows = _row_stats(h1, amax, nan_rows)
    if W2 > 0:
        h2 = _row_tile(x_ptr, x_off, O2, W2, N, GATED, IS_BF16, ON_GPU, FAST_EXP, DT)
        amax, nan_rows = _row_stats(h2, amax, nan_rows)
    if W3 > 0:
        h3 = _row_tile(x_ptr, x_off, O3, W3, N, GATED, IS_BF16, ON_GPU, FAST_EXP, DT)
        amax, nan_rows = _row_stats(h3, amax, nan_rows)
    row_scale = scale_of(amax, nan_rows)
    tl.store(out_scale_ptr + row * stride_sm + tl.arange(0, 1), row_scale)
    out_off = row * stride_om
    _store_row_tile(out_ptr, out_off, h0, row_scale, 0, W0, N, ON_GPU)
    if W1 > 0:
        _store_row_tile(out_ptr, out_off, h1, row_scale, O1, W1, N, ON_GPU)
    if W2 > 0:
        _store_row_tile(out_ptr, out_off, h2, row_scale, O2, W2, N, ON_GPU)
    if W3 > 0:
        _store_row_tile(out_ptr, out_off, h3, row_scale, O3, W3, N, ON_GPU)


def row_tiles(N: int, min_tile: int = 256, max_tiles: int = 4) -> tuple[int, int, int, int]:
    """Power-of-two tile widths (zero-padded to four) that cover a row of N: the binary digits of N from the
    top, down to ``min_tile``; what is left (or what a fourth digit would not cover) is one last, masked tile."""
    tiles, rest = [], N
    while rest >= min_tile and len(tiles) < max_tiles - 1:
        tiles.append(1 << (rest.bit_length() - 1))
        rest -= tiles[-1]
    if rest:
        tiles.append(max(16, triton.next_power_of_2(rest)))
    return tuple(tiles + [0] * (max_tiles - len(tiles)))


def _compiled(kernel, device: torch.device):
    """The compiled kernel on CUDA; on CPU the interpreter, which Triton only builds when
    ``TRITON_INTERPRET=1`` was set before ``triton`` itself was imported."""
    if device.type != "cuda" and not isinstance(kernel, InterpretedFunction):
        raise OcriaError("silu_mul_quant kernels on CPU need TRITON_INTERPRET=1 set before triton is imported")
    return kernel


def default_config(mode: str, M: int, N: int) -> dict:
    """Rows x columns per program and warps: the fastest per mode (or within 0.5% of it) of the sweep at
    4096 x 12288 in bench/results/silu_quant_h200_run7.json, with libdevice ``fast_expf``, which gave PyTorch's bytes
    for every bf16 gate value.

    Per-token FP8 (sweeps at 4096 rows of 6144, 12288 and 18944 columns, bench/results/silu_quant_h200_run12.json):
    rows up to 12288 wide are held in registers by ``_token_fp8_row_kernel``, about 48 values per thread (4 warps
    up to 6144 columns, 8 above), so h is computed once: 6144 columns 59.8 us, 12288 columns 123.8 us, against
    78.8 and 160.3 for the best two-pass tiles. Wider rows would hold more there, and walk their chunks twice
    instead, amax then bytes (18944: 261 us, against 292 for the best ``row_tiles`` launch): from 1024 rows (a
    program per row fills the GPU) 1024-column chunks with 4 warps (bench/results/silu_quant_h200_run10.json),
    below that 2048-column chunks with 8 warps (fewer steps per program: 1.5x faster at 1 to 128 rows, run10
    against run9). Programs striding over rows and prefetching the next one into L2 were no faster (run11), nor was
    holding h as bf16 bits, half the registers (within 2% at 8 warps and 6144 or 12288 columns, run13)."""
    if mode == "fp8_dynamic":
        if N <= 12288:
            return {"row_tiles": True, "num_warps": 4 if N <= 6144 else 8, "fast_exp": True}
        if M >= 1024:
            return {"block_m": 1, "block_n": 1024, "num_warps": 4, "fast_exp": True}
        return {"block_m": 1, "block_n": 2048, "num_warps": 8, "fast_exp": True}
    widest = 1024 if mode == "fp8_static" else 2048
    block_n = widest if N >= widest else max(16, triton.next_power_of_2(N))
    return {"block_m": 1, "block_n": block_n, "num_warps": 8 if block_n >= 2048 else 4, "fast_exp": True}


def tiling(mode: str, N: int, config: dict) -> tuple[int, int, int]:
    """(columns per tile, tiles per program, passes) of a row of width N under ``config``: ``block_n`` 0 is
    the whole row; per-token FP8 walks its row's tiles in one program, twice when there is more than one."""
    block_n = config["block_n"] or max(16, triton.next_power_of_2(N))
    chunks = triton.cdiv(N, block_n) if mode == "fp8_dynamic" else 1
    return block_n, chunks, 2 if chunks > 1 else 1


def _launch_row_tiles(x: Tensor, out: Tensor, out_scale: Tensor, M: int, N: int, gated: bool, as_bits: bool,
                      cfg: dict) -> None:
    w0, w1, w2, w3 = row_tiles(N)
    dev = x.device
    _compiled(_token_fp8_row_kernel, dev)[(M,)](
        x, out, out_scale, N, x.stride(0), out.stride(0), out_scale.stride(0),
        GATED=gated, IS_BF16=as_bits, ON_GPU=dev.type == "cuda", FAST_EXP=cfg["fast_exp"],
        W0=w0, W1=w1, W2=w2, W3=w3, num_warps=cfg["num_warps"], **pdl_args(dev),
    )


def _launch(x: Tensor, mode: str, scale: Tensor | None, gated: bool,
            config: dict | None = None) -> tuple[Tensor, Tensor | None]:
    if mode not in MODE_IDS:
        raise ValueError(f"unknown activation quantization mode {mode!r}; expected one of {tuple(MODE_IDS)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    lead, width = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, width)
    M = x2.shape[0]
    N = width // 2 if gated else width
    if gated and width % 2:
        raise ValueError(f"gate_up last dim must be even, got {width}")
    if mode == "nvfp4" and N % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs a width that is a multiple of 16, got {N}")
    if mode in ("fp8_static", "nvfp4"):
        if scale is None:
            raise ValueError(f"mode {mode!r} needs a calibrated scale")
        scale = scale.to(device=x.device, dtype=torch.float32).reshape(1)
    dev = x.device
    out_scale = None
    if mode == "bf16":
        out = torch.empty(M, N, dtype=x.dtype, device=dev)
    elif mode in ("fp8_static", "fp8_dynamic"):
        out = torch.empty(M, N, dtype=torch.uint8, device=dev)
        if mode == "fp8_dynamic":
            out_scale = torch.empty(M, 1, dtype=torch.float32, device=dev)
    else:
        out = torch.empty(M, N // 2, dtype=torch.uint8, device=dev)
        out_scale = torch.empty(M, N // NVFP4_BLOCK, dtype=torch.uint8, device=dev)
    cfg = config or default_config(mode, M, N)
    as_bits = x.dtype == torch.bfloat16
    x_arg = x2.view(torch.int16) if as_bits else x2
    if M > 0 and cfg.get("row_tiles"):
        if mode != "fp8_dynamic":
            raise ValueError(f"row_tiles configs are for mode 'fp8_dynamic', not {mode!r}")
        _launch_row_tiles(x_arg, out, out_scale, M, N, gated, as_bits, cfg)
    elif M > 0:
        block_m = cfg["block_m"]
        block_n, chunks, passes = tiling(mode, N, cfg)
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n * chunks))
        out_arg = out.view(torch.int16) if as_bits and mode == "bf16" else out
        _compiled(_silu_mul_quant_kernel, dev)[grid](
            x_arg, out_arg, scale if scale is not None else out, out_scale if out_scale is not None else out,
            M, N, x2.stride(0), out.stride(0), out_scale.stride(0) if out_scale is not None else 0,
            MODE=MODE_IDS[mode], GATED=gated, IS_BF16=as_bits, ON_GPU=dev.type == "cuda", FAST_EXP=cfg["fast_exp"],
            NPASS=passes,
            BLOCK_M=block_m, BLOCK_N=block_n, NUM_CHUNKS=chunks, num_warps=cfg["num_warps"], **pdl_args(dev),
        )
    if mode in ("fp8_static", "fp8_dynamic"):
        out = out.view(torch.float8_e4m3fn)
    out = out.reshape(*lead, out.shape[-1])
    if out_scale is not None:
        if out_scale.dtype == torch.uint8:
            out_scale = out_scale.view(torch.float8_e4m3fn)
        out_scale = out_scale.reshape(*lead, out_scale.shape[-1])
    return out, out_scale


def silu_mul_quant_triton(
    gate_up: Tensor, mode: str, scale: Tensor | None = None, config: dict | None = None
) -> tuple[Tensor, Tensor | None]:
    """Fused kernel; same contract as ``reference.silu_mul_quant_reference``."""
    return _launch(gate_up, mode, scale, gated=True, config=config)


def quantize_act_triton(
    x: Tensor, mode: str, scale: Tensor | None = None, config: dict | None = None
) -> tuple[Tensor, Tensor | None]:
    """The same kernel without the activation; same contract as ``reference.quantize_act_reference``."""
    return _launch(x, mode, scale, gated=False, config=config)
