"""A decoder layer's output GEMM with the elementwise op before it (SiLU-multiply, sigmoid gate, gated RMSNorm) and
the FP8 quantization of its input in the same launch."""

from ocria.plugins.gemm_prologue.op import prologue_gemm
from ocria.plugins.gemm_prologue.reference import Prologue, prologue_gemm_reference, prologue_reference

__all__ = ["Prologue", "prologue_gemm", "prologue_gemm_reference", "prologue_reference"]
