"""Fused SiLU(gate) x up -> quantized activation: the Triton kernel (CPU interpreter) is bit-exact
against the PyTorch reference, which is bit-exact against ModelOpt's quantizers (test_numerics)."""

import os
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import pytest
import torch

from ocria.plugins import numerics as nx
from ocria.plugins.policy import ALL_KERNELS
from ocria.plugins.silu_quant import (
    quantize_act,
    quantize_act_reference,
    silu_mul,
    silu_mul_quant,
    silu_mul_quant_reference,
)
from ocria.plugins.silu_quant.kernel import (
    E2M1_DECISIONS,
    quantize_act_triton,
    row_tile_elems,
    row_tiling,
    silu_mul_quant_triton,
)

SCALES = {"bf16": None, "fp8_static": torch.tensor([0.02]), "fp8_dynamic": None,
          "nvfp4": nx.nvfp4_global_scale(torch.tensor(12.0))}


def _canon(t: torch.Tensor | None) -> torch.Tensor | None:
    """Bytes of a quantized tensor with every NaN made one pattern (a NaN's sign carries nothing)."""
    if t is None:
        return None
    if t.dtype in (torch.float8_e4m3fn, torch.uint8):
        b = t.view(torch.uint8)
        return torch.where((t.dtype == torch.float8_e4m3fn) & ((b & 0x7F) == 0x7F), torch.full_like(b, 0x7F), b)
    return torch.where(t.isnan(), torch.full_like(t, float("nan")), t).view(torch.int16 if t.element_size() == 2
                                                                               else torch.int32)


def _assert_same(got, ref):
    assert got[0].shape == ref[0].shape and got[0].dtype == ref[0].dtype
    assert torch.equal(_canon(got[0]), _canon(ref[0]))
    if ref[1] is None:
        assert got[1] is None
    else:
        assert got[1].dtype == ref[1].dtype and torch.equal(_canon(got[1]), _canon(ref[1]))


def _all_bf16_gates(width: int) -> torch.Tensor:
    """Every bf16 bit pattern (incl. NaN, inf, subnormals) once, as [65536 / width, width] gate values."""
    return torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(-1, width)


@pytest.mark.parametrize("mode", list(SCALES))
def test_every_bf16_gate_value_bit_exact(mode):
    gate = _all_bf16_gates(1024)  # 64 rows: the interpreter's cost is per program, a row's per-token scale any width
    torch.manual_seed(0)
    up = (torch.randn(gate.shape) * 2).to(torch.bfloat16)
    gate_up = torch.cat([gate, up], dim=-1)
    ref = silu_mul_quant_reference(gate_up, mode, SCALES[mode])
    _assert_same(silu_mul_quant_triton(gate_up, mode, SCALES[mode]), ref)


def _tie_inputs() -> torch.Tensor:
    """silu(32) == 32 exactly in fp32, so h = 32 * up is known: place E4M3 and E2M1 ties, NaN, inf and
    zero blocks in h for the quantizers in the kernel to get right."""
    e4m3 = torch.arange(1, 0x7E, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ties = torch.cat([(e4m3[1:] + e4m3[:-1]) / 2, e4m3])[:240] * 0.02 / 32  # static scale 0.02
    up = torch.zeros(4, 256)
    up[0, :240] = ties
    up[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) / 32  # E2M1 ties at scale 1
    up[1, 16:32] = torch.tensor([float("nan")] + [1.0] * 15)
    up[1, 32:48] = torch.tensor([float("inf")] + [0.5] * 14 + [-float("inf")])
    up[2] = torch.randn(256)
    up[2, 100] = float("nan")  # NaN row for per-token scales
    up[3, 5] = 1e30  # overflow in bf16 -> inf after silu * up
    gate = torch.full((4, 256), 32.0)
    return torch.cat([gate, up], dim=-1).to(torch.bfloat16)


@pytest.mark.parametrize("mode", list(SCALES))
def test_ties_nan_inf_and_zero_blocks_bit_exact(mode):
    gate_up = _tie_inputs()
    scale = nx.nvfp4_global_scale(torch.tensor(6 * 448.0)) if mode == "nvfp4" else SCALES[mode]
    got = silu_mul_quant_triton(gate_up, mode, scale)
    _assert_same(got, silu_mul_quant_reference(gate_up, mode, scale))
    if mode == "nvfp4":
        assert nx.unpack_e2m1(got[0])[1, :16].tolist() == [0, 2, 2, 4, 4, 6, 6, 7] * 2
        assert got[1].float()[0, 15].item() == 1.0  # all-zero block -> block scale 1.0
    if mode == "fp8_static":
        assert torch.equal(got[0].view(torch.uint8)[0, 124:240], torch.arange(1, 117, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", list(SCALES))
def test_random_shapes_and_leading_dims(mode, dtype):
    torch.manual_seed(1)
    gate_up = (torch.randn(2, 3, 2 * 80) * 3).to(dtype)  # N = 80 is not a power of two
    got = silu_mul_quant_triton(gate_up, mode, SCALES[mode])
    ref = silu_mul_quant_reference(gate_up, mode, SCALES[mode])
    _assert_same(got, ref)
    assert got[0].shape[:2] == (2, 3)


def test_fp32_input_matches_within_exp_ulps():
    torch.manual_seed(2)
    gate_up = torch.randn(7, 2 * 48) * 4
    got, _ = silu_mul_quant_triton(gate_up, "bf16")
    torch.testing.assert_close(got, silu_mul(gate_up), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("block_n", [0, 128], ids=["whole_row_one_pass", "chunks_two_passes"])
def test_fp8_dynamic_one_pass_and_chunked_rows_agree_with_reference(block_n):
    """Per-token FP8 with the row in one tile (h computed once) and in 128-column chunks (amax pass, then bytes)."""
    cfg = {"block_m": 1, "block_n": block_n, "num_warps": 4, "fast_silu": False}
    torch.manual_seed(3)
    up = (torch.randn(_all_bf16_gates(1024).shape) * 2).to(torch.bfloat16)
    for gate_up in (_tie_inputs(), torch.cat([_all_bf16_gates(1024), up], dim=-1)):
        _assert_same(silu_mul_quant_triton(gate_up, "fp8_dynamic", None, cfg),
                     silu_mul_quant_reference(gate_up, "fp8_dynamic", None))


@pytest.mark.parametrize("n, warps, elems, tiling", [
    (6144, 4, 16, (2048, 3)), (12288, 8, 16, (4096, 3)), (18944, 16, 16, (8192, 3)), (18944, 16, 8, (4096, 5)),
    (1400, 1, 8, (256, 6)), (100, 4, 16, (2048, 1))])
def test_row_tiling_covers_the_row_with_equal_tiles(n, warps, elems, tiling):
    width, tiles = row_tiling(n, warps, elems)
    assert (width, tiles) == tiling
    assert (tiles - 1) * width < n <= tiles * width


def test_row_tile_elems_pads_least_and_bad_tilings_are_rejected():
    assert row_tile_elems(18944, 16) == 8  # 20480 columns against 24576
    assert row_tile_elems(6144, 4) == row_tile_elems(12288, 8) == 16
    with pytest.raises(ValueError, match="more than the row kernel"):
        row_tiling(100_000, 4, 16)
    with pytest.raises(ValueError, match="8 or 16 elements"):
        row_tiling(6144, 4, 4)


@pytest.mark.parametrize("n, warps, elems", [(1536, 4, None), (1000, 4, None), (2320, 4, None), (5000, 16, None),
                                             (1400, 1, 8), (1000, 1, 16)])
def test_fp8_dynamic_row_tiles_one_pass_matches_reference(n, warps, elems):
    """The row held as equal tiles, the last one masked (2320 columns, 4 warps: three of 1024; 1400, one warp and
    8 elements per thread: six of 256; 5000 with 16 warps and its register cap): gated bf16 with a NaN row, a zero
    row and an inf, and fp32."""
    cfg = {"row_tiles": True, "num_warps": warps, "fast_silu": False, **({"max_registers": 64} if warps == 16 else {}),
           **({"tile_elems": elems} if elems else {})}
    torch.manual_seed(n)
    gate_up = (torch.randn(5, 2 * n) * 3).to(torch.bfloat16)
    gate_up[1, 7] = float("nan")
    gate_up[2] = 0.0
    gate_up[3, n + 5] = float("inf")
    _assert_same(silu_mul_quant_triton(gate_up, "fp8_dynamic", None, cfg),
                 silu_mul_quant_reference(gate_up, "fp8_dynamic", None))
    x = gate_up[:, :n].float() * 1e-3
    _assert_same(quantize_act_triton(x, "fp8_dynamic", None, cfg), quantize_act_reference(x, "fp8_dynamic", None))


@pytest.mark.parametrize("programs_per_sm", [0, 2], ids=["one_program_per_tile", "programs_walk_tiles"])
def test_nvfp4_tiles_across_rows_match_reference(programs_per_sm):
    """NVFP4 tiles of 4 blocks across row ends (N = 48: three blocks a row; 39 blocks, so the last tile's lanes past
    the end reload the last block), with the interpreter's one SM running two programs that walk 5 tiles each (the
    next tile's loads before this one's codes), or one program a tile."""
    cfg = {"blocks": 4, "num_warps": 1, "programs_per_sm": programs_per_sm, "fast_silu": False}
    torch.manual_seed(5)
    gate_up = (torch.randn(13, 2 * 48) * 3).to(torch.bfloat16)
    gate_up[4, 20] = float("nan")
    gate_up[7, :16] = 0.0
    scale = SCALES["nvfp4"]
    _assert_same(silu_mul_quant_triton(gate_up, "nvfp4", scale, cfg), silu_mul_quant_reference(gate_up, "nvfp4", scale))


def test_row_tiles_config_only_for_per_token_fp8():
    with pytest.raises(ValueError, match="row_tiles"):
        silu_mul_quant_triton(torch.zeros(2, 64, dtype=torch.bfloat16), "fp8_static", torch.tensor([0.1]),
                              {"row_tiles": True, "num_warps": 4, "fast_silu": False})


def test_fp8_dynamic_scales_per_token_and_zero_row():
    gate_up = torch.zeros(3, 64, dtype=torch.bfloat16)
    gate_up[1, :32] = 32.0
    gate_up[1, 32 + 3] = 7.0
    q, scales = silu_mul_quant_triton(gate_up, "fp8_dynamic")
    assert scales.shape == (3, 1)
    assert scales[0].item() == pytest.approx(1 / 448)
    assert scales[1].item() == pytest.approx(224 / 448)
    assert q.float()[1, 3].item() == 448.0


@pytest.mark.parametrize("mode", ["fp8_static", "fp8_dynamic", "nvfp4"])
def test_quantize_act_kernel_matches_reference(mode):
    torch.manual_seed(3)
    x = (torch.randn(9, 96) * 5).to(torch.bfloat16)
    x[0, :16] = 0
    _assert_same(quantize_act_triton(x, mode, SCALES[mode]), quantize_act_reference(x, mode, SCALES[mode]))


@pytest.mark.parametrize("mode", list(SCALES))
def test_custom_op_matches_reference_and_passes_opcheck(mode):
    torch.manual_seed(4)
    gate_up = (torch.randn(5, 2 * 32) * 2).to(torch.bfloat16)
    ref = silu_mul_quant_reference(gate_up, mode, SCALES[mode])
    _assert_same(silu_mul_quant(gate_up, mode, SCALES[mode], policy=ALL_KERNELS), ref)
    _assert_same(silu_mul_quant(gate_up, mode, SCALES[mode]), ref)  # CPU default: the reference
    torch.library.opcheck(torch.ops.ocria.silu_mul_quant.default, (gate_up, mode, SCALES[mode], 0),
                          test_utils=("test_schema", "test_faketensor"))
    if mode != "bf16":
        x = gate_up[:, :32].contiguous()
        ref_q = quantize_act_reference(x, mode, SCALES[mode])
        _assert_same(quantize_act(x, mode, SCALES[mode], policy=ALL_KERNELS), ref_q)


@pytest.mark.parametrize("mode", list(SCALES))
def test_custom_op_compiles_whole_and_gives_the_eager_bytes(mode):
    """torch.compile takes the op without a graph break (fullgraph) and the compiled call returns the eager call's
    bytes; tensors made from the outputs' traced shapes and dtypes (what the fake implementation says) match the real
    ones."""
    torch.manual_seed(6)
    gate_up = (torch.randn(4, 2 * 32) * 2).to(torch.bfloat16)

    def f(x):
        out, scales = torch.ops.ocria.silu_mul_quant(x * 2, mode, SCALES[mode], 0)
        return out, scales, out.new_zeros(out.shape), scales.new_zeros(scales.shape)

    torch._dynamo.reset()
    got, want = torch.compile(f, backend="aot_eager", fullgraph=True)(gate_up), f(gate_up)
    assert torch.equal(_canon(got[0]), _canon(want[0])) and torch.equal(_canon(got[1]), _canon(want[1]))
    assert all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got[2:], want[:2], strict=True))


def _codes_by_floors(h: torch.Tensor, d: float, decisions) -> torch.Tensor:
    """E2M1 magnitude codes of bf16 |h| under divisor d as the GPU's packed path counts them: the number of floors
    F_k = floor_bf16(RD_fp32(d m_k)) below |h|, m_k = b_k + offset_k. d m_k is exact in float64 (24 + 27 bits)."""
    code = torch.zeros(h.shape, dtype=torch.int32)
    for b, off in decisions:
        exact = torch.tensor(d, dtype=torch.float64) * (b + off)
        rd = exact.to(torch.float32)
        if rd.double() > exact:
            rd = torch.nextafter(rd, torch.tensor(-float("inf")))
        floor = (rd.view(torch.int32) & -65536).view(torch.float32)
        code += (h.abs().float() > floor).to(torch.int32)
    return code


def _nvfp4_divisors() -> list[float]:
    """Block divisors d = fp32(E4M3 block scale x global scale): calibrated-looking and adversarial (24-bit)
    global scales across [2^-60, 64], at small, unit and large block scales."""
    g = torch.Generator().manual_seed(0)
    scales = [1.0, 2.0**-60, 64.0, float(nx.nvfp4_global_scale(torch.tensor(12.0)))]
    scales += [float(m) * 2.0**e for m, e in zip(torch.randint(2**23, 2**24, (60,), generator=g).tolist(),
                                                 torch.randint(-83, -17, (60,), generator=g).tolist())]
    e4m3 = nx.e4m3_decode(torch.arange(1, 0x7F, dtype=torch.uint8))
    picks = [e4m3[0], e4m3[63], e4m3[-1]] + [e4m3[i] for i in torch.randint(0, e4m3.numel(), (3,), generator=g)]
    return [float(torch.tensor(float(sc), dtype=torch.float32) * torch.tensor(s, dtype=torch.float32))
            for s in scales for sc in picks]


def test_nvfp4_floor_compares_give_modelopt_codes():
    """The GPU's bf16 NVFP4 path codes |h| by comparing it with seven floors per block (``E2M1_DECISIONS``), no
    quotient: for every non-negative bf16 value (subnormals and inf included) and 384 divisors its code is ModelOpt's,
    E2M1(RN(h / d)). A decision with the tie sent the other way (0.75 as '>') misses."""
    h = (torch.arange(0, 0x7F81, dtype=torch.int32) << 16).view(torch.float32)
    for d in _nvfp4_divisors():
        want = nx.e2m1_encode(h / torch.tensor(d, dtype=torch.float32)).to(torch.int32)
        assert torch.equal(_codes_by_floors(h, d, E2M1_DECISIONS), want), d
    wrong = list(E2M1_DECISIONS)
    wrong[1] = (0.75, -wrong[1][1])
    d = 1.0
    want = nx.e2m1_encode(h / torch.tensor(d))
    assert not torch.equal(_codes_by_floors(h, d, wrong), want.to(torch.int32))


# Compiles the NVFP4 kernel for sm_90a as a launch on Hopper would, for every input dtype, gated and not
# (bench/ops/ptxas.py: Triton's code generator, then its bundled ptxas; no GPU needed).
_COMPILE_NVFP4_FOR_HOPPER = """
from bench.ops.ptxas import compile_sm90
from ocria.plugins.silu_quant.kernel import _nvfp4_kernel
for kind, words in ((0, "*i32"), (1, "*i32"), (2, "*i64")):
    for gated in (True, False):
        types = dict(x_ptr=words, out_ptr="*i32", scale_ptr="*fp32", out_scale_ptr="*u8", M="i32", stride_xm="i32")
        consts = dict(N=64, GATED=gated, KIND=kind, ON_GPU=True, FAST_SILU=True, BLOCKS=32, PDL=False)
        compile_sm90(_nvfp4_kernel, types, consts, 1)
"""


def _run_without_interpreter(script: str) -> str:
    """``script``'s stdout, run in a process where Triton compiles for real (this one interprets); fails the test
    with its stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_nvfp4_kernel_compiles_for_hopper_from_every_input_dtype():
    """The interpreter runs the kernel as Python, so it cannot see what only Triton's code generator rejects (fp16
    and fp32 inputs once failed there: two returns of different types in one helper)."""
    _run_without_interpreter(_COMPILE_NVFP4_FOR_HOPPER)


# The default NVFP4 launch compiled for sm_90a: its registers, spills, and where its loop issues the next tile's loads
_NVFP4_DEFAULT_BUILD = """
from bench.ops.kernels.silu_quant import nvfp4_loop_stats
from ocria.plugins.silu_quant.kernel import default_config
for m in (16, 1024):
    cfg = default_config("nvfp4", m, 6144)
    r = nvfp4_loop_stats(6144, cfg)
    print(cfg["programs_per_sm"] * cfg["num_warps"], r["registers"], r["spill_store_bytes"], r["first_load_after"],
          r["loop_instructions"])
"""


def test_default_nvfp4_launch_keeps_its_warps_resident_and_loads_early():
    """``default_config`` launches NVFP4_WARPS_PER_SM warps per SM: the loop's registers (allocated in eights) must
    let all of them be resident at once, or the last programs start a second wave. The register cap is there for
    the loads: the next tile's must go out in the loop's first third (without the cap ptxas puts them at its end,
    and the loop's memory time no longer overlaps its arithmetic)."""
    for line in _run_without_interpreter(_NVFP4_DEFAULT_BUILD).splitlines():
        warps, registers, spills, first_load, loop = map(int, line.split())
        assert warps * 32 * -(-registers // 8) * 8 <= 65536 and spills == 0, line
        assert first_load < loop // 3, line


_COMPILE_SILU_FAST_AND_IEEE = """
from bench.ops.ptxas import compile_sm90
from ocria.plugins.silu_quant.kernel import _silu_mul_quant_kernel
for elem, is_bf16 in (("i16", True), ("fp16", False), ("fp32", False)):
    types = dict(x_ptr="*" + elem, out_ptr="*" + elem, scale_ptr="*fp32", out_scale_ptr="*fp32", M="i32", N="i32",
                 stride_xm="i32", stride_om="i32", stride_sm="i32")
    ptx = [compile_sm90(_silu_mul_quant_kernel, types, dict(MODE=0, GATED=True, IS_BF16=is_bf16, ON_GPU=True,
                                                            FAST_SILU=fast, NPASS=1, BLOCK_M=1, BLOCK_N=256,
                                                            NUM_CHUNKS=1, PDL=False), 4)["ptx"]
           for fast in (True, False)]
    print(elem, ptx[0] == ptx[1])
"""


def test_approximate_silu_is_built_for_bf16_inputs_only():
    """The approximate silu is proven against PyTorch for every bf16 value only (bench/ops); fp16 and fp32
    inputs once took an approximate exp too and missed PyTorch's bytes on the H200. For them ``fast_silu`` must build
    the same code as the IEEE silu."""
    assert _run_without_interpreter(_COMPILE_SILU_FAST_AND_IEEE).split() == ["i16", "False", "fp16", "True", "fp32",
                                                                            "True"]


def test_bad_arguments_are_rejected():
    x = torch.randn(2, 2 * 40, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown activation quantization mode"):
        silu_mul_quant_triton(x, "int8")
    with pytest.raises(ValueError, match="multiple of 16"):
        silu_mul_quant_triton(x, "nvfp4", torch.tensor(1.0))
    with pytest.raises(ValueError, match="calibrated scale"):
        silu_mul_quant_triton(x, "fp8_static")
