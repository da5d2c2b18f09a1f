"""ReplaySSM on the GPU: correctness against float64, then µs per GDN layer and step against baselines.

Rows (batch x T, Qwen3.5-like heads, fp32 state, bf16 inputs, every slot with T pending tokens):
  ours      replay_verify (fold pending + T outputs + park) and causal_conv_verify, separately
  snapshot  per-token-snapshot strategy: a recurrent Triton kernel that reads one state and writes
            all T per-token states (selection afterwards is an index, so it costs nothing here)
  fla       flash-linear-attention fused_recurrent_gated_delta_rule (T tokens, final state out)
  floor     bytes replay_verify must move (state read + write once, pending ring in, inputs in,
            outputs and parked ring out) at the measured device copy bandwidth
Timing: a CUDA graph of R calls over R disjoint slot sets (R x state > L2), repeated until a replay runs >= 2 ms,
median of replays / calls; ours with R copies of the inputs and each call's output kept until its next call
(timing.rotating_calls), so that no byte the floor counts stays in L2 from one call to the next.

    python3 bench/replay_ssm.py --out bench/results/replay_ssm_h200.json
Launch A/B only (64x4 for every batch, as before launch_config, vs its pick and the --configs tiles):
    python3 bench/replay_ssm.py --launch-ab --batches 1 8 32 --ts 1 16 --configs 32x4 16x4 --rotate-mib 256 \
        --out bench/results/replay_ssm_launch_h200.json
CPU smoke run of the same code (Triton interpreter, tiny heads, no timing worth reading):
    TRITON_INTERPRET=1 python bench/replay_ssm.py --device cpu --heads 2 4 32 --batches 2 --ts 3 \
        --sweep 2 3 --rotate-mib 0 --out /tmp/r.json
"""

import argparse
import datetime
import json
import math
import os
import shlex
import sys
import time

import torch
import triton
import triton.language as tl

from ocria.bench.timing import capture_graph, copy_bandwidth, graph_reps, median_us, rotating_calls
from ocria.plugins.replay_ssm import kernel as K
from ocria.plugins.replay_ssm import reference as R
from ocria.plugins.replay_ssm.kernel import _softplus


@triton.jit
def _snapshot_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, src_ptr, src_idx_ptr, snap_ptr, dst_idx_ptr,
    o_ptr, T, scale, eps,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """Token-by-token recurrence that stores the state after every token (strategy 1 of MISSION.md)."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = i_h // (HV // HK)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    ms = (rk < DK)[:, None] & (rv < DV)[None, :]
    src = tl.load(src_idx_ptr + i_b).to(tl.int64)
    dst = tl.load(dst_idx_ptr + i_b).to(tl.int64)
    S = tl.load(src_ptr + ((src * HV + i_h) * DK + rk[:, None]) * DV + rv[None, :], mask=ms, other=0.0)
    decay_rate = tl.exp(tl.load(A_log_ptr + i_h).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + i_h).to(tl.float32)
    for t in range(T):
        row = (i_b * T + t).to(tl.int64)
        k = tl.load(k_ptr + (row * HK + hk) * DK + rk, mask=rk < DK, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + (row * HK + hk) * DK + rk, mask=rk < DK, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (row * HV + i_h) * DV + rv, mask=rv < DV, other=0.0).to(tl.float32)
        k = k * tl.rsqrt(tl.sum(k * k, 0) + eps)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + eps) * scale
        g = -decay_rate * _softplus(tl.load(a_ptr + row * HV + i_h).to(tl.float32) + dt_bias)
        beta = tl.sigmoid(tl.load(b_ptr + row * HV + i_h).to(tl.float32))
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], 0))
        S = S + k[:, None] * u[None, :]
        o = tl.sum(S * q[:, None], 0)
        tl.store(o_ptr + (row * HV + i_h) * DV + rv, o.to(o_ptr.dtype.element_ty), mask=rv < DV)
        tl.store(snap_ptr + (((dst * T + t) * HV + i_h) * DK + rk[:, None]) * DV + rv[None, :], S, mask=ms)


def snapshot_verify(q, k, v, a, b, A_log, dt_bias, src, src_idx, snap, dst_idx, block_v=32, num_warps=4):
    """o for T tokens from src[src_idx]; writes snap[dst_idx, t] = state after token t."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[-2:]
    o = torch.empty_like(v)
    grid = (triton.cdiv(Dv, block_v), Hv, B)
    _snapshot_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, src, src_idx, snap, dst_idx, o, T, Dk**-0.5, 1e-6,
        HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=triton.next_power_of_2(Dk), BV=block_v, num_warps=num_warps,
    )  # fmt: skip
    return o


def _fla():
    """flash-linear-attention's recurrent kernel, or the reason it cannot be imported."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError as e:
        return None, f"not installed ({type(e).__name__}: {e})"
    return fused_recurrent_gated_delta_rule, "installed"


def _time_us(calls, device, reps=15):
    """Median µs of one call: a CUDA graph of the calls, repeated until a replay runs ``timing.GRAPH_US`` (so its own
    launch is spread thin), median replay / calls in it; CPU: wall clock once."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) / len(calls) * 1e6, "wall-clock (cpu smoke)"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    rounds = 1
    try:
        graph = capture_graph(calls)
        rounds = graph_reps(len(calls), len(calls), median_us(graph.replay, len(calls), 3))
        if rounds > 1:
            del graph
            graph = capture_graph(calls * rounds)
        run, method = graph.replay, "cuda-graph"
    except Exception as e:  # a library that cannot be captured is timed eagerly instead
        torch.cuda.synchronize()
        print(f"  graph capture failed ({type(e).__name__}: {str(e)[:80]}); eager timing", file=sys.stderr)
        rounds = 1

        def run():
            for c in calls:
                c()

        method = "eager"
    for _ in range(3):
        run()
    return median_us(run, len(calls) * rounds, reps), method


def parse_rows(rows: list[str]) -> list[tuple[int, int]]:
    """``--rows`` given as BATCHxT strings, as (batch, T) pairs; anything else is refused with a one-line message."""
    try:
        return [(int(b), int(t)) for b, t in (r.split("x") for r in rows)]
    except ValueError:
        raise SystemExit(f"--rows {rows}: use BATCHxT, e.g. 32x16") from None


def make_buffers(n_slots, Hk, Hv, Dk, Dv, Tmax, C, KW, device, gen, pending):
    def rnd(*s):
        return torch.randn(*s, device=device, generator=gen)

    return dict(
        state=rnd(n_slots, Hv, Dk, Dv) * 0.1,
        ring_k=R.l2norm(rnd(n_slots, 2, Tmax, Hk, Dk)),
        ring_u=rnd(n_slots, 2, Tmax, Hv, Dv),
        ring_g=-torch.rand(n_slots, 2, Tmax, Hv, device=device, generator=gen) * 0.3,
        ring_phase=torch.randint(0, 2, (n_slots,), device=device, generator=gen, dtype=torch.int32),
        pending_len=pending.to(device=device, dtype=torch.int32),
    ), rnd(n_slots, KW - 1 + Tmax, C)


def make_inputs(B, T, Hk, Hv, Dk, Dv, C, dtype, device, gen):
    def rnd(*s):
        return torch.randn(*s, device=device, generator=gen).to(dtype)

    return dict(
        q=rnd(B, T, Hk, Dk),
        k=rnd(B, T, Hk, Dk),
        v=rnd(B, T, Hv, Dv),
        a=rnd(B, T, Hv),
        b=rnd(B, T, Hv),
        A_log=torch.randn(Hv, device=device, generator=gen) * 0.5 - 2.0,
        dt_bias=torch.randn(Hv, device=device, generator=gen) * 0.5,
    ), rnd(B, T, C)


def rel_err(got, want) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def check_correctness(heads, device, config, steps=3, B=4, Tmax=16, KW=4):
    """Kernels vs replay_verify_ref / causal_conv_verify_ref on float64 buffers, several steps in a row."""
    Hk, Hv, D = heads
    C = 2 * Hk * D + Hv * D
    gen = torch.Generator(device=device).manual_seed(0)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        slots = torch.randperm(B + 3, device=device, generator=gen)[:B]
        pend = torch.randint(0, Tmax + 1, (B + 3,), generator=torch.Generator().manual_seed(1))
        bufs, conv_buf = make_buffers(B + 3, Hk, Hv, D, D, Tmax, C, KW, device, gen, pend)
        bufs64 = {k: (v.double() if v.is_floating_point() else v.clone()) for k, v in bufs.items()}
        conv64 = conv_buf.double()
        conv_w = torch.randn(C, KW, device=device, generator=gen) * 0.5
        worst = dict(output=0.0, state=0.0, ring=0.0, conv=0.0, conv_window=0.0)
        for step in range(steps):
            T = [Tmax, 1, 7][step % 3]
            inp, x = make_inputs(B, T, Hk, Hv, D, D, C, dtype, device, gen)
            o = K.replay_verify_kernel(**inp, **bufs, slot_ids=slots, **config)
            o64 = R.replay_verify_ref(**{k: t.double() for k, t in inp.items()}, **bufs64, slot_ids=slots)
            y = K.causal_conv_verify_kernel(x, conv_w, conv_buf, bufs["pending_len"], slots)
            y64 = R.causal_conv_verify_ref(x.double(), conv_w.double(), conv64, bufs64["pending_len"], slots)
            worst["output"] = max(worst["output"], rel_err(o, o64))
            worst["conv"] = max(worst["conv"], rel_err(y, y64))
            accepted = torch.randint(1, T + 1, (B,), device=device, generator=gen).int()
            for b_ in (bufs, bufs64):
                b_["ring_phase"][slots] ^= 1
                b_["pending_len"][slots] = accepted
            for name in ("ring_k", "ring_u", "ring_g"):
                worst["ring"] = max(worst["ring"], rel_err(bufs[name], bufs64[name]))
            folded = R.fold_pending(**bufs, slot_ids=slots)
            folded64 = R.fold_pending(**bufs64, slot_ids=slots)
            worst["state"] = max(worst["state"], rel_err(folded, folded64))
            worst["conv_window"] = max(worst["conv_window"], rel_err(conv_buf, conv64))
        results[str(dtype).removeprefix("torch.")] = worst
    return results


def bench_row(B, T, heads, dtype, device, bw, config, fla_fn, rotate_bytes, baselines=True, KW=4, Tmax=16):
    Hk, Hv, D = heads
    C = 2 * Hk * D + Hv * D
    gen = torch.Generator(device=device).manual_seed(B * 100 + T)
    state_bytes = Hv * D * D * 4
    ring_tok = (Hk * D + Hv * D + Hv) * 4  # k, u, g
    esize = torch.tensor([], dtype=dtype).element_size()
    in_tok = (2 * Hk * D + Hv * D + 2 * Hv) * esize
    out_tok = Hv * D * esize
    floor_bytes = B * (2 * state_bytes + T * ring_tok + T * (in_tok + out_tok + ring_tok))
    conv_bytes = B * (C * (KW - 1) * 4 * 2 + T * C * (esize + 4 + esize))
    reps = int(min(256, max(2, math.ceil(rotate_bytes / floor_bytes))))
    bufs, conv_buf = make_buffers(reps * B, Hk, Hv, D, D, Tmax, C, KW, device, gen, torch.full((reps * B,), T))
    inp, x = make_inputs(B, T, Hk, Hv, D, D, C, dtype, device, gen)
    conv_w = torch.randn(C, KW, device=device, generator=gen)
    slot_sets = [torch.randperm(B, device=device, generator=gen).int() + r * B for r in range(reps)]
    row = dict(batch=B, T=T, pending=T, rotations=reps, floor_bytes=floor_bytes)

    # Each rotation its own inputs and outputs too, so that the bytes the floor counts all cross HBM
    inps = [inp, *(make_inputs(B, T, Hk, Hv, D, D, C, dtype, device, gen)[0] for _ in range(reps - 1))]
    ours = rotating_calls(lambda r: K.replay_verify_kernel(**inps[r], **bufs, slot_ids=slot_sets[r], **config),
                          list(range(reps)))  # fmt: skip
    row["ours_us"], row["timing"] = _time_us(ours, device)
    row["floor_us"] = floor_bytes / bw * 1e6
    row["ours_over_floor"] = row["ours_us"] / row["floor_us"]
    if not baselines:
        return row
    conv = [lambda s=s: K.causal_conv_verify_kernel(x, conv_w, conv_buf, bufs["pending_len"], s) for s in slot_sets]
    row["conv_us"], _ = _time_us(conv, device)
    row["conv_floor_us"] = conv_bytes / bw * 1e6

    snap_reps = int(min(256, max(2, math.ceil(rotate_bytes / (B * (T + 1) * state_bytes)))))
    src = torch.randn(snap_reps * B, Hv, D, D, device=device, generator=gen) * 0.1
    snap = torch.empty(snap_reps * B, T, Hv, D, D, device=device)
    idx = [torch.arange(r * B, (r + 1) * B, device=device, dtype=torch.int32) for r in range(snap_reps)]
    calls = [lambda i=i: snapshot_verify(**inp, src=src, src_idx=i, snap=snap, dst_idx=i) for i in idx]
    row["snapshot_us"], _ = _time_us(calls, device)

    row["snapshot_over_ours"] = row["snapshot_us"] / row["ours_us"]
    if fla_fn is not None:
        scale = D**-0.5

        def fla_call(r):
            return fla_fn(
                inp["q"], inp["k"], inp["v"], g=inp["a"], beta=inp["b"], scale=scale,
                initial_state=src[r * B : (r + 1) * B], output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, A_log=inp["A_log"], dt_bias=inp["dt_bias"], use_beta_sigmoid_in_kernel=True,
            )  # fmt: skip

        try:
            row["fla_us"], row["fla_timing"] = _time_us([lambda r=r: fla_call(r) for r in range(snap_reps)], device)
        except Exception as e:  # report, keep the other rows
            row["fla_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return row


def launch_kwargs(cfg: tuple[int, ...]) -> dict:
    """``replay_verify_kernel`` keyword arguments of a ``BVxWARPS[xMAXREG]`` tile config."""
    return dict(zip(("block_v", "num_warps", "max_registers"), cfg, strict=False))


def launch_label(B: int, T: int, heads: tuple[int, int, int], device: torch.device, Tmax: int = 16) -> str:
    """What a default bf16 launch runs: "ws" (the warp-specialized Hopper kernel) or launch_config's tile."""
    Hk, Hv, D = heads
    if T > 1 and K.warp_specialized(device, torch.bfloat16, Hk, Hv, D, D, Tmax):
        return "ws"
    return "x".join(str(x) for x in K.launch_config(B, Hv, D, K._sm_count(device)) if x is not None)


def check_launch(B, T, heads, device, configs, Tmax=16):
    """Each config's outputs, folded state and ring vs replay_verify_ref in float64 on the same bf16
    inputs, with pending counts drawn over 0..Tmax so the rank-1 and chunk folds both run."""
    Hk, Hv, D = heads
    gen = torch.Generator(device=device).manual_seed(11 * B + T)
    pend = torch.randint(0, Tmax + 1, (B + 2,), generator=torch.Generator().manual_seed(B + T))
    bufs, _ = make_buffers(B + 2, Hk, Hv, D, D, Tmax, 1, 4, device, gen, pend)
    inp, _ = make_inputs(B, T, Hk, Hv, D, D, 1, torch.bfloat16, device, gen)
    slots = torch.randperm(B + 2, device=device, generator=gen)[:B].int()
    ref = {k: (v.double() if v.is_floating_point() else v.clone()) for k, v in bufs.items()}
    o_ref = R.replay_verify_ref(**{k: t.double() for k, t in inp.items()}, **ref, slot_ids=slots)
    out = {}
    for cfg in configs:
        mine = {k: v.clone() for k, v in bufs.items()}
        o = K.replay_verify_kernel(**inp, **mine, slot_ids=slots, **launch_kwargs(cfg))
        out["x".join(map(str, cfg))] = dict(
            output=rel_err(o, o_ref),
            state=rel_err(mine["state"], ref["state"]),
            ring=max(rel_err(mine[n], ref[n]) for n in ("ring_k", "ring_u", "ring_g")),
        )
    return out


def launch_ab(args, heads, device, bw, rotate, result, save):
    """Old launch (64 columns x 4 warps for every batch) vs launch_config's pick, and the other tile
    configs, per batch x T; each checked against float64 first."""
    Hk, Hv, D = heads
    sms = K._sm_count(device)
    result["sm_count"] = sms
    previous = {}
    if os.path.exists(args.previous):
        with open(args.previous) as f:
            earlier = json.load(f)
        if earlier.get("heads") == result["heads"] and earlier.get("gpu") == result["gpu"]:
            previous = {(r["batch"], r["T"]): r["ours_us"] for r in earlier.get("rows", [])}
    result["previous_file"] = args.previous if previous else None
    rows = result["rows"] = []
    for B in args.batches:
        for T in args.ts:
            auto = K.launch_config(B, Hv, D, sms)
            auto = tuple(x for x in auto if x is not None)
            configs = list(dict.fromkeys([(64, 4), auto, *[tuple(map(int, c.split("x"))) for c in args.configs]]))
            row = dict(batch=B, T=T, pending=T, auto="x".join(map(str, auto)))
            row["programs_auto"] = triton.cdiv(D, auto[0]) * Hv * B
            row["check"] = check_launch(B, T, heads, device, configs)
            for cfg in configs:
                timed = bench_row(B, T, heads, torch.bfloat16, device, bw, launch_kwargs(cfg), None,
                                  rotate, baselines=False)  # fmt: skip
                row["x".join(map(str, cfg)) + "_us"] = timed["ours_us"]
                row["floor_us"] = timed["floor_us"]
            row["old_us"], row["new_us"] = row["64x4_us"], row[row["auto"] + "_us"]
            row["old_over_new"] = row["old_us"] / row["new_us"]
            row["new_over_floor"] = row["new_us"] / row["floor_us"]
            if (B, T) in previous:
                row["previous_kernel_64x4_us"] = previous[(B, T)]
            rows.append(row)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k != "check"})
            save()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s, {sms} SMs")
    print(f"{'B':>3} {'T':>3} {'auto':>5} {'old us':>8} {'new us':>8} {'old/new':>7} {'floor':>7} {'new/fl':>6} "
          f"{'prev us':>8} {'max err':>8}")  # fmt: skip
    for r in rows:
        err = max(e["output"] for e in r["check"].values())
        prev = f"{r['previous_kernel_64x4_us']:8.1f}" if "previous_kernel_64x4_us" in r else f"{'-':>8}"
        print(f"{r['batch']:>3} {r['T']:>3} {r['auto']:>5} {r['old_us']:8.1f} {r['new_us']:8.1f} "
              f"{r['old_over_new']:7.2f} {r['floor_us']:7.1f} {r['new_over_floor']:6.2f} {prev} "
              f"{err:8.1e}")  # fmt: skip


def cross_check(heads, device, fla_fn, config):
    """Same tokens from the same state (nothing pending): ours vs the snapshot kernel vs fla, fp32."""
    Hk, Hv, D = heads
    B, T = 2, 16
    gen = torch.Generator(device=device).manual_seed(3)
    bufs, _ = make_buffers(B, Hk, Hv, D, D, 16, 1, 4, device, gen, torch.zeros(B))
    inp, _ = make_inputs(B, T, Hk, Hv, D, D, 1, torch.float32, device, gen)
    src = bufs["state"].clone()
    idx = torch.arange(B, device=device, dtype=torch.int32)
    ours = K.replay_verify_kernel(**inp, **bufs, slot_ids=idx, **config)
    snap = torch.empty(B, T, Hv, D, D, device=device)
    out = {"snapshot_vs_ours": rel_err(snapshot_verify(**inp, src=src, src_idx=idx, snap=snap, dst_idx=idx), ours)}
    if fla_fn is None:
        return out
    try:
        o, _ = fla_fn(
            inp["q"], inp["k"], inp["v"], g=inp["a"], beta=inp["b"], scale=D**-0.5, initial_state=src.clone(),
            output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=inp["A_log"],
            dt_bias=inp["dt_bias"], use_beta_sigmoid_in_kernel=True,
        )  # fmt: skip
        out["fla_vs_ours"] = rel_err(o, ours)
    except Exception as e:  # report, keep the benchmark going
        out["fla_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--heads", type=int, nargs=3, default=[16, 32, 128], metavar=("HK", "HV", "D"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--ts", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--rotate-mib", type=int, default=1024, help="distinct memory each timed graph touches")
    configs_help = "BVxWARPS[xMAXREG] tile configs to sweep"
    p.add_argument("--configs", nargs="+", default=["128x8", "64x4"], help=configs_help)
    p.add_argument("--sweep", type=int, nargs="+", default=[32, 8, 16], help="batch and T of the config sweep")
    ab_help = "only replay_verify: 64x4 (the old launch) vs launch_config's pick and --configs, per row"
    p.add_argument("--launch-ab", action="store_true", help=ab_help)
    previous_help = "--launch-ab: an earlier result file whose rows are quoted beside the new ones"
    p.add_argument("--previous", default="bench/results/replay_ssm_h200.json", help=previous_help)
    p.add_argument("--no-overlap", action="store_true", help="T > 1: launch the verify kernel after the prep kernel "
                   "has finished (kernel.OVERLAP_PREP off), for an A/B")
    args = p.parse_args()
    K.OVERLAP_PREP = not args.no_overlap
    device = torch.device(args.device)
    heads = tuple(args.heads)
    rotate = args.rotate_mib << 20
    fla_fn, fla_status = _fla()
    result = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter smoke run)",
        command="python3 " + shlex.join(sys.argv),
        torch=torch.__version__, triton=triton.__version__, fla=fla_status,
        heads=dict(Hk=heads[0], Hv=heads[1], Dk=heads[2], Dv=heads[2]), state_dtype="float32", input_dtype="bfloat16",
        overlap_prep=K.OVERLAP_PREP,
    )  # fmt: skip

    def save():  # after every row, so a run cut short still leaves its rows
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    if args.launch_ab:
        bw = copy_bandwidth() if device.type == "cuda" else float("nan")
        result["copy_bandwidth_GBps"] = bw / 1e9
        launch_ab(args, heads, device, bw if device.type == "cuda" else 1e12, rotate, result, save)
        return

    # Correctness and the table use the launch the runtime makes (launch_config's pick for each batch);
    # the sweep times fixed tile configs beside it on one row.
    configs = [launch_kwargs(tuple(map(int, c.split("x")))) for c in args.configs]
    result["correctness"] = check_correctness(heads, device, {})
    result["cross_check_fp32"] = cross_check(heads, device, fla_fn, {})
    result["dot_precision"] = {str(k).removeprefix("torch."): v for k, v in K.DOT_PRECISION.items()}
    print(json.dumps(result["correctness"], indent=1), json.dumps(result["cross_check_fp32"]))

    bw = copy_bandwidth() if device.type == "cuda" else float("nan")
    result["copy_bandwidth_GBps"] = bw / 1e9
    if device.type != "cuda":
        bw = 1e12  # nominal, so the smoke run exercises the floor arithmetic

    sweep = []
    for config in [{}, *configs]:
        row = bench_row(args.sweep[0], args.sweep[1], heads, torch.bfloat16, device, bw, config, None, rotate,
                        baselines=False)  # fmt: skip
        sweep.append(dict(config or dict(launch="launch_config"), us=row["ours_us"], floor_us=row["floor_us"]))
        print(f"sweep {config or 'launch_config'}: {row['ours_us']:.1f} us (floor {row['floor_us']:.1f})")
    result["sweep"], result["config"] = sweep, "launch_config"

    rows = result["rows"] = []
    save()
    for B in args.batches:
        for T in args.ts:
            rows.append(bench_row(B, T, heads, torch.bfloat16, device, bw, {}, fla_fn, rotate))
            rows[-1]["launch"] = launch_label(B, T, heads, device)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()})
            save()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; config {result['config']}")
    head = ("B", "T", "launch", "ours", "floor", "x floor", "conv", "snapshot", "snap/ours", "fla")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (3, 3, 8, 8, 8, 7, 7, 9, 9, 8), strict=True)))
    for r in rows:
        fla = f"{r['fla_us']:8.1f}" if "fla_us" in r else f"{'-':>8}"
        print(f"{r['batch']:>3} {r['T']:>3} {r['launch']:>8} {r['ours_us']:8.1f} {r['floor_us']:8.1f} "
              f"{r['ours_over_floor']:7.2f} {r['conv_us']:7.1f} {r['snapshot_us']:9.1f} "
              f"{r['snapshot_over_ours']:9.2f} {fla}")  # fmt: skip


if __name__ == "__main__":
    main()
