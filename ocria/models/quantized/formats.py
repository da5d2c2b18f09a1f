"""The checkpoint formats of quantized linears: the ``Format`` enum, and what a ModelOpt unified checkpoint
(``hf_quant_config.json``) declares for each layer. Run-time reading only; ``ocria.quant`` writes them."""

import json
from enum import Enum
from pathlib import Path


class Format(str, Enum):
    """A linear layer's weight format. A ``str`` enum: it compares, hashes and serializes as its value."""

    BF16 = "bf16"
    FP8 = "fp8"  # E4M3 weights and activations, fp32 scales (tensor cores on sm_89+)
    NVFP4 = "nvfp4"  # E2M1 weights in 16-element blocks with E4M3 block scales and an fp32 global scale

    def __str__(self) -> str:
        return self.value


FORMATS = tuple(f.value for f in Format)
# Weight bits per parameter, block scales included (NVFP4: 4 + 8 / 16)
FORMAT_BITS = {Format.BF16: 16.0, Format.FP8: 8.0, Format.NVFP4: 4.5}
QUANT_CONFIG = "hf_quant_config.json"


def read_quant_config(directory: Path) -> dict:
    """``hf_quant_config.json``'s ``quantization`` section ({} for a plain checkpoint)."""
    path = Path(directory) / QUANT_CONFIG
    return json.loads(path.read_text()).get("quantization", {}) if path.is_file() else {}


# ModelOpt names NVFP4 calibrated with AWQ ``NVFP4_AWQ``: the same tensors plus a per-channel ``pre_quant_scale``;
# FP8 with per-channel weight scales and per-token activation scales (a recipe's per-channel LM head)
# ``FP8_PER_CHANNEL_PER_TOKEN``: E4M3 weights with a [N] ``weight_scale`` and no ``input_scale``
STORED_AS = {"nvfp4_awq": "nvfp4", "fp8_per_channel_per_token": "fp8"}


def stored_format(quant_algo: str) -> Format:
    """The tensor format (``fp8`` / ``nvfp4``) of a ModelOpt ``quant_algo`` name."""
    algo = quant_algo.lower()
    return Format(STORED_AS.get(algo, algo))


def layer_formats(quant: dict) -> dict[str, Format]:
    """Quantized layer name -> ``fp8`` / ``nvfp4`` from an hf_quant_config ``quantization`` section."""
    algo = quant.get("quant_algo")
    if algo == "MIXED_PRECISION":
        return {name: stored_format(entry["quant_algo"]) for name, entry in quant.get("quantized_layers", {}).items()}
    return {}
