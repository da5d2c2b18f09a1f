"""ReplaySSM (``ocria::replay_verify``): a 16-token verify block and a one-token decode step of a GDN layer, and its
conv window (``ocria::causal_conv_verify``), every slot with T tokens pending from the step before.

Floor (verify): each slot's fp32 state read and written once, its T pending ring tokens (k, u, g) read, the T new
tokens' q, k, v, a, b read, their outputs written and their k, u, g parked. Check: within float tolerance of the
reference on the same inputs, state and ring included (bench/plugins' bf16 bound: the kernel takes tf32 products)."""

from functools import partial

import torch

from bench.ops.presets import text_config
from bench.ops.ptxas import Sm90Build
from bench.ops.registry import Floor, Inputs, OpBench, Shape, Tolerance, Variant, leading_rows, shape
from bench.ops.switches import current, invariant, without
from ocria.models import gdn as R
from ocria.models.gdn import causal_conv_verify, replay_verify
from ocria.plugins.replay_ssm.kernel import (
    PREFETCH_MAX_BLOCK_V,
    _verify_block_kernel,
    _verify_one_kernel,
    key_chunking,
    launch_config,
)

TMAX = 16  # the ring's capacity: a verify block
KW = 4  # the conv kernel width
BATCHES = (1, 8, 32)
TF32 = Tolerance("rel", 2e-2, "bf16 inputs take tf32 products in the kernel (bench plugins check)")
BUFFERS = ("state", "ring_k", "ring_u", "ring_g", "ring_phase", "pending_len")
ROW_INPUTS = ("q", "k", "v", "a", "b", "slot_ids")
STRIDES = ("sq", "sk", "sv", "sa", "sb")  # token strides of the fused projection's views: multiples of 16


def replay_shapes(T: int) -> tuple[Shape, ...]:
    """Both presets' GDN heads at batch 1, 8 and 32, T new tokens, and a CPU shape (2 rows, 2 x 32-wide key heads)."""
    shapes = []
    for label in ("mini", "sim"):
        t = text_config(label)
        heads = dict(Hk=t["linear_num_key_heads"], Hv=t["linear_num_value_heads"], Dk=t["linear_key_head_dim"],
                     Dv=t["linear_value_head_dim"])
        shapes += [shape(f"{label}_b{b}", B=b, T=T, **heads) for b in BATCHES]
    return (shape("cpu_b2", cpu=True, B=2, T=min(T, 3), Hk=2, Hv=4, Dk=32, Dv=32), *shapes)


def replay_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """bf16 q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], a, b [B, T, Hv]; fp32 state and ring of B + 2 slots, each with T
    tokens pending; the batch's slots a permutation of them."""
    B, T, Hk, Hv, Dk, Dv = (s[n] for n in ("B", "T", "Hk", "Hv", "Dk", "Dv"))
    S = B + 2

    def rnd(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, device=device)

    return {"q": rnd(B, T, Hk, Dk).bfloat16(), "k": rnd(B, T, Hk, Dk).bfloat16(), "v": rnd(B, T, Hv, Dv).bfloat16(),
            "a": rnd(B, T, Hv).bfloat16(), "b": rnd(B, T, Hv).bfloat16(),
            "A_log": rnd(Hv) * 0.5 - 2.0, "dt_bias": rnd(Hv) * 0.5,
            "state": rnd(S, Hv, Dk, Dv) * 0.1, "ring_k": R.l2norm(rnd(S, 2, TMAX, Hk, Dk)),
            "ring_u": rnd(S, 2, TMAX, Hv, Dv), "ring_g": -torch.rand(S, 2, TMAX, Hv, generator=g, device=device) * 0.3,
            "ring_phase": torch.randint(0, 2, (S,), generator=g, device=device, dtype=torch.int32),
            "pending_len": torch.full((S,), T, dtype=torch.int32, device=device),
            "slot_ids": torch.randperm(S, generator=g, device=device)[:B].int()}


def replay_floor(s: Shape) -> Floor:
    B, T, Hk, Hv, Dk, Dv = (s[n] for n in ("B", "T", "Hk", "Hv", "Dk", "Dv"))
    state = Hv * Dk * Dv * 4
    ring_token = (Hk * Dk + Hv * Dv + Hv) * 4  # k, u, g
    in_token = (2 * Hk * Dk + Hv * Dv + 2 * Hv) * 2
    out_token = Hv * Dv * 2
    return Floor(B * (2 * state + T * ring_token + T * (in_token + out_token + ring_token)),
                 B * Hv * Dk * Dv * (2 * T + 8 * T))  # the pending fold, then per token decay, S^T k, k u^T, S^T q


def _call(fn, i: Inputs) -> tuple[torch.Tensor, ...]:
    o = fn(*(i[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", *BUFFERS, "slot_ids")))
    return (o, i["state"], i["ring_k"], i["ring_u"], i["ring_g"])


def _kernel(i: Inputs) -> tuple[torch.Tensor, ...]:
    return _call(partial(replay_verify, policy=current()), i)


def sm90_build(s: Shape) -> Sm90Build:
    """The one-token or the block kernel with ``launch_config``'s tile at this batch (an H100's 132 SMs)."""
    Hk, Hv, D, one = s["Hk"], s["Hv"], s["Dk"], s["T"] == 1
    block_v, warps, max_registers = launch_config(s["B"], Hv, s["Dv"], 132)
    types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", a_ptr="*bf16", b_ptr="*bf16", A_log_ptr="*fp32",
                 dt_bias_ptr="*fp32", state_ptr="*fp32", ring_k_ptr="*fp32", ring_u_ptr="*fp32", ring_g_ptr="*fp32",
                 ring_phase_ptr="*i32", pending_ptr="*i32", slot_ptr="*i32", mats_ptr="*fp32", o_ptr="*bf16",
                 T="i32", Tmax="i32", scale="fp32", eps="fp32", sq="i32", sk="i32", sv="i32", sa="i32", sb="i32")
    consts = dict(HK=Hk, HV=Hv, DK=D, DV=s["Dv"], BK=max(16, D), BV=block_v, TP=16, PREC="tf32", PDL=False)
    if one:
        kernel, consts = _verify_one_kernel, dict(consts, PREFETCH=block_v <= PREFETCH_MAX_BLOCK_V)
    else:
        kernel, consts = _verify_block_kernel, dict(consts, BKC=key_chunking(block_v, max(16, D))[0],
                                                    STAGES=key_chunking(block_v, max(16, D))[1], OVERLAP=True)
    aligned = tuple(n for n, t in types.items() if n in kernel.arg_names and (t.startswith("*") or n in STRIDES))
    return Sm90Build(kernel, types, consts, warps, divisible_by_16=aligned, maxnreg=max_registers)


def conv_shapes() -> tuple[Shape, ...]:
    """The conv window of both presets' GDN layers (channels of q, k, v) at batch 1 and 32, T = 16 and 1."""
    shapes = []
    for label in ("mini", "sim"):
        t = text_config(label)
        C = 2 * t["linear_num_key_heads"] * t["linear_key_head_dim"] + t["linear_num_value_heads"] * \
            t["linear_value_head_dim"]
        shapes += [shape(f"{label}_b{b}_t{T}", B=b, T=T, C=C) for b in (1, 32) for T in (1, TMAX)]
    return (shape("cpu_b2", cpu=True, B=2, T=3, C=96), *shapes)


def conv_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """x [B, T, C] bf16, weight [C, KW] fp32, the conv buffer [B + 2, KW - 1 + Tmax, C] bf16, T pending per slot."""
    B, T, C = s["B"], s["T"], s["C"]
    S = B + 2
    return {"x": torch.randn(B, T, C, generator=g, device=device).bfloat16(),
            "weight": torch.randn(C, KW, generator=g, device=device) * 0.5,
            "conv_buf": torch.randn(S, KW - 1 + TMAX, C, generator=g, device=device).bfloat16(),
            "pending_len": torch.full((S,), T, dtype=torch.int32, device=device),
            "slot_ids": torch.randperm(S, generator=g, device=device)[:B].int()}


def conv_floor(s: Shape) -> Floor:
    B, T, C = s["B"], s["T"], s["C"]
    return Floor(B * C * (2 * (KW - 1) * 2 + T * (2 + 2 + 2)) + C * KW * 4, 2 * B * T * C * KW)


def _conv(fn, i: Inputs) -> tuple[torch.Tensor, ...]:
    return (fn(i["x"], i["weight"], i["conv_buf"], i["pending_len"], i["slot_ids"]), i["conv_buf"])


def _replay_op(name: str, T: int) -> OpBench:
    variants = {"kernel": Variant(_kernel), "sequential": Variant(invariant(_kernel))}
    if T > 1:  # the warp-specialized Hopper kernel (default where it runs) against the prep + block kernels
        variants["no_ws"] = Variant(without(_kernel, "replay_ssm_ws"))
    return OpBench(
        name=name, shapes=replay_shapes(T), inputs=replay_inputs, floor=replay_floor,
        reference=partial(_call, R.replay_verify_reference), variants=variants, check=TF32, mutates=True,
        rows=lambda i, r: leading_rows(i, r, ROW_INPUTS), ptxas={"no_ws" if T > 1 else "kernel": sm90_build})


BENCHES = (
    _replay_op("replay_ssm_verify", TMAX),
    _replay_op("replay_ssm_step", 1),
    OpBench(name="replay_ssm_conv", shapes=conv_shapes(), inputs=conv_inputs, floor=conv_floor,
            reference=partial(_conv, R.causal_conv_verify_reference),
            variants={"kernel": Variant(lambda i: _conv(partial(causal_conv_verify, policy=current()), i))},
            check=TF32, mutates=True, rows=lambda i, r: leading_rows(i, r, ("x", "slot_ids"))),
)
