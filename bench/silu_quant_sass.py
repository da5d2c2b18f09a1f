"""Registers, spills and SASS instructions per element of the SiLU-quant kernel for sm_90, without a GPU.

The quantized modes are compute-bound on the H200 (bench/silu_quant.py), so the
instructions a thread issues per element predict their time. Counts are static: both sides of a branch
(e.g. the FP8 quotient's FMA path and its IEEE-division fallback) and the division's slow path are included.

    python bench/silu_quant_sass.py --out bench/results/silu_quant_sass.json
"""

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # ptxas.py, also when loaded by path (tests)
from ptxas import compile_report, compile_sm90  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.plugins.silu_quant.kernel import (
    MODE_IDS,
    _nvfp4_kernel,
    _silu_mul_quant_kernel,
    _token_fp8_row_kernel,
    default_config,
    row_tile_elems,
    row_tiling,
    tiling,
)

# What a launch specializes (aligned pointers, widths and row strides multiples of 16): without it the loads
# compile unvectorized, unlike the kernel that runs.
DIVISIBLE_BY_16 = ("x_ptr", "out_ptr", "scale_ptr", "out_scale_ptr", "N", "stride_xm", "stride_om")
TYPES = dict(x_ptr="*i16", out_ptr="*u8", scale_ptr="*fp32", out_scale_ptr="*fp32", M="i32", N="i32",
             stride_xm="i32", stride_om="i32", stride_sm="i32")


def stats(mode: str, n: int, cfg: dict) -> dict:
    """One gated bf16 launch of ``mode`` at width n with ``cfg`` (keys of ``default_config``)."""
    if cfg.get("row_tiles"):
        return row_stats(n, cfg)
    if mode == "nvfp4":
        return nvfp4_stats(n, cfg)
    block_n, chunks, passes = tiling(mode, n, cfg)
    consts = dict(MODE=MODE_IDS[mode], GATED=True, IS_BF16=True, ON_GPU=True, FAST_SILU=cfg["fast_silu"],
                  NPASS=passes, BLOCK_M=cfg["block_m"], BLOCK_N=block_n, NUM_CHUNKS=chunks, PDL=False)
    types = dict(TYPES, out_ptr="*i16" if mode == "bf16" else "*u8",
                 out_scale_ptr="*u8" if mode == "nvfp4" else "*fp32")
    out = compile_sm90(_silu_mul_quant_kernel, types, consts, cfg["num_warps"], divisible_by_16=DIVISIBLE_BY_16)
    # Each pass's chunk-loop body is in the code once and sees each of a thread's elements once per tile.
    return _row(mode, n, cfg, [cfg["block_m"], block_n], passes, out)


def row_stats(n: int, cfg: dict) -> dict:
    """Per-token FP8 in one pass (``_token_fp8_row_kernel``, the row in registers), with its register cap if any."""
    warps = cfg["num_warps"]
    width, tiles = row_tiling(n, warps, cfg.get("tile_elems") or row_tile_elems(n, warps))
    consts = dict(GATED=True, IS_BF16=True, ON_GPU=True, FAST_SILU=cfg["fast_silu"], PDL=False, W=width, NT=tiles)
    types = dict(x_ptr="*i16", out_ptr="*u8", out_scale_ptr="*fp32", N="i32", stride_xm="i32", stride_om="i32",
                 stride_sm="i32")
    out = compile_sm90(_token_fp8_row_kernel, types, consts, warps, divisible_by_16=DIVISIBLE_BY_16[:2] + (
        "out_scale_ptr", "N", "stride_xm", "stride_om"), maxnreg=cfg.get("max_registers"))
    return _row("fp8_dynamic", n, cfg, [1, width * tiles], 1, out)


def nvfp4_stats(n: int, cfg: dict) -> dict:
    """NVFP4 (``_nvfp4_kernel``: one 16-element block per thread as pair words, eight codes per int32 word). Both of
    its loops are in the count; ``loop_instructions`` / 16 is per element on the bf16 path (its compares, HSET2)."""
    consts = dict(N=n, GATED=True, KIND=0, ON_GPU=True, FAST_SILU=cfg["fast_silu"], BLOCKS=cfg["blocks"], PDL=False)
    types = dict(x_ptr="*i32", out_ptr="*i32", scale_ptr="*fp32", out_scale_ptr="*u8", M="i32", stride_xm="i32")
    out = compile_sm90(_nvfp4_kernel, types, consts, cfg["num_warps"],
                       divisible_by_16=("x_ptr", "out_ptr", "out_scale_ptr", "stride_xm"),
                       maxnreg=cfg.get("max_registers"))
    return {**_row("nvfp4", n, cfg, [1, 16 * cfg["blocks"]], 1, out), **tile_loop_loads(out["sass"], "HSET2")}


def tile_loop_loads(sass: str, opcode: str | None = None) -> dict:
    """Where the tile loop issues its global loads (the next tile's, asked for at the top of the loop in the source):
    SASS instructions (16 bytes each) from the loop's top to its first and last load, the loop's length, and its
    quarter-rate instructions (ex2, rcp) before the first load and in all, the loop being the widest backward
    branch, or the widest with an ``opcode`` instruction in it (the NVFP4 kernel has a loop per path)."""
    addr = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
    code = [(int(m.group(1), 16), m.group(2)) for m in map(addr.search, sass.splitlines()) if m]
    back = [(int(t, 16), a) for a, ins in code for t in re.findall(r"\bBRA (?:`\()?0x([0-9a-f]+)", ins)
            if int(t, 16) < a]
    if opcode:
        back = [(t, a) for t, a in back if any(t <= at <= a and ins.startswith(opcode) for at, ins in code)]
    top, end = min(back, key=lambda ta: ta[0] - ta[1])
    loads = [a for a, ins in code if top <= a <= end and "LDG" in ins]
    first = loads[0] if loads else end
    return {"loop_instructions": (end - top) // 16 + 1, "loads_in_loop": len(loads),
            "first_load_after": (loads[0] - top) // 16 if loads else None,
            "last_load_after": (loads[-1] - top) // 16 if loads else None,
            "mufu_before_first_load": sum(top <= a < first and ins.startswith("MUFU") for a, ins in code),
            "mufu_in_loop": sum(top <= a <= end and ins.startswith("MUFU") for a, ins in code)}


def _row(mode: str, n: int, cfg: dict, tile: list[int], passes: int, out: dict) -> dict:
    """A report row from ``compile_sm90``'s output for a launch of ``tile`` per program."""
    per_thread = tile[0] * tile[1] / (32 * cfg["num_warps"])
    return dict(mode=mode, width=n, config=cfg, tile=tile, passes=passes,
                registers=out["registers"], spill_store_bytes=out["spill_store_bytes"],
                instructions=out["instructions"], instructions_per_element=out["instructions"] / per_thread,
                top_opcodes=dict(sorted(out["opcodes"].items(), key=lambda kv: -kv[1])[:8]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[6144, 12288, 18944])
    ap.add_argument("--out", default="bench/results/silu_quant_sass.json")
    args = ap.parse_args()
    two_pass = {"block_m": 1, "block_n": 4096, "num_warps": 8, "fast_silu": True}  # per-token FP8, for comparison
    rows = []
    for n in args.widths:
        for mode in MODE_IDS:
            for cfg in [default_config(mode, 4096, n)] + ([two_pass] if mode == "fp8_dynamic" else []):
                rows.append(stats(mode, n, cfg))
    write_json(compile_report(rows), args.out)
    print(f"{'N':>6} {'mode':12} {'tile':>12} {'warps':>5} {'passes':>6} {'regs':>4} {'spill B':>7} {'instr/elem':>10}")
    for r in rows:
        print(f"{r['width']:>6} {r['mode']:12} {'x'.join(map(str, r['tile'])):>12} {r['config']['num_warps']:>5} "
              f"{r['passes']:>6} {r['registers']:>4} {r['spill_store_bytes']:>7} "
              f"{r['instructions_per_element']:>10.1f}")


if __name__ == "__main__":
    main()
