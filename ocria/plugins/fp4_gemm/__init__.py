"""NVFP4 weight-only GEMM (bf16 activations x packed E2M1 + E4M3 block scales) for Hopper decode."""

from ocria.plugins.fp4_gemm.op import nvfp4_gemm
from ocria.plugins.fp4_gemm.reference import nvfp4_gemm_reference

__all__ = ["nvfp4_gemm", "nvfp4_gemm_reference"]
