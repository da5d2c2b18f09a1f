"""Decode attention plugin: the Triton kernel (CPU interpreter) against the gather + SDPA reference,
and the same result for a token decoded alone or inside a verify block."""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from ocria.errors import OcriaError
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.decode_attention.reference import decode_attention_reference

if "ocria.plugins.decode_attention.kernel" in sys.modules:  # decorated earlier without the interpreter
    importlib.reload(sys.modules["ocria.plugins.decode_attention.kernel"])
from ocria.plugins.decode_attention.kernel import decode_attention_triton  # noqa: E402


def _case(B=3, H=4, Hkv=2, T=5, D=32, S=5, L=80, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g).to(dtype).transpose(1, 2)  # [B, H, T, D] view, as the layers pass it
    k = torch.randn(S, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(S, Hkv, L, D, generator=g).to(dtype)
    slots = torch.randperm(S, generator=g)[:B]
    start = torch.randint(0, L - T - 8, (B,), generator=g, dtype=torch.int32)
    return q, k, v, slots, start


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("H,Hkv,T,D,causal", [(4, 2, 5, 32, True), (4, 4, 1, 64, True), (8, 2, 16, 32, True),
                                              (4, 1, 16, 48, False)])
def test_kernel_matches_reference(dtype, H, Hkv, T, D, causal):
    q, k, v, slots, start = _case(H=H, Hkv=Hkv, T=T, D=D, dtype=dtype, seed=H + T + D)
    attn_len = int(start.max()) + T + 5  # past every row's last key: masked, not read
    got = decode_attention(q, k, v, slots, start, attn_len, D**-0.5, causal, use_kernel=True)
    want = decode_attention_reference(q, k, v, slots, start, attn_len, D**-0.5, causal)
    assert got.shape == want.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_a_token_gets_the_same_result_alone_or_in_a_block():
    """Row t of a T=16 verify equals decoding that token alone with start + t: same tile, same loop
    (the interpreter's matmul may still round a row differently by its position: 1 ulp seen)."""
    q, k, v, slots, start = _case(T=16, seed=3)
    block = decode_attention_triton(q, k, v, slots, start, 200, 0.2)
    for t in (0, 7, 15):
        alone = decode_attention_triton(q[:, :, t:t + 1], k, v, slots, start + t, 200, 0.2)
        torch.testing.assert_close(alone[:, :, 0], block[:, :, t], rtol=1e-6, atol=1e-6)


def test_long_chunks_take_the_reference_and_bad_shapes_are_refused():
    q, k, v, slots, start = _case(T=20, seed=4)
    torch.testing.assert_close(decode_attention(q, k, v, slots, start, 80, 0.2, use_kernel=True),
                               decode_attention_reference(q, k, v, slots, start, 80, 0.2))
    with pytest.raises(OcriaError, match="T <= 16"):
        decode_attention_triton(q, k, v, slots, start, 80, 0.2)
    q, k, v, slots, start = _case(T=4, seed=5)
    torch.library.opcheck(torch.ops.ocria.decode_attention.default, (q, k, v, slots, start, 40, 0.2, True))
