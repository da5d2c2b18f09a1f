"""Fused RMSNorm kernels for decode: the zero-centred norm of Qwen3.5, the plain norm of the DFlash drafter
(each also with the residual add, or an attention's rotary embedding, fused in) and the GDN output's gated norm;
the decoder's input norm and the gated norm also with FP8 outputs for the FP8 layers that follow them."""

from ocria.plugins.rms_norm.op import (
    add_plain_rms_norm,
    add_rms_norm,
    add_rms_norm_fp8,
    gated_rms_norm,
    gated_rms_norm_fp8,
    plain_rms_norm,
    rms_norm,
    rms_norm_rope,
)

__all__ = ["add_plain_rms_norm", "add_rms_norm", "add_rms_norm_fp8", "gated_rms_norm", "gated_rms_norm_fp8",
           "plain_rms_norm", "rms_norm", "rms_norm_rope"]
