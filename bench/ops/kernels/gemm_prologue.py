"""The prologue GEMM (``ocria::prologue_gemm``): a decoder layer's output GEMM with the elementwise op before it
(SiLU-multiply before ``down_proj``, the sigmoid gate before ``o_proj``, the gated norm before the GDN's
``out_proj``) computed in its K loop, against the unfused pair of plugin kernels (the op's own, then the decode GEMM).

Floor: the op's two inputs and the weight read once, the output written. Check: the bits of its exact math
(tests/test_gemm_prologue.py), which are the unfused chain's too."""

from functools import partial

import torch

from bench.ops.presets import text_config
from bench.ops.ptxas import Sm90Build
from bench.ops.registry import BITS, Floor, Inputs, OpBench, Shape, Variant, leading_rows, shape
from bench.ops.switches import current
from ocria.plugins.decode_gemm.kernel import decode_gemm_triton
from ocria.plugins.gemm_prologue import Prologue, prologue_gemm, prologue_gemm_reference
from ocria.plugins.gemm_prologue.kernel import _prologue_gemm_kernel, prologue_config
from ocria.plugins.rms_norm.kernel import rms_norm_triton
from ocria.plugins.sigmoid_gate.kernel import sigmoid_gate_triton
from ocria.plugins.silu_quant.kernel import silu_mul_quant_triton

EPS = 1e-6


def heads(kind: Prologue, label: str) -> tuple[int, int]:
    """(H, D) of the op's inputs a, b [B, T, H, D] in the preset: the MLP's width as one head, the attention heads,
    the GDN value heads."""
    t = text_config(label)
    if kind == Prologue.SILU_MUL:
        return 1, t["intermediate_size"]
    if kind == Prologue.SIGMOID_GATE:
        return t["num_attention_heads"], t["head_dim"]
    return t["linear_num_value_heads"], t["linear_value_head_dim"]


def prologue_shapes(kind: Prologue) -> tuple[Shape, ...]:
    """Both presets at batch 1 and 16 of one token (decode) and 1 x 16 (a verify block), and a CPU shape."""
    shapes = [shape(f"{label}_b{b}_t{t}", B=b, T=t, H=heads(kind, label)[0], D=heads(kind, label)[1],
                    N=text_config(label)["hidden_size"]) for label in ("mini", "sim") for b, t in ((1, 1), (16, 1),
                                                                                                  (1, 16))]
    H = 1 if kind == Prologue.SILU_MUL else 2
    return (shape("cpu_b2", cpu=True, B=2, T=3, H=H, D=64 if H == 1 else 32, N=48), *shapes)


def prologue_inputs(kind: Prologue, s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """a, b [B, T, H, D] bf16 (for the SiLU-multiply the gate and up halves of one fused output), the norm weight
    [D] and the bf16 weight [N, H D]."""
    B, T, H, D, N = (s[n] for n in ("B", "T", "H", "D", "N"))
    a, b = ((torch.randn(B, T, H, D, generator=g, device=device) * 2).to(torch.bfloat16) for _ in range(2))
    if kind == Prologue.SILU_MUL:
        a, b = (x.unsqueeze(-2) for x in torch.cat([a.flatten(-2), b.flatten(-2)], -1).chunk(2, -1))
    return {"a": a, "b": b, "norm_weight": (1 + 0.1 * torch.randn(D, generator=g, device=device)).to(torch.bfloat16),
            "weight": (torch.randn(N, H * D, generator=g, device=device) * (H * D) ** -0.5).to(torch.bfloat16)}


def prologue_floor(s: Shape) -> Floor:
    B, T, H, D, N = (s[n] for n in ("B", "T", "H", "D", "N"))
    rows, K = B * T, H * D
    return Floor(2 * (2 * rows * K + N * K + rows * N), 2 * rows * N * K)


def unfused(kind: Prologue, i: Inputs) -> tuple[torch.Tensor]:
    """The op's own kernel, then the decode GEMM (what a decode step runs without the prologue GEMM)."""
    a, b = i["a"], i["b"]
    if kind == Prologue.SILU_MUL:
        h = silu_mul_quant_triton(torch.cat([a, b], -1).flatten(-2), "bf16", None)[0]
    elif kind == Prologue.SIGMOID_GATE:
        h = sigmoid_gate_triton(a, b)
    else:
        h = rms_norm_triton(a, i["norm_weight"], EPS, z=b).flatten(-2)
    return (decode_gemm_triton(h, i["weight"]).reshape(*a.shape[:2], -1),)


def sm90_build(kind: Prologue, s: Shape) -> Sm90Build:
    """The kernel with ``prologue_config`` for the weight, bf16 input, one row tile."""
    cfg = prologue_config(s["N"], s["H"] * s["D"])
    types = {n: "i32" for n in _prologue_gemm_kernel.arg_names}
    types.update(a_ptr="*i16", b_ptr="*i16", nw_ptr="*i16", w_ptr="*bf16", o_ptr="*bf16", ws_ptr="*fp32",
                 count_ptr="*i32", sx_ptr="*fp32", sw_ptr="*fp32", eps="fp32")
    consts = dict(PRO=int(kind), XQ=0, D=s["D"], SW_COLS=False, ON_GPU=True, SWAP=cfg["swap"], SPLIT_K=cfg["split_k"],
                  ROW_TILES=1, BLOCK_M=16, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PDL=True)
    return Sm90Build(_prologue_gemm_kernel, types, consts, cfg["num_warps"], 3,
                     divisible_by_16=("a_ptr", "b_ptr", "w_ptr", "o_ptr", "N", "K", "K_SPLIT", "stride_wn"))


def _args(kind: Prologue, i: Inputs) -> tuple:
    return kind, i["a"], i["b"], i["weight"], i["norm_weight"], EPS


def _op(kind: Prologue) -> OpBench:
    return OpBench(
        name=f"gemm_prologue_{kind.name.lower()}", shapes=prologue_shapes(kind), inputs=partial(prologue_inputs, kind),
        floor=prologue_floor, reference=lambda i: (prologue_gemm_reference(*_args(kind, i)),),
        variants={"kernel": Variant(lambda i: (prologue_gemm(*_args(kind, i), policy=current()),)),
                  "unfused": Variant(partial(unfused, kind))},
        check=BITS, baseline="unfused", rows=lambda i, r: leading_rows(i, r, ("a", "b")),
        ptxas={"kernel": partial(sm90_build, kind)})


BENCHES = tuple(_op(kind) for kind in Prologue)
