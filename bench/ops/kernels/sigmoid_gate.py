"""The gated attention's output gate (``ocria::sigmoid_gate``): ``o * sigmoid(gate)`` with the gate a strided view
of the q projection, in one launch against the reference's copy, sigmoid and multiply.

Floor: o and the gate read, the product written. Check: within one bf16 ulp (bench plugins check)."""

import torch

from bench.ops.presets import text_config
from bench.ops.registry import Floor, Inputs, OpBench, Shape, Tolerance, Variant, leading_rows, shape
from bench.ops.switches import current
from ocria.plugins.sigmoid_gate import sigmoid_gate, sigmoid_gate_reference


def gate_shapes() -> tuple[Shape, ...]:
    """Both presets' attention heads at 1 and 32 rows of 1 and 16 tokens, and a CPU shape."""
    shapes = [shape(f"{label}_b{b}_t{t}", B=b, T=t, H=text_config(label)["num_attention_heads"],
                    D=text_config(label)["head_dim"]) for label in ("mini", "sim") for b in (1, 32) for t in (1, 16)]
    return (shape("cpu_b2", cpu=True, B=2, T=3, H=2, D=32), *shapes)


def gate_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """o [B, T, H, D] bf16 (attention's output, heads-major transposed) and gate: the second half of q [B, T, H, 2D]."""
    B, T, H, D = (s[n] for n in ("B", "T", "H", "D"))
    q = (torch.randn(B, T, H, 2 * D, generator=g, device=device) * 4).to(torch.bfloat16)
    o = torch.randn(B, H, T, D, generator=g, device=device).to(torch.bfloat16).transpose(1, 2)
    return {"o": o, "gate": q.chunk(2, dim=-1)[1]}


def gate_floor(s: Shape) -> Floor:
    n = s["B"] * s["T"] * s["H"] * s["D"]
    return Floor(3 * 2 * n, 4 * n)


BENCHES = (
    OpBench(name="sigmoid_gate", shapes=gate_shapes(), inputs=gate_inputs, floor=gate_floor,
            reference=lambda i: (sigmoid_gate_reference(i["o"], i["gate"]),),
            variants={"kernel": Variant(lambda i: (sigmoid_gate(i["o"], i["gate"], policy=current()),))},
            check=Tolerance("ulps", 1, "sigmoid's rounding (bench plugins check)"),
            rows=lambda i, r: leading_rows(i, r, ("o", "gate"))),
)
