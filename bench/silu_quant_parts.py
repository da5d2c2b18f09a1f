"""Where the NVFP4 SiLU-quant kernel's time goes: its tile loop split into its memory side and its arithmetic.

Variants of ``_nvfp4_kernel``'s loop, built from the kernel's own helpers and launched like it (programs walking
tiles of 16-element blocks, the next tile's loads in flight):
  full          the kernel's loop; its bytes are checked against ocria::silu_mul_quant
  memory_only   the same loads and stores, the arithmetic replaced by an xor-sum of the loaded words
  compute_l2    the same arithmetic on data that does not come from DRAM: every program reads tile 0 or 1 (L2 hits
                after the first reads) and makes each next tile's words from the last ones with an xor
  no_prefetch   the loop without the next tile's loads in flight (fewer registers: more warps per SM); bytes checked
  empty         a launch that exits at once: what a kernel costs in the CUDA graph before it does anything
Timed like bench/silu_quant.py (a CUDA graph over rotating input copies, >= 256 MB touched); the floor is the
NVFP4 bytes at the copy bandwidth measured in the same run.

    python3 bench/silu_quant_parts.py --out bench/results/silu_quant_parts_h200.json
For a profiler, ``--launches N`` launches ocria::silu_mul_quant and then each variant N times (in that order, on
rotating inputs) and times nothing; at the clock the card runs at (METHOD.md: leave the clocks alone):
    ncu --clock-control none -k regex:"_nvfp4_kernel|_parts_kernel" --launch-skip 2 --launch-count 16 \
        python3 bench/silu_quant_parts.py --shapes 1024x6144 --launches 3
"""

import argparse
import datetime
import shlex
import subprocess
import sys

import torch
import triton
import triton.language as tl

from ocria.bench.results import write_json
from ocria.bench.timing import copy_bandwidth, time_calls
from ocria.plugins import numerics as nx
from ocria.plugins.launch import sm_count
from ocria.plugins.silu_quant.kernel import (
    NVFP4_MAX_REGISTERS,
    _nvfp4_loads,
    _nvfp4_tile,
    _rcp,
    silu_mul_quant_triton,
)

ROTATE_BYTES = 256 << 20
VARIANTS = ("full", "memory_only", "compute_l2", "no_prefetch", "empty")  # WHAT: the index
FULL, MEMORY_ONLY, COMPUTE_L2, NO_PREFETCH, EMPTY = (tl.constexpr(i) for i in range(len(VARIANTS)))
# (variant, blocks per tile, warps, programs per SM): the kernel's default shape at 1024 tokens, under its register
# cap (NVFP4_MAX_REGISTERS), and no_prefetch uncapped at 45 registers, 40 warps per SM
RUNS = [("full", 128, 4, 6), ("memory_only", 128, 4, 6), ("compute_l2", 128, 4, 6), ("no_prefetch", 128, 4, 10),
        ("empty", 128, 4, 6)]


@triton.jit
def _parts_kernel(x_ptr, out_ptr, scale_ptr, out_scale_ptr, M, stride_xm, N: tl.constexpr, BLOCKS: tl.constexpr,
                  WHAT: tl.constexpr):
    if WHAT != EMPTY:
        scale = tl.load(scale_ptr)
        inv_s6 = _rcp(6.0 * scale)
        pid = tl.program_id(0)
        n_tiles = tl.cdiv(M * (N // 16), BLOCKS)
        step = tl.num_programs(0)
        if WHAT == COMPUTE_L2:
            g0, u0, g1, u1 = _nvfp4_loads(x_ptr, pid % 2, M, stride_xm, N, True, BLOCKS)
        elif WHAT == NO_PREFETCH:
            g0 = tl.zeros([BLOCKS, 4], tl.int32)
            u0, g1, u1 = g0, g0, g0
        else:
            g0, u0, g1, u1 = _nvfp4_loads(x_ptr, pid, M, stride_xm, N, True, BLOCKS)
        for tile in range(pid, n_tiles, step):
            if WHAT == NO_PREFETCH:
                g0, u0, g1, u1 = _nvfp4_loads(x_ptr, tile, M, stride_xm, N, True, BLOCKS)
                next_g0, next_u0, next_g1, next_u1 = g0, u0, g1, u1
            elif WHAT == COMPUTE_L2:
                next_g0, next_u0, next_g1, next_u1 = g0 ^ tile, u0 ^ tile, g1 ^ tile, u1 ^ tile
            else:
                next_g0, next_u0, next_g1, next_u1 = _nvfp4_loads(x_ptr, tile + step, M, stride_xm, N, True, BLOCKS)
            blk = tile * BLOCKS + tl.arange(0, BLOCKS)
            bmask = blk < M * (N // 16)
            if WHAT == MEMORY_ONLY:
                words = tl.join(tl.sum(g0 ^ u0, 1), tl.sum(g1 ^ u1, 1))
                tl.store(out_scale_ptr + blk, tl.sum(g0, 1).to(tl.uint8), mask=bmask)
            else:
                _, scode, words = _nvfp4_tile(g0, u0, g1, u1, scale, inv_s6, True, True, 0, True, True, True)
                tl.store(out_scale_ptr + blk, scode.to(tl.uint8), mask=bmask)
            tl.store(out_ptr + blk[:, None] * 2 + tl.arange(0, 2)[None, :], words, mask=bmask[:, None])
            g0, u0, g1, u1 = next_g0, next_u0, next_g1, next_u1


def launch(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, out_scale: torch.Tensor, what: int, blocks: int,
           warps: int, programs_per_sm: int) -> None:
    """One launch of a variant on bf16 gate_up ``x`` [M, 2N] (global scale in the fast range, as calibrated)."""
    m, n = x.shape[0], x.shape[1] // 2
    words = x.view(torch.int32)
    grid = min(triton.cdiv(m * (n // 16), blocks), programs_per_sm * sm_count(x.device))
    cap = {} if what == VARIANTS.index("no_prefetch") else {"maxnreg": NVFP4_MAX_REGISTERS}
    _parts_kernel[(grid,)](words, out.view(torch.int32), scale, out_scale, m, words.stride(0), N=n, BLOCKS=blocks,
                           WHAT=what, num_warps=warps, **cap)


def shape_arg(text: str) -> tuple[int, int]:
    """``TOKENSxWIDTH`` (e.g. 1024x6144), the width a multiple of 16 (NVFP4 blocks)."""
    try:
        m, n = (int(v) for v in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKENSxWIDTH such as 1024x6144, got {text!r}") from None
    if m < 1 or n < 16 or n % 16:
        raise argparse.ArgumentTypeError(f"tokens >= 1 and a width that is a multiple of 16, got {text!r}")
    return m, n


def profile_launches(shapes: list[tuple[int, int]], scale: torch.Tensor, launches: int) -> None:
    """ocria::silu_mul_quant, then each of ``RUNS`` in order, ``launches`` times each per shape, each launch on the
    next of a few input copies larger than L2 together (a profiler that flushes caches between passes reads DRAM
    either way)."""
    for m, n in shapes:
        xs = [(torch.randn(m, 2 * n, device="cuda") * 3).to(torch.bfloat16) for _ in range(3)]
        out = torch.empty(m, n // 2, dtype=torch.uint8, device="cuda")
        out_scale = torch.empty(m, n // 16, dtype=torch.uint8, device="cuda")
        print(f"{m} x {n}: ocria::silu_mul_quant (_nvfp4_kernel), then " +
              ", ".join(f"{name} ({blocks}b/{warps}w/{pps}pps)" for name, blocks, warps, pps in RUNS) +
              f" (_parts_kernel), {launches} launches each", flush=True)
        for i in range(launches):
            silu_mul_quant_triton(xs[i % 3], "nvfp4", scale)
        for name, blocks, warps, pps in RUNS:
            for i in range(launches):
                launch(xs[i % 3], scale, out, out_scale, VARIANTS.index(name), blocks, warps, pps)
        torch.cuda.synchronize()
        del xs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", type=shape_arg,
                    default=[(1024, 6144), (1024, 12288), (1024, 18944), (4096, 12288)],
                    help="tokens x width")
    ap.add_argument("--out", default="bench/results/silu_quant_parts_h200.json")
    ap.add_argument("--launches", type=int, default=0,
                    help="for a profiler: launch the kernel and each variant this many times, time nothing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU: the variants run the kernel's GPU code (inline PTX), which has no CPU form")
    torch.manual_seed(0)
    scale = nx.nvfp4_global_scale(torch.tensor(12.0)).cuda()
    if args.launches:
        profile_launches(args.shapes, scale, args.launches)
        return
    bw = copy_bandwidth()
    rows = []
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "git": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
              "copy_bandwidth_TBps": bw / 1e12, "rows": rows}
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    print(f"{'M':>5} {'N':>6} {'variant':12s} {'tile':>13} {'µs':>7} {'x floor':>7} {'bytes':>6}")
    for m, n in args.shapes:
        copies = max(1, min(64, -(-ROTATE_BYTES // (m * 4 * n))))
        xs = [(torch.randn(m, 2 * n, device="cuda") * 3).to(torch.bfloat16) for _ in range(copies)]
        want = silu_mul_quant_triton(xs[0], "nvfp4", scale)
        floor = (m * 2 * n * 2 + m * n // 2 + m * n // 16) / bw * 1e6
        out = torch.empty(m, n // 2, dtype=torch.uint8, device="cuda")
        out_scale = torch.empty(m, n // 16, dtype=torch.uint8, device="cuda")
        for name, blocks, warps, pps in RUNS:
            what = VARIANTS.index(name)
            out.zero_()
            launch(xs[0], scale, out, out_scale, what, blocks, warps, pps)
            same = None
            if name in ("full", "no_prefetch"):
                same = bool(torch.equal(out, want[0].view(torch.uint8))
                            and torch.equal(out_scale, want[1].view(torch.uint8)))
            args_of = {"scale": scale, "out": out, "out_scale": out_scale, "what": what, "blocks": blocks,
                       "warps": warps, "programs_per_sm": pps}
            us = time_calls([lambda x=x, a=args_of: launch(x, **a) for x in xs], 20 if m < 4096 else 5)
            rows.append({"tokens": m, "width": n, "variant": name, "blocks": blocks, "num_warps": warps,
                         "programs_per_sm": pps, "us": us, "floor_us": floor, "x_floor": us / floor,
                         "same_bytes_as_kernel": same})
            tile, check = f"{blocks}b/{warps}w/{pps}pps", "" if same is None else str(same)
            print(f"{m:5d} {n:6d} {name:12s} {tile:>13} {us:7.2f} {us / floor:7.3f} {check:>6}")
        del xs
        write_json(result, args.out)
    result["ok"] = all(r["same_bytes_as_kernel"] is not False for r in rows)
    write_json(result, args.out)


if __name__ == "__main__":
    main()
