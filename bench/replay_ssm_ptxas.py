"""Registers, spills and wgmma tile shapes of the replay_verify kernel for sm_90, without a GPU.

Compiles the Triton kernel for an H100/H200 target on this machine, as a launch specializes it, and runs
the ptxas that ships with Triton on the PTX, for each tile config and dot precision (Qwen3.5-like heads,
bf16 inputs):

    python bench/replay_ssm_ptxas.py --out bench/results/replay_ssm_ptxas.json
"""

import argparse
import re

from ptxas import compile_report, compile_sm90

from ocria.bench.results import write_json
from ocria.plugins.replay_ssm.kernel import (
    KEY_CHUNK,
    KEY_CHUNK_MAX_REGISTERS,
    PREFETCH_MAX_BLOCK_V,
    PREP_WARPS,
    _chunk_prep_kernel,
    _verify_block_kernel,
    _verify_one_kernel,
)

_TYPES = dict(
    q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", a_ptr="*bf16", b_ptr="*bf16", A_log_ptr="*fp32",
    dt_bias_ptr="*fp32", state_ptr="*fp32", ring_k_ptr="*fp32", ring_u_ptr="*fp32", ring_g_ptr="*fp32",
    ring_phase_ptr="*i32", pending_ptr="*i32", slot_ptr="*i32", mats_ptr="*fp32", o_ptr="*bf16",
    T="i32", Tmax="i32", scale="fp32", eps="fp32", sq="i32", sk="i32", sv="i32", sa="i32", sb="i32",
)  # fmt: skip
# What a launch specializes (16-byte aligned pointers, row strides of the fused projections multiples of 16):
# without it the loads compile unvectorized, unlike the kernel that runs.
DIVISIBLE_BY_16 = tuple(n for n, t in _TYPES.items() if t.startswith("*")) + ("sq", "sk", "sv", "sa", "sb")


def compile_stats(block_v: int, num_warps: int, precision: str, one_token: bool, heads=(16, 32, 128),
                  max_registers: int | None = None) -> dict:  # fmt: skip
    """T = 1: the one-token kernel; T > 1: the block kernel with ``KEY_CHUNK`` keys per chunk and 3 stages, as a
    deep grid launches it on Hopper (beside the prep kernel; 16-column tiles launch the whole tile instead), under
    ``max_registers`` when given."""
    Hk, Hv, D = heads
    consts = dict(HK=Hk, HV=Hv, DK=D, DV=D, BK=D, BV=block_v, TP=16, PREC=precision, PDL=False)
    if one_token:
        kernel, consts = _verify_one_kernel, dict(consts, PREFETCH=block_v <= PREFETCH_MAX_BLOCK_V)
    else:
        kernel, consts = _verify_block_kernel, dict(consts, BKC=KEY_CHUNK, STAGES=3, OVERLAP=True)
    aligned = tuple(n for n in DIVISIBLE_BY_16 if n in kernel.arg_names)
    out = compile_sm90(kernel, _TYPES, consts, num_warps, divisible_by_16=aligned, maxnreg=max_registers)
    ptx = out["ptx"]
    tiles = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
    return dict(
        block_v=block_v, num_warps=num_warps, precision=precision, one_token=one_token, max_registers=max_registers,
        registers=out["registers"],
        spill_store_bytes=out["spill_store_bytes"], spill_load_bytes=out["spill_load_bytes"],
        wgmma_tiles=tiles, mma_sync=ptx.count("mma.sync"),
    )  # fmt: skip


def prep_stats(precision: str, value_heads_per_program: int, heads=(16, 32, 128)) -> dict:
    """The T x T prep kernel for T > 1 with ``PREP_WARPS`` warps: one program per batch row and value head (shallow
    grids) or per key head (deep grids, ``value_heads_per_program`` = Hv / Hk)."""
    Hk, Hv, D = heads
    consts = dict(HK=Hk, HV=Hv, DK=D, BK=D, TP=16, HEADS=value_heads_per_program, PREC=precision, PDL=False,
                  OVERLAP=True)  # fmt: skip
    aligned = tuple(n for n in DIVISIBLE_BY_16 if n in _chunk_prep_kernel.arg_names)
    out = compile_sm90(_chunk_prep_kernel, _TYPES, consts, PREP_WARPS, divisible_by_16=aligned)
    return dict(kernel="chunk_prep", num_warps=PREP_WARPS, value_heads_per_program=value_heads_per_program,
                precision=precision, registers=out["registers"], spill_store_bytes=out["spill_store_bytes"],
                spill_load_bytes=out["spill_load_bytes"])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = [
        compile_stats(bv, warps, prec, one)
        for bv, warps in ((64, 4), (64, 8), (128, 8), (32, 4), (16, 4))
        for prec in ("tf32", "tf32x3")
        for one in (True, False)
    ]
    # What a deep grid with bf16 inputs launches: the block kernel capped for five programs per SM.
    rows.append(compile_stats(64, 4, "tf32", False, max_registers=KEY_CHUNK_MAX_REGISTERS))
    prep = [prep_stats(prec, heads) for prec in ("tf32", "tf32x3") for heads in (1, 2)]
    write_json(compile_report(rows + prep), args.out)
    head = ("BV", 4), ("warps", 5), ("precision", 9), ("T=1", 4), ("cap", 4), ("regs", 4), ("spill st/ld B", 14)
    print(" ".join(f"{name:>{width}}" for name, width in head) + "  wgmma tiles")
    for r in rows:
        spill = f"{r['spill_store_bytes']}/{r['spill_load_bytes']}"
        print(f"{r['block_v']:>4} {r['num_warps']:>5} {r['precision']:>9} {'yes' if r['one_token'] else 'no':>4} "
              f"{r['max_registers'] or '-':>4} "
              f"{r['registers']:>4} {spill:>14}  "
              f"{','.join(r['wgmma_tiles']) or 'mma.sync only'}")  # fmt: skip
    for r in prep:
        print(f"chunk_prep {r['precision']:>9} x{r['value_heads_per_program']} heads: {r['registers']} registers, "
              f"{r['spill_store_bytes']}/{r['spill_load_bytes']} B spilled")


if __name__ == "__main__":
    main()
