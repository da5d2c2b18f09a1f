"""How close to the ReplaySSM floor a kernel can get at all: the floor's bytes moved with (almost) no arithmetic.

``_floor_bytes_kernel`` runs in the verify block kernel's tiling (one program per value-column tile, value head and
batch row; the state tile walked in key chunks with the same pipelining, tile width, warps and register cap as
``replay_verify`` picks) and moves exactly the bytes ``bench/replay_ssm.py`` counts as the floor: the state read and
written once, the pending ring entries (k, u, g) read, the new tokens' q, k, v, a, b read, the bf16 outputs and the
parked ring entries written. Its arithmetic is a few adds, so nothing is optimised away. Timed beside
``replay_verify`` and a plain copy of the same bytes (``torch`` copy of floor/2 bytes: read + write), each in a CUDA
graph over rotating slot sets like ``replay_ssm.bench_row``. What the bytes kernel takes over the floor is the part
of the 1.5x target that no fold, products or prep can use.

    python3 bench/replay_ssm_bytes.py --rows 8x16 16x16 32x16 64x16 --out bench/results/replay_ssm_bytes_h200.json
CPU smoke run (Triton interpreter, tiny heads, no timing worth reading):
    TRITON_INTERPRET=1 python bench/replay_ssm_bytes.py --device cpu --heads 2 4 32 --rows 2x3 --rotate-mib 0 \
        --out /tmp/bytes.json
"""

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))  # replay_ssm.py, also when loaded by path (tests)
import replay_ssm as RB  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.bench.timing import copy_bandwidth  # noqa: E402
from ocria.plugins.replay_ssm import kernel as K  # noqa: E402
from ocria.plugins.replay_ssm.kernel import _slot_position  # noqa: E402


@triton.jit
def _floor_bytes_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, state_ptr, ring_k_ptr, ring_u_ptr, ring_g_ptr, ring_phase_ptr, pending_ptr,
    slot_ptr, o_ptr, T, Tmax, sq, sk, sv, sa, sb,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    TP: tl.constexpr, BKC: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """State tile += g_tot (the pending log-decays' sum) and += the pending keys' column sums, chunk by chunk;
    o = v + per-token sums of the new keys and queries + the pending writes' row sums; parks u = v, g = a + b and
    k = the new keys (fp32). The same loads and stores as the verify kernels, one add or reduction each."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = i_h // (HV // HK)
    rt = tl.arange(0, TP)
    rc = tl.arange(0, BKC)
    rv = i_v * BV + tl.arange(0, BV)
    mv, mt = rv < DV, rt < T
    mvt = mv[:, None] & mt[None, :]
    row = (i_b * T + rt).to(tl.int64)
    slot, phase, n = _slot_position(slot_ptr, ring_phase_ptr, pending_ptr, i_b)
    tok = (slot * 2 + phase) * Tmax + rt
    park = (slot * 2 + 1 - phase) * Tmax + rt
    mp = rt < n
    g_tot = tl.sum(tl.load(ring_g_ptr + tok * HV + i_h, mask=mp, other=0.0), 0)
    UpT = tl.load(ring_u_ptr + (tok[None, :] * HV + i_h) * DV + rv[:, None], mask=mv[:, None] & mp[None, :], other=0.0)
    parks_k = (i_v == 0) & (i_h % (HV // HK) == 0)
    s_base = state_ptr + (slot * HV + i_h) * DK * DV
    kq = tl.zeros([TP], dtype=tl.float32)
    for c in tl.range(0, BK, BKC, num_stages=STAGES):
        rk = c + rc
        mk = rk < DK
        s_ptrs = s_base + rk[None, :] * DV + rv[:, None]
        St = tl.load(s_ptrs, mask=mv[:, None] & mk[None, :], other=0.0)
        Kp = tl.load(ring_k_ptr + (tok[:, None] * HK + hk) * DK + rk[None, :], mask=mp[:, None] & mk[None, :],
                     other=0.0)  # fmt: skip
        tl.store(s_ptrs, St + g_tot + tl.sum(Kp, 0)[None, :], mask=mv[:, None] & mk[None, :])
        mtk = mt[:, None] & mk[None, :]
        Kc = tl.load(k_ptr + row[:, None] * sk + hk * DK + rk[None, :], mask=mtk, other=0.0).to(tl.float32)
        Qc = tl.load(q_ptr + row[:, None] * sq + hk * DK + rk[None, :], mask=mtk, other=0.0).to(tl.float32)
        kq += tl.sum(Kc + Qc, 1)
        if parks_k:
            tl.store(ring_k_ptr + (park[:, None] * HK + hk) * DK + rk[None, :], Kc, mask=mtk)
    VT = tl.load(v_ptr + row[None, :] * sv + i_h * DV + rv[:, None], mask=mvt, other=0.0).to(tl.float32)
    OT = VT + kq[None, :] + tl.sum(UpT, 1)[:, None]
    tl.store(o_ptr + (row[None, :] * HV + i_h) * DV + rv[:, None], OT.to(o_ptr.dtype.element_ty), mask=mvt)
    tl.store(ring_u_ptr + (park[None, :] * HV + i_h) * DV + rv[:, None], VT, mask=mvt)
    if i_v == 0:
        a = tl.load(a_ptr + row * sa + i_h, mask=mt, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row * sb + i_h, mask=mt, other=0.0).to(tl.float32)
        tl.store(ring_g_ptr + park * HV + i_h, a + b, mask=mt)


def floor_bytes_kernel(q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len,
                       slot_ids, tiling: tuple[int, int, int, int] | None = None) -> torch.Tensor:  # fmt: skip
    """Launch ``_floor_bytes_kernel`` with ``replay_verify``'s arguments (A_log, dt_bias unused) and its T > 1 launch
    (tile width, warps, key chunks, stages, register cap), or ``tiling`` = (block_v, warps, key chunk, stages)
    uncapped; inputs contiguous [B, T, heads, dim]."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[-2:]
    BK = max(16, triton.next_power_of_2(Dk))
    if tiling:
        block_v, warps, BKC, stages = tiling
        max_registers = None
    else:
        block_v, warps, deep_cap = K.launch_config(B, Hv, Dv, K._sm_count(v.device))
        BKC, stages = K.key_chunking(block_v, BK)
        max_registers = K.block_registers(deep_cap, BKC, BK, K.DOT_PRECISION[v.dtype])
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _floor_bytes_kernel[(triton.cdiv(Dv, block_v), Hv, B)](
        q, k, v, a, b, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids, o, T, ring_k.shape[2],
        Hk * Dk, Hk * Dk, Hv * Dv, Hv, Hv, HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=block_v,
        TP=max(16, triton.next_power_of_2(ring_k.shape[2])), BKC=BKC, STAGES=stages, num_warps=warps,
        **({"maxnreg": max_registers} if max_registers else {}),
    )  # fmt: skip
    return o


def bytes_row(B: int, T: int, heads: tuple[int, int, int], device: torch.device, bw: float, rotate_bytes: int,
              tilings: list[tuple[int, int, int, int]] = (), Tmax: int = 16) -> dict:  # fmt: skip
    """µs of replay_verify, the bytes kernel (its launch and each of ``tilings``) and a copy of the same bytes, every
    slot with T pending tokens."""
    row = RB.bench_row(B, T, heads, torch.bfloat16, device, bw, {}, None, rotate_bytes, baselines=False, Tmax=Tmax)
    Hk, Hv, D = heads
    gen = torch.Generator(device=device).manual_seed(B * 100 + T)
    reps = row["rotations"]
    bufs, _ = RB.make_buffers(reps * B, Hk, Hv, D, D, Tmax, 1, 1, device, gen, torch.full((reps * B,), T))
    inp, _ = RB.make_inputs(B, T, Hk, Hv, D, D, 1, torch.bfloat16, device, gen)
    slot_sets = [torch.randperm(B, device=device, generator=gen).int() + r * B for r in range(reps)]
    calls = [lambda s=s: floor_bytes_kernel(**inp, **bufs, slot_ids=s) for s in slot_sets]
    row["bytes_kernel_us"], _ = RB._time_us(calls, device)
    row["tilings"] = {}
    for tiling in tilings:
        calls = [lambda s=s, t=tiling: floor_bytes_kernel(**inp, **bufs, slot_ids=s, tiling=t) for s in slot_sets]
        row["tilings"]["x".join(map(str, tiling))] = RB._time_us(calls, device)[0] / row["floor_us"]
    half = row["floor_bytes"] // 2
    src = torch.empty(reps, half, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    row["copy_us"], _ = RB._time_us([lambda r=r: dst[r].copy_(src[r]) for r in range(reps)], device)
    for name in ("ours", "bytes_kernel", "copy"):
        row[f"{name}_over_floor"] = row[f"{name}_us"] / row["floor_us"]
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", default=["8x16", "16x16", "32x16", "64x16"], help="BATCHxT")
    p.add_argument("--heads", nargs=3, type=int, default=[16, 32, 128], metavar=("HK", "HV", "D"))
    p.add_argument("--rotate-mib", type=int, default=1024)
    p.add_argument("--tilings", nargs="*", default=[], help="bytes-kernel tilings BVxWARPSxCHUNKxSTAGES to time too")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = RB.parse_rows(args.rows)
    try:
        tilings = [tuple(int(x) for x in t.split("x")) for t in args.tilings]
    except ValueError:
        raise SystemExit(f"--tilings {args.tilings}: use BVxWARPSxCHUNKxSTAGES, e.g. 64x4x32x3") from None
    if any(len(t) != 4 for t in tilings):
        raise SystemExit(f"--tilings {args.tilings}: use BVxWARPSxCHUNKxSTAGES, e.g. 64x4x32x3")
    device = torch.device(args.device)
    bw = copy_bandwidth() if device.type == "cuda" else 1e12  # CPU: nominal, so the floor arithmetic runs
    result = dict(
        date=str(datetime.date.today()), gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        command="python " + shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
        torch=torch.__version__, triton=triton.__version__, heads=args.heads, copy_bandwidth_GBps=bw / 1e9, rows=[],
    )  # fmt: skip
    for B, T in rows:
        result["rows"].append(bytes_row(B, T, tuple(args.heads), device, bw, args.rotate_mib << 20, tilings))
    write_json(result, args.out)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; µs per layer and step (x floor)")
    print(f"{'B':>3} {'T':>3} {'floor':>7} {'replay_verify':>15} {'bytes kernel':>15} {'copy':>15}")
    for r in result["rows"]:
        cells = " ".join(f"{r[f'{n}_us']:7.2f} ({r[f'{n}_over_floor']:.2f}x)"[:15].rjust(15)
                         for n in ("ours", "bytes_kernel", "copy"))  # fmt: skip
        print(f"{r['batch']:>3} {r['T']:>3} {r['floor_us']:7.2f} {cells}")
        if r["tilings"]:
            print("      bytes kernel x floor by tiling: " + ", ".join(f"{t} {x:.2f}" for t, x in r["tilings"].items()))


if __name__ == "__main__":
    main()
