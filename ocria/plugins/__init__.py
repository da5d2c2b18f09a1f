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

__all__ = ["decode_attention", "decode_gemm", "fp4_gemm", "gemm_prologue", "kv_write", "replay_ssm",
           "replay_ssm_ops", "rms_norm", "sigmoid_gate", "silu_quant"]
