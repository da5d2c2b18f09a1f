"""Decode attention plugin: the Triton kernel (CPU interpreter) against the gather + SDPA reference,
in one chunk and split-KV over several (ragged contexts, GQA 1-4, T=1 and 16, causal and block masks),
and the same result for a token decoded alone or inside a verify block."""

import importlib
import os
import sys
from dataclasses import replace

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from ocria.errors import OcriaError
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.decode_attention.reference import decode_attention_reference
from ocria.plugins.policy import ALL_KERNELS

if "ocria.plugins.decode_attention.kernel" in sys.modules:  # decorated earlier without the interpreter
    importlib.reload(sys.modules["ocria.plugins.decode_attention.kernel"])
from ocria.plugins.decode_attention import op as op_module  # noqa: E402
from ocria.plugins.decode_attention.kernel import decode_attention_triton, split_count  # noqa: E402


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
    got = decode_attention(q, k, v, slots, start, attn_len, D**-0.5, causal, policy=ALL_KERNELS)
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


def test_a_batch_invariant_step_chunks_by_length_only(monkeypatch):
    """Under ``policy.for_steps()``: 32-key chunks whatever the batch or length bound, always combined. A
    row's bits do not depend on the other rows or on how many chunks the launch has (35 here, three groups of the
    combine, against fewer for a batch of one whose bound is its own context), and a token alone agrees
    with its row in the block (up to the interpreter's matmul, which may round a row by its position). On an
    H200's 132 SMs the per-shape chunking (a policy without batch invariance) cuts a batch of three into 64-key
    chunks and a sequence alone into smaller ones, and the rows differ."""
    monkeypatch.setitem(op_module.decode_attention_triton.__globals__, "sm_count", lambda device: 132)
    q, k, v, slots, start = _case(T=16, L=1100, seed=5)

    def alone_equals_block(policy) -> tuple[torch.Tensor, list[bool]]:
        step = policy.for_steps()
        block = decode_attention(q, k, v, slots, start, 1100, 0.2, policy=step)
        ones = [decode_attention(q[b:b + 1], k, v, slots[b:b + 1], start[b:b + 1], int(start[b]) + 16, 0.2,
                                 policy=step)[0] for b in range(3)]  # fmt: skip
        return block, [torch.equal(one, block[b]) for b, one in enumerate(ones)]

    block, same = alone_equals_block(ALL_KERNELS)
    assert all(same)
    assert not all(alone_equals_block(replace(ALL_KERNELS, batch_invariant=False))[1])
    for t in (0, 9, 15):
        alone = decode_attention(q[:, :, t:t + 1], k, v, slots, start + t, 1100, 0.2, policy=ALL_KERNELS.for_steps())
        torch.testing.assert_close(alone[:, :, 0], block[:, :, t], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(block, decode_attention_reference(q, k, v, slots, start, 1100, 0.2), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_long_chunks_take_the_reference_and_bad_shapes_are_refused():
    q, k, v, slots, start = _case(T=20, seed=4)
    torch.testing.assert_close(decode_attention(q, k, v, slots, start, 80, 0.2, policy=ALL_KERNELS),
                               decode_attention_reference(q, k, v, slots, start, 80, 0.2))
    with pytest.raises(OcriaError, match="T <= 16"):
        decode_attention_triton(q, k, v, slots, start, 80, 0.2)
    q, k, v, slots, start = _case(T=4, seed=5)
    torch.library.opcheck(torch.ops.ocria.decode_attention.default, (q, k, v, slots, start, 40, 0.2, True, 0))
    with pytest.raises(OcriaError, match="attn_len 0"):
        decode_attention_triton(q, k, v, slots, start, 0, 0.2)


def _ragged(H, Hkv, T, D=32, L=200, dtype=torch.float32, seed=0):
    """Four rows over a 200-key cache: a zero prefix, a context shorter than one chunk, one ending on a
    64-key boundary, and a full one; slots shuffled among six."""
    q, k, v, slots, _ = _case(B=4, H=H, Hkv=Hkv, T=T, D=D, S=6, L=L, dtype=dtype, seed=seed)
    start = torch.tensor([0, 9, 128 - T, L - T], dtype=torch.int32)
    return q, k, v, slots, start


@pytest.mark.parametrize("H,Hkv,T,causal,splits,dtype", [
    (4, 4, 1, True, 5, "fp32"), (4, 4, 1, True, 5, "bf16"), (4, 2, 16, True, 3, "fp32"), (3, 1, 16, True, 5, "bf16"),
    (4, 1, 16, False, 5, "fp32"), (4, 1, 1, True, 9, "fp32"), (2, 1, 16, False, 2, "bf16")])
def test_split_kv_matches_reference(H, Hkv, T, causal, splits, dtype):
    dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    q, k, v, slots, start = _ragged(H, Hkv, T, dtype=dtype, seed=H * T + splits)
    got = decode_attention_triton(q, k, v, slots, start, 200, 32**-0.5, causal, num_splits=splits)
    want = decode_attention_reference(q, k, v, slots, start, 200, 32**-0.5, causal)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_one_chunk_and_split_agree_and_a_token_is_the_same_alone_or_in_a_block_when_split():
    q, k, v, slots, start = _ragged(2, 1, 16, D=48, seed=7)
    one = decode_attention_triton(q, k, v, slots, start, 200, 0.2, num_splits=1)
    block = decode_attention_triton(q, k, v, slots, start, 200, 0.2, num_splits=4)
    torch.testing.assert_close(block, one, rtol=1e-5, atol=1e-5)
    for t in (0, 15):
        alone = decode_attention_triton(q[:, :, t:t + 1], k, v, slots, start + t, 200, 0.2, num_splits=4)
        torch.testing.assert_close(alone[:, :, 0], block[:, :, t], rtol=1e-6, atol=1e-6)


def test_split_count_fills_one_wave_and_keeps_one_chunk_for_big_batches():
    assert split_count(2, 4096, 132) == 64  # B=1, 2 KV heads: capped at MAX_SPLITS
    assert split_count(2, 300, 132) == 10  # short context: no chunk under 32 keys
    assert split_count(16, 4096, 132) == 8  # B=8
    assert split_count(64, 4096, 132) == 2  # B=32
    assert split_count(128, 4096, 132) == split_count(2, 20, 132) == split_count(512, 4096, 132) == 1


def test_the_op_splits_on_a_wide_gpu(monkeypatch):
    """With an H200's 132 SMs a batch-1 call takes the split path through the registered op."""
    monkeypatch.setitem(op_module.decode_attention_triton.__globals__, "sm_count", lambda device: 132)
    q, k, v, slots, _ = _case(B=1, H=8, Hkv=2, T=2, L=140, seed=8)
    start = torch.tensor([120], dtype=torch.int32)
    assert split_count(2, 130, 132) == 5
    got = decode_attention(q, k, v, slots, start, 130, 0.2, policy=ALL_KERNELS)
    torch.testing.assert_close(got, decode_attention_reference(q, k, v, slots, start, 130, 0.2), rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.ocria.decode_attention.default, (q, k, v, slots, start, 130, 0.2, True, 0))
