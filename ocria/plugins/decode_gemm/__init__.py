"""Skinny GEMM for decode and verify steps (at most 16 rows): one launch, weights streamed once, rows
batch invariant."""

from ocria.plugins.decode_gemm.kernel import (
    MAX_M,
    decode_gemm_fp8_triton,
    decode_gemm_norm_triton,
    decode_gemm_triton,
    default_config,
)
from ocria.plugins.decode_gemm.op import decode_gemm, decode_gemm_fp8, decode_gemm_norm
from ocria.plugins.decode_gemm.reference import (
    decode_gemm_fp8_fp32,
    decode_gemm_fp32,
    decode_gemm_norm_fp32,
    decode_gemm_reference,
)

__all__ = ["MAX_M", "decode_gemm", "decode_gemm_fp8", "decode_gemm_fp8_fp32", "decode_gemm_fp8_triton",
           "decode_gemm_fp32", "decode_gemm_norm", "decode_gemm_norm_fp32", "decode_gemm_norm_triton",
           "decode_gemm_reference", "decode_gemm_triton", "default_config"]
