"""Triton kernel: the new tokens' k and v rows into their KV-cache slots, both in one launch.

Why: each attention layer of a decode step wrote its cache with two ``index_put`` kernels (k, v), 12 of the
`ar` step's kernels on ocria-1-sim and more in the drafter (the H200 profile of a batch-1 ``ar`` step). A program
copies one (token, KV head) row of k and of v; elements move as raw bits of their width, so the copy is exact for
any dtype (and the interpreter needs no bf16 arithmetic). Positions outside the cache are not written: the runtime
sizes caches so that none occur (the reference would raise).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ocria.errors import OcriaError
from ocria.plugins.launch import pdl_args, pdl_enter
from ocria.plugins.policy import DEFAULT_LAUNCH, Launch

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, rows_ptr, pos_ptr, T, L,
    skb, skt, skh, svb, svt, svh, srb, srt, spb, spt, scs, sch, scl, svs, svh_c, svl,
    D: tl.constexpr, BD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    bt, h = tl.program_id(0), tl.program_id(1)
    b, t = bt // T, bt % T
    row = tl.load(rows_ptr + b * srb + t * srt).to(tl.int64)
    pos = tl.load(pos_ptr + b * spb + t * spt).to(tl.int64)
    d = tl.arange(0, BD)
    m = d < tl.where((pos >= 0) & (pos < L), D, 0)  # nothing when the position lies outside the cache
    k = tl.load(k_ptr + b.to(tl.int64) * skb + t * skt + h * skh + d, mask=m)
    v = tl.load(v_ptr + b.to(tl.int64) * svb + t * svt + h * svh + d, mask=m)
    tl.store(kc_ptr + row * scs + h * sch + pos * scl + d, k, mask=m)
    tl.store(vc_ptr + row * svs + h * svh_c + pos * svl + d, v, mask=m)


def supports(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor) -> bool:
    """Same dtype everywhere (a bit copy), unit stride along D, k/v [B, T, Hkv, D] matching the caches' heads."""
    return (k.dtype == v.dtype == k_cache.dtype == v_cache.dtype and k.dim() == 4 and k.shape == v.shape
            and k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k.shape[2:] == (k_cache.shape[1],
            k_cache.shape[3]) and all(t.stride(-1) == 1 for t in (k, v, k_cache, v_cache)))


def kv_write_triton(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, rows: Tensor, pos: Tensor,
                    launch: Launch = DEFAULT_LAUNCH) -> None:
    """``kv_write_reference`` in one launch (k, v may be strided views, e.g. of a fused projection)."""
    if not supports(k_cache, v_cache, k, v) or rows.shape != k.shape[:2] or pos.shape != k.shape[:2]:
        raise OcriaError(f"kv_write kernel: k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}, caches "
                         f"{tuple(k_cache.shape)} {k_cache.dtype}: needs one dtype, [B, T, Hkv, D] rows of the "
                         f"caches' [S, Hkv, L, D], unit stride along D, rows/pos [B, T]")
    B, T, H, D = k.shape
    if B * T == 0:
        return
    bits = _BITS[k.element_size()]
    k_, v_, kc, vc = (t.view(bits) for t in (k, v, k_cache, v_cache))
    _kv_write_kernel[(B * T, H)](
        k_, v_, kc, vc, rows, pos, T, k_cache.shape[2], *k.stride()[:3], *v.stride()[:3], *rows.stride(),
        *pos.stride(), *k_cache.stride()[:3], *v_cache.stride()[:3],
        D=D, BD=triton.next_power_of_2(D), num_warps=1 if D <= 128 else 2, **pdl_args(k.device, launch),
    )  # fmt: skip
