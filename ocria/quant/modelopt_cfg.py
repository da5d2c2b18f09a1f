"""Recipes -> ModelOpt configs: the ordered ``quant_cfg`` list for ``mtq.quantize`` and the search
arguments for ``mtq.auto_quantize``.

Each rule ``{match: G, format: F}`` becomes entries for the quantizers ``G.weight_quantizer`` and
``G.input_quantizer`` (ModelOpt matches quantizer names with fnmatch, later entries win, like our
rules); the quantizer attributes of F are ModelOpt's own presets (``FP8_DEFAULT_CFG``,
``NVFP4_DEFAULT_CFG``). The protected layers are disabled after the rules, and only ``nn.Linear``
layers are ever quantized.
"""

import copy

import modelopt.torch.quantization as mtq

from ocria.quant.recipe import HEAD, PROTECTED, VISION, HeadQuant, HeadScale, Recipe

PRESETS = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}
HEAD_PRESETS = {HeadScale.PER_CHANNEL: "FP8_PER_CHANNEL_PER_TOKEN_CFG", HeadScale.PER_TENSOR: "FP8_DEFAULT_CFG"}
NON_LINEAR = ("nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "nn.Embedding", "nn.LayerNorm")


def preset(fmt: str) -> dict:
    """ModelOpt's config for one format (a fresh copy)."""
    return copy.deepcopy(getattr(mtq, PRESETS[fmt]))


def head_preset(head: HeadQuant) -> dict:
    """ModelOpt's config of the LM head's format (a fresh copy)."""
    return copy.deepcopy(getattr(mtq, HEAD_PRESETS[head.scale]))


def quantizer_attributes(fmt: str | HeadQuant) -> dict[str, dict]:
    """``{"weight": cfg, "input": cfg}`` quantizer attributes of a format (or of a recipe's LM head), from
    ModelOpt's preset."""
    out = {}
    for entry in (head_preset(fmt) if isinstance(fmt, HeadQuant) else preset(fmt))["quant_cfg"]:
        for kind in ("weight", "input"):
            if entry.get("quantizer_name") == f"*{kind}_quantizer" and "cfg" in entry:
                out[kind] = entry["cfg"]
    return out


def protected_entries(allow_vision_quant: bool) -> list[dict]:
    patterns = [*PROTECTED] + ([] if allow_vision_quant else [VISION])
    entries = [{"quantizer_name": f"{p}.*", "enable": False} for p in patterns]
    entries += [{"quantizer_name": "*", "parent_class": cls, "enable": False} for cls in NON_LINEAR]
    return entries


def quant_cfg(recipe: Recipe, algorithm: str | None = None) -> dict:
    """The ``mtq.quantize`` config of a rule-based recipe (``algorithm`` overrides the recipe's)."""
    entries: list[dict] = [{"quantizer_name": "*", "enable": False}]
    for rule in recipe.rules:
        if rule.format == "bf16":
            entries.append({"quantizer_name": f"{rule.match}.*_quantizer", "enable": False})
            continue
        attrs = quantizer_attributes(rule.format)
        for kind in ("weight", "input"):
            entries.append({"quantizer_name": f"{rule.match}.{kind}_quantizer", "cfg": copy.deepcopy(attrs[kind])})
    entries += protected_entries(recipe.allow_vision_quant) + head_entries(recipe.lm_head)
    return {"quant_cfg": entries, "algorithm": algorithm or recipe.algorithm}


def head_entries(head: HeadQuant | None) -> list[dict]:
    """The LM head's quantizer entries (after the protected ones, which disable it); none for a BF16 head."""
    if head is None:
        return []
    attrs = quantizer_attributes(head)
    return [{"quantizer_name": f"{HEAD}.{kind}_quantizer", "cfg": copy.deepcopy(attrs[kind])}
            for kind in ("weight", "input")]
