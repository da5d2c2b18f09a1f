"""Fused RMSNorm plugin: the Triton kernel (CPU interpreter) against the PyTorch reference the model
layers use, for the zero-centred, the plain (drafter) and the gated norm, fp32 and bf16, strided inputs, and the
switch."""

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from ocria.errors import OcriaError
from ocria.plugins.policy import ALL_KERNELS, REFERENCE
from ocria.plugins.rms_norm import (
    add_plain_rms_norm,
    add_rms_norm,
    add_rms_norm_fp8,
    gated_rms_norm,
    gated_rms_norm_fp8,
    plain_rms_norm,
    rms_norm,
    rms_norm_rope,
)
from ocria.plugins.rms_norm.op import fp8_reference
from ocria.plugins.rms_norm.reference import (
    add_plain_rms_norm_reference,
    add_rms_norm_reference,
    gated_rms_norm_reference,
    plain_rms_norm_reference,
    rms_norm_reference,
    rms_norm_rope_reference,
)

if "ocria.plugins.rms_norm.kernel" in sys.modules:  # decorated earlier without the interpreter
    importlib.reload(sys.modules["ocria.plugins.rms_norm.kernel"])


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units of the last place between same-dtype tensors (bit patterns)."""
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    ia, ib = a.contiguous().view(view).long(), b.contiguous().view(view).long()
    sign = 1 << (15 if view == torch.int16 else 31)
    ia = torch.where(ia < 0, -(ia + sign), ia)  # sign-magnitude -> monotonic integers
    ib = torch.where(ib < 0, -(ib + sign), ib)
    return int((ia - ib).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 5, 64), (2, 1, 4, 96), (1, 1, 2048)])
def test_zero_centred_norm_matches_reference(dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = (torch.randn(shape[-1], generator=g) * 0.1).to(dtype)
    got = rms_norm(x, w, 1e-6, 1.0, policy=ALL_KERNELS)
    want = rms_norm_reference(x, w, 1e-6, 1.0)
    assert got.dtype == dtype and got.shape == x.shape
    assert _ulps_apart(got, want) <= (1 if dtype == torch.bfloat16 else 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gated_norm_matches_reference(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 64, generator=g).to(dtype)
    z = (torch.randn(2, 3, 4, 64, generator=g) * 4).to(dtype)
    w = (1 + torch.randn(64, generator=g) * 0.1).to(dtype)
    got = gated_rms_norm(x, z, w, 1e-6, policy=ALL_KERNELS)
    assert _ulps_apart(got, gated_rms_norm_reference(x, z, w, 1e-6)) <= (1 if dtype == torch.bfloat16 else 8)


def test_strided_rows_and_zero_rows():
    """q of gated attention is a column slice (every other head_dim block): read in place."""
    qg = torch.randn(2, 3, 4, 2 * 32, dtype=torch.bfloat16)
    q = qg.chunk(2, dim=-1)[0]
    w = torch.randn(32, dtype=torch.bfloat16) * 0.1
    assert not q.is_contiguous()
    assert _ulps_apart(rms_norm(q, w, 1e-6, 1.0, policy=ALL_KERNELS), rms_norm_reference(q, w, 1e-6, 1.0)) <= 1
    empty = torch.empty(0, 3, 32)
    assert rms_norm(empty, w.float(), 1e-6, 1.0, policy=ALL_KERNELS).shape == empty.shape


def test_switch_autograd_and_errors():
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.zeros(16, requires_grad=True)
    rms_norm(x, w, 1e-6, 1.0, policy=ALL_KERNELS).sum().backward()  # autograd takes the reference
    assert x.grad is not None and w.grad is not None
    with pytest.raises(OcriaError, match="widths must agree"):
        rms_norm(torch.randn(4, 16), torch.zeros(8), 1e-6, 1.0, policy=ALL_KERNELS)
    torch.library.opcheck(torch.ops.ocria.rms_norm.default, (torch.randn(3, 16), torch.randn(16), 1e-6, 1.0, 0))
    torch.library.opcheck(torch.ops.ocria.gated_rms_norm.default,
                          (torch.randn(3, 16), torch.randn(3, 16), torch.randn(16), 1e-6, 0))


def test_the_policy_reaches_every_norm_of_the_model():
    """The policy a forward is given reaches every norm of the text model (one ``ocria::`` norm launch per norm module
    with the kernels, none with the references), and the kernel path gives the reference's hidden states."""
    from torch.profiler import ProfilerActivity, profile

    from ocria.builder.presets import load_preset, random_models

    target, _ = random_models(load_preset("ocria-mini"), "cpu", torch.float32)
    norms = [m for m in target.text.modules() if "Norm" in type(m).__name__]
    assert len(norms) == 1 + 2 * 8 + 2 * 2 + 6  # final, 2 per layer, q/k per attention layer, gated per GDN layer
    ids = torch.randint(7, 500, (2, 9))
    pos = torch.arange(9).expand(3, 2, 9)
    out, launches = {}, {}
    for name, policy in (("reference", REFERENCE), ("kernels", ALL_KERNELS)):
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            out[name] = target.text(target.text.embed_tokens(ids), pos, capture=(1, 5), policy=policy)
        launches[name] = sum(e.name.startswith("ocria::") and "norm" in e.name for e in prof.events())
    assert launches == {"reference": 0, "kernels": len(norms)}
    (want, want_captured), (got, got_captured) = out["reference"], out["kernels"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for g, w in zip(got_captured, want_captured):  # layer outputs: the residual adds the norms fused
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_writes_the_sum_and_its_norm(dtype):
    """The residual add fused into the norm: the sum is PyTorch's add bit for bit, the norm within 1 ulp."""
    x = (torch.randn(5, 3, 96) * 3).to(dtype)
    r = torch.randn(5, 3, 96).to(dtype)
    w = (torch.randn(96) * 0.1).to(dtype)
    got_sum, got = add_rms_norm(x, r, w, 1e-6, 1.0, policy=ALL_KERNELS)
    want_sum, want = add_rms_norm_reference(x, r, w, 1e-6, 1.0)
    assert torch.equal(got_sum, x + r) and torch.equal(want_sum, x + r)
    assert _ulps_apart(got, want) <= (1 if dtype == torch.bfloat16 else 8)
    torch.library.opcheck(torch.ops.ocria.add_rms_norm.default, (x.float(), r.float(), w.float(), 1e-6, 1.0, 0))
    xb = x.bfloat16()  # under autocast the residual stream is fp32 and the branch bf16: PyTorch's promotion
    mixed_sum, mixed = add_rms_norm(xb, r.float(), w, 1e-6, 1.0, policy=ALL_KERNELS)
    want_mixed = add_rms_norm_reference(xb, r.float(), w, 1e-6, 1.0)[1]
    assert mixed_sum.dtype == torch.float32 and torch.equal(mixed, want_mixed)
    with pytest.raises(OcriaError, match="residual"):
        add_rms_norm(x, r[..., :64], w, 1e-6, 1.0, policy=ALL_KERNELS)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(64, 256), (2, 16, 4, 128), (1, 3, 2048)])
def test_plain_norm_matches_reference(dtype, shape):
    """The drafter's ``w * norm(x).to(x dtype)``. bf16 bound 2 ulps: where the fp32 norm (another summation
    order) rounds to the neighbouring bf16, that 1-ulp step times w (mantissa in [1, 2)) moves the product by
    less than 2 of its ulps; in practice nearly every element is bit-equal."""
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = (1 + torch.randn(shape[-1], generator=g) * 0.5).to(dtype)
    got = plain_rms_norm(x, w, 1e-6, policy=ALL_KERNELS)
    want = plain_rms_norm_reference(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    assert _ulps_apart(got, want) <= (2 if dtype == torch.bfloat16 else 8)
    if dtype == torch.bfloat16:
        assert float((got != want).float().mean()) <= 0.01
    # the chain rounds norm(x) to bf16 before the weight: a kernel that skipped that rounding would differ
    unrounded = (w.float() * torch.nn.functional.rms_norm(x.float(), (shape[-1],), eps=1e-6)).to(dtype)
    assert dtype == torch.float32 or not torch.equal(unrounded, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_plain_rms_norm_writes_the_sum_and_its_norm(dtype):
    x = (torch.randn(2, 16, 256) * 3).to(dtype)
    r = torch.randn(2, 16, 256).to(dtype)
    w = (1 + torch.randn(256) * 0.5).to(dtype)
    got_sum, got = add_plain_rms_norm(x, r, w, 1e-6, policy=ALL_KERNELS)
    want_sum, want = add_plain_rms_norm_reference(x, r, w, 1e-6)
    assert torch.equal(got_sum, x + r) and torch.equal(want_sum, x + r)
    assert _ulps_apart(got, want) <= (2 if dtype == torch.bfloat16 else 8)
    strided = torch.randn(2, 16, 2 * 256).to(dtype)[..., 256:]  # a column slice is read in place
    assert _ulps_apart(add_plain_rms_norm(strided, r, w, 1e-6, policy=ALL_KERNELS)[1],
                       add_plain_rms_norm_reference(strided, r, w, 1e-6)[1]) <= (2 if dtype == torch.bfloat16 else 8)
    torch.library.opcheck(torch.ops.ocria.add_plain_rms_norm.default, (x.float(), r.float(), w.float(), 1e-6, 0))
    torch.library.opcheck(torch.ops.ocria.plain_rms_norm.default, (x.float(), w.float(), 1e-6, 0))


def test_plain_norm_mixed_dtypes_and_autograd_take_the_reference():
    """fp32 w on bf16 x makes an fp32 product (PyTorch's promotion), which the kernel does not write: the
    reference runs; so does autograd. The kernel itself refuses the mixed product in one line."""
    x = torch.randn(4, 64).bfloat16()
    w = 1 + torch.randn(64) * 0.5
    got = plain_rms_norm(x, w, 1e-6, policy=ALL_KERNELS)
    assert got.dtype == torch.float32 and torch.equal(got, plain_rms_norm_reference(x, w, 1e-6))
    mixed_sum, mixed = add_plain_rms_norm(x, x.float(), w.bfloat16(), 1e-6, policy=ALL_KERNELS)
    assert mixed_sum.dtype == torch.float32 and torch.equal(mixed, plain_rms_norm_reference(x + x.float(),
                                                                                           w.bfloat16(), 1e-6))
    with pytest.raises(OcriaError, match="product"):
        torch.ops.ocria.plain_rms_norm(x, w, 1e-6, 0)
    xg, wg = torch.randn(4, 64, requires_grad=True), torch.ones(64, requires_grad=True)
    add_plain_rms_norm(xg, xg, wg, 1e-6, policy=ALL_KERNELS)[1].sum().backward()
    assert xg.grad is not None and wg.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("plain", [True, False], ids=["plain", "zero_centred"])
@pytest.mark.parametrize("rot", [128, 32], ids=["full", "partial"])
def test_norm_rope_matches_norm_then_models_rotary(dtype, plain, rot):
    """q/k norm + rotary in one launch against the models' own eager ops (``layers.apply_rotary``). The rotary
    part is exact: the kernel's output is the eager rotary of the kernel's own norm, bit for bit (the partner
    channel's norm is recomputed, each product rounded before the sum as PyTorch rounds it); so the only
    difference from the eager pair is the norm's (<= 2 bf16 ulps, rare; cancellation in the sum can make that
    more ulps of a small result, hence the absolute bound)."""
    from ocria.models.layers import apply_rotary

    g = torch.Generator().manual_seed(rot + plain)
    x = (torch.randn(2, 5, 3, 128, generator=g) * 3).to(dtype)  # [B, T, H, D]
    w = (1 + torch.randn(128, generator=g) * 0.5).to(dtype)
    ang = torch.rand(2, 5, rot // 2, generator=g) * 40
    cos, sin = torch.cat([ang, ang], -1).cos().to(dtype), torch.cat([ang, ang], -1).sin().to(dtype)
    norm = plain_rms_norm(x, w, 1e-6) if plain else rms_norm(x, w, 1e-6, 1.0)
    want = apply_rotary(norm, cos[:, :, None], sin[:, :, None])
    assert torch.equal(rms_norm_rope_reference(x, w, cos, sin, 1e-6, 1.0, plain), want)
    got = rms_norm_rope(x, w, cos, sin, 1e-6, 1.0, plain, policy=ALL_KERNELS)
    assert got.dtype == dtype and got.shape == x.shape
    kernel_norm = (plain_rms_norm(x, w, 1e-6, policy=ALL_KERNELS) if plain
                   else rms_norm(x, w, 1e-6, 1.0, policy=ALL_KERNELS))
    assert torch.equal(got, apply_rotary(kernel_norm, cos[:, :, None], sin[:, :, None]))
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 2**-7,
                               atol=1e-5 if dtype == torch.float32 else 2**-6)
    assert dtype == torch.float32 or float((got != want).float().mean()) <= 0.01
    strided = torch.randn(2, 5, 3, 256).to(dtype)[..., 128:]  # e.g. q of gated attention, read in place
    strided_norm = (plain_rms_norm(strided, w, 1e-6, policy=ALL_KERNELS) if plain
                    else rms_norm(strided, w, 1e-6, 1.0, policy=ALL_KERNELS))
    assert torch.equal(rms_norm_rope(strided, w, cos, sin, 1e-6, 1.0, plain, policy=ALL_KERNELS),
                       apply_rotary(strided_norm, cos[:, :, None], sin[:, :, None]))
    fused = torch.randn(2, 5, 3 * 128 + 200).to(dtype)  # k of a fused q/k/v GEMM: token stride 584, head 128
    split = fused[..., 72:72 + 3 * 128].view(2, 5, 3, 128)
    split_norm = plain_rms_norm(split, w, 1e-6, policy=ALL_KERNELS) if plain else rms_norm(split, w, 1e-6, 1.0,
                                                                                           policy=ALL_KERNELS)
    assert torch.equal(rms_norm_rope(split, w, cos, sin, 1e-6, 1.0, plain, policy=ALL_KERNELS),
                       apply_rotary(split_norm, cos[:, :, None], sin[:, :, None]))
    torch.library.opcheck(torch.ops.ocria.rms_norm_rope.default,
                          (x.float(), w.float(), cos.float(), sin.float(), 1e-6, 1.0, plain, 0))


def test_norm_rope_shapes_and_fallbacks():
    x, w = torch.randn(2, 5, 3, 64), torch.ones(64)
    cos, sin = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    with pytest.raises(OcriaError, match="rope needs"):
        rms_norm_rope(x, w, cos[:, :4], sin[:, :4], 1e-6, plain=True, policy=ALL_KERNELS)
    with pytest.raises(OcriaError, match="rope needs"):
        rms_norm_rope(x, w, cos[..., :63], sin[..., :63], 1e-6, plain=True, policy=ALL_KERNELS)
    half = rms_norm_rope(x, w, cos.bfloat16(), sin.bfloat16(), 1e-6, plain=True, policy=ALL_KERNELS)  # promoted
    assert half.dtype == torch.float32
    assert torch.equal(half, rms_norm_rope_reference(x, w, cos.bfloat16(), sin.bfloat16(), 1e-6, 0.0, True))
    xg = x.clone().requires_grad_()
    rms_norm_rope(xg, w, cos, sin, 1e-6, plain=True, policy=ALL_KERNELS).sum().backward()  # autograd: reference
    assert xg.grad is not None


def _fp8_bytes(t: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes with every NaN as one pattern (a NaN's sign carries nothing)."""
    b = t.view(torch.uint8)
    return torch.where((b & 0x7F) == 0x7F, torch.full_like(b, 0x7F), b)


def _same_fp8(got: tuple, want: tuple) -> None:
    assert got[0].dtype == torch.float8_e4m3fn and got[0].shape == want[0].shape
    assert torch.equal(_fp8_bytes(got[0]), _fp8_bytes(want[0]))
    if want[1] is None:
        assert got[1] is None
    else:
        assert got[1].shape == want[1].shape and torch.equal(got[1].nan_to_num(-1.0), want[1].nan_to_num(-1.0))


FP8_MODES = [("fp8_dynamic", None), ("fp8_static", torch.tensor([0.004]))]


@pytest.mark.parametrize("mode, scale", FP8_MODES, ids=["per_token", "static"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_add_rms_norm_fp8_writes_the_quantized_output(dtype, mode, scale):
    """The FP8 bytes (and per-token scales) are ModelOpt's quantization of the y the same launch writes, which is
    add_rms_norm's y; a NaN row, a zero row and a masked tail (96 of 128 columns) included."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 5, 96, generator=g) * 3).to(dtype)
    r = torch.randn(2, 5, 96, generator=g).to(dtype)
    x[0, 1, 7] = float("nan")
    x[1, 2], r[1, 2] = 0.0, 0.0
    w = (torch.randn(96, generator=g) * 0.1).to(dtype)
    s, y, q, tokens = add_rms_norm_fp8(x, r, w, 1e-6, 1.0, mode, scale, policy=ALL_KERNELS)
    s_plain, y_plain = add_rms_norm(x, r, w, 1e-6, 1.0, policy=ALL_KERNELS)
    assert torch.equal(s.nan_to_num(), s_plain.nan_to_num()) and torch.equal(y.nan_to_num(), y_plain.nan_to_num())
    _same_fp8((q, tokens), fp8_reference(y, mode, scale))
    ref = add_rms_norm_fp8(x, r, w, 1e-6, 1.0, mode, scale, policy=REFERENCE)
    _same_fp8(ref[2:], fp8_reference(ref[1], mode, scale))


@pytest.mark.parametrize("mode, scale", FP8_MODES, ids=["per_token", "static"])
@pytest.mark.parametrize("heads", [4, 1, 3], ids=["kernel", "kernel_one_head", "reference_for_3_heads"])
def test_gated_rms_norm_fp8_quantizes_each_token_over_its_heads(heads, mode, scale):
    """x [B, T, H, D]: one FP8 scale per token over its H * D values (the out_projection's input row)."""
    from ocria.plugins.rms_norm.kernel import rms_norm_fp8_triton

    g = torch.Generator().manual_seed(heads)
    x = torch.randn(2, 3, heads, 64, generator=g).to(torch.bfloat16)
    z = (torch.randn(2, 3, heads, 64, generator=g) * 4).to(torch.bfloat16)
    x[1, 0, heads - 1, 5] = float("nan")
    w = (1 + torch.randn(64, generator=g) * 0.1).to(torch.bfloat16)
    q, tokens = gated_rms_norm_fp8(x, z, w, 1e-6, mode, scale, policy=ALL_KERNELS)
    assert q.shape == (2, 3, heads * 64) and (tokens is None if mode == "fp8_static" else tokens.shape == (2, 3, 1))
    if heads & (heads - 1) == 0:
        y, *fp8 = rms_norm_fp8_triton(x, w, 1e-6, mode, scale, z=z)
        assert torch.equal(y.nan_to_num(), gated_rms_norm(x, z, w, 1e-6, policy=ALL_KERNELS).nan_to_num())
        _same_fp8(tuple(fp8), fp8_reference(y, mode, scale, gated=True))
        _same_fp8((q, tokens), tuple(fp8))
    else:
        _same_fp8((q, tokens), fp8_reference(gated_rms_norm_reference(x, z, w, 1e-6), mode, scale, gated=True))


def test_fp8_norm_ops_pass_opcheck_and_refuse_bad_modes():
    from ocria.plugins.rms_norm.kernel import rms_norm_fp8_triton

    x, r = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(3, 64, dtype=torch.bfloat16)
    w = torch.zeros(64, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.ocria.add_rms_norm_fp8.default, (x, r, w, 1e-6, 1.0, "fp8_dynamic", None, 0),
                          test_utils="test_faketensor")
    xh, zh = torch.randn(2, 4, 32, dtype=torch.bfloat16), torch.randn(2, 4, 32, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.ocria.gated_rms_norm_fp8.default,
                          (xh, zh, torch.ones(32, dtype=torch.bfloat16), 1e-6, "fp8_static", torch.tensor([0.1]), 0),
                          test_utils="test_faketensor")
    with pytest.raises(OcriaError, match="FP8 output mode"):
        rms_norm_fp8_triton(x, w, 1e-6, "fp8_static", None, residual=r)
    with pytest.raises(OcriaError, match="power of two"):
        rms_norm_fp8_triton(torch.randn(2, 3, 32), torch.ones(32), 1e-6, "fp8_dynamic", None, z=torch.randn(2, 3, 32))
