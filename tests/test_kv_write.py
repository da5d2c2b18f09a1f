"""KV-cache write plugin: the one-launch Triton kernel (CPU interpreter) against the two indexed assignments,
for strided k/v views, several dtypes, expanded slot rows, and positions past the cache left unwritten."""

import pytest
import torch

from ocria.errors import OcriaError
from ocria.models.attention import cache_index
from ocria.plugins.kv_write import kv_write, kv_write_reference
from ocria.plugins.kv_write.kernel import kv_write_triton
from ocria.plugins.policy import ALL_KERNELS


def _case(dtype: torch.dtype, B=3, T=4, H=2, D=24, S=5, L=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, T, 3 * H * D, generator=g).to(dtype)  # k and v as column slices of a fused projection
    k, v = (fused[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D) for i in (1, 2))
    caches = [torch.randn(S, H, L, D, generator=g).to(dtype) for _ in range(2)]
    slots = torch.tensor([4, 0, 2])[:B]
    start = torch.tensor([0, 7, L - T])[:B]
    return k, v, caches, slots, start


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_kernel_writes_what_the_indexed_assignments_write(dtype):
    k, v, (kc, vc), slots, start = _case(dtype)
    assert k.stride(1) == 3 * k.shape[2] * k.shape[3]  # a view into the fused projection, not contiguous
    want_k, want_v = kc.clone(), vc.clone()
    rows, pos = cache_index(slots, start, k.shape[1])  # rows: an expanded view (stride 0 along T)
    kv_write_reference(want_k, want_v, k, v, rows, pos)
    kv_write(kc, vc, k, v, rows, pos, policy=ALL_KERNELS)
    assert torch.equal(kc.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), want_v.view(torch.uint8))


def test_positions_past_the_cache_are_not_written():
    k, v, (kc, vc), slots, start = _case(torch.float32)
    before = kc.clone(), vc.clone()
    rows, pos = cache_index(slots, start + kc.shape[2], k.shape[1])
    kv_write_triton(kc, vc, k, v, rows, pos)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_mixed_dtypes_take_the_reference_and_the_kernel_refuses_them():
    k, v, (kc, vc), slots, start = _case(torch.float32)
    rows, pos = cache_index(slots, start, k.shape[1])
    kb, vb = k.to(torch.bfloat16), v.to(torch.bfloat16)
    want_k, want_v = kc.clone(), vc.clone()
    kv_write_reference(want_k, want_v, kb, vb, rows, pos)
    kv_write(kc, vc, kb, vb, rows, pos, policy=ALL_KERNELS)  # bf16 rows into fp32 caches: the reference casts
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    with pytest.raises(OcriaError, match="kv_write kernel"):
        kv_write_triton(kc, vc, kb, vb, rows, pos)
