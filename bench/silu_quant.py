"""Fused SiLU(gate) x up -> bf16 / FP8 / NVFP4 on the GPU: bit-exactness, then µs and GB/s.

Correctness (GPU, against the PyTorch reference run on the same GPU): every bf16 gate value, every bf16 up
value, a large random tensor, and ties/NaN/inf/zero-block inputs, for each mode; mismatching bytes are
counted (a NaN's sign is not significant). The ``*_fast_silu`` rows check the GPU's approximate bf16 silu on
every gate and up value; the timed rows use it only if all of them match, the IEEE silu otherwise.

Timing rows (tokens M x width N, gate_up [M, 2N] bf16):
  fused     ocria::silu_mul_quant (one Triton kernel) with the kernel's own default_config, what the runtime
            launches (the sweep before the table times other tiles at 4096 x 12288, to keep those defaults honest)
  unfused   the plain PyTorch chain: F.silu(gate) * up, then the quantizer in torch ops
            (fp8: div, clamp, cast; fp8_dynamic: amax, div, clamp, cast; nvfp4: numerics.quantize_nvfp4)
  floor     bytes in + bytes out at the device copy bandwidth measured in the same run
  copy      a plain device copy moving the same bytes (half read, half written), timed like the kernel: what any
            kernel of that size pays for launch, ramp-up and drain on top of the floor (x copy: fused over it). A
            reference, not a bound: its time moves with where its buffers land (on the H200,
            13.7 against 9.7 µs for copies of the same size placed differently)
Timing: a CUDA graph of R calls over rotating input copies (>= 256 MB touched), each copy's outputs kept until its
next call so they rotate too (timing.rotating_calls), R enough for a replay of >= 2 ms (timing.time_calls), median
over replays / R.

    python3 bench/silu_quant.py --out bench/results/silu_quant_h200.json
CPU smoke run of the correctness part and the timed closures (Triton interpreter, no timing):
    TRITON_INTERPRET=1 python bench/silu_quant.py --device cpu --tokens 3 --widths 64 --out /tmp/s.json
"""

import argparse
import datetime
import json
import shlex
import sys
from types import ModuleType

import torch
import torch.nn.functional as F

from ocria.bench.results import write_json
from ocria.bench.timing import copy_bandwidth, rotating_calls, time_calls
from ocria.plugins import numerics as nx
from ocria.plugins.silu_quant import kernel as kernel_module
from ocria.plugins.silu_quant import quantize_act_reference, silu_mul_quant, silu_mul_quant_reference
from ocria.plugins.silu_quant.kernel import default_config, silu_mul_quant_triton

ROTATE_BYTES = 256 << 20
MODES = ("bf16", "fp8_static", "fp8_dynamic", "nvfp4")
SWEEP = [(1, 1024, 4), (1, 2048, 8), (2, 1024, 4), (2, 2048, 8), (4, 1024, 4), (4, 1024, 8), (8, 512, 4),
         (4, 2048, 8)]  # (rows, columns, warps) per program
SWEEP_DYNAMIC = [{"block_m": 1, "block_n": bn, "num_warps": w}  # block_n 0: the whole row as one tile
                 for bn, w in ((1024, 4), (1024, 8), (2048, 8), (4096, 8), (0, 16))]
SWEEP_DYNAMIC += [{"row_tiles": True, "num_warps": w} for w in (4, 8, 16)]  # one pass, the row in registers
SWEEP_DYNAMIC += [{"row_tiles": True, "num_warps": w, "max_registers": 64} for w in (4, 8)]
# the row kernel's tiles at 8 and 16 elements per thread, capped (unset above: the padding decides)
SWEEP_ROW_ELEMS = [{"row_tiles": True, "num_warps": w, "tile_elems": e, "max_registers": 64}
                   for w in (4, 8, 16) for e in (8, 16)]
SWEEP_DYNAMIC += SWEEP_ROW_ELEMS
ONE_AND_TWO_PASS = {"row_tiles": {"row_tiles": True, "num_warps": 8, "fast_silu": False},
                    "two_pass": {"block_m": 1, "block_n": 16, "num_warps": 4, "fast_silu": False}}
# NVFP4: 16-element blocks per program, warps, and programs per SM walking the tiles (0: one program per tile)
# (with the default's register cap where a fourth number is given: 80 registers, 24 warps per SM)
SWEEP_NVFP4 = [{"blocks": b, "num_warps": w, "programs_per_sm": p, **({"max_registers": r[0]} if r else {})}
               for b, w, p, *r in ((128, 4, 6, 96), (64, 2, 12, 96), (32, 1, 24, 96), (256, 8, 3, 96), (256, 8, 0),
                                   (128, 4, 0), (512, 16, 2), (256, 8, 2))]
# Decode-sized NVFP4 (16 rows): smaller tiles spread a few rows over more SMs
SWEEP_NVFP4_FEW_ROWS = [{"blocks": b, "num_warps": w, "programs_per_sm": 0}
                        for b, w in ((32, 1), (64, 2), (128, 4), (256, 8), (512, 16))]
DYNAMIC_WIDTHS = (6144, 18944)  # per-token FP8 chunks its rows by width: swept at these too
# 1024 rows of per-token FP8 are about one wave of row programs: the row kernel with and without a 64-register cap
# (8 programs of 4 warps per SM instead of 7; 16 warps are capped at 64 anyway)
SWEEP_ROWS_1024 = [{"row_tiles": True, "num_warps": w} for w in (4, 8, 16)]
SWEEP_ROWS_1024 += [{"row_tiles": True, "num_warps": w, "max_registers": 64} for w in (4, 8)] + SWEEP_ROW_ELEMS


def unfused(gate_up: torch.Tensor, mode: str, scale: torch.Tensor | None):
    gate, up = gate_up.chunk(2, dim=-1)
    h = F.silu(gate) * up
    if mode == "bf16":
        return h
    if mode == "fp8_static":
        return (h.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    if mode == "fp8_dynamic":
        s = h.abs().amax(dim=-1, keepdim=True).float().clamp(min=2.0**-24) / 448.0
        return (h.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s
    return nx.quantize_nvfp4(h, scale)


def out_bytes(m: int, n: int, mode: str) -> int:
    return {"bf16": 2 * m * n, "fp8_static": m * n, "fp8_dynamic": m * n + 4 * m,
            "nvfp4": m * n // 2 + m * n // 16}[mode]


def _mismatches(a, b) -> int:
    def canon(t):
        if t is None:
            return None
        if t.dtype == torch.float8_e4m3fn:
            u = t.view(torch.uint8)
            return torch.where((u & 0x7F) == 0x7F, torch.full_like(u, 0x7F), u).to(torch.int32)
        if t.dtype == torch.uint8:
            return t.to(torch.int32)
        nan = t.isnan()
        return torch.where(nan, torch.zeros_like(t), t).view(torch.int16 if t.element_size() == 2 else torch.int32)\
            .to(torch.int32) + nan.to(torch.int32) * 7777
    bad = int((canon(a[0]) != canon(b[0])).sum())
    if b[1] is not None:
        bad += int((canon(a[1]) != canon(b[1])).sum())
    return bad


def nvfp4_code_edges(scale: float, blocks: int, dev: str) -> torch.Tensor:
    """[blocks / 32, 512] bf16 for NVFP4 under global ``scale``: in each 16-element block an anchor (its amax, so its
    divisor d) and, with random signs, the two bf16 values around d b for each of the seven E2M1 decision points b
    (where RN(h / d)'s code changes; ``kernel.E2M1_DECISIONS``), the last element random below the anchor."""
    g = torch.Generator().manual_seed(1)
    s = torch.tensor(scale, dtype=torch.float32)
    anchor = (6 * s * torch.exp2(torch.empty(blocks).uniform_(-8.0, 8.6, generator=g))).to(torch.bfloat16).float()
    d = nx.e4m3_decode(nx.e4m3_encode((anchor / (6 * s)).clamp(2**-9, 448))) * s
    cols = [anchor]
    for b, _ in kernel_module.E2M1_DECISIONS:
        below = (d * b).view(torch.int32) & -65536
        cols += [below.view(torch.float32), (below + 65536).view(torch.float32)]
    cols.append(anchor * torch.rand(blocks, generator=g))
    x = torch.stack(cols, dim=-1)
    x = x * torch.where(torch.rand(x.shape, generator=g) < 0.5, -1.0, 1.0)
    return x.to(torch.bfloat16).reshape(-1, 512).to(dev)


def correctness(scales: dict, dev: str, kernel: ModuleType | None = None) -> list[dict]:
    """Mismatching bytes against the reference per input and mode; ``kernel``: a variant of the kernel module
    (bench/silu_quant_ab.py), called directly instead of through the operator."""
    K = kernel or kernel_module
    if kernel is None:
        def fused(x, mode, s):
            return silu_mul_quant(x, mode, s, use_kernel=True)
    else:
        fused = kernel.silu_mul_quant_triton
    rows = []
    gate = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(-1, 512).to(dev)
    up = (torch.randn(gate.shape, device=dev) * 2).to(torch.bfloat16)
    every_gate = torch.cat([gate, up], dim=-1)
    every_up = torch.cat([(torch.randn(gate.shape, device=dev) * 3).to(torch.bfloat16), gate], dim=-1)
    n = 6144 if dev == "cuda" else 64
    rnd = (torch.randn(1024 if dev == "cuda" else 8, 2 * n, device=dev) * 3).to(torch.bfloat16)
    rnd[5, :16] = 0
    rnd[7, 3] = float("nan")
    rnd[6, n + 40] = float("inf")
    ties_up = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 32, device=dev).reshape(1, 256) / 32
    ties = torch.cat([torch.full((1, 256), 32.0, device=dev), ties_up], dim=-1).to(torch.bfloat16)
    # Narrow rows: tiles of 16..64 columns, where a thread may hold a single element (the paired bf16 rounding).
    narrow = [(f"random_3x{w}", (torch.randn(3, 2 * w, device=dev) * 3).to(torch.bfloat16)) for w in (16, 48)]
    name_rnd = f"random_{rnd.shape[0]}x{n}"
    for name, x in (("every_bf16_gate", every_gate), ("every_bf16_up", every_up), (name_rnd, rnd),
                    ("e2m1_ties", ties), *narrow):
        for mode in MODES:
            s = nx.nvfp4_global_scale(torch.tensor(6 * 448.0)).to(dev) if name == "e2m1_ties" and mode == "nvfp4" \
                else scales[mode]
            got = fused(x, mode, s)
            ref = silu_mul_quant_reference(x, mode, s)
            rows.append({"input": name, "mode": mode, "elements": x.numel() // 2, "mismatches": _mismatches(got, ref)})
            if mode == "fp8_dynamic":  # both per-token designs, whichever the default is
                for label, cfg in ONE_AND_TWO_PASS.items():
                    rows.append({"input": f"{name}_{label}", "mode": mode, "elements": x.numel() // 2,
                                 "mismatches": _mismatches(K.silu_mul_quant_triton(x, mode, None, cfg), ref)})
            if name in ("every_bf16_gate", "every_bf16_up") and dev == "cuda":  # the approximate silu's complete check
                cfg = {**K.default_config(mode, x.shape[0], 512), "fast_silu": True}
                rows.append({"input": f"{name}_fast_silu", "mode": mode, "elements": x.numel() // 2,
                             "mismatches": _mismatches(K.silu_mul_quant_triton(x, mode, s, cfg), ref)})
    # Every bf16 value as the activation itself (no silu): the quantizer alone, several scales.
    every = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(-1, 512).to(dev)
    for mode, svals in (("fp8_static", [0.02, 1.0, 3.7e-3, 117.0]), ("fp8_dynamic", [None]),
                        ("nvfp4", [1e-3, 0.37, 52.0, 100.0, 1e-19])):  # the last two: outside [2^-60, 64]
        for sv in svals:
            s = None if sv is None else torch.tensor([sv], device=dev)
            got = K.quantize_act_triton(every, mode, s)
            ref = quantize_act_reference(every, mode, s)
            rows.append({"input": f"every_bf16_value_scale_{sv}", "mode": mode, "elements": every.numel(),
                         "mismatches": _mismatches(got, ref)})
    for sv in (1e-3, 0.37, float(scales["nvfp4"])):  # NVFP4 codes next to their decision points
        edges, s = nvfp4_code_edges(sv, 4096 if dev == "cuda" else 64, dev), torch.tensor([sv], device=dev)
        rows.append({"input": f"nvfp4_code_edges_scale_{sv:.4g}", "mode": "nvfp4", "elements": edges.numel(),
                     "mismatches": _mismatches(K.quantize_act_triton(edges, "nvfp4", s),
                                               quantize_act_reference(edges, "nvfp4", s))})
    for sv in (100.0, 1e-19):  # NVFP4 from gate_up under global scales outside [2^-60, 64]
        s = torch.tensor([sv], device=dev)
        rows.append({"input": f"{name_rnd}_scale_{sv}", "mode": "nvfp4", "elements": rnd.numel() // 2,
                     "mismatches": _mismatches(fused(rnd, "nvfp4", s), silu_mul_quant_reference(rnd, "nvfp4", s))})
    # fp32 activations at every E4M3 midpoint and next to it (the hardware convert's ties), scale 1.
    vals = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = torch.cat([vals, (vals[1:] + vals[:-1]) / 2, torch.tensor([448.0, 460.0, 464.0, 470.0, 1e9])])
    pts = torch.cat([mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, -mids - 1)])
    pts = torch.cat([pts, -pts, torch.tensor([float("inf"), -float("inf"), float("nan")])])
    pts = torch.cat([pts, torch.zeros((-pts.numel()) % 16)]).reshape(1, -1).to(dev)
    for sv in (1.0, 0.5):
        s = torch.tensor([sv], device=dev)
        rows.append({"input": f"fp32_e4m3_ties_scale_{sv}", "mode": "fp8_static", "elements": pts.numel(),
                     "mismatches": _mismatches(K.quantize_act_triton(pts, "fp8_static", s),
                                               quantize_act_reference(pts, "fp8_static", s))})
    return rows


def sweep(scales: dict, fast: bool, modes: list[str]) -> dict:
    """Best config per mode at 4096 tokens x 12288 ((rows, columns, warps) per program; blocks, warps and
    programs per SM for NVFP4); for per-token FP8 also at 4096 tokens of the widths of DYNAMIC_WIDTHS (keys
    ``fp8_dynamic@N``) and, for its one-pass row kernel with and without a register cap, at 1024 tokens of every
    width (``fp8_dynamic@1024xN``), as for NVFP4 (``nvfp4@1024xN``), and NVFP4 at 16 tokens (``nvfp4@16xN``).
    Timed like the table (rotating input copies); a config whose bytes differ from the default's is recorded and
    never best."""
    best, log = {}, []
    tiles = [{"block_m": bm, "block_n": bn, "num_warps": warps} for bm, bn, warps in SWEEP]
    # (rows, width, key suffix, configs per mode)
    of_mode = {"fp8_dynamic": SWEEP_DYNAMIC, "nvfp4": SWEEP_NVFP4}
    points = [(4096, 12288, "", {m: of_mode.get(m, tiles) for m in modes})]
    points += [(4096, w, f"@{w}", {"fp8_dynamic": SWEEP_DYNAMIC}) for w in DYNAMIC_WIDTHS]
    points += [(1024, w, f"@1024x{w}", {"fp8_dynamic": SWEEP_ROWS_1024, "nvfp4": SWEEP_NVFP4})
               for w in (6144, 12288, 18944)]
    points += [(16, w, f"@16x{w}", {"nvfp4": SWEEP_NVFP4_FEW_ROWS}) for w in (6144, 12288, 18944)]
    for rows, width, suffix, configs_of in points:
        copies = max(1, min(64, -(-ROTATE_BYTES // (rows * 4 * width))))
        xs = [(torch.randn(rows, 2 * width, device="cuda") * 3).to(torch.bfloat16) for _ in range(copies)]
        for mode in [m for m in configs_of if m in modes]:
            key = mode + suffix
            want = silu_mul_quant_triton(xs[0], mode, scales[mode])
            for cfg in configs_of[mode]:
                cfg = {**cfg, "fast_silu": fast}
                try:
                    same = _mismatches(silu_mul_quant_triton(xs[0], mode, scales[mode], cfg), want) == 0
                except ValueError as e:  # a tiling this width does not take (e.g. too many row tiles)
                    log.append({"mode": key, "config": cfg, "error": str(e)})
                    continue
                us = time_calls(rotating_calls(lambda x, md=mode, c=cfg: silu_mul_quant_triton(x, md, scales[md], c),
                                               xs), 5 if rows == 4096 else 20)  # fmt: skip
                log.append({"mode": key, "config": cfg, "us": us, "same_bytes_as_default": same})
                if same and (key not in best or us < best[key]["us"]):
                    best[key] = {"config": cfg, "us": us}
        del xs
    return {"best": best, "tried": log}


def copy_us(nbytes: int, copies: int, calls: int) -> float:
    """µs per call of ``Tensor.copy_`` reading nbytes / 2 and writing nbytes / 2, over ``copies`` rotating buffers."""
    src = [torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_() for _ in range(copies)]
    dst = [torch.empty_like(s) for s in src]
    return time_calls([lambda s=s, d=d: d.copy_(s) for s, d in zip(src, dst)], calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 1024, 4096, 8192])
    ap.add_argument("--widths", type=int, nargs="+", default=[6144, 12288, 18944])
    ap.add_argument("--out", default="bench/results/silu_quant_h200.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to sweep and time")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = args.device
    scales = {"bf16": None, "fp8_static": torch.tensor([0.02], device=dev), "fp8_dynamic": None,
              "nvfp4": nx.nvfp4_global_scale(torch.tensor(12.0)).to(dev)}
    checks = correctness(scales, dev)
    for c in checks:
        print(f"exact {c['input']:18s} {c['mode']:12s} mismatches {c['mismatches']} / {c['elements']}")
    if dev != "cuda":  # smoke run: exercise the timed closures once, no timing
        x = (torch.randn(args.tokens[0], 2 * args.widths[0]) * 3).to(torch.bfloat16)
        for mode in MODES:
            silu_mul_quant(x, mode, scales[mode], use_kernel=True)
            unfused(x, mode, scales[mode])
        print(json.dumps({"all_exact": all(c["mismatches"] == 0 for c in checks)}))
        return
    fast = all(c["mismatches"] == 0 for c in checks if c["input"].endswith("_fast_silu"))  # else time the IEEE silu
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; fast silu exact for every bf16 gate and up value: {fast}")
    tuning = sweep(scales, fast, args.modes)
    for mode, b in tuning["best"].items():
        print(f"best config {mode:18s} {b['config']} {b['us']:.1f} µs at 4096 tokens")

    rows = []
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__,
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
              "copy_bandwidth_TBps": bw / 1e12, "fast_silu_exact": fast, "tuning": tuning, "correctness": checks,
              "rows": rows}
    print(f"{'M':>5} {'N':>6} {'mode':12s} {'fused µs':>9} {'unfused':>9} {'floor':>8} {'x floor':>7} "
          f"{'copy':>8} {'x copy':>6} {'speedup':>7} {'GB/s':>7}")
    for n in args.widths:
        for m in args.tokens:
            in_bytes = m * 2 * n * 2
            copies = max(1, min(64, -(-ROTATE_BYTES // in_bytes)))
            xs = [(torch.randn(m, 2 * n, device="cuda") * 3).to(torch.bfloat16) for _ in range(copies)]
            for mode in args.modes:
                s = scales[mode]
                calls = 20 if in_bytes < (64 << 20) else 5
                cfg = {**default_config(mode, m, n), "fast_silu": fast}
                fused = time_calls(rotating_calls(lambda x, md=mode, s=s, c=cfg: silu_mul_quant_triton(x, md, s, c),
                                                  xs), calls)  # fmt: skip
                plain = time_calls(rotating_calls(lambda x, md=mode, s=s: unfused(x, md, s), xs), calls)
                nbytes = in_bytes + out_bytes(m, n, mode)
                floor = nbytes / bw * 1e6
                copy = copy_us(nbytes, copies, calls)
                row = {"tokens": m, "width": n, "mode": mode, "config": cfg, "fused_us": fused, "unfused_us": plain,
                       "floor_us": floor, "copy_us": copy, "bytes": nbytes, "fused_GBps": nbytes / fused * 1e-3,
                       "x_floor": fused / floor, "x_copy": fused / copy, "speedup_vs_unfused": plain / fused}
                rows.append(row)
                print(f"{m:5d} {n:6d} {mode:12s} {fused:9.2f} {plain:9.2f} {floor:8.2f} {fused / floor:7.2f} "
                      f"{copy:8.2f} {fused / copy:6.2f} {plain / fused:7.2f} {row['fused_GBps']:7.0f}")
            del xs
        write_json(result, args.out)
    big = [r for r in rows if r["tokens"] >= 1024]
    summary = {"max_x_floor_tokens_ge_1024": max(r["x_floor"] for r in big),
               "max_x_copy_tokens_ge_1024": max(r["x_copy"] for r in big),
               "min_speedup_tokens_ge_1024": min(r["speedup_vs_unfused"] for r in big),
               "all_exact": all(c["mismatches"] == 0 for c in checks)}
    print(json.dumps(summary))
    result["summary"] = summary
    write_json(result, args.out)


if __name__ == "__main__":
    main()
