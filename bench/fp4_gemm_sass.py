"""Registers, spills and the K loop's instructions per weight element of the NVFP4 GEMM for sm_90a, without a GPU.

The NVFP4 decode GEMM is compute-bound on the H200 (6-9x its memory floor in bench/quant_gemm.py):
streaming 4.5 bits per weight at ~18 B/cycle/SM leaves ~3.9 lane-instructions per weight element, so the K loop's
instructions per element predict whether it can reach the floor. The loop is the code between a backward branch and
its target that holds the MMAs; per element = loop instructions per thread / the weight elements one thread covers
per iteration (BLOCK_N * BLOCK_K / (32 * num_warps)). Counts are static (predicated-off and pipelining instructions
included). One row per ocria-1-sim shape class at M <= 16, with ``default_config``. To see what a kernel change does
to these counts, run the script on the kernel file before and after it.

    python bench/fp4_gemm_sass.py --out bench/results/fp4_gemm_sass.json
"""

import argparse
import re
from collections.abc import Callable

from ptxas import compile_report, compile_sm90

from ocria.bench.results import write_json
from ocria.plugins.fp4_gemm.kernel import _nvfp4_gemm_kernel, default_config

TYPES = dict(x_ptr="*i16", w_ptr="*u8", s_ptr="*u8", g_ptr="*fp32", y_ptr="*i16", ws_ptr="*fp32", count_ptr="*i32",
             M="i32", N="i32", K="i32", K_SLICE="i32", stride_xm="i32", stride_wn="i32", stride_sn="i32",
             stride_ym="i32")
# What a launch on these shapes specializes (Triton marks pointers and ints divisible by 16); without it the loads
# compile unvectorized and the counts describe a kernel that never runs. M varies and is left unmarked.
DIVISIBLE_BY_16 = ("x_ptr", "w_ptr", "s_ptr", "g_ptr", "y_ptr", "ws_ptr", "count_ptr", "N", "K", "K_SLICE",
                   "stride_xm", "stride_wn", "stride_sn", "stride_ym")
SHAPES = {"lm_head": (248320, 2048), "wide": (12288, 2048), "narrow": (2048, 6144)}
# SASS lines with their address (branch targets are addresses).
SASS_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")
SASS_MMA = re.compile(r"\b(HMMA|HGMMA)\b")
SASS_BRA = re.compile(r"\bBRA(?:\.\w+)*\s+0x([0-9a-f]+)")
PTX_MMA = re.compile(r"wgmma\.mma_async|mma\.sync")


def _innermost_loop(lines: list[str], target_of: Callable[[str], int | None], is_mma: Callable[[str], bool]
                    ) -> list[str]:
    """The lines from a backward branch's target to the branch, fewest lines among the loops with the most MMAs."""
    best: list[str] = []
    for i, line in enumerate(lines):
        j = target_of(line)
        if j is None or j > i:
            continue
        body = lines[j:i + 1]
        key = (sum(map(is_mma, body)), -len(body))
        if key > (sum(map(is_mma, best)), -len(best)):
            best = body
    return best


def sass_loop(sass: str) -> list[str]:
    """Instruction lines of the SASS K loop."""
    lines = [ln for ln in sass.splitlines() if SASS_INSTR.match(ln)]
    index = {int(SASS_INSTR.match(ln).group(1), 16): i for i, ln in enumerate(lines)}

    def target(line: str) -> int | None:
        m = SASS_BRA.search(line)
        return index.get(int(m.group(1), 16)) if m else None
    return _innermost_loop(lines, target, lambda ln: bool(SASS_MMA.search(ln)))


def ptx_loop(ptx: str) -> list[str]:
    """Instruction lines of the PTX K loop (labels and directives dropped)."""
    lines = [ln.split("//")[0].strip() for ln in ptx.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith((".", "{", "}"))]
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if ln.endswith(":")}

    def target(line: str) -> int | None:
        m = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)
        return labels.get(m.group(1)) if m else None
    body = _innermost_loop(lines, target, lambda ln: bool(PTX_MMA.search(ln)))
    return [ln for ln in body if not ln.endswith(":")]


def stats(name: str, N: int, K: int, slices: int = 1) -> dict:
    cfg = dict(default_config(16, N), SLICES=slices)
    consts = dict(cfg, EVEN_K=True, PTX_DEQUANT=True, DOT_F32=False, PDL=False)
    consts = {k: v for k, v in consts.items() if k in _nvfp4_gemm_kernel.arg_names}  # also the kernel before EVEN_K
    out = compile_sm90(_nvfp4_gemm_kernel, TYPES, consts, cfg["num_warps"], cfg["num_stages"], DIVISIBLE_BY_16)
    loop = sass_loop(out["sass"])
    opcodes: dict[str, int] = {}
    for line in loop:
        op = SASS_INSTR.match(line).group(2)
        opcodes[op] = opcodes.get(op, 0) + 1
    total = sum(1 for ln in out["sass"].splitlines() if SASS_INSTR.match(ln))
    per_thread = cfg["BLOCK_N"] * cfg["BLOCK_K"] / (32 * cfg["num_warps"])
    return dict(shape=name, N=N, K=K, config=cfg, mma="wgmma" if "HGMMA" in opcodes else "mma.sync",
                registers=out["registers"], shared_bytes=out["shared_bytes"],
                spill_store_bytes=out["spill_store_bytes"], spill_load_bytes=out["spill_load_bytes"],
                instructions=total, k_loop_sass=len(loop), k_loop_ptx=len(ptx_loop(out["ptx"])),
                weight_elements_per_thread=per_thread, k_loop_sass_per_element=len(loop) / per_thread,
                k_loop_top_opcodes=dict(sorted(opcodes.items(), key=lambda kv: -kv[1])[:10]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/fp4_gemm_sass.json")
    ap.add_argument("--slices", type=int, nargs="+", default=[1], help="K slices over programs (SLICES) to compile")
    args = ap.parse_args()
    rows = [stats(name, N, K, s) for name, (N, K) in SHAPES.items() for s in args.slices]
    write_json(compile_report(rows), args.out)
    print(f"{'shape':8} {'config':>18} {'mma':>8} {'regs':>4} {'smem KB':>7} {'spill':>5} {'instr':>6} | K loop: "
          f"{'SASS':>5} {'PTX':>5} {'elem/thr':>8} {'SASS/elem':>9}")
    for r in rows:
        c = r["config"]
        desc = (f"n{c['BLOCK_N']}k{c['BLOCK_K']}w{c['num_warps']}s{c['num_stages']}split{c.get('SPLIT_K', 1)}"
                f"x{c['SLICES']}")
        print(f"{r['shape']:8} {desc:>18} {r['mma']:>8} {r['registers']:>4} {r['shared_bytes'] / 1024:>7.0f} "
              f"{r['spill_store_bytes']:>5} {r['instructions']:>6} | {'':7} {r['k_loop_sass']:>5} {r['k_loop_ptx']:>5} "
              f"{r['weight_elements_per_thread']:>8.0f} {r['k_loop_sass_per_element']:>9.1f}")


if __name__ == "__main__":
    main()
