"""SiLU-multiply and the ``down_proj`` input's quantization in one launch (``ocria::silu_mul_quant``), one op per
output format: bf16, per-tensor FP8, per-token FP8, NVFP4.

Floor: gate_up [M, 2N] bf16 read once, the output (and its scales) written once. Check: byte for byte the unfused
PyTorch chain (tests/test_silu_quant.py), which is also the baseline (what the model ran before the kernel)."""

from functools import partial

import torch

from bench.ops.presets import text_config
from bench.ops.ptxas import Sm90Build, compile_sm90, tile_loop_loads
from bench.ops.registry import BITS, Floor, Inputs, OpBench, Shape, Variant, leading_rows, shape
from bench.ops.switches import current
from ocria.plugins import numerics as nx
from ocria.plugins.silu_quant import silu_mul_quant, silu_mul_quant_reference
from ocria.plugins.silu_quant.kernel import (
    MODE_IDS,
    _nvfp4_kernel,
    _silu_mul_quant_kernel,
    _token_fp8_row_kernel,
    default_config,
    row_tile_elems,
    row_tiling,
    silu_mul_quant_triton,
    tiling,
)

TOKENS = (1, 16, 1024)
# The per-token FP8 designs besides the default: the row held in registers (one pass) and a two-pass tile loop.
FP8_DYNAMIC_FORMS = {"row_tiles": {"row_tiles": True, "num_warps": 8, "fast_silu": False},
                     "two_pass": {"block_m": 1, "block_n": 16, "num_warps": 4, "fast_silu": False}}


def silu_shapes() -> tuple[Shape, ...]:
    """Both presets' MLP widths at 1, 16 and 1024 tokens, and a CPU shape (3 tokens, 64 columns: 4 NVFP4 blocks)."""
    shapes = [shape(f"{label}_m{m}", M=m, N=text_config(label)["intermediate_size"])
              for label in ("mini", "sim") for m in TOKENS]
    return (shape("cpu_m3", cpu=True, M=3, N=64), *shapes)


def global_scale(mode: str, device: torch.device) -> torch.Tensor | None:
    """The calibrated scale a layer would hold: per tensor for FP8, the NVFP4 global scale of |h| <= 12."""
    if mode == "fp8_static":
        return torch.tensor([0.02], device=device)
    if mode == "nvfp4":
        return nx.nvfp4_global_scale(torch.tensor(12.0)).to(device)
    return None


def silu_inputs(mode: str, s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """gate_up [M, 2N] bf16 (the fused gate/up projection's output) and the mode's scale (an empty tensor if none)."""
    x = (torch.randn(s["M"], 2 * s["N"], generator=g, device=device) * 3).to(torch.bfloat16)
    scale = global_scale(mode, device)
    return {"gate_up": x, "scale": scale if scale is not None else torch.empty(0, device=device)}


def out_bytes(M: int, N: int, mode: str) -> int:
    """Bytes of the quantized output and its scales."""
    return {"bf16": 2 * M * N, "fp8_static": M * N, "fp8_dynamic": M * N + 4 * M,
            "nvfp4": M * N // 2 + M * N // 16}[mode]


def silu_floor(mode: str, s: Shape) -> Floor:
    M, N = s["M"], s["N"]
    return Floor(4 * M * N + out_bytes(M, N, mode), 6 * M * N)


def _scale(i: Inputs) -> torch.Tensor | None:
    return i["scale"] if i["scale"].numel() else None


def _outputs(result: tuple) -> tuple[torch.Tensor, ...]:
    return tuple(t for t in result if t is not None)


DIVISIBLE_BY_16 = ("x_ptr", "out_ptr", "scale_ptr", "out_scale_ptr", "N", "stride_xm", "stride_om")
TYPES = dict(x_ptr="*i16", out_ptr="*u8", scale_ptr="*fp32", out_scale_ptr="*fp32", M="i32", N="i32",
             stride_xm="i32", stride_om="i32", stride_sm="i32")


def sm90_build(mode: str, s: Shape) -> Sm90Build:
    """The kernel a gated bf16 launch of ``mode`` at this shape runs with ``default_config``."""
    cfg = default_config(mode, s["M"], s["N"])
    if mode == "nvfp4":
        return nvfp4_build(s["N"], cfg)
    if cfg.get("row_tiles"):
        warps = cfg["num_warps"]
        width, tiles = row_tiling(s["N"], warps, cfg.get("tile_elems") or row_tile_elems(s["N"], warps))
        consts = dict(GATED=True, IS_BF16=True, ON_GPU=True, FAST_SILU=cfg["fast_silu"], PDL=False, W=width, NT=tiles)
        types = dict(x_ptr="*i16", out_ptr="*u8", out_scale_ptr="*fp32", N="i32", stride_xm="i32", stride_om="i32",
                     stride_sm="i32")
        return Sm90Build(_token_fp8_row_kernel, types, consts, warps, divisible_by_16=DIVISIBLE_BY_16[:2] + (
            "out_scale_ptr", "N", "stride_xm", "stride_om"), maxnreg=cfg.get("max_registers"))
    block_n, chunks, passes = tiling(mode, s["N"], cfg)
    consts = dict(MODE=MODE_IDS[mode], GATED=True, IS_BF16=True, ON_GPU=True, FAST_SILU=cfg["fast_silu"],
                  NPASS=passes, BLOCK_M=cfg["block_m"], BLOCK_N=block_n, NUM_CHUNKS=chunks, PDL=False)
    types = dict(TYPES, out_ptr="*i16" if mode == "bf16" else "*u8")
    return Sm90Build(_silu_mul_quant_kernel, types, consts, cfg["num_warps"], divisible_by_16=DIVISIBLE_BY_16)


def nvfp4_build(n: int, cfg: dict) -> Sm90Build:
    """The NVFP4 kernel (one 16-element block per thread as pair words) at width n with ``cfg``."""
    consts = dict(N=n, GATED=True, KIND=0, ON_GPU=True, FAST_SILU=cfg["fast_silu"], BLOCKS=cfg["blocks"], PDL=False)
    types = dict(x_ptr="*i32", out_ptr="*i32", scale_ptr="*fp32", out_scale_ptr="*u8", M="i32", stride_xm="i32")
    return Sm90Build(_nvfp4_kernel, types, consts, cfg["num_warps"],
                     divisible_by_16=("x_ptr", "out_ptr", "out_scale_ptr", "stride_xm"),
                     maxnreg=cfg.get("max_registers"))


def nvfp4_loop_stats(n: int, cfg: dict) -> dict:
    """The NVFP4 kernel's registers and spills and where its bf16 tile loop (the one with HSET2) issues its loads
    (``ptxas.tile_loop_loads``)."""
    b = nvfp4_build(n, cfg)
    out = compile_sm90(b.kernel, b.types, b.consts, b.num_warps, b.num_stages, b.divisible_by_16, b.maxnreg)
    return {"registers": out["registers"], "spill_store_bytes": out["spill_store_bytes"],
            **tile_loop_loads(out["sass"], "HSET2")}


def _op(mode: str) -> OpBench:
    variants = {"kernel": Variant(lambda i: _outputs(silu_mul_quant(i["gate_up"], mode, _scale(i), policy=current())))}
    if mode == "fp8_dynamic":
        for name, cfg in FP8_DYNAMIC_FORMS.items():
            variants[name] = Variant(lambda i, c=cfg: _outputs(silu_mul_quant_triton(i["gate_up"], mode, None, c)))
    return OpBench(
        name=f"silu_quant_{mode}", shapes=silu_shapes(), inputs=partial(silu_inputs, mode),
        floor=partial(silu_floor, mode),
        reference=lambda i: _outputs(silu_mul_quant_reference(i["gate_up"], mode, _scale(i))),
        variants=variants, check=BITS, rows=lambda i, r: leading_rows(i, r, ("gate_up",)),
        ptxas={"kernel": partial(sm90_build, mode)})


BENCHES = tuple(_op(mode) for mode in MODE_IDS)
