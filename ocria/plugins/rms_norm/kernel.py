"""Triton kernels: one launch per RMSNorm (rows of x in, normalised rows out), fp32 inside; with a
residual, the launch also adds it first and writes the sum (the decoder's residual stream); with cos/sin,
the attention's q/k norm is followed in the same launch by its rotary embedding, rounded as the eager ops round.

bf16 tensors travel as int16 bits and are rounded to nearest even on the bits, so the CPU
interpreter (whose bf16 casts truncate) computes what the GPU computes. ``exp`` in the gate is
libdevice's ``expf`` on the GPU (what PyTorch's CUDA silu calls) and numpy's in the interpreter.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from ocria.errors import OcriaError
from ocria.plugins.fp8_codes import e4m3_bytes, token_scale
from ocria.plugins.launch import pdl_args, pdl_enter
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch
from ocria.plugins.rounding import bf16_as_int16, bf16_bits, round_to_dtype, widen

MAX_WIDTH = 16384


@triton.jit
def _norm_chain(x, w, rstd, offset, PLAIN: tl.constexpr, X_BF16: tl.constexpr, PROD_BF16: tl.constexpr,
                ON_GPU: tl.constexpr, DT: tl.constexpr):
    """Plain: w * norm(x).to(x dtype), rounded to the product's dtype (Qwen3's norm); else norm(x) * (offset + w)."""
    normed = x * rstd[:, None]
    if PLAIN:
        normed = round_to_dtype(normed, X_BF16, ON_GPU, DT)
        return round_to_dtype(normed * w[None, :], PROD_BF16, ON_GPU, DT)
    else:
        return normed * (offset + w)[None, :]


@triton.jit
def _rms_norm_kernel(
    x_ptr, z_ptr, w_ptr, y_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, q_ptr, qs_ptr, M, N, stride_x, stride_xh, stride_z,
    stride_r, eps, offset, HEADS, R, PLAIN: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    ROPE: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr, X_BF16: tl.constexpr, W_BF16: tl.constexpr,
    Z_BF16: tl.constexpr, PROD_BF16: tl.constexpr, ON_GPU: tl.constexpr, DT: tl.constexpr, ROWS: tl.constexpr,
    BN: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # QUANT (1: static FP8 with the scale at qs_ptr, 2: per-token FP8 over GROUP rows, its scales to qs_ptr) also
    # writes the E4M3 bytes of the output y (as stored) to q_ptr: the FP8 input of the linear layer that follows.
    pdl_enter(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BN)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)
    # row = token * HEADS + head (HEADS 1 without rope): x may be a strided view (heads split off a fused GEMM)
    x_rows = x_ptr + ((rows64 // HEADS) * stride_x + (rows64 % HEADS) * stride_xh)[:, None]
    x = widen(tl.load(x_rows + cols[None, :], mask=mask, other=0), X_BF16)
    if RESIDUAL:  # s = x + r rounded to x's dtype, as PyTorch's add; the norm reads s
        r = widen(tl.load(r_ptr + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0), X_BF16)
        x = round_to_dtype(x + r, X_BF16, ON_GPU, DT)
        s_ptrs = s_ptr + rows64[:, None] * N + cols[None, :]
        if X_BF16:
            tl.store(s_ptrs, bf16_bits(x), mask=mask)
        else:
            tl.store(s_ptrs, x.to(DT), mask=mask)
    w = widen(tl.load(w_ptr + cols, mask=cols < N, other=0), W_BF16)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, 1) / N + eps)
    y = _norm_chain(x, w, rstd, offset, PLAIN, X_BF16, PROD_BF16, ON_GPU, DT)
    if GATED:  # the plain chain, then * silu(z) in fp32
        z = widen(tl.load(z_ptr + rows64[:, None] * stride_z + cols[None, :], mask=mask, other=0), Z_BF16)
        if ON_GPU:
            e = libdevice.exp(-z)
        else:
            e = tl.exp(-z)
        y = y * tl.math.div_rn(z, 1.0 + e)
    if ROPE:  # row = token * HEADS + head; channels c < R: y*cos + rotate_half(y)*sin, each op rounded to x's dtype
        y = round_to_dtype(y, X_BF16, ON_GPU, DT)  # the norm's output, in x's dtype
        half = R // 2
        rot = (rows < M)[:, None] & (cols < R)[None, :]
        partner = tl.where(cols < half, cols + half, cols - half)  # rotate_half's source channel, norm recomputed
        xp = widen(tl.load(x_rows + partner[None, :], mask=rot, other=0), X_BF16)
        wp = widen(tl.load(w_ptr + partner, mask=cols < R, other=0), W_BF16)
        yp = round_to_dtype(_norm_chain(xp, wp, rstd, offset, PLAIN, X_BF16, PROD_BF16, ON_GPU, DT), X_BF16,
                            ON_GPU, DT)
        yp = tl.where((cols < half)[None, :], -yp, yp)
        cs = (rows64 // HEADS)[:, None] * R + cols[None, :]
        c = widen(tl.load(cos_ptr + cs, mask=rot, other=0), X_BF16)
        sn = widen(tl.load(sin_ptr + cs, mask=rot, other=0), X_BF16)
        if ON_GPU:  # no fused multiply-add: PyTorch rounds each product before the sum
            a, b = libdevice.mul_rn(y, c), libdevice.mul_rn(yp, sn)
        else:
            a, b = y * c, yp * sn
        a, b = round_to_dtype(a, X_BF16, ON_GPU, DT), round_to_dtype(b, X_BF16, ON_GPU, DT)
        y = tl.where((cols < R)[None, :], a + b, y)
    y_ptrs = y_ptr + rows64[:, None] * N + cols[None, :]
    if X_BF16:
        tl.store(y_ptrs, bf16_bits(y), mask=mask)
    else:
        tl.store(y_ptrs, y.to(DT), mask=mask)
    if QUANT > 0:
        _store_fp8(round_to_dtype(y, X_BF16, ON_GPU, DT), mask, q_ptr, qs_ptr, rows64, cols, M, N, QUANT, GROUP,
                   ON_GPU, ROWS, BN)


@triton.jit
def _store_fp8(y, mask, q_ptr, qs_ptr, rows64, cols, M, N, QUANT: tl.constexpr, GROUP: tl.constexpr,
               ON_GPU: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr):
    """E4M3 bytes of the [ROWS, BN] tile y, whose rows come GROUP to a token (program tiles start on a token)."""
    NG: tl.constexpr = ROWS // GROUP
    yt = tl.reshape(y, [NG, GROUP * BN])
    if QUANT == 1:
        scale = tl.zeros([NG], dtype=tl.float32) + tl.load(qs_ptr)
    else:
        scale = token_scale(yt, tl.reshape(mask, [NG, GROUP * BN]))
        tokens = rows64 // GROUP
        first = (rows64 % GROUP) == 0
        tl.store(qs_ptr + tokens, tl.reshape(tl.broadcast_to(scale[:, None], [NG, GROUP]), [ROWS]),
                 mask=first & (rows64 < M))
    codes = tl.reshape(e4m3_bytes(yt, scale, ON_GPU), [ROWS, BN])
    tl.store(q_ptr + rows64[:, None] * N + cols[None, :], codes, mask=mask)


def _rows(t: Tensor) -> tuple[Tensor, int]:
    """t [..., N] as [M, N] with a row stride, without a copy when the leading dims collapse."""
    t2 = t.reshape(-1, t.shape[-1])
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2, t2.stride(0)


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0, z: Tensor | None = None,
                    residual: Tensor | None = None, out_sum: Tensor | None = None, plain: bool = False,
                    cos: Tensor | None = None, sin: Tensor | None = None, launch: Launch = DEFAULT_LAUNCH) -> Tensor:
    """``rms_norm_reference`` (z None), ``plain_rms_norm_reference`` (``plain``, offset unused) or
    ``gated_rms_norm_reference`` (z given) in one launch. With ``residual`` (not with z):
    ``out_sum = x + residual`` is written and the norm is of that sum. With cos, sin [..., R] (x [..., H, N],
    neither z nor residual): ``rms_norm_rope_reference``, the rotary embedding of the norm's first R channels."""
    return _launch(x, weight, eps, offset, z, residual, out_sum, plain, cos, sin, launch=launch)[0]


def rms_norm_fp8_triton(x: Tensor, weight: Tensor, eps: float, mode: str, scale: Tensor | None, offset: float = 0.0,
                        z: Tensor | None = None, residual: Tensor | None = None,
                        out_sum: Tensor | None = None,
                        launch: Launch = DEFAULT_LAUNCH) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(y, q, token_scales)``: ``rms_norm_triton``'s y (no rope) and, from the same launch, the E4M3 bytes of y as
    the next linear layer's FP8 input: ``fp8_static`` with ``scale`` (token_scales None) or ``fp8_dynamic``, one
    scale per token. A token is a row of x, with z (the gated norm, x [..., H, D]) the H rows of its heads."""
    if mode not in FP8_MODES or (mode == "fp8_static") != (scale is not None):
        raise OcriaError(f"rms_norm kernel: FP8 output mode {mode!r} with scale {scale}: expected fp8_static with a "
                         "scale or fp8_dynamic without one")
    group = x.shape[-2] if z is not None else 1
    if group & (group - 1) or group * triton.next_power_of_2(x.shape[-1]) > MAX_WIDTH:
        raise OcriaError(f"rms_norm kernel: FP8 output over {group} heads of {x.shape[-1]}: the heads of a token "
                         f"must be a power of two and fit one tile of {MAX_WIDTH}")
    return _launch(x, weight, eps, offset, z, residual, out_sum, False, None, None, (FP8_MODES[mode], scale, group),
                   launch)


FP8_MODES = {"fp8_static": 1, "fp8_dynamic": 2}


def _launch(x: Tensor, weight: Tensor, eps: float, offset: float, z: Tensor | None, residual: Tensor | None,
            out_sum: Tensor | None, plain: bool, cos: Tensor | None, sin: Tensor | None,
            quant: tuple[int, Tensor | None, int] | None = None,
            launch: Launch = DEFAULT_LAUNCH) -> tuple[Tensor, Tensor | None, Tensor | None]:
    N = x.shape[-1]
    if N > MAX_WIDTH or weight.shape != (N,) or any(t is not None and t.shape != x.shape for t in (z, residual)):
        raise OcriaError(f"rms_norm kernel: x {tuple(x.shape)}, weight {tuple(weight.shape)}"
                         f"{'' if z is None else f', z {tuple(z.shape)}'}"
                         f"{'' if residual is None else f', residual {tuple(residual.shape)}'}"
                         f": widths must agree and be <= {MAX_WIDTH}")
    prod = torch.promote_types(weight.dtype, x.dtype)
    if plain and prod != x.dtype:
        raise OcriaError(f"rms_norm kernel: the plain norm's product w * norm(x) is {prod}, not x's {x.dtype}")
    if x.dtype not in (torch.bfloat16, torch.float32) or (residual is not None and residual.dtype != x.dtype):
        raise OcriaError(f"rms_norm kernel: x (and residual) must be bf16 or fp32 of one dtype, got {x.dtype}"
                         f"{'' if residual is None else f' and {residual.dtype}'}")
    rope = cos is not None
    if rope and (z is not None or residual is not None or sin is None or cos.shape != sin.shape
                 or x.dim() < 2 or cos.shape[:-1] != x.shape[:-2] or cos.shape[-1] % 2 or cos.shape[-1] > N
                 or cos.dtype != x.dtype or sin.dtype != x.dtype):
        raise OcriaError(f"rms_norm kernel: rope needs x [..., H, N] and cos, sin [..., R] of x's dtype with an even "
                         f"R <= N, got x {tuple(x.shape)} {x.dtype}, cos {tuple(cos.shape)} {cos.dtype}"
                         f"{'' if sin is None else f', sin {tuple(sin.shape)}'}")
    if rope:  # [tokens, H, N] with token and head strides: q/k split off a fused GEMM are read in place
        x2 = x.reshape(-1, x.shape[-2], N)
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        sx, sxh, M = x2.stride(0), x2.stride(1), x2.shape[0] * x2.shape[1]
    else:
        (x2, sx), sxh = _rows(x), 0
        M = x2.shape[0]
    z2, sz = _rows(z) if z is not None else (x2, sx)
    r2, sr = _rows(residual) if residual is not None else (x2, sx)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    s = out_sum if out_sum is not None else y
    mode, group = (quant[0], quant[2]) if quant is not None else (0, 1)
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if mode else None
    lead = x.shape[:-2] if z is not None else x.shape[:-1]  # a token: a row, or (gated) the heads of a row
    tokens = torch.empty(*lead, 1, dtype=torch.float32, device=x.device) if mode == 2 else None
    qs = quant[1].float().reshape(1).contiguous() if mode == 1 else tokens
    if M == 0:
        return y, _as_fp8(q, z is not None), tokens
    BN = triton.next_power_of_2(N)
    rows = max(group, min(16, 4096 // BN))
    cs = (cos.contiguous(), sin.contiguous()) if rope else (x2, x2)
    _rms_norm_kernel[(triton.cdiv(M, rows),)](
        *(bf16_as_int16(t) for t in (x2, z2, weight.contiguous(), y, r2, s, *cs)), q if mode else y,
        qs if mode else y, M, N, sx, sxh, sz, sr, eps, offset, x.shape[-2] if rope else 1, cos.shape[-1] if rope else 0,
        PLAIN=plain or z is not None, GATED=z is not None, RESIDUAL=residual is not None, ROPE=rope, QUANT=mode,
        GROUP=group,
        X_BF16=x.dtype == torch.bfloat16, W_BF16=weight.dtype == torch.bfloat16,
        Z_BF16=z2.dtype == torch.bfloat16, PROD_BF16=prod == torch.bfloat16, ON_GPU=x.device.type == "cuda",
        DT=tl.float32, ROWS=rows, BN=BN, **pdl_args(x.device, launch),
    )  # fmt: skip
    return y, _as_fp8(q, z is not None), tokens


def _as_fp8(q: Tensor | None, gated: bool) -> Tensor | None:
    """The E4M3 bytes as float8; the gated norm's [..., H, D] flattened to [..., H * D] (the next layer's input)."""
    if q is None:
        return None
    q = q.view(torch.float8_e4m3fn)
    return q.reshape(*q.shape[:-2], -1) if gated else q
