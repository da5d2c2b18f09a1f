"""The reference quantizers reproduce ModelOpt 0.47's quantizers and unified-HF exporters bit for bit."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # ModelOpt imports triton: the plugin tests need the interpreter

import pytest
import torch

from ocria.plugins import numerics as nx

mq = pytest.importorskip("modelopt.torch.quantization.qtensor")
quant_utils = pytest.importorskip("modelopt.torch.export.quant_utils")


def _bytes(q: torch.Tensor) -> torch.Tensor:
    """uint8 view with every NaN pattern (0x7F / 0xFF) made 0x7F: the sign of a NaN carries nothing."""
    b = q.view(torch.uint8) if q.dtype != torch.uint8 else q
    return torch.where((b & 0x7F) == 0x7F, torch.full_like(b, 0x7F), b)


def _e4m3_grid() -> torch.Tensor:
    """All finite E4M3 values, their midpoints (ties) and the fp32 neighbours of both."""
    vals = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (vals[1:] + vals[:-1]) / 2
    pts = torch.cat([vals, mids, torch.tensor([448.0, 456.0, 464.0, 470.0, 1e6])])
    pts = torch.cat([pts, torch.nextafter(pts, torch.full_like(pts, 1e9)), torch.nextafter(pts, -pts - 1)])
    return torch.cat([pts, -pts])


def test_e4m3_encode_matches_torch_cast_on_ties_and_random():
    t = torch.cat([_e4m3_grid(), torch.randn(200_000) * torch.exp2(torch.randint(-14, 10, (200_000,)).float())])
    ours = nx.e4m3_encode(t)
    torch_cast = t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(ours, torch_cast)


def test_e4m3_saturation_nan_and_signed_zero():
    t = torch.tensor([float("inf"), -float("inf"), 1e30, -500.0, float("nan"), -0.0, 0.0, -1e-30])
    assert nx.e4m3_encode(t).tolist()[:4] == [0x7E, 0xFE, 0x7E, 0xFE]
    assert (nx.e4m3_encode(t)[4] & 0x7F).item() == 0x7F
    assert nx.e4m3_encode(t).tolist()[5:] == [0x80, 0x00, 0x80]


def test_e2m1_rounding_ties_to_even_and_specials():
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.0001, 7.0, -0.25, -0.0, -0.1,
                      float("inf"), -float("inf"), float("nan")])
    got = nx.e2m1_encode(t).tolist()
    assert got == [0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 0, 8, 7, 15, 7]
    grid = torch.linspace(-8, 8, 64001)
    assert torch.equal(nx.e2m1_encode(grid), mq.NVFP4QTensor._cast_fp4(grid.clone()))


def _special_weight(n: int, k: int) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(n, k) * torch.exp2(torch.randint(-6, 4, (n, 1)).float())
    w[0, :16] = 0.0  # an all-zero block
    w[1, 16:32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * 0.125  # E2M1 ties
    w[2, 5] = float("inf")
    w[3, 40] = -float("inf")
    w[4, 7] = float("nan")
    return w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_weight_export_bit_exact(dtype):
    torch.manual_seed(1)
    w = (torch.randn(64, 96) * 0.05).to(dtype)
    w[3, :] = 0
    w[5, 7] = w.abs().max()  # an element exactly at amax -> 448
    scale = (w.float().abs().amax() / 448.0).reshape(1)
    ref = quant_utils.to_quantized_weight(w, scale, "fp8")
    assert torch.equal(_bytes(nx.quantize_fp8(w, scale)), _bytes(ref))
    # ModelOpt's dequantize multiplies in the target dtype; in fp32 both are float32(q) * scale.
    back = nx.dequantize_fp8(ref, scale, torch.float32)
    assert torch.equal(back, mq.FP8QTensor(w.shape, dtype, ref).dequantize(torch.float32, scale=scale))


def test_fp8_static_activation_matches_modelopt_fake_quant_grid():
    torch.manual_seed(2)
    x = torch.randn(32, 128, dtype=torch.bfloat16) * 3
    x[0, :4] = torch.tensor([1e4, -1e4, float("inf"), -float("inf")])  # saturate at 448
    scale = torch.tensor([0.01])
    q = nx.quantize_fp8(x, scale)
    expect = (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(_bytes(q), _bytes(expect))


def test_fp8_per_token_matches_modelopt_axis_quant():
    torch.manual_seed(3)
    x = torch.randn(16, 256) * torch.exp2(torch.randint(-8, 8, (16, 1)).float())
    q, scales = nx.quantize_fp8_per_token(x)
    ref, ref_scales = mq.FP8QTensor.quantize(x, axis=0)
    assert torch.equal(scales, ref_scales.reshape(16, 1))
    assert torch.equal(_bytes(q), _bytes(ref._quantized_data))


def test_fp8_per_token_zero_row_uses_unit_amax():
    x = torch.zeros(2, 32)
    x[1, 3] = 2.0
    q, scales = nx.quantize_fp8_per_token(x)
    assert scales[0].item() == pytest.approx(1 / 448)
    assert torch.count_nonzero(q.float()[0]) == 0
    assert q.float()[1, 3].item() == 448.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4_weight_export_bit_exact(dtype):
    w = _special_weight(32, 128).to(dtype)
    finite = w.float().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    ws2 = mq.NVFP4QTensor.get_weights_scaling_factor_2(finite.to(dtype))
    ws, _ = mq.NVFP4QTensor.get_weights_scaling_factor(w, 16, ws2)
    packed_ref = quant_utils.to_quantized_weight(w, ws, "nvfp4", ws2, 16)
    packed, scales = nx.quantize_nvfp4(w, ws2)
    assert torch.equal(_bytes(scales), _bytes(ws))
    assert torch.equal(packed, packed_ref)
    assert scales.float()[0, 0].item() == 1.0  # zero block -> scale 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4_dequantize_matches_modelopt(dtype):
    torch.manual_seed(4)
    w = torch.randn(48, 64).to(dtype)
    ws2 = mq.NVFP4QTensor.get_weights_scaling_factor_2(w)
    qt, ws, _ = mq.NVFP4QTensor.quantize(w, 16, None, ws2)
    ref = qt.dequantize(dtype, scale=ws, double_scale=ws2, block_sizes={-1: 16})
    assert torch.equal(nx.dequantize_nvfp4(qt._quantized_data, ws, ws2, dtype), ref)


def test_nvfp4_activation_with_input_scale_bit_exact():
    torch.manual_seed(5)
    x = torch.randn(8, 256, dtype=torch.bfloat16) * 4
    x[2, 32:48] = 0
    x[3, 0] = float("nan")
    x[4, 20] = float("inf")
    gscale = nx.nvfp4_global_scale(torch.tensor(3.0))  # calibrated amax smaller than the data
    qt, ws, _ = mq.NVFP4QTensor.quantize(x, 16, None, gscale)
    packed, scales = nx.quantize_nvfp4(x, gscale)
    assert torch.equal(_bytes(scales), _bytes(ws))
    assert torch.equal(packed, qt._quantized_data)
    assert scales.float()[2, 2].item() == 1.0  # zero block -> scale 1.0
    assert torch.all(nx.unpack_e2m1(packed)[3, :16] == 7)  # NaN block -> code 7 everywhere


def test_pack_unpack_roundtrip_low_nibble_is_even_index():
    codes = torch.randint(0, 16, (4, 32), dtype=torch.uint8)
    packed = nx.pack_e2m1(codes)
    assert torch.equal(packed[:, 0] & 0x0F, codes[:, 0]) and torch.equal(packed[:, 0] >> 4, codes[:, 1])
    assert torch.equal(nx.unpack_e2m1(packed), codes)
