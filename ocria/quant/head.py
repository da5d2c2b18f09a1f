"""The recipe's quantized LM head (``lm_head: {format: fp8, scale: ...}``): untying it from the embeddings, and its
calibration-free FP8 weights for ``ocria.quant.direct``.

Qwen3.5 ties the head to the token embeddings. A quantized head cannot share their tensor (the embeddings stay
BF16: a lookup reads one row per token, a head reads every row per step), so a build gives the head its own copy
first and the exported ``config.json`` says ``tie_word_embeddings: false``; the checkpoint then stores both, the
head in FP8 (half the BF16 head's bytes).
"""

import torch
from torch import Tensor, nn

from ocria.models import OCRiaForConditionalGeneration
from ocria.plugins import numerics as nx
from ocria.quant.recipe import HeadQuant, HeadScale


def untie_head(model: OCRiaForConditionalGeneration) -> None:
    """Give ``model.lm_head`` a weight of its own (a copy of the tied embeddings) and mark the config untied."""
    if model.text_config.tie_word_embeddings:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone(),
                                            requires_grad=model.lm_head.weight.requires_grad)
        model.text_config.tie_word_embeddings = False


def head_weight_tensors(weight: Tensor, head: HeadQuant) -> dict[str, Tensor]:
    """Unified-format tensors of an FP8 head from its weight [V, H] without calibration: E4M3 ``weight`` and fp32
    ``weight_scale``, ``amax / 448`` per vocabulary row (per_channel, [V]) or over the whole matrix (per_tensor,
    scalar). No ``input_scale``: the activations are scaled per token at run time.

    Args:
        weight: [V, H] float head weight.
        head: the recipe's head format.
    Returns:
        ``{"weight": float8_e4m3fn [V, H], "weight_scale": fp32 [V] or []}``.
    """
    w = weight.detach().float()
    amax = w.abs().amax(dim=1) if head.scale == HeadScale.PER_CHANNEL else w.abs().amax()
    amax = torch.where(amax <= nx.FP8_AMAX_EPS, torch.ones_like(amax), amax)  # an all-zero row: codes 0, scale 1/448
    scale = amax / torch.full((), nx.E4M3_MAX, device=w.device)
    codes = nx.e4m3_encode(w / (scale[:, None] if scale.dim() else scale)).view(torch.float8_e4m3fn)
    return {"weight": codes, "weight_scale": scale}
