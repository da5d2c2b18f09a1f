"""Registers, spills and the K loop's instructions of the decode GEMM for sm_90a, without a GPU.

For each ocria-1-sim weight shape class: the plain kernel with its default configuration, its FP8 form
(``ocria::decode_gemm_fp8``: E4M3 x and weights, per-row and per-column scales) and, for the input
projections, the norm-prologue kernel (``ocria::decode_gemm_norm``) with ``norm_config``. The K loop
is the PTX basic block that holds the MMAs; its global loads, shared-memory stores, barriers and shuffles
are what each K tile costs beside the weight stream (counts are static, per thread, per iteration).

    python bench/decode_gemm_sass.py --out bench/results/decode_gemm_sass.json
"""

import argparse
import re

from ptxas import compile_report, compile_sm90

from ocria.bench.results import write_json
from ocria.plugins.decode_gemm.kernel import BLOCK_M, _decode_gemm_kernel, default_config, norm_config

TYPES = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", o_ptr="*bf16", ws_ptr="*fp32", count_ptr="*i32",
             r_ptr="*bf16", nw_ptr="*bf16", s_ptr="*bf16", sx_ptr="*fp32", sw_ptr="*fp32", eps="fp32", M="i32",
             N="i32", K="i32", K_SPLIT="i32",
             stride_xm="i32", stride_wn="i32", stride_om="i32", stride_rm="i32")
# What a launch on these shapes specializes (pointers and ints divisible by 16): without it the loads compile
# unvectorized, unlike the kernel that runs. M varies and is left unmarked.
DIVISIBLE_BY_16 = ("x_ptr", "w_ptr", "b_ptr", "o_ptr", "ws_ptr", "count_ptr", "r_ptr", "nw_ptr", "s_ptr", "sx_ptr",
                   "sw_ptr", "N", "K", "K_SPLIT", "stride_xm", "stride_wn", "stride_om", "stride_rm")
SHAPES = {"gdn_in_proj": (12352, 2048), "gdn_out_proj": (2048, 4096), "attn_o_proj": (2048, 2048)}
NORMED = ("gdn_in_proj",)  # the input projections (attention qkv and MLP gate_up share its configuration)
COUNTED = {"ld.global": r"ld\.global", "cp.async": r"cp\.async\.(?:ca|cg)", "tma": r"cp\.async\.bulk",
           "st.global": r"st\.global", "st.shared": r"st\.shared",
           "ld.shared": r"ld\.shared", "barriers": r"bar\.sync|barrier\.sync", "shuffles": r"shfl\.sync",
           "mma": r"wgmma\.mma_async|mma\.sync"}


def k_loop(ptx: str) -> dict:
    """Instruction counts of the basic block that holds the MMAs (the K loop's body)."""
    blocks = re.split(r"\n\$L__BB\d+_\d+:", ptx)
    body = max(blocks, key=lambda b: len(re.findall(COUNTED["mma"], b)))
    return {name: len(re.findall(pattern, body)) for name, pattern in COUNTED.items()}


def stats(name: str, N: int, K: int, norm: bool, fp8: bool = False) -> dict:
    cfg = norm_config(N, K) if norm else default_config(N, K)
    consts = dict(HAS_BIAS=False, SWAP=cfg["swap"], AS_BITS=False, SPLIT_K=cfg["split_k"], NORM=norm, RESIDUAL=norm,
                  OUT_F32=False, FP8=fp8, SX_ROWS=fp8, SW_COLS=fp8, BLOCK_M=BLOCK_M, BLOCK_N=cfg["block_n"],
                  BLOCK_K=cfg["block_k"], PDL=False, PF_LINES=8)
    names = _decode_gemm_kernel.arg_names
    consts = {k: v for k, v in consts.items() if k in names}  # also a kernel from before PDL (the "before" files)
    types = {k: v for k, v in TYPES.items() if k in names}
    if fp8:
        types.update(x_ptr="*fp8e4nv", w_ptr="*fp8e4nv")
    out = compile_sm90(_decode_gemm_kernel, types, consts, cfg["num_warps"], cfg["num_stages"],
                       tuple(n for n in DIVISIBLE_BY_16 if n in names))
    kernel = "decode_gemm_norm" if norm else "decode_gemm_fp8" if fp8 else "decode_gemm"
    return dict(shape=name, N=N, K=K, kernel=kernel, config=cfg,
                registers=out["registers"], spill_store_bytes=out["spill_store_bytes"],
                instructions=out["instructions"], k_loop=k_loop(out["ptx"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/decode_gemm_sass.json")
    args = ap.parse_args()
    rows = [stats(name, N, K, norm) for name, (N, K) in SHAPES.items() for norm in (False, True)
            if not norm or name in NORMED]
    rows += [stats(name, N, K, False, fp8=True) for name, (N, K) in SHAPES.items()]
    write_json(compile_report(rows), args.out)
    print(f"{'shape':14} {'kernel':17} {'config':>24} {'regs':>4} {'spill':>5} | K loop: "
          + " ".join(f"{c:>9}" for c in COUNTED))
    for r in rows:
        c = r["config"]
        desc = f"n{c['block_n']}k{c['block_k']}w{c['num_warps']}{'swap' if c['swap'] else ''}s{c['split_k']}"
        print(f"{r['shape']:14} {r['kernel']:17} {desc:>24} {r['registers']:>4} {r['spill_store_bytes']:>5} | "
              + " ".join(f"{r['k_loop'][c]:>9}" for c in COUNTED))


if __name__ == "__main__":
    main()
