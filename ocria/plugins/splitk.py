"""Split-K reduced inside the launch, shared by the decode GEMM and the NVFP4 GEMM.

S programs per output tile each stream 1/S of K and store an fp32 partial to a workspace; the last of them
to arrive (a per-tile counter, which it resets) sums the S partials in split order and writes the output. No
second launch, and the sum's order does not depend on arrival, so results repeat bit for bit. The workspace
and counters are one per device, so calls must not overlap in time (one stream).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

_SCRATCH: dict[torch.device, tuple[Tensor, Tensor]] = {}
# Every workspace ever handed out stays allocated: a CUDA graph captured with an outgrown one still writes to it
# when replayed, and freed memory would be another tensor's by then.
_OUTGROWN: list[tuple[Tensor, Tensor]] = []


def scratch(device: torch.device, ws_elems: int, counters: int) -> tuple[Tensor, Tensor]:
    """The device's split-K workspace (fp32) and per-tile arrival counters (int32, zero between calls),
    grown when a call needs more. Allocated on the first eager call, before any CUDA graph captures it."""
    ws, count = _SCRATCH.get(device, (None, None))
    if ws is None or ws.numel() < ws_elems or count.numel() < counters:
        if ws is not None:
            _OUTGROWN.append((ws, count))
        ws = torch.empty(max(ws_elems, 0 if ws is None else ws.numel()), dtype=torch.float32, device=device)
        count = torch.zeros(max(counters, 0 if count is None else count.numel()), dtype=torch.int32, device=device)
        _SCRATCH[device] = ws, count
    return ws, count


@triton.jit
def sum_splits(acc, ws_ptr, count_ptr, tile, split, SPLITS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Store this program's partial ``acc`` [ROWS, COLS] of output tile ``tile``; returns (last, total): whether
    this program arrived last and, if so, the SPLITS partials summed in split order (zeros otherwise)."""
    base = ws_ptr + tile.to(tl.int64) * (SPLITS * ROWS * COLS)
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    tl.store(base + split * (ROWS * COLS) + offs, acc)
    tl.debug_barrier()  # every thread's partial is written before the counter moves
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    last = arrived == SPLITS - 1
    total = tl.zeros([ROWS, COLS], dtype=tl.float32)
    if last:
        for s in range(SPLITS):  # split order, whichever program arrived last
            total += tl.load(base + s * (ROWS * COLS) + offs, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next call
    return last, total
