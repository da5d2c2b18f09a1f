"""Calibration-free weight quantization of a loaded target, for speed work on random-weight presets.

Each linear a recipe selects is quantized from its own weight with the reference quantizers (FP8:
per-tensor ``amax / 448``; NVFP4: ModelOpt's global and 16-element block scales, gate and up sharing
one global scale as ModelOpt's export makes them). FP8 layers get no ``input_scale``, so their
activations are scaled per token at run time. The bytes and kernels of a step are those of an engine
built with the same recipe; the numbers are not (no calibration): engines come from
``ocria-build engine --recipe`` (ModelOpt), this is what ``ocria bench engine --recipe`` times. A recipe's
``lm_head`` unties the head and quantizes it too (``ocria.quant.head``); a drafter bound to the old head must be bound
to the new one (``DFlash2Drafter.bind``).
"""

import re

import torch
from torch import Tensor, nn

from ocria.models import OCRiaForConditionalGeneration
from ocria.models.quantized.linear import QuantLinear
from ocria.models.quantized.load import install_linears
from ocria.plugins import numerics as nx
from ocria.quant.head import head_weight_tensors, untie_head
from ocria.quant.recipe import HEAD, Recipe


def quantize_weight(weight: Tensor, fmt: str, amax: Tensor | None = None) -> dict[str, Tensor]:
    """Unified-format tensors (``weight``, ``weight_scale``[, ``weight_scale_2``]) of one weight [N, K];
    ``amax`` overrides the tensor's own (a group sharing a global scale)."""
    amax = weight.detach().float().abs().amax() if amax is None else amax
    if fmt == "fp8":
        scale = amax / 448.0
        return {"weight": nx.quantize_fp8(weight, scale), "weight_scale": scale}
    if fmt == "nvfp4":
        global_scale = nx.nvfp4_global_scale(amax)
        packed, block_scales = nx.quantize_nvfp4(weight, global_scale)
        return {"weight": packed, "weight_scale": block_scales, "weight_scale_2": global_scale}
    raise ValueError(f"quantize_weight: format {fmt!r} is not fp8 or nvfp4")


@torch.no_grad()
def quantize_in_place(model: OCRiaForConditionalGeneration, recipe: Recipe) -> dict[str, str]:
    """Replace the recipe's non-bf16 linears of ``model`` (and its LM head, with ``lm_head``) by ``QuantLinear``s;
    returns name -> format."""
    if recipe.auto is not None:
        raise ValueError(f"recipe {recipe.name!r} searches formats with calibration data; name fixed rules")
    modules = dict(model.named_modules())
    formats = {n: f for n, f in recipe.formats(modules).items() if f != "bf16"}
    group = {name: re.sub(r"\.(gate|up)_proj$", ".gate_up", name) for name in formats}  # gate/up share a scale
    group_amax: dict[str, Tensor] = {}
    for name, key in group.items():
        amax = modules[name].weight.float().abs().amax()
        group_amax[key] = torch.maximum(group_amax.get(key, amax), amax)
    linears = {}
    for name, fmt in formats.items():
        linear: nn.Linear = modules[name]
        amax = group_amax[group[name]]
        t = quantize_weight(linear.weight, fmt, amax)
        linears[name] = QuantLinear(fmt, t["weight"], linear.bias, t["weight_scale"], t.get("weight_scale_2"),
                                    name=name)
    if recipe.lm_head is not None:
        untie_head(model)
        t = head_weight_tensors(model.lm_head.weight, recipe.lm_head)
        linears[HEAD] = QuantLinear(recipe.lm_head.format, t["weight"], None, t["weight_scale"], name=HEAD)
        formats[HEAD] = recipe.lm_head.format
    install_linears(model, linears)
    return formats
