"""Fast GPU check of every plugin kernel against its PyTorch reference (run first in a device call).

Seconds, not minutes: one small case per kernel and dtype, on the GPU, compared with the reference on
the same GPU tensors. ReplaySSM and the conv window run on strided views (as the model passes them)
and must equal the reference within float tolerance, buffers included; the fused norms within the
bf16 ulps their rounding chains allow (1 for rms_norm, 4 for gated_rms_norm: see NORM_ULPS_BF16);
decode attention within float tolerance; SiLU-quant byte for byte in every mode; the decode GEMM (and
its add + RMSNorm prologue, against its fp32 math) within one bf16 rounding, each row bit-identical alone
and in a 16-row block; the NVFP4 GEMM within one bf16 rounding of dequantize + fp32 matmul; the KV-cache
write bit for bit; the attention output gate within a bf16 ulp; a chain of
kernels launched with PDL, in a CUDA graph, bit for bit the chain without it. Exit code 1 and a table if
anything is off.

    python bench/plugins_check.py --out bench/results/plugins_check_h200.json
"""

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
from pathlib import Path

import torch

from ocria.bench.timing import rel_err
from ocria.plugins import numerics as nx
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.decode_attention.reference import decode_attention_reference
from ocria.plugins.decode_gemm import (
    decode_gemm,
    decode_gemm_fp8_fp32,
    decode_gemm_fp8_triton,
    decode_gemm_fp32,
    decode_gemm_norm,
    decode_gemm_norm_fp32,
)
from ocria.plugins.fp4_gemm import nvfp4_gemm, nvfp4_gemm_reference
from ocria.plugins.kv_write import kv_write, kv_write_reference
from ocria.plugins.launch import PDL_ENV, pdl_launch
from ocria.plugins.replay_ssm import reference as R
from ocria.plugins.replay_ssm.ops import causal_conv_verify, replay_verify
from ocria.plugins.rms_norm import add_rms_norm, gated_rms_norm, rms_norm
from ocria.plugins.rms_norm.kernel import rms_norm_fp8_triton
from ocria.plugins.rms_norm.op import fp8_reference
from ocria.plugins.rms_norm.reference import gated_rms_norm_reference, rms_norm_reference
from ocria.plugins.sigmoid_gate import sigmoid_gate, sigmoid_gate_reference
from ocria.plugins.silu_quant import quantize_act, silu_mul_quant
from ocria.plugins.silu_quant.reference import quantize_act_reference, silu_mul_quant_reference
from ocria.plugins.switch import DISABLE_ENV


def _fused_views(*parts: torch.Tensor) -> list[torch.Tensor]:
    """The parts as column slices of one [B, T, total] tensor, like a fused projection's outputs."""
    B, T = parts[0].shape[:2]
    flat = [p.reshape(B, T, -1) for p in parts]
    fused = torch.cat(flat, dim=-1)
    views = torch.split(fused, [f.shape[-1] for f in flat], dim=-1)
    return [v.unflatten(-1, p.shape[2:]) for v, p in zip(views, parts, strict=True)]


def check_replay(dtype: torch.dtype, dev: str, gates_fused: bool) -> dict:
    """q, k, v as views of one fused output and a, b either in it too (rows of 1032 elements, which the Triton kernels
    take) or apart (rows of 1024: bf16 T > 1 takes the Hopper kernel on an H200, as the model's views do)."""
    g = torch.Generator(dev).manual_seed(0)
    B, T, Tmax, S, Hk, Hv, D, KW = 4, 16, 16, 6, 2, 4, 128, 4
    r = lambda *s: torch.randn(*s, generator=g, device=dev)  # noqa: E731
    C = 2 * Hk * D + Hv * D
    slots = torch.tensor([5, 0, 3, 1], device=dev)
    pending = torch.tensor([3, 16, 0, 7, 1, 2], dtype=torch.int32, device=dev)
    q, k, v = (r(B, T, Hk, D).to(dtype), r(B, T, Hk, D).to(dtype), r(B, T, Hv, D).to(dtype))
    a, b = r(B, T, Hv).to(dtype), r(B, T, Hv).to(dtype)
    state = (r(S, Hv, D, D) * 0.1, R.l2norm(r(S, 2, Tmax, Hk, D)), r(S, 2, Tmax, Hv, D), -r(S, 2, Tmax, Hv).abs(),
             torch.randint(0, 2, (S,), device=dev, dtype=torch.int32))
    params = (r(Hv) - 2, r(Hv))
    views = _fused_views(q, k, v, a, b) if gates_fused else [*_fused_views(q, k, v), a, b]
    mine, ref = [t.clone() for t in state], [t.clone() for t in state]
    out = replay_verify(*views, *params, *mine, pending, slots, use_kernel=True)
    want = R.replay_verify_ref(q, k, v, a, b, *params, *ref, pending, slots)
    errs = [rel_err(out, want)] + [rel_err(x, y) for x, y in zip(mine, ref, strict=True)]
    x, w, buf = r(B, T, C).to(dtype), r(C, KW), r(S, KW - 1 + Tmax, C).to(dtype)
    (x_view,) = _fused_views(x)
    buf_mine, buf_ref = buf.clone(), buf.clone()
    y = causal_conv_verify(x_view, w, buf_mine, pending, slots, use_kernel=True)
    y_ref = R.causal_conv_verify_ref(x, w, buf_ref, pending, slots)
    errs += [rel_err(y, y_ref), rel_err(buf_mine, buf_ref)]
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # bf16 inputs take tf32 products in the kernel
    rows = f"strided, {views[0].stride(1)}-element rows"
    return {"kernel": f"replay_verify + causal_conv_verify ({rows})", "dtype": str(dtype), "max_rel_err": max(errs),
            "tolerance": tol, "ok": max(errs) <= tol}


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    sign = 1 << (15 if view == torch.int16 else 31)
    ia, ib = (t.contiguous().view(view).long() for t in (a, b))
    ia, ib = (torch.where(t < 0, -(t + sign), t) for t in (ia, ib))
    return int((ia - ib).abs().max())


# Why the bf16 limits differ (the kernel mirrors every rounding of the reference; what differs is the fp32
# norm before the first rounding: PyTorch's rms_norm takes rsqrt with its own reduction order, the kernel
# 1 / sqrt_rn over a tl.sum tree, a few fp32 ulps apart, far below one bf16 ulp):
# - rms_norm rounds once, at the end: two fp32 values a few fp32 ulps apart round to bf16 at most 1 ulp apart.
# - gated_rms_norm rounds three times (norm -> bf16, w * norm -> bf16, * silu(z) -> bf16). Where the fp32 norm
#   sits on a bf16 rounding boundary, the first rounding flips by 1 ulp and the two later roundings carry it
#   on, scaled by the mantissa ratios of the products: up to 2 ulps after w * norm (|w * a| / ulp grows by at
#   most 2 per ulp of a) and up to 4 at the output (enumerating every bf16 mantissa of norm and weight against
#   sampled fp32 silu(z), with and without an fp32 ulp of noise on it). The check's 4M gated elements meet such
#   boundaries, so the 2 ulps an H200 shows are this chain at work, not a kernel bug; more than 4 would
#   be a kernel that does not round where the model rounds.
NORM_ULPS_BF16 = {"rms_norm": 1, "gated_rms_norm": 4}


def check_norms(dtype: torch.dtype, dev: str) -> list[dict]:
    g = torch.Generator(dev).manual_seed(1)
    x = torch.randn(64, 16, 2048, generator=g, device=dev).to(dtype)
    qg = torch.randn(64, 16, 8, 512, generator=g, device=dev).to(dtype)
    q = qg.chunk(2, dim=-1)[0]  # strided rows, as gated attention's q
    z = torch.randn(64, 16, 32, 128, generator=g, device=dev).to(dtype)
    o = torch.randn(64, 16, 32, 128, generator=g, device=dev).to(dtype)
    w, wq, wo = (torch.randn(n, generator=g, device=dev).to(dtype) * 0.1 for n in (2048, 256, 128))
    ulps = {"rms_norm": max(_ulps(rms_norm(x, w, 1e-6, 1.0, use_kernel=True), rms_norm_reference(x, w, 1e-6, 1.0)),
                            _ulps(rms_norm(q, wq, 1e-6, 1.0, use_kernel=True), rms_norm_reference(q, wq, 1e-6, 1.0))),
            "gated_rms_norm": _ulps(gated_rms_norm(o, z, wo + 1, 1e-6, use_kernel=True),
                                    gated_rms_norm_reference(o, z, wo + 1, 1e-6))}
    rows = []
    for name, u in ulps.items():
        limit = NORM_ULPS_BF16[name] if dtype == torch.bfloat16 else 64
        rows.append({"kernel": name, "dtype": str(dtype), "max_ulps": u, "tolerance": limit, "ok": u <= limit})
    return rows


def check_attention(dtype: torch.dtype, dev: str) -> dict:
    """ocria-1-sim's attention shape (8 heads of 256 over 2 KV heads), T = 1 and 16, causal and block."""
    g = torch.Generator(dev).manual_seed(3)
    S, L, errs = 9, 600, []
    k, v = (torch.randn(S, 2, L, 256, generator=g, device=dev).to(dtype) for _ in range(2))
    for T, causal in ((1, True), (16, True), (16, False)):
        q = torch.randn(8, T, 8, 256, generator=g, device=dev).to(dtype).transpose(1, 2)
        slots = torch.randperm(S, generator=g, device=dev)[:8]
        start = torch.randint(0, L - 40, (8,), generator=g, device=dev, dtype=torch.int32)
        got = decode_attention(q, k, v, slots, start, 512, 256**-0.5, causal, use_kernel=True)
        errs.append(rel_err(got, decode_attention_reference(q, k, v, slots, start, 512, 256**-0.5, causal)))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    return {"kernel": "decode_attention", "dtype": str(dtype), "max_rel_err": max(errs), "tolerance": tol,
            "ok": max(errs) <= tol}


def check_decode_gemm(dev: str, norm: bool) -> dict:
    """A narrow and a wide ocria-1-sim weight (the two configurations), 16 rows and each row alone; with
    ``norm``, the add + RMSNorm prologue (``decode_gemm_norm``) against its fp32 math, its residual sum exact."""
    g = torch.Generator(dev).manual_seed(4)
    errs, invariant, sums_exact = [], True, True
    for N, K in ((2048, 4096), (5120, 2048)):
        w = (torch.randn(N, K, generator=g, device=dev) * K**-0.5).to(torch.bfloat16)
        x = torch.randn(16, K, generator=g, device=dev).to(torch.bfloat16)
        if norm:
            r = torch.randn(16, K, generator=g, device=dev).to(torch.bfloat16)
            nw = (torch.randn(K, generator=g, device=dev) * 0.3).to(torch.bfloat16)

            def run(rows, x=x, r=r, nw=nw, w=w):
                return decode_gemm_norm(x[rows], r[rows], nw, 1e-6, w, use_kernel=True)
            (block, s), (want, s_want) = run(slice(0, 16)), decode_gemm_norm_fp32(x, r, nw, 1e-6, w)
            sums_exact &= torch.equal(s, s_want)
        else:
            def run(rows, x=x, w=w):
                return decode_gemm(x[rows], w, use_kernel=True), None
            block, want = run(slice(0, 16))[0], decode_gemm_fp32(x, w)
        errs.append(rel_err(block, want))
        invariant &= all(torch.equal(run(slice(m, m + 1))[0][0], block[m]) for m in (0, 7, 15))
    tol = 1e-2  # one bf16 rounding of the output (the sum order differs from the exact product's)
    return {"kernel": "decode_gemm_norm" if norm else "decode_gemm", "dtype": "torch.bfloat16",
            "max_rel_err": max(errs), "tolerance": tol, "rows_batch_invariant": invariant,
            "residual_sum_exact": sums_exact, "ok": max(errs) <= tol and invariant and sums_exact}


def check_decode_gemm_fp8(dev: str) -> dict:
    """The FP8 decode GEMM (``decode_gemm_fp8``) against its exact math on two ocria-1-sim weights, per-token
    activation scales and per-column weight scales, 16 rows and each row alone."""
    g = torch.Generator(dev).manual_seed(5)
    errs, invariant = [], True
    for N, K in ((2048, 4096), (5120, 2048)):
        w = (torch.randn(N, K, generator=g, device=dev) * 40).to(torch.float8_e4m3fn)
        q = (torch.randn(16, K, generator=g, device=dev) * 40).to(torch.float8_e4m3fn)
        sx = torch.rand(16, 1, generator=g, device=dev) * 1e-2
        sw = torch.rand(N, generator=g, device=dev) * 1e-3
        block = decode_gemm_fp8_triton(q, w, sx, sw)
        errs.append(rel_err(block, decode_gemm_fp8_fp32(q, w, sx, sw)))
        invariant &= all(torch.equal(decode_gemm_fp8_triton(q[m:m + 1], w, sx[m:m + 1], sw)[0], block[m])
                         for m in (0, 7, 15))
    return {"kernel": "decode_gemm_fp8", "dtype": "torch.float8_e4m3fn", "max_rel_err": max(errs), "tolerance": 1e-2,
            "rows_batch_invariant": invariant, "ok": max(errs) <= 1e-2 and invariant}


# (M, N, K): one per default tile configuration: 16-row tiles with K split over the warps (a K tail too), 64-row
# and 128-row wgmma tiles, and M > 16 with 32/64-row M tiles; at M = 1 the GEMV's configurations (K <= 2048 without
# prefetch, longer K with it, in 2048- and 1024-wide tiles), with K tails.
NVFP4_SHAPES = ((16, 2048, 6144), (5, 12288, 2048), (1, 65536, 256), (40, 2048, 1040), (24, 32768, 512),
                (1, 12288, 2048), (1, 2048, 6144), (1, 2048, 4160), (1, 4096, 1040))


def check_nvfp4_gemm(dev: str, shapes: tuple = NVFP4_SHAPES) -> list[dict]:
    """Both code paths of the NVFP4 GEMM: integer unpacking (``OCRIA_DISABLE_KERNELS=nvfp4_ptx``) and the default
    PTX dequantization (sm_89+; older GPUs unpack with integers in both rows)."""
    rows = []
    for ptx in (False, True):
        with _env(DISABLE_ENV, None if ptx else "nvfp4_ptx"):
            rows.append(dict(_check_nvfp4_gemm(dev, shapes),
                             kernel="nvfp4_gemm" + ("" if ptx else " (integer unpacking)")))
    return rows


@contextlib.contextmanager
def _env(name: str, value: str | None):
    """Environment variable ``name`` set to ``value`` (None: unset) inside the block, as it was after."""
    saved = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if saved is not None:
            os.environ[name] = saved


def _check_nvfp4_gemm(dev: str, shapes: tuple) -> dict:
    """The NVFP4 weight-only GEMM against dequantize + fp32 matmul, with a zero, subnormal, negative and NaN
    E4M3 block scale in each weight: within one bf16 rounding, NaN in the same outputs."""
    g = torch.Generator(dev).manual_seed(6)
    errs, nan_same = [], True
    for M, N, K in shapes:
        w = torch.randn(N, K, generator=g, device=dev) * K**-0.5
        gs = nx.nvfp4_global_scale(w.abs().amax())
        packed, scales = nx.quantize_nvfp4(w, gs)
        bits = scales.view(torch.uint8)
        bits[0, 0], bits[1, 1], bits[2, 2], bits[3, 0], bits[N - 1, -1] = 0x00, 0x01, 0x05, 0xB8, 0x7F
        x = torch.randn(M, K, generator=g, device=dev).to(torch.bfloat16)
        got = nvfp4_gemm(x, packed, scales, gs, use_kernel=True)
        want = nvfp4_gemm_reference(x, packed, scales, gs)
        nan_same &= torch.equal(got.isnan(), want.isnan())
        errs.append(rel_err(got[~want.isnan()], want[~want.isnan()]))
    tol = 1e-2  # one bf16 rounding of the output (the sum order differs from the reference's)
    return {"kernel": "nvfp4_gemm", "dtype": "torch.bfloat16", "max_rel_err": max(errs), "tolerance": tol,
            "nan_same": nan_same, "ok": max(errs) <= tol and nan_same}


def check_kv_write(dev: str) -> dict:
    """The KV-cache write (bf16, k/v as views of a fused projection, ocria-1-sim's 2 KV heads of 256) against
    the indexed assignments: the caches bit for bit."""
    g = torch.Generator(dev).manual_seed(7)
    B, T, H, D, S, L = 4, 16, 2, 256, 6, 512
    fused = torch.randn(B, T, 3 * H * D, generator=g, device=dev).to(torch.bfloat16)
    k, v = (fused[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D) for i in (1, 2))
    caches = [torch.randn(S, H, L, D, generator=g, device=dev).to(torch.bfloat16) for _ in range(2)]
    want = [c.clone() for c in caches]
    slots = torch.tensor([5, 0, 3, 1], device=dev)
    pos = torch.tensor([0, 100, 300, L - T], device=dev)[:, None] + torch.arange(T, device=dev)
    rows = slots[:, None].expand_as(pos)
    kv_write(*caches, k, v, rows, pos, use_kernel=True)
    kv_write_reference(*want, k, v, rows, pos)
    bad = sum(int((c.view(torch.int16) != w.view(torch.int16)).sum()) for c, w in zip(caches, want))
    return {"kernel": "kv_write", "dtype": "torch.bfloat16", "mismatched_bytes": bad, "tolerance": 0, "ok": bad == 0}


def check_sigmoid_gate(dev: str) -> dict:
    """The attention output gate (bf16, ocria-1-sim's 16 heads of 256, gate a strided view of the q
    projection) against ``o * sigmoid(gate)``: bf16 ulps."""
    g = torch.Generator(dev).manual_seed(8)
    q = (torch.randn(4, 16, 16, 512, generator=g, device=dev) * 4).to(torch.bfloat16)
    gate = q.chunk(2, dim=-1)[1]
    o = torch.randn(4, 16, 16, 256, generator=g, device=dev).to(torch.bfloat16).transpose(1, 2)
    ulps = _ulps(sigmoid_gate(o, gate, use_kernel=True), sigmoid_gate_reference(o, gate))
    return {"kernel": "sigmoid_gate", "dtype": "torch.bfloat16", "max_ulps": ulps, "tolerance": 1, "ok": ulps <= 1}


def _silu_inputs(dev: str, g: torch.Generator) -> list[torch.Tensor]:
    """gate_up [rows, 2 x 512]: fp16 gates of every bit pattern against two sets of up values (unit and wide), and
    fp32 gates and ups over [-100, 100] with inf, NaN, +-0, exp's overflow edge and subnormals among the gates."""
    every = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(-1, 512).to(dev)
    ups = [torch.randn(every.shape, generator=g, device=dev).half() * s for s in (1.0, 300.0)]
    gate32 = torch.randn(256, 512, generator=g, device=dev) * 30
    specials = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 88.7, -88.7, 103.9, -103.9, 1e-40,
                             -1e-40, 1e-45], device=dev)  # fmt: skip
    gate32[0, : specials.numel()] = specials
    up32 = torch.randn(256, 512, generator=g, device=dev) * 10
    return [torch.cat([every, up], -1) for up in ups] + [torch.cat([gate32, up32], -1)]


def check_silu_quant(dev: str) -> list[dict]:
    g = torch.Generator(dev).manual_seed(2)
    gate_up = (torch.randn(37, 2 * 6144, generator=g, device=dev) * 3).to(torch.bfloat16)
    scale = torch.tensor(0.02, device=dev)
    # bf16 gate_up in every mode; NVFP4 also from fp16 gate_up and from fp16 / fp32 activations without the silu
    # (pair words of 32 and 64 bits: builds the bf16 path does not compile)
    modes = (("bf16", None), ("fp8_static", scale), ("fp8_dynamic", None), ("nvfp4", scale))
    cases = [(silu_mul_quant, silu_mul_quant_reference, gate_up, mode, s) for mode, s in modes]
    cases += [(silu_mul_quant, silu_mul_quant_reference, gate_up.half(), "nvfp4", scale)]
    cases += [(quantize_act, quantize_act_reference, gate_up[:, :6144].to(dt), "nvfp4", scale)
              for dt in (torch.float16, torch.float32)]
    # fp16 gate_up with every fp16 gate value (NaN, inf and subnormals included), fp32 with wide random values and
    # specials, in every mode: the exp these take on the GPU must be PyTorch's
    cases += [(silu_mul_quant, silu_mul_quant_reference, x, mode, s) for x in _silu_inputs(dev, g) for mode, s in modes]
    rows = []
    for op, reference, x, mode, s in cases:
        out, scales = op(x, mode, s, use_kernel=True)
        ref, ref_scales = reference(x, mode, s)
        bad = int((out.view(torch.uint8) != ref.view(torch.uint8)).sum())
        if scales is not None:
            bad += int((scales.contiguous().view(torch.uint8) != ref_scales.contiguous().view(torch.uint8)).sum())
        rows.append({"kernel": f"{op.__name__} {mode}", "dtype": str(x.dtype), "mismatched_bytes": bad,
                     "tolerance": 0, "ok": bad == 0})
    return rows


def check_norm_fp8(dev: str) -> list[dict]:
    """The norms' FP8 outputs: byte for byte ModelOpt's quantization of the y the same launch writes (per token and
    static; the gated norm per token over its 32 heads), and y as the plain norm kernel's."""
    g = torch.Generator(dev).manual_seed(4)
    x, r = (torch.randn(37, 2048, generator=g, device=dev).to(torch.bfloat16) for _ in range(2))
    o, z = (torch.randn(37, 32, 128, generator=g, device=dev).to(torch.bfloat16) for _ in range(2))
    w = (torch.randn(2048, generator=g, device=dev) * 0.1).to(torch.bfloat16)
    wo = (1 + torch.randn(128, generator=g, device=dev) * 0.1).to(torch.bfloat16)
    rows = []
    for mode, s in (("fp8_dynamic", None), ("fp8_static", torch.tensor(0.01, device=dev))):
        y, q, tokens = rms_norm_fp8_triton(x, w, 1e-6, mode, s, 1.0, residual=r, out_sum=torch.empty_like(x))
        yo, qo, tokens_o = rms_norm_fp8_triton(o, wo, 1e-6, mode, s, z=z)
        bad = 0
        for yy, qq, tt, gated in ((y, q, tokens, False), (yo, qo, tokens_o, True)):
            ref, ref_tokens = fp8_reference(yy, mode, s, gated)
            bad += int((qq.view(torch.uint8) != ref.view(torch.uint8)).sum())
            bad += 0 if tt is None else int((tt.view(torch.int32) != ref_tokens.view(torch.int32)).sum())
        y_plain = add_rms_norm(x, r, w, 1e-6, 1.0, use_kernel=True)[1]
        bad += int((y.view(torch.int16) != y_plain.view(torch.int16)).sum())
        rows.append({"kernel": f"add_rms_norm / gated_rms_norm -> {mode}", "dtype": "torch.bfloat16",
                     "mismatched_bytes": bad, "tolerance": 0, "ok": bad == 0})
    return rows


def check_pdl_chain(dev: str) -> list[dict]:
    """Programmatic dependent launch (``OCRIA_PDL=1``): 24 rounds of norm -> GEMM -> SiLU -> split-K GEMM ->
    PyTorch add, each kernel reading the one before, captured in a CUDA graph with PDL and replayed three
    times, must equal the chain run eagerly without PDL bit for bit (PDL changes when kernels start, not
    what they compute). Nothing to check where PDL does not run (CPU, GPUs before Hopper)."""
    if dev != "cuda":
        return []
    g = torch.Generator(dev).manual_seed(5)
    H, F = 2048, 6144
    nw = (torch.randn(H, generator=g, device=dev) * 0.3).to(torch.bfloat16)
    w_up = (torch.randn(2 * F, H, generator=g, device=dev) * H**-0.5).to(torch.bfloat16)
    w_down = (torch.randn(H, F, generator=g, device=dev) * F**-0.5).to(torch.bfloat16)
    x0 = torch.randn(1, H, generator=g, device=dev).to(torch.bfloat16)

    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(24):
            h = rms_norm(x, nw, 1e-6, use_kernel=True)
            a = silu_mul_quant(decode_gemm(h, w_up, use_kernel=True), "bf16", use_kernel=True)[0]
            x = x + decode_gemm(a, w_down, use_kernel=True)
        return x

    with _env(PDL_ENV, None):
        want = chain(x0)
    with _env(PDL_ENV, "1"):
        active = pdl_launch(torch.device(dev))
        eager = chain(x0)
        x_in = x0.clone()
        chain(x_in)  # compile and allocate before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(x_in)
        replays = []
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            replays.append(torch.equal(out, want))
    ok = torch.equal(eager, want) and all(replays)
    return [{"kernel": "PDL chain (eager, CUDA graph x3)", "dtype": "torch.bfloat16", "pdl_active": active,
             "eager_equal": torch.equal(eager, want), "graph_replays_equal": replays, "ok": ok}]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/plugins_check_h200.json")
    ap.add_argument("--device", default="cuda", help="cpu: the kernels in the interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    dev = args.device
    rows = [*(check_replay(dtype, dev, fused) for dtype in (torch.float32, torch.bfloat16) for fused in (True, False)),
            *check_norms(torch.float32, dev),
            *check_norms(torch.bfloat16, dev), check_attention(torch.float32, dev),
            check_attention(torch.bfloat16, dev), *check_silu_quant(dev), check_decode_gemm(dev, False),
            check_decode_gemm(dev, True), check_decode_gemm_fp8(dev),
            *check_nvfp4_gemm(dev), check_kv_write(dev), check_sigmoid_gate(dev), *check_norm_fp8(dev),
            *check_pdl_chain(dev)]
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name() if dev == "cuda" else dev, "torch": torch.__version__,
              "command": " ".join(["python", *sys.argv]), "checks": rows, "ok": all(r["ok"] for r in rows)}
    for r in rows:
        measure = {k: v for k, v in r.items() if k in ("max_rel_err", "max_ulps", "mismatched_bytes", "pdl_active",
                                                        "graph_replays_equal")}
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['kernel']:48s} {r['dtype']:15s} {measure}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
