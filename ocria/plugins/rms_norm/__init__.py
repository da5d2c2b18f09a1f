"""Fused RMSNorm kernels for decode: the zero-centred norm of Qwen3.5 and the GDN output's gated norm."""

from ocria.plugins.rms_norm.op import add_rms_norm, gated_rms_norm, rms_norm

__all__ = ["add_rms_norm", "gated_rms_norm", "rms_norm"]
