"""Quantized linear layers and the loader of ModelOpt unified checkpoints: what the runtime executes. Building
them (recipes, calibration, export) is ``ocria.quant``, a build-time package the runtime never imports.

- ``formats``: the ``Format`` enum and the per-layer formats a checkpoint declares.
- ``linear``: ``QuantLinear``, FP8 / NVFP4 layers executing the exported tensors.
- ``load``: a quantized checkpoint back as a target model.
"""

from ocria.models.quantized.formats import FORMAT_BITS, FORMATS, Format
from ocria.models.quantized.linear import QuantLinear
from ocria.models.quantized.load import install_linears, load_quantized_target, quantized_layers

__all__ = ["FORMATS", "FORMAT_BITS", "Format", "QuantLinear", "install_linears", "load_quantized_target",
           "quantized_layers"]
