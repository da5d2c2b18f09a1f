"""Decode GEMM plugin: the Triton kernel (CPU interpreter) against the fp32 product rounded once to bf16
and against ``F.linear``, both operand orders, bias, strided rows, batch invariance (a row's bits do not
depend on the row count or on the other rows), the op's fake implementation and its shape errors."""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
import triton
import triton.language as tl

from ocria.errors import OcriaError

if "ocria.plugins.decode_gemm.kernel" in sys.modules:  # decorated earlier without the interpreter
    importlib.reload(sys.modules["ocria.plugins.decode_gemm.kernel"])
from ocria.plugins.decode_gemm import (  # noqa: E402
    MAX_M,
    decode_gemm,
    decode_gemm_fp8,
    decode_gemm_fp8_fp32,
    decode_gemm_fp8_triton,
    decode_gemm_fp32,
    decode_gemm_norm,
    decode_gemm_norm_fp32,
    decode_gemm_norm_triton,
    decode_gemm_reference,
    decode_gemm_triton,
    default_config,
)
from ocria.plugins.policy import ALL_KERNELS, REFERENCE  # noqa: E402
from ocria.plugins.rms_norm.reference import add_rms_norm_reference, rms_norm_reference  # noqa: E402
from ocria.plugins.rounding import widen_e4m3  # noqa: E402

CONFIGS = {
    "columns": {"block_n": 16, "block_k": 64, "num_warps": 4, "num_stages": 2, "swap": False},
    "swap_ab": {"block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 3, "swap": True},
    # K = 320 in 3 splits of 128 (the last one masked) and in 2 of 192: partials summed by the last arrival
    "split_k3": {"block_n": 16, "block_k": 64, "num_warps": 4, "num_stages": 2, "swap": False, "split_k": 3},
    "split_k2_swap_ab": {"block_n": 32, "block_k": 64, "num_warps": 4, "num_stages": 2, "swap": True, "split_k": 2},
}


def _case(M=5, K=320, N=96, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=g) * K**-0.5).to(torch.bfloat16)
    b = torch.randn(N, generator=g).to(torch.bfloat16) if bias else None
    return x, w, b


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 units in the last place (same-sign values; the tests' outputs are not near 0)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@pytest.mark.parametrize("cfg", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("M,bias", [(1, False), (5, True), (16, False)])
def test_kernel_matches_fp32_product_rounded_once(cfg, M, bias):
    """K = 320 is not a multiple of either K tile: the last tile is masked."""
    x, w, b = _case(M=M, bias=bias, seed=M)
    got = decode_gemm_triton(x, w, b, config=CONFIGS[cfg])
    want = decode_gemm_fp32(x, w, b)
    assert got.shape == (M, 96) and got.dtype == torch.bfloat16
    ulps = _ulps(got, want)
    # fp32 sums in another order can cross a bf16 rounding boundary: at most 1 ulp, and rarely.
    assert int(ulps.max()) <= 1 and float((ulps > 0).float().mean()) < 0.05
    torch.testing.assert_close(got.float(), decode_gemm_reference(x, w, b).float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cfg", CONFIGS, ids=list(CONFIGS))
def test_rows_are_batch_invariant(cfg):
    """A row gives the same bits alone (M = 1), among 5 or among 16 rows, in any position and whatever
    the other rows hold."""
    x, w, b = _case(M=16, bias=True, seed=7)
    full = decode_gemm_triton(x, w, b, config=CONFIGS[cfg])
    five = decode_gemm_triton(x[:5], w, b, config=CONFIGS[cfg])
    assert torch.equal(five, full[:5])
    for m in (0, 3, 11, 15):
        assert torch.equal(decode_gemm_triton(x[m:m + 1], w, b, config=CONFIGS[cfg])[0], full[m])
    other = x.clone()
    other[1:] = torch.randn(15, x.shape[1]).to(torch.bfloat16) * 100
    assert torch.equal(decode_gemm_triton(other, w, b, config=CONFIGS[cfg])[0], full[0])
    assert torch.equal(decode_gemm_triton(x.flip(0), w, b, config=CONFIGS[cfg]).flip(0), full)


@pytest.mark.parametrize("cfg", ["columns", "split_k2_swap_ab"])
def test_more_than_16_rows_run_as_16_row_tiles_with_the_same_bits(cfg):
    """40 rows (three row tiles, the last one partial) through the kernel: each row has the bits it has alone,
    also with split-K, whose partials of every row tile are summed apart."""
    x, w, b = _case(M=40, bias=True, seed=11)
    full = decode_gemm_triton(x, w, b, config=CONFIGS[cfg])
    assert int(_ulps(full, decode_gemm_fp32(x, w, b)).max()) <= 1
    for m in (0, 17, 39):
        assert torch.equal(decode_gemm_triton(x[m:m + 1], w, b, config=CONFIGS[cfg])[0], full[m])
    q, scale = torch.randn(40, 320).to(torch.float8_e4m3fn), torch.rand(40, 1) + 0.5
    fp8 = decode_gemm_fp8_triton(q, w.to(torch.float8_e4m3fn), scale, torch.tensor(0.5), config=CONFIGS[cfg])
    for m in (5, 33):
        alone = decode_gemm_fp8_triton(q[m:m + 1], w.to(torch.float8_e4m3fn), scale[m:m + 1], torch.tensor(0.5),
                                       config=CONFIGS[cfg])  # fmt: skip
        assert torch.equal(alone[0], fp8[m])


def test_split_k_leaves_its_counters_at_zero_and_repeats_bit_for_bit():
    """The tile's last program resets its counter, so the next call (any shape) starts clean."""
    from ocria.plugins.splitk import _SCRATCH

    x, w, b = _case(M=4, bias=True, seed=3)
    first = decode_gemm_triton(x, w, b, config=CONFIGS["split_k3"])
    assert not _SCRATCH[x.device][1].any()
    wide = _case(M=2, K=640, N=160, seed=4)
    decode_gemm_triton(*wide, config=CONFIGS["split_k2_swap_ab"])
    assert not _SCRATCH[x.device][1].any()
    assert torch.equal(decode_gemm_triton(x, w, b, config=CONFIGS["split_k3"]), first)


def test_default_config_depends_on_the_weight_only_and_covers_the_columns():
    x, w, _ = _case(M=16, K=64, N=4128, seed=2)  # N > 4096: the wide-output config
    got = decode_gemm(x, w, policy=ALL_KERNELS)
    assert int(_ulps(got, decode_gemm_fp32(x, w)).max()) <= 1
    assert torch.equal(decode_gemm(x[9:10], w, policy=ALL_KERNELS)[0], got[9])
    assert default_config(4128, 64) != default_config(2048, 64)


def test_default_config_splits_long_k_of_narrow_outputs():
    x, w, _ = _case(M=3, K=4096, N=64, seed=7)  # N <= 4096, K >= 4096: the split-K default
    assert default_config(64, 4096)["split_k"] > 1
    got = decode_gemm(x, w, policy=ALL_KERNELS)
    assert int(_ulps(got, decode_gemm_fp32(x, w)).max()) <= 1
    assert torch.equal(decode_gemm(x[1:2], w, policy=ALL_KERNELS)[0], got[1])


def test_strided_rows_and_leading_dims():
    x, w, b = _case(M=6, K=128, N=48, seed=3, bias=True)
    wide = torch.zeros(6, 200, dtype=torch.bfloat16)
    wide[:, 40:168] = x
    strided = wide[:, 40:168]  # row stride 200, not K
    assert strided.stride(0) == 200
    want = decode_gemm(x, w, b, policy=ALL_KERNELS)
    assert torch.equal(decode_gemm(strided, w, b, policy=ALL_KERNELS), want)
    assert torch.equal(decode_gemm(x.reshape(2, 3, 128), w, b, policy=ALL_KERNELS), want.reshape(2, 3, 48))


def test_more_rows_take_the_reference_and_the_switch_off_is_f_linear():
    x, w, b = _case(M=MAX_M + 1, K=64, N=32, seed=4, bias=True)
    assert torch.equal(decode_gemm(x, w, b, policy=ALL_KERNELS), decode_gemm_reference(x, w, b))
    # a verify step's rows: the kernel, in 16-row tiles
    assert torch.equal(decode_gemm(x, w, b, policy=ALL_KERNELS.for_steps()), decode_gemm_triton(x, w, b))
    assert torch.equal(decode_gemm(x[:4], w, b, policy=REFERENCE), decode_gemm_reference(x[:4], w, b))
    assert torch.equal(decode_gemm(x[:4], w, b), decode_gemm_reference(x[:4], w, b))  # AUTO on CPU: reference


def test_empty_rows():
    _, w, _ = _case(K=64, N=32)
    assert decode_gemm(torch.empty(0, 64, dtype=torch.bfloat16), w, policy=ALL_KERNELS).shape == (0, 32)


@pytest.mark.parametrize("K,N,dtype,bias_shape,rows,match", [
    (72, 32, torch.bfloat16, None, 2, "multiples of 16"),
    (64, 40, torch.bfloat16, None, 2, "multiples of 16"),
    (64, 32, torch.float32, None, 2, "bf16 only"),
    (64, 32, torch.bfloat16, (31,), 2, "bias"),
])  # fmt: skip
def test_bad_shapes_are_refused(K, N, dtype, bias_shape, rows, match):
    x = torch.randn(rows, K).to(dtype)
    w = torch.randn(N, K).to(dtype)
    b = torch.randn(bias_shape).to(dtype) if bias_shape else None
    with pytest.raises(OcriaError, match=match):
        decode_gemm_triton(x, w, b)
    with pytest.raises(OcriaError, match="do not chain"):
        decode_gemm_triton(torch.randn(2, 48).to(torch.bfloat16), torch.randn(32, 64).to(torch.bfloat16))


def test_op_registration_and_fake():
    x, w, b = _case(M=3, K=64, N=32, seed=5, bias=True)
    torch.library.opcheck(torch.ops.ocria.decode_gemm.default, (x, w, b, False, 0))
    torch.library.opcheck(torch.ops.ocria.decode_gemm.default, (x, w, None, False, 0))
    from torch._subclasses.fake_tensor import FakeTensorMode

    x3 = x.reshape(1, 3, 64)
    with FakeTensorMode() as mode:
        out = torch.ops.ocria.decode_gemm(mode.from_tensor(x3), mode.from_tensor(w), None, False, 0)
    assert out.shape == (1, 3, 32) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("residual", [True, False], ids=["add_norm", "norm"])
@pytest.mark.parametrize("cfg", ["columns", "swap_ab"])
def test_norm_prologue_matches_its_math_and_the_separate_norm(cfg, residual):
    """decode_gemm_norm: s = x + residual exactly as PyTorch adds, the output bit for bit the fp32 math of
    ``decode_gemm_norm_fp32``, and within bf16 noise of the separate norm kernel's output fed to the GEMM."""
    x, w, _ = _case(M=5, seed=11)
    g = torch.Generator().manual_seed(12)
    r = torch.randn(x.shape, generator=g).to(torch.bfloat16) if residual else None
    nw = (torch.randn(x.shape[1], generator=g) * 0.3).to(torch.bfloat16)
    out, s = decode_gemm_norm_triton(x, r, nw, 1e-6, w, config=CONFIGS[cfg])
    want, s_want = decode_gemm_norm_fp32(x, r, nw, 1e-6, w)
    assert torch.equal(s, s_want) and int(_ulps(out, want).max()) <= 1
    h = add_rms_norm_reference(x, r, nw, 1e-6, 1.0)[1] if residual else rms_norm_reference(x, nw, 1e-6, 1.0)
    torch.testing.assert_close(out.float(), decode_gemm_reference(h, w).float(), rtol=2e-2, atol=2e-2)
    full = decode_gemm_norm_triton(torch.cat([x, x]), None if r is None else torch.cat([r, r]), nw, 1e-6, w,
                                   config=CONFIGS[cfg])[0]
    assert torch.equal(full[:5], out) and torch.equal(full[5:], out)  # rows stay batch invariant


def test_decoder_layers_fold_their_norms_into_the_input_projections(monkeypatch):
    """A bf16 decoder with fused projections and the kernels on: every input norm and post-attention norm
    runs inside its projection's GEMM (2 per layer), and the logits stay within bf16 noise of the
    separate norms."""
    from tiny_models import text_config

    from ocria.models import layers
    from ocria.models.config import TextConfig
    from ocria.models.text import TextModel

    torch.manual_seed(0)
    model = TextModel(TextConfig.from_dict(text_config(linear_num_value_heads=8)))
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight"):
            p.data.normal_(0, 0.3)  # zero-initialised norms would hide a wrong (1 + w)
    model = model.to(torch.bfloat16).eval()
    model.fuse_projections()
    embeds = torch.randn(1, 6, 32).to(torch.bfloat16)
    pos = torch.arange(6).expand(3, 1, 6)
    with torch.no_grad():
        plain = model(embeds, pos, policy=REFERENCE)[0]
        folded = []

        def counted(*args, **kwargs):
            out = decode_gemm_norm(*args, **kwargs)
            folded.append(out is not None)
            return out

        monkeypatch.setattr(layers, "decode_gemm_norm", counted)
        fused = model(embeds, pos, policy=ALL_KERNELS)[0]
    assert folded == [True] * 2 * model.cfg.num_hidden_layers
    assert float((fused.float() - plain.float()).abs().max() / plain.float().abs().max()) <= 3e-2


@pytest.mark.parametrize("cfg", ["columns", "split_k3"])
def test_fp32_output_is_the_unrounded_sum(cfg):
    """out_fp32 (the target's logits): the fp32 sums themselves, no bf16 rounding, rows batch invariant; the
    reference path gives fp32 too."""
    x, w, b = _case(M=16, seed=21, bias=True)
    got = decode_gemm(x, w, b, policy=ALL_KERNELS, out_fp32=True)
    exact = x.float() @ w.float().T + b.float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, got.to(torch.bfloat16).float())  # not rounded to bf16 on the way
    assert torch.equal(decode_gemm_triton(x[3:4], w, b, config=CONFIGS[cfg], out_fp32=True)[0],
                       decode_gemm_triton(x, w, b, config=CONFIGS[cfg], out_fp32=True)[3])
    ref = decode_gemm(x, w, b, policy=REFERENCE, out_fp32=True)
    assert ref.dtype == torch.float32 and torch.allclose(ref, exact, rtol=1e-5, atol=1e-5)
    assert torch.ops.ocria.decode_gemm.default(x.to("meta"), w.to("meta"), None, True, 0).dtype == torch.float32


def _fp8_case(M=5, K=320, N=96, seed=0, per_row=False, per_col=False):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(M, K, generator=g) * 40).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, generator=g) * 40).to(torch.float8_e4m3fn)
    q[0, :3] = torch.tensor([0.001953125, -0.0137, 448.0]).to(torch.float8_e4m3fn)  # a subnormal, the max
    sx = torch.rand(M, 1, generator=g) * 0.01 + 1e-3 if per_row else torch.tensor(0.0042)
    sw = torch.rand(N, generator=g) * 1e-3 + 1e-4 if per_col else torch.tensor(7.3e-4)
    return q, w, sx, sw


@pytest.mark.parametrize("cfg", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("per_row,per_col", [(False, False), (True, False), (False, True), (True, True)])
def test_fp8_kernel_matches_its_math(cfg, per_row, per_col):
    """FP8 form: E4M3 bytes decoded exactly, fp32 sums, both scales, one bf16 rounding (at most 1 ulp off the
    fp32 product summed in another order), and rows batch invariant."""
    q, w, sx, sw = _fp8_case(M=7, seed=3, per_row=per_row, per_col=per_col)
    b = torch.randn(96).to(torch.bfloat16)
    got = decode_gemm_fp8_triton(q, w, sx, sw, b, config=CONFIGS[cfg])
    want = decode_gemm_fp8_fp32(q, w, sx, sw, b)
    assert got.dtype == torch.bfloat16 and got.shape == (7, 96)
    assert int(_ulps(got, want).max()) <= 1 and float((_ulps(got, want) > 0).float().mean()) < 0.05
    one = decode_gemm_fp8_triton(q[4:5], w, sx[4:5] if per_row else sx, sw, b, config=CONFIGS[cfg])
    assert torch.equal(one[0], got[4])


def test_fp8_op_refuses_and_falls_back():
    q, w, sx, sw = _fp8_case(M=3, K=64, N=32, seed=1)
    assert decode_gemm_fp8(q, w, sx, sw) is None  # CPU tensors: the caller's dequantizing path
    assert decode_gemm_fp8(torch.cat([q] * 6), w, sx, sw, policy=ALL_KERNELS) is None  # 18 rows
    torch.testing.assert_close(decode_gemm_fp8(q, w, sx, sw, policy=ALL_KERNELS).float(),
                               decode_gemm_fp8_fp32(q, w, sx, sw).float(), rtol=1e-2, atol=1e-3)
    # the schema check multiplies the inputs, which float8 tensors cannot do on CPU: the fake one alone
    torch.library.opcheck(torch.ops.ocria.decode_gemm_fp8.default, (q, w, sx, sw, None, False, 0),
                          test_utils="test_faketensor")
    with pytest.raises(OcriaError, match="float8_e4m3fn x and weight"):
        decode_gemm_fp8_triton(q.float(), w, sx, sw)
    with pytest.raises(OcriaError, match="x_scale"):
        decode_gemm_fp8_triton(q, w, torch.ones(2), sw)


@triton.jit
def _widen_e4m3_kernel(b_ptr, y_ptr):
    i = tl.arange(0, 256)
    tl.store(y_ptr + i, widen_e4m3(tl.load(b_ptr + i)))


def test_widen_e4m3_decodes_every_byte_as_torch():
    """The shared E4M3 decode (the FP8 form here, the NVFP4 GEMM's block scales): all 256 bytes, signs,
    subnormals and NaN, exactly as PyTorch's float8_e4m3fn."""
    b = torch.arange(256, dtype=torch.uint8)
    y = torch.empty(256)
    _widen_e4m3_kernel[(1,)](b, y)
    want = b.view(torch.float8_e4m3fn).float()
    assert torch.equal(y.isnan(), want.isnan()) and int(want.isnan().sum()) == 2
    assert torch.equal(y[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))  # -0.0 too


def test_split_k_workspace_outlives_its_growth():
    """A CUDA graph captured with a workspace keeps writing to it when replayed: growing the workspace must leave
    the old one allocated (freed, it would be another tensor's memory by the replay)."""
    import gc
    import weakref

    from ocria.plugins.splitk import _SCRATCH, scratch

    dev = torch.device("cpu")
    ws, counters = scratch(dev, 64, 4)
    old = weakref.ref(ws), weakref.ref(counters)
    del ws, counters
    grown, _ = scratch(dev, _SCRATCH[dev][0].numel() + 64, 8)
    gc.collect()
    assert grown.numel() > 64 and all(ref() is not None for ref in old)
