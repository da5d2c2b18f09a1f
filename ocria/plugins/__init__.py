"""Custom kernels, each beside its plain PyTorch reference. Importing the package registers every
``torch.ops.ocria`` operator (each subpackage's ``torch.library.custom_op`` definitions)."""

from ocria.plugins import (
    decode_attention,
    decode_gemm,
    fp4_gemm,
    gemm_prologue,
    kv_write,
    replay_ssm,
    rms_norm,
    sigmoid_gate,
    silu_quant,
)
from ocria.plugins.replay_ssm import ops as replay_ssm_ops

OPERATORS = ("add_plain_rms_norm", "add_rms_norm", "add_rms_norm_fp8", "causal_conv_verify", "decode_attention",
             "decode_gemm", "decode_gemm_fp8", "decode_gemm_norm", "gated_rms_norm", "gated_rms_norm_fp8", "kv_write",
             "nvfp4_gemm", "plain_rms_norm", "prologue_gemm", "quantize_act", "replay_verify", "rms_norm",
             "rms_norm_rope", "sigmoid_gate", "silu_mul_quant")

__all__ = ["OPERATORS", "decode_attention", "decode_gemm", "fp4_gemm", "gemm_prologue", "kv_write", "replay_ssm",
           "replay_ssm_ops", "rms_norm", "sigmoid_gate", "silu_quant"]
