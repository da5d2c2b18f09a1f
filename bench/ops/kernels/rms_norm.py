"""The fused norms (``ocria::rms_norm`` family): the zero-centred RMSNorm, the residual add fused into it, the GDN's
gated norm and the attention's q/k norm with its rotary embedding, each in one launch against the eager chain.

Floor: inputs read and outputs written once. Check: the bf16 ulps the rounding chains allow (bench plugins check: 1
for the norm and the add + norm, whose sum is exact, 4 for the gated norm's three roundings); the norm + rotary
within an absolute bound of its reference (tests/test_rms_norm.py: the rotary's cancellations)."""

import torch

from bench.ops.presets import text_config
from bench.ops.registry import Floor, Inputs, OpBench, Shape, Tolerance, Variant, leading_rows, shape
from bench.ops.switches import current
from ocria.plugins.rms_norm import add_rms_norm, gated_rms_norm, rms_norm, rms_norm_rope
from ocria.plugins.rms_norm.reference import (
    add_rms_norm_reference,
    gated_rms_norm_reference,
    rms_norm_reference,
    rms_norm_rope_reference,
)

EPS = 1e-6
TOKENS = (1, 16, 512)


def hidden_shapes() -> tuple[Shape, ...]:
    """Both presets' hidden size at 1, 16 and 512 tokens, and a CPU shape."""
    shapes = [shape(f"{label}_m{m}", M=m, N=text_config(label)["hidden_size"])
              for label in ("mini", "sim") for m in TOKENS]
    return (shape("cpu_m3", cpu=True, M=3, N=96), *shapes)


def head_shapes(gdn: bool) -> tuple[Shape, ...]:
    """Both presets' GDN value heads (``gdn``) or attention heads at 1, 16 and 512 tokens, and a CPU shape."""
    shapes = []
    for label in ("mini", "sim"):
        t = text_config(label)
        H, D = ((t["linear_num_value_heads"], t["linear_value_head_dim"]) if gdn
                else (t["num_attention_heads"], t["head_dim"]))
        R = 0 if gdn else int(D * t["rope_parameters"]["partial_rotary_factor"])
        shapes += [shape(f"{label}_m{m}", M=m, H=H, D=D, R=R) for m in TOKENS]
    return (shape("cpu_m3", cpu=True, M=3, H=2, D=32, R=0 if gdn else 8), *shapes)


def _bf16(g: torch.Generator, device: torch.device, *size: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*size, generator=g, device=device) * scale).to(torch.bfloat16)


def norm_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """x and residual [M, N], the norm weight [N] (bf16)."""
    M, N = s["M"], s["N"]
    return {"x": _bf16(g, device, M, N), "residual": _bf16(g, device, M, N), "w": _bf16(g, device, N, scale=0.1)}


def gated_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """The GDN output o and its gate z [M, H, D], the norm weight [D] around 1 (bf16)."""
    M, H, D = s["M"], s["H"], s["D"]
    return {"x": _bf16(g, device, M, H, D), "z": _bf16(g, device, M, H, D),
            "w": (1 + torch.randn(D, generator=g, device=device) * 0.1).to(torch.bfloat16)}


def rope_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """q [M, H, D] (bf16), the norm weight [D], the rotary cos, sin [M, R] of random positions."""
    M, H, D, R = s["M"], s["H"], s["D"], s["R"]
    angle = torch.rand(M, R // 2, generator=g, device=device) * 100
    angle = torch.cat([angle, angle], -1)
    return {"x": _bf16(g, device, M, H, D), "w": _bf16(g, device, D, scale=0.1),
            "cos": angle.cos().to(torch.bfloat16), "sin": angle.sin().to(torch.bfloat16)}


def _elements(s: Shape) -> int:
    return s["M"] * (s["N"] if "N" in s.as_dict() else s["H"] * s["D"])


BENCHES = (
    OpBench(name="rms_norm", shapes=hidden_shapes(), inputs=norm_inputs,
            floor=lambda s: Floor(2 * 2 * _elements(s) + 2 * s["N"], 4 * _elements(s)),
            reference=lambda i: (rms_norm_reference(i["x"], i["w"], EPS, 1.0),),
            variants={"kernel": Variant(lambda i: (rms_norm(i["x"], i["w"], EPS, 1.0, policy=current()),))},
            check=Tolerance("ulps", 1, "one rounding of an fp32 norm a few fp32 ulps apart"),
            rows=lambda i, r: leading_rows(i, r, ("x", "residual"))),
    OpBench(name="add_rms_norm", shapes=hidden_shapes(), inputs=norm_inputs,
            floor=lambda s: Floor(4 * 2 * _elements(s) + 2 * s["N"], 5 * _elements(s)),
            reference=lambda i: add_rms_norm_reference(i["x"], i["residual"], i["w"], EPS, 1.0),
            variants={"kernel": Variant(lambda i: add_rms_norm(i["x"], i["residual"], i["w"], EPS, 1.0,
                                                               policy=current()))},
            check=Tolerance("ulps", 1, "the sum exact, the norm one rounding"),
            rows=lambda i, r: leading_rows(i, r, ("x", "residual"))),
    OpBench(name="gated_rms_norm", shapes=head_shapes(gdn=True), inputs=gated_inputs,
            floor=lambda s: Floor(3 * 2 * _elements(s) + 2 * s["D"], 8 * _elements(s)),
            reference=lambda i: (gated_rms_norm_reference(i["x"], i["z"], i["w"], EPS),),
            variants={"kernel": Variant(lambda i: (gated_rms_norm(i["x"], i["z"], i["w"], EPS, policy=current()),))},
            check=Tolerance("ulps", 4, "three roundings carry a boundary flip of the norm (bench plugins check)"),
            rows=lambda i, r: leading_rows(i, r, ("x", "z"))),
    OpBench(name="rms_norm_rope", shapes=head_shapes(gdn=False), inputs=rope_inputs,
            floor=lambda s: Floor(2 * 2 * _elements(s) + 2 * 2 * s["M"] * s["R"] + 2 * s["D"], 6 * _elements(s)),
            reference=lambda i: (rms_norm_rope_reference(i["x"], i["w"], i["cos"], i["sin"], EPS, 1.0, False),),
            variants={"kernel": Variant(lambda i: (rms_norm_rope(i["x"], i["w"], i["cos"], i["sin"], EPS, 1.0,
                                                                 policy=current()),))},
            check=Tolerance("rel", 2e-2, "the norm's ulps through the rotary's cancellations"),
            rows=lambda i, r: leading_rows(i, r, ("x", "cos", "sin"))),
)
