"""Quantized linear execution on CPU: the NVFP4 Triton GEMM (interpreter) against dequantize +
fp32 matmul, and QuantLinear on exported ModelOpt tensors (bf16 / FP8 / NVFP4, fused MLP)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

from dataclasses import replace

import pytest
import torch

from ocria.errors import CheckpointError
from ocria.models.quantized.linear import QuantLinear, detect_format, mlp_forward
from ocria.plugins import numerics as nx
from ocria.plugins.fp4_gemm import nvfp4_gemm, nvfp4_gemm_reference
from ocria.plugins.fp4_gemm.gemv import nvfp4_gemv_launch
from ocria.plugins.fp4_gemm.kernel import default_config, nvfp4_gemm_triton
from ocria.plugins.policy import ALL_KERNELS, DEFAULT_LAUNCH, Launch
from ocria.plugins.silu_quant import silu_mul


def _nvfp4_weight(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05 * torch.exp2(torch.randint(-3, 3, (n, 1), generator=g).float())
    w[0, :16] = 0  # zero block: scale 1.0
    gs = nx.nvfp4_global_scale(w.abs().amax())
    packed, scales = nx.quantize_nvfp4(w, gs)
    return packed, scales, gs


@pytest.mark.parametrize("m,n,k", [(1, 32, 64), (5, 48, 512), (17, 40, 80), (40, 130, 272), (20, 4112, 48),
                                   (40, 4112, 48), (80, 64, 48)])
def test_nvfp4_gemm_kernel_matches_dequantized_fp32_matmul(m, n, k):
    """Each default tile class: M <= 16, 17..64 rows with narrow and wide outputs, more rows."""
    packed, scales, gs = _nvfp4_weight(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = nvfp4_gemm_triton(x, packed, scales, gs)
    ref = nvfp4_gemm_reference(x, packed, scales, gs)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    torch.testing.assert_close(got.float(), ref.float(), rtol=8e-3, atol=1e-3 * ref.float().abs().max().item())


def test_nvfp4_gemm_small_tiles_and_leading_dims():
    packed, scales, gs = _nvfp4_weight(64, 256, seed=2)
    x = torch.randn(2, 3, 256).to(torch.bfloat16)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64}
    got = nvfp4_gemm_triton(x, packed, scales, gs, cfg)
    torch.testing.assert_close(got.float(), nvfp4_gemm_reference(x, packed, scales, gs).float(), rtol=8e-3, atol=1e-3)
    # (opcheck's schema test cannot clone float8 inputs on CPU; the fake impl is what graphs need)
    torch.library.opcheck(torch.ops.ocria.nvfp4_gemm.default, (x, packed, scales, gs, 0),
                          test_utils="test_faketensor")
    torch.testing.assert_close(nvfp4_gemm(x, packed, scales, gs, policy=ALL_KERNELS), got)


@pytest.mark.parametrize("slices", [2, 3])
def test_nvfp4_gemm_k_slices_reduce_in_the_launch(slices):
    """K cut into slices over programs (320 = 128 + 128 + 64 at three), summed in slice order by the last to
    arrive: the reference's result, each row alone the same bits as inside the block, counters left at zero."""
    from ocria.plugins.splitk import _SCRATCH

    packed, scales, gs = _nvfp4_weight(48, 320, seed=3)
    x = torch.randn(5, 320, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "SLICES": slices}
    got = nvfp4_gemm_triton(x, packed, scales, gs, cfg)
    ref = nvfp4_gemm_reference(x, packed, scales, gs)
    torch.testing.assert_close(got.float(), ref.float(), rtol=8e-3, atol=1e-3 * ref.float().abs().max().item())
    assert not _SCRATCH[x.device][1].any()
    assert torch.equal(nvfp4_gemm_triton(x[3:4], packed, scales, gs, cfg)[0], got[3])
    assert torch.equal(nvfp4_gemm_triton(x, packed, scales, gs, cfg), got)


@pytest.mark.parametrize("n,k,cfg", [
    (40, 1040, None),  # the short-K default (8 rows, 1024-wide tiles, no prefetch) with a K tail
    (24, 4160, None),  # the long-K default: prefetch, 1024-wide tiles, a K tail
    (24, 4096, None),  # prefetch with 2048-wide tiles and no tail (the last tile's prefetch rereads it)
    (20, 384, {"BLOCK_N": 4, "BLOCK_K": 128, "num_warps": 1, "PREFETCH": True}),
])
def test_nvfp4_gemv_for_one_row_matches_the_reference(n, k, cfg):
    """M = 1 runs the CUDA-core GEMV: the dequantized fp32 matmul within one bf16 rounding, with a zero, subnormal,
    negative and NaN block scale in the weight (NaN in exactly that output)."""
    packed, scales, gs = _nvfp4_weight(n, k, seed=5)
    bits = scales.view(torch.uint8)
    bits[1, 0], bits[2, 1], bits[3, 2], bits[n - 1, -1] = 0x01, 0x00, 0xB8, 0x7F
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    ref = nvfp4_gemm_reference(x, packed, scales, gs).float()
    if cfg is None:
        got = nvfp4_gemm_triton(x, packed, scales, gs).float()
    else:
        y = torch.empty(1, n, dtype=torch.bfloat16)
        nvfp4_gemv_launch(x, packed, scales, gs.reshape(1), y, False, {"PDL": False}, cfg)
        got = y.float()
    assert torch.equal(got.isnan(), ref.isnan()) and ref[0, n - 1].isnan()
    ok = ~ref.isnan()
    torch.testing.assert_close(got[ok], ref[ok], rtol=8e-3, atol=1e-3 * ref[ok].abs().max().item())


def test_nvfp4_gemv_runs_for_one_row_unless_set_aside(monkeypatch):
    """M = 1 launches the GEMV; more rows, an explicit tile config or the ``nvfp4_gemv`` path disabled launch the
    tensor-core kernel."""
    from ocria.plugins.fp4_gemm import kernel

    launches = []
    monkeypatch.setattr(kernel, "nvfp4_gemv_launch", lambda *a, **kw: launches.append(nvfp4_gemv_launch(*a, **kw)))
    packed, scales, gs = _nvfp4_weight(48, 1024, seed=7)
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    one = nvfp4_gemm_triton(x[:1], packed, scales, gs)
    assert len(launches) == 1
    two = nvfp4_gemm_triton(x, packed, scales, gs)
    mma = nvfp4_gemm_triton(x[:1], packed, scales, gs, default_config(1, 48))
    assert torch.equal(nvfp4_gemm_triton(x[:1], packed, scales, gs, launch=DEFAULT_LAUNCH & ~Launch.NVFP4_GEMV), mma)
    assert len(launches) == 1
    torch.testing.assert_close(one.float(), two[:1].float(), rtol=8e-3, atol=1e-3 * two.float().abs().max().item())


def test_nvfp4_rows_are_batch_invariant_in_a_verify_step(monkeypatch):
    """In a batch-invariant step (``Launch.INVARIANT``): no GEMV for one row and the 16-row tiles at every M (40 rows
    are three row tiles), so each row has the same bits alone or among 40, whose own default would be 64-row tiles."""
    from ocria.plugins.fp4_gemm import kernel

    monkeypatch.setattr(kernel, "nvfp4_gemv_launch", lambda *a, **kw: pytest.fail("GEMV in a batch-invariant step"))
    packed, scales, gs = _nvfp4_weight(80, 48, seed=9)
    x = torch.randn(40, 48, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    assert default_config(40, 80)["BLOCK_M"] != default_config(1, 80)["BLOCK_M"]
    step = ALL_KERNELS.for_steps().launch
    full = nvfp4_gemm_triton(x, packed, scales, gs, launch=step)
    for m in (0, 21, 39):
        assert torch.equal(nvfp4_gemm_triton(x[m:m + 1], packed, scales, gs, launch=step)[0], full[m])
    torch.testing.assert_close(full.float(), nvfp4_gemm_reference(x, packed, scales, gs).float(), rtol=8e-3,
                               atol=1e-3 * full.float().abs().max().item())  # fmt: skip


def test_nvfp4_gemm_rejects_mismatched_weight():
    packed, scales, gs = _nvfp4_weight(32, 64)
    with pytest.raises(ValueError, match="do not match"):
        nvfp4_gemm_triton(torch.randn(2, 128).to(torch.bfloat16), packed, scales, gs)
    with pytest.raises(ValueError, match="SLICES=0"):
        nvfp4_gemm_triton(torch.randn(2, 64).to(torch.bfloat16), packed, scales, gs,
                          {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "SLICES": 0})


mtq = pytest.importorskip("modelopt.torch.quantization")
quant_utils = pytest.importorskip("modelopt.torch.export.quant_utils")


def _export(linear: torch.nn.Linear, fmt: str) -> dict[str, torch.Tensor]:
    """The tensors ModelOpt's unified exporter writes for one calibrated linear layer."""
    w = linear.weight.detach()
    ws = quant_utils.get_weight_scaling_factor(linear)
    ws2 = quant_utils.get_weight_scaling_factor_2(linear)
    out = {"weight": quant_utils.to_quantized_weight(w, ws, fmt, ws2, 16), "weight_scale": ws,
           "input_scale": quant_utils.get_activation_scaling_factor(linear)}
    if ws2 is not None:
        out["weight_scale_2"] = ws2
    return out


def _calibrated(cfg, n: int = 48, k: int = 64, seed: int = 0):
    torch.manual_seed(seed)
    lin = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False))
    x = torch.randn(16, k)
    mtq.quantize(lin, cfg, lambda mod: mod(x))
    return lin[0], x


def test_fp8_layer_from_modelopt_export_matches_fake_quant():
    lin, x = _calibrated(mtq.FP8_DEFAULT_CFG)
    tensors = _export(lin, "fp8")
    layer = QuantLinear.from_tensors(tensors)
    assert layer.fmt == "fp8" and layer.act_mode == "fp8_static"
    with torch.no_grad():
        expect = lin(x)  # ModelOpt's fake-quantized forward (input and weight quantizers)
    got = layer(x)
    torch.testing.assert_close(got, expect, rtol=2e-2, atol=2e-2 * expect.abs().max().item())
    # exact emulation: dequant(quant(x)) @ dequant(W)^T with our rounding
    xq = nx.dequantize_fp8(nx.quantize_fp8(x, tensors["input_scale"]), tensors["input_scale"], torch.float32)
    w = nx.dequantize_fp8(tensors["weight"], tensors["weight_scale"], torch.float32)
    torch.testing.assert_close(got, xq @ w.t(), rtol=0, atol=0)


def test_nvfp4_layer_dequantizes_like_modelopt_and_runs_weight_only():
    lin, x = _calibrated(mtq.NVFP4_DEFAULT_CFG)
    tensors = _export(lin, "nvfp4")
    layer = QuantLinear.from_tensors(tensors)
    assert layer.fmt == "nvfp4" and layer.in_features == 64 and layer.out_features == 48
    qt = nx.dequantize_nvfp4(tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"], torch.float32)
    mo = quant_utils.NVFP4QTensor((48, 64), torch.float32, tensors["weight"]).dequantize(
        torch.float32, scale=tensors["weight_scale"], double_scale=tensors["weight_scale_2"], block_sizes={-1: 16})
    assert torch.equal(qt, mo)
    torch.testing.assert_close(layer(x), x @ mo.t(), rtol=0, atol=0)
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(layer(xb, ALL_KERNELS).float(), xb.float() @ mo.t(), rtol=8e-3, atol=2e-3)  # Triton


def test_fp8_dynamic_layer_without_input_scale():
    torch.manual_seed(3)
    w = torch.randn(24, 32) * 0.1
    ws = (w.abs().amax() / 448).reshape(1)
    layer = QuantLinear.from_tensors({"proj.weight": nx.quantize_fp8(w, ws), "proj.weight_scale": ws}, "proj.")
    assert layer.act_mode == "fp8_dynamic" and layer.name == "proj"
    x = torch.randn(5, 32)
    q, s = nx.quantize_fp8_per_token(x)
    expect = (q.float() * s) @ nx.dequantize_fp8(layer.weight, ws, torch.float32).t()
    torch.testing.assert_close(layer(x), expect, rtol=0, atol=0)


def test_fp8_row_scale_for_scaled_mm_is_made_once():
    """Per-token activations need the weight scale as a [1, N] row: per-tensor and per-channel give the
    same row values, built on the first call and reused (no expand-and-copy kernel per step)."""
    w = torch.randn(24, 32) * 0.1
    per_tensor = QuantLinear("fp8", nx.quantize_fp8(w, torch.tensor([0.01])), weight_scale=torch.tensor([0.01]))
    per_channel = QuantLinear("fp8", nx.quantize_fp8(w, torch.tensor([0.01])), weight_scale=torch.full((24,), 0.01))
    row = per_tensor._row_weight_scale()
    assert row.shape == (1, 24) and row.is_contiguous() and per_tensor._row_weight_scale() is row
    assert torch.equal(row, per_channel._row_weight_scale())


def test_concat_fp8_with_different_scales_equals_separate_layers():
    torch.manual_seed(4)
    layers = []
    for scale_mul in (1.0, 3.0):
        w = torch.randn(16, 32) * 0.1 * scale_mul
        ws = (w.abs().amax() / 448).reshape(1)
        layers.append(QuantLinear("fp8", nx.quantize_fp8(w, ws), weight_scale=ws, input_scale=torch.tensor(0.02)))
    fused = QuantLinear.concat(layers)
    assert fused.weight_scale.shape == (32,)
    x = torch.randn(3, 32)
    torch.testing.assert_close(fused(x), torch.cat([lay(x) for lay in layers], dim=-1), rtol=0, atol=0)


def test_fp8_decode_rows_run_the_decode_gemm():
    """With the kernels on (the interpreter here; the default on CUDA), up to 16 rows of an FP8 layer are one
    decode-GEMM launch on the quantized input: per-token scales, a fused layer's per-channel weight scales."""
    from ocria.plugins.decode_gemm import decode_gemm_fp8_triton

    torch.manual_seed(6)
    layers = []
    for scale_mul in (1.0, 3.0):
        w = torch.randn(16, 32) * 0.1 * scale_mul
        ws = (w.abs().amax() / 448).reshape(1)
        layers.append(QuantLinear("fp8", nx.quantize_fp8(w, ws), weight_scale=ws))
    fused = QuantLinear.concat(layers)
    x = torch.randn(3, 32).to(torch.bfloat16)
    q, s = nx.quantize_fp8_per_token(x)
    got = fused(x, ALL_KERNELS)
    assert torch.equal(got, decode_gemm_fp8_triton(q, fused.weight, s, fused.weight_scale))
    # CPU default: the emulation, within bf16 rounding of it
    torch.testing.assert_close(got.float(), fused(x).float(), rtol=1e-2, atol=1e-2)


def test_mlp_forward_fp8_down_takes_fused_quantized_input():
    torch.manual_seed(5)
    hidden, inter = 32, 48
    gate_up = QuantLinear("bf16", (torch.randn(2 * inter, hidden) * 0.2).to(torch.bfloat16))
    w = torch.randn(hidden, inter) * 0.1
    ws, in_scale = (w.abs().amax() / 448).reshape(1), torch.tensor(0.01)
    down = QuantLinear("fp8", nx.quantize_fp8(w, ws), weight_scale=ws, input_scale=in_scale)
    x = torch.randn(4, hidden).to(torch.bfloat16)
    got = mlp_forward(x, gate_up, down)
    fused_silu = replace(ALL_KERNELS, disabled=frozenset({"decode_gemm_fp8"}))  # the layer's GEMM as before
    assert torch.equal(mlp_forward(x, gate_up, down, policy=fused_silu), got)  # fused SiLU-quant (interpreter)
    h = silu_mul(x @ gate_up.weight.t())
    hq = nx.dequantize_fp8(nx.quantize_fp8(h, in_scale), in_scale, torch.bfloat16)
    expect = hq @ nx.dequantize_fp8(down.weight, ws, torch.bfloat16).t()
    torch.testing.assert_close(got, expect, rtol=0, atol=0)


def test_mlp_forward_nvfp4_down_uses_bf16_activation():
    torch.manual_seed(6)
    gate_up = QuantLinear("bf16", (torch.randn(96, 32) * 0.2).to(torch.bfloat16))
    packed, scales, gs = _nvfp4_weight(32, 48, seed=6)
    down = QuantLinear("nvfp4", packed, weight_scale=scales, weight_scale_2=gs)
    x = torch.randn(3, 32).to(torch.bfloat16)
    expect = silu_mul(x @ gate_up.weight.t()) @ nx.dequantize_nvfp4(packed, scales, gs, torch.bfloat16).t()
    torch.testing.assert_close(mlp_forward(x, gate_up, down), expect, rtol=0, atol=0)


def test_bad_tensors_are_rejected():
    packed, scales, gs = _nvfp4_weight(32, 64)
    with pytest.raises(CheckpointError, match="weight_scale must be"):
        QuantLinear.from_tensors({"weight": packed, "weight_scale": scales[:, :2], "weight_scale_2": gs})
    with pytest.raises(CheckpointError, match="no weight"):
        detect_format({}, "x.")
    with pytest.raises(CheckpointError, match="scalar or"):
        QuantLinear.from_tensors({"weight": torch.zeros(4, 16, dtype=torch.float8_e4m3fn)})
    fp8 = QuantLinear("fp8", torch.zeros(4, 16, dtype=torch.float8_e4m3fn), weight_scale=torch.tensor(1.0))
    with pytest.raises(CheckpointError, match="cannot fuse"):
        QuantLinear.concat([fp8, QuantLinear("bf16", torch.zeros(4, 16))])
