"""Warp-specialized state stream for ReplaySSM, a probe (Hopper, Gluon): can one producer warp feeding a consumer
warpgroup through a shared-memory ring move the verify kernel's state at a copy's rate?

The first building block of a warp-specialized block kernel for the verify step.
Persistent programs walk the (batch row, value head, 64-column tile) tiles of a verify step. A producer warp reads
each tile's slot and issues TMA loads of its [32 keys, 64 columns] fp32 state chunks into a ring of ``STAGES``
shared-memory buffers (full / empty mbarriers per buffer); the consumer warpgroup takes each chunk into registers,
scales it by a decay per (row, head) (a stand-in for the fold) and writes it back in place by a
TMA store from a second ring of ``OUT_STAGES`` buffers. Checked exactly against ``state * decay`` in PyTorch, then
timed in a CUDA graph over rotating slot sets beside a copy of the same bytes and ``replay_verify`` at T = 16.

    python3 bench/replay_ssm_ws_probe.py --rows 8 16 32 64 --out bench/results/replay_ssm_ws_probe_h200.json
GPU only (Gluon has no interpreter).
"""

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
import replay_ssm as RB  # noqa: E402

from ocria.bench.results import write_json  # noqa: E402
from ocria.bench.timing import copy_bandwidth, time_calls  # noqa: E402

BKC, BV = 32, 64  # key chunk x column tile: the committed block kernel's


@gluon.jit
def _tile(t, NT: gl.constexpr, HV: gl.constexpr):
    """(column tile, value head, batch row) of flat tile t, column tiles fastest (the block kernel's grid order)."""
    return t % NT, (t // NT) % HV, t // (NT * HV)


@gluon.jit
def _producer(desc, bufs, full, empty, slot_ptr, n_tiles, NT: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr,
              BKC: gl.constexpr, BV: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: each tile's slot, then its chunks' TMA loads, each into the next ring buffer once it is free."""
    i = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        i_v, i_h, i_b = _tile(t, NT, HV)
        row0 = (gl.load(slot_ptr + i_b) * HV + i_h) * DK
        for c in gl.static_range(DK // BKC * (BV // BOX)):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1
            mbarrier.expect(full.index(s), BKC * BOX * 4)
            tma.async_copy_global_to_shared(desc, [row0 + c // (BV // BOX) * BKC, i_v * BV + c % (BV // BOX) * BOX],
                                            full.index(s), bufs.index(s))  # fmt: skip
            i += 1


@gluon.jit
def _consumer(desc, bufs, outs, full, empty, slot_ptr, decay_ptr, n_tiles, NT: gl.constexpr, HV: gl.constexpr,
              DK: gl.constexpr, BKC: gl.constexpr, BV: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr,
              OUT_STAGES: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """The default partition: each chunk from the ring into registers, scaled, out through the store ring."""
    chunk: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    i = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        i_v, i_h, i_b = _tile(t, NT, HV)
        row0 = (gl.load(slot_ptr + i_b) * HV + i_h) * DK
        decay = gl.load(decay_ptr + i_b * HV + i_h)
        for c in gl.static_range(DK // BKC * (BV // BOX)):
            s = i % STAGES
            mbarrier.wait(full.index(s), (i // STAGES) & 1)
            x = bufs.index(s).load(chunk)
            mbarrier.arrive(empty.index(s))
            o = i % OUT_STAGES
            tma.store_wait(OUT_STAGES - 1)  # the store that last used buffer o has read it
            outs.index(o).store(x * decay)
            fence_async_shared()
            tma.async_copy_shared_to_global(desc, [row0 + c // (BV // BOX) * BKC, i_v * BV + c % (BV // BOX) * BOX],
                                            outs.index(o))  # fmt: skip
            i += 1
    tma.store_wait(0)


@gluon.jit
def _ws_stream_kernel(desc, slot_ptr, decay_ptr, n_tiles, NT: gl.constexpr, HV: gl.constexpr, DK: gl.constexpr,
                      BKC: gl.constexpr, BV: gl.constexpr, STAGES: gl.constexpr, OUT_STAGES: gl.constexpr,
                      num_warps: gl.constexpr):  # fmt: skip
    BOX: gl.constexpr = desc.block_type.shape[1]
    layout: gl.constexpr = desc.layout
    bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BKC, BOX], layout)
    outs = gl.allocate_shared_memory(gl.float32, [OUT_STAGES, BKC, BOX], layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (desc, bufs, outs, full, empty, slot_ptr, decay_ptr, n_tiles, NT, HV, DK, BKC, BV, BOX, STAGES,
                     OUT_STAGES, num_warps)),
        (_producer, (desc, bufs, full, empty, slot_ptr, n_tiles, NT, HV, DK, BKC, BV, BOX, STAGES)),
    ], [1], [40])  # fmt: skip


def ws_stream(state: torch.Tensor, slot_ids: torch.Tensor, decay: torch.Tensor, programs: int, stages: int,
              out_stages: int, box: int) -> None:  # fmt: skip
    """state[slot_ids[b], h] *= decay[b, h] in place, by ``programs`` persistent warp-specialized programs moving
    [32 keys, ``box`` columns] ring items (``box`` 32 or 64: a 64-column item is one 128-byte-swizzled TMA box that
    Triton issues as two 32-column copies)."""
    S, HV, DK, DV = state.shape
    B = slot_ids.numel()
    layout = gl.NVMMASharedLayout.get_default_for([BKC, box], gl.float32)
    desc = TensorDescriptor.from_tensor(state.view(S * HV * DK, DV), [BKC, box], layout)
    n_tiles = (DV // BV) * HV * B
    _ws_stream_kernel[(min(programs, n_tiles),)](desc, slot_ids, decay, n_tiles, NT=DV // BV, HV=HV, DK=DK, BKC=BKC,
                                                  BV=BV, STAGES=stages, OUT_STAGES=out_stages, num_warps=4)  # fmt: skip


def check(device: torch.device, configs: list[tuple[int, int, int, int]]) -> dict:
    """Mismatching elements against PyTorch's state * decay (the same fp32 product) at batch 5 over 11 slots."""
    gen = torch.Generator(device=device).manual_seed(0)
    out = {}
    for programs, stages, out_stages, box in configs:
        state = torch.randn(11, 32, 128, 128, device=device, generator=gen)
        slots = torch.randperm(11, device=device, generator=gen)[:5].int()
        decay = torch.rand(5, 32, device=device, generator=gen)
        want = state.clone()
        want[slots.long()] *= decay[:, :, None, None]
        ws_stream(state, slots, decay, programs, stages, out_stages, box)
        torch.cuda.synchronize()
        out[f"{programs}x{stages}x{out_stages}x{box}"] = int((state != want).sum())
    return out


def probe_row(B: int, configs: list[tuple[int, ...]], sms: int, bw: float, rotate_bytes: int,
              device: torch.device, HV: int = 32, D: int = 128) -> dict:  # fmt: skip
    """µs of each config at batch B, over rotating slot sets so the state comes from DRAM, beside a copy of the same
    bytes (rotating too) and ``replay_verify`` at T = 16 with its floor."""
    state_bytes = B * HV * D * D * 4
    sets = max(2, rotate_bytes // state_bytes)
    state = torch.randn(sets * B, HV, D, D, device=device)
    slot_sets = [torch.arange(i * B, (i + 1) * B, device=device, dtype=torch.int32) for i in range(sets)]
    decay = 1 - torch.rand(B, HV, device=device) * 1e-3
    row = dict(batch=B, state_us_at_copy=2 * state_bytes / bw * 1e6)
    for c in configs:
        fns = [lambda s=s, c=c: ws_stream(state, s, decay, c[0] * sms, *c[1:]) for s in slot_sets]
        row["x".join(map(str, c))] = time_calls(fns)
    flat = state.view(sets, -1)
    row["copy_us"] = time_calls([lambda i=i: flat[i].copy_(flat[i + 1]) for i in range(sets - 1)])
    verify = RB.bench_row(B, 16, (16, HV, D), torch.bfloat16, device, bw, {}, None, rotate_bytes, baselines=False)
    row["replay_verify_us"], row["floor_us"] = verify["ours_us"], verify["floor_us"]
    return row


def parse_config(text: str) -> tuple[int, int, int, int]:
    """PROGRAMS_PER_SMxSTAGESxOUT_STAGESxBOX, e.g. 1x6x2x64."""
    parts = text.split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts) or parts[3] not in ("32", "64"):
        raise SystemExit(f"--configs {text!r}: use PROGRAMS_PER_SMxSTAGESxOUT_STAGESxBOX, positive, BOX 32 or 64")
    return tuple(int(p) for p in parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", type=int, default=[8, 16, 32, 64], help="batch sizes (T = 16)")
    # One program per SM: Triton builds the kernel at 255 registers per thread (the consumer warpgroup raised by
    # setmaxnreg), so a second program does not fit; depth comes from the ring instead.
    p.add_argument("--configs", nargs="+", default=["1x12x4x32", "1x16x4x32", "1x6x2x64", "1x8x2x64", "1x12x4x64"],
                   help="PROGRAMS_PER_SMxSTAGESxOUT_STAGESxBOX")
    p.add_argument("--rotate-mib", type=int, default=1024)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    configs = [parse_config(c) for c in args.configs]
    if not torch.cuda.is_available():
        raise SystemExit("replay_ssm_ws_probe.py runs Gluon kernels on a CUDA GPU (Hopper); none is visible")
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    result = dict(date=str(datetime.date.today()), gpu=torch.cuda.get_device_name(device),
                  command="python " + shlex.join(sys.argv), torch=torch.__version__)  # fmt: skip
    result["mismatches"] = check(device, [(c[0] * sms, *c[1:]) for c in configs])
    bw = copy_bandwidth()
    result["copy_bandwidth_GBps"] = bw / 1e9
    rows = []
    for B in args.rows:
        rows.append(probe_row(B, configs, sms, bw, args.rotate_mib << 20, device))
        print(rows[-1], flush=True)
    result["rows"] = rows
    write_json(result, args.out)
    print(f"\nmismatches {result['mismatches']}")
    names = ["x".join(map(str, c)) for c in configs]
    print(f"{'batch':>5} {'state@copy':>10} {'copy':>7} " + " ".join(f"{n:>8}" for n in names) + "  verify  floor")
    for r in rows:
        print(f"{r['batch']:5d} {r['state_us_at_copy']:10.2f} {r['copy_us']:7.2f} "
              + " ".join(f"{r[n]:8.2f}" for n in names) + f" {r['replay_verify_us']:7.2f} {r['floor_us']:6.2f}")


if __name__ == "__main__":
    main()
