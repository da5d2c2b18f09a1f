"""The NVFP4 weight-only GEMM (``ocria::nvfp4_gemm``: bf16 activations x E2M1 weights with E4M3 block scales): the
one-row GEMV on the CUDA cores (``nvfp4_gemv``, the default at M = 1) against the tensor-core kernel, the PTX
dequantization (``nvfp4_ptx``) against integer unpacking, and cuBLAS on the bf16 weight as the baseline.

Floor: the packed weight and its block scales once, x in, the output out. Check: within one bf16 rounding of
dequantize + fp32 matmul (the sum order differs; tests/test_quant.py)."""

import torch
import torch.nn.functional as F

from bench.ops.presets import linear_shapes
from bench.ops.registry import Floor, Inputs, OpBench, Shape, Tolerance, Variant, leading_rows, shape
from bench.ops.switches import current, without
from ocria.plugins import numerics as nx
from ocria.plugins.fp4_gemm import nvfp4_gemm, nvfp4_gemm_reference

LAYERS = ("mlp_gate_up", "mlp_down", "gdn_in_proj", "lm_head")  # what an NVFP4 recipe quantizes


def fp4_shapes() -> tuple[Shape, ...]:
    """Both presets' quantized linears at 1 row (GEMV) and 16 rows, and CPU shapes of 1 and 3 rows."""
    shapes = [shape(f"{label}_{layer}_m{m}", M=m, N=n, K=k)
              for label in ("mini", "sim") for layer, (n, k) in linear_shapes(label).items() if layer in LAYERS
              for m in (1, 16)]
    return (shape("cpu_m3", cpu=True, M=3, N=32, K=64), *shapes)


def fp4_inputs(s: Shape, device: torch.device, g: torch.Generator) -> Inputs:
    """x [M, K] bf16; the weight [N, K] quantized: packed [N, K/2] uint8, block scales [N, K/16] E4M3, global scale;
    ``w_bf16`` its dequantized bf16 form (the cuBLAS baseline's weight)."""
    K = s["K"]
    w = torch.randn(s["N"], K, generator=g, device=device) * K**-0.5
    gs = nx.nvfp4_global_scale(w.abs().amax()).to(device)
    packed, scales = nx.quantize_nvfp4(w, gs)
    return {"x": torch.randn(s["M"], K, generator=g, device=device).to(torch.bfloat16), "packed": packed,
            "scales": scales, "global_scale": gs,
            "w_bf16": nx.dequantize_nvfp4(packed, scales, gs, torch.float32).to(torch.bfloat16)}


def fp4_floor(s: Shape) -> Floor:
    M, N, K = s["M"], s["N"], s["K"]
    return Floor(N * K // 2 + N * K // 16 + 2 * M * (K + N), 2 * M * N * K)


def _args(i: Inputs) -> tuple[torch.Tensor, ...]:
    return i["x"], i["packed"], i["scales"], i["global_scale"]


def _kernel(i: Inputs) -> tuple[torch.Tensor]:
    return (nvfp4_gemm(*_args(i), policy=current()),)


BENCHES = (
    OpBench(
        name="nvfp4_gemm", shapes=fp4_shapes(), inputs=fp4_inputs, floor=fp4_floor,
        reference=lambda i: (nvfp4_gemm_reference(*_args(i)),),
        variants={"kernel": Variant(_kernel),
                  "no_gemv": Variant(without(_kernel, "nvfp4_gemv")),
                  "int_unpack": Variant(without(_kernel, "nvfp4_ptx")),
                  "cublas_bf16": Variant(lambda i: (F.linear(i["x"], i["w_bf16"]),), kernel=False)},
        check=Tolerance("rel", 1e-2, "one bf16 rounding of the output (bench plugins check)"), baseline="cublas_bf16",
        rows=lambda i, r: leading_rows(i, r, ("x",))),
)
