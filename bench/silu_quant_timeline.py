"""Where an NVFP4 SiLU-quant launch spends its time, warp by warp: ``%globaltimer`` stamps of one launch.

A probe, GPU only. It runs a copy of ``ocria/plugins/silu_quant/kernel.py`` with ``STAMP_PATCH`` applied (the test
suite checks it still applies), whose NVFP4 kernel takes an int64 buffer of 1 + 2 ``STAMP_TILES`` stamps per warp:
the warp's start, then for each of its first tiles the moment the tile's loads are in registers (the stamp reads a sum
of the loaded words, so it waits for them; a warp busy with the tile before reads it later) and the moment its stores
are issued. Inputs rotate over copies larger than L2, as the benchmarks time them, and the last launch is read.
Reported in µs from the first warp's start: quantiles over warps of the first tile's data, the last tile's data and
the last tile's end, the last tile's own time, every tile's time, and the mean end of the warps of each eighth of the
programs and of each warp index (on the H200 a program's warps ended up to 6 µs apart,
and the second program launched on an SM ended later than the first).

    cp ocria/plugins/silu_quant/kernel.py /tmp/silu_tl.py
    patch /tmp/silu_tl.py STAMP_PATCH  # the file the constant below names
    python bench/silu_quant_timeline.py --kernel /tmp/silu_tl.py --rows 1024x6144 1024x12288 --out /tmp/tl.json
"""

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_variants import Variant, load  # noqa: E402
from silu_quant import ROTATE_BYTES  # noqa: E402
from silu_quant_ab import parse_rows  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.plugins import numerics as nx  # noqa: E402

STAMP_PATCH = "bench/results/silu_quant_s32_stamps.patch"
QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)


def quantiles(values: torch.Tensor) -> list[float]:
    return [round(float(torch.quantile(values.flatten(), q)), 2) for q in QUANTILES]


def warp_times(stamps: torch.Tensor) -> dict:
    """Stamps [programs, warps, 1 + 2 tiles] in ns (0: not written) -> µs from the first warp's start."""
    s = stamps.to(torch.float64)
    t0 = s[..., 0][s[..., 0] > 0].min()
    us = (s - t0) / 1e3
    ready, end = us[..., 1::2], us[..., 2::2]
    tiles = (s[..., 1::2] > 0).sum(-1)
    worked = tiles > 0
    last = (tiles - 1).clamp_min(0).unsqueeze(-1)
    last_ready, last_end = ready.gather(-1, last).squeeze(-1), end.gather(-1, last).squeeze(-1)
    by_program = [chunk for chunk in torch.tensor_split(last_end, 8) if chunk.numel()]
    return dict(
        quantiles=list(QUANTILES), tiles=[int(tiles[worked].min()), int(tiles[worked].max())],
        first_data=quantiles(ready[..., 0][worked]), last_data=quantiles(last_ready[worked]),
        last_end=quantiles(last_end[worked]), last_tile=quantiles((last_end - last_ready)[worked]),
        tile=quantiles((end - ready)[s[..., 1::2] > 0]),
        end_by_program_eighth=[round(float(c.mean()), 2) for c in by_program],
        end_by_warp=[round(float(v), 2) for v in last_end.mean(0)],
    )  # fmt: skip


def run(K, M: int, N: int, device: torch.device) -> dict:
    cfg = K.default_config("nvfp4", M, N)
    shape = (K.nvfp4_programs(M, N, cfg, device), cfg["blocks"] // 32, 1 + 2 * K.STAMP_TILES)  # as the launch's grid
    stamps = torch.zeros(shape, dtype=torch.int64, device=device)
    K.STAMPS[0] = stamps
    scale = nx.nvfp4_global_scale(torch.tensor(12.0)).to(device)
    copies = max(2, -(-ROTATE_BYTES // (M * 4 * N)))
    xs = [(torch.randn(M, 2 * N, device=device) * 3).to(torch.bfloat16) for _ in range(copies)]
    for x in xs:  # the last launch's stamps are read: its inputs come from DRAM
        stamps.zero_()
        K.silu_mul_quant_triton(x, "nvfp4", scale)
    torch.cuda.synchronize()
    return dict(row=f"{M}x{N}", config=cfg, **warp_times(stamps.cpu()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", required=True, help="a stamped copy of kernel.py (see the module docstring)")
    p.add_argument("--rows", nargs="+", default=["1024x6144", "1024x12288"])
    p.add_argument("--max-blocks", type=int, help="the copy's NVFP4_MAX_BLOCKS (blocks per tile), for another tiling")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not Path(args.kernel).is_file():
        raise SystemExit(f"--kernel {args.kernel}: no such file (a copy of kernel.py with {STAMP_PATCH} applied)")
    rows = parse_rows(args.rows)
    if args.max_blocks is not None and args.max_blocks not in (32, 64, 128, 256, 512, 1024):
        raise SystemExit(f"--max-blocks {args.max_blocks}: use a power of two from 32 (one warp) to 1024 (32 warps)")
    if not torch.cuda.is_available():
        raise SystemExit("silu_quant_timeline: needs a CUDA GPU, none is visible")
    stamped = Variant("stamped", args.kernel, {"NVFP4_MAX_BLOCKS": args.max_blocks} if args.max_blocks else {})
    load(stamped)  # a copy that does not import, or lacks the setting, is named, not traced back
    if not hasattr(stamped.module, "STAMPS"):
        raise SystemExit(f"--kernel {args.kernel}: no STAMPS buffer; apply {STAMP_PATCH} to a copy of kernel.py")
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                  command="python " + shlex.join(sys.argv), rows=[])  # fmt: skip
    for M, N in rows:
        row = run(stamped.module, M, N, torch.device("cuda"))
        result["rows"].append(row)
        print(row)
        write_json(result, args.out)


if __name__ == "__main__":
    main()
