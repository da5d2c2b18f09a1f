"""Load a ModelOpt unified HF checkpoint of the target with its quantized linears executing the
exported tensors (``ocria.models.quantized.linear.QuantLinear``: FP8 ``_scaled_mm`` / NVFP4 Triton GEMM on
CUDA, dequantized weights on CPU).

A linear layer is quantized exactly when its ``weight`` tensor is float8_e4m3fn (FP8) or uint8
(NVFP4); ``hf_quant_config.json`` must agree. A SwiGLU MLP whose gate and up projections share a
format becomes one gate/up GEMM plus the fused SiLU-multiply(-quantize) kernel.
"""

import re
from pathlib import Path

import torch
from torch import Tensor, nn

from ocria.errors import CheckpointError
from ocria.models import OCRiaForConditionalGeneration
from ocria.models.checkpoint import checkpoint_files, load_module, read_tensors
from ocria.models.config import OCRiaConfig, read_config_json
from ocria.models.layers import PolicyLinear, SwiGLU
from ocria.models.quantized.formats import Format, layer_formats, read_quant_config, stored_format
from ocria.models.quantized.linear import QuantLinear, detect_format, mlp_forward
from ocria.models.target import IGNORED_TENSORS
from ocria.plugins.policy import AUTO, ExecutionPolicy

TENSOR_SUFFIXES = ("weight", "bias", "weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale")


class PreScaledLinear(PolicyLinear):
    """A quantized linear whose input is first multiplied per channel by ModelOpt's AWQ
    ``pre_quant_scale`` (the exported weight already carries the inverse scale)."""

    def __init__(self, linear: QuantLinear, pre_quant_scale: Tensor):
        super().__init__()
        self.linear = linear
        self.register_buffer("pre_quant_scale", pre_quant_scale.float().reshape(-1))

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    @property
    def fusion_key(self) -> tuple | None:
        """Neighbours that share an input fuse as their quantized layers do when they also share the scale
        (ModelOpt's export gives layers with one input one averaged ``pre_quant_scale``)."""
        key = self.linear.fusion_key
        return None if key is None else ("pre_scaled", key, tuple(self.pre_quant_scale.tolist()))

    @classmethod
    def fuse(cls, layers: list["PreScaledLinear"], name: str = "fused") -> tuple["PreScaledLinear",
                                                                                 list["PreScaledLinear"]]:
        """``QuantLinear.fuse`` of the wrapped layers, under their one scale."""
        fused, views = QuantLinear.fuse([lay.linear for lay in layers], name=name)
        scale = layers[0].pre_quant_scale
        return cls(fused, scale), [cls(view, scale) for view in views]

    fp32_logits = True  # an LM head, as QuantLinear's

    def rows(self, n: int) -> "PreScaledLinear":
        """The first ``n`` outputs (``QuantLinear.rows``) under the same input scale."""
        return PreScaledLinear(self.linear.rows(n), self.pre_quant_scale)

    def forward(self, x: Tensor, policy: ExecutionPolicy = AUTO, out_fp32: bool = False) -> Tensor:
        return self.linear(x * self.pre_quant_scale.to(x.dtype), policy, out_fp32=out_fp32)


class QuantSwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up stacked into one quantized GEMM; ``gate_proj``
    and ``up_proj`` stay reachable under their HF names as views of it. ``down`` may be pre-scaled (AWQ)."""

    def __init__(self, gate: QuantLinear, up: QuantLinear, down: QuantLinear | PreScaledLinear, name: str):
        super().__init__()
        self.gate_up, (self.gate_proj, self.up_proj) = QuantLinear.fuse([gate, up], name=f"{name}.gate_up")
        self.down_proj = down

    def forward(self, x: Tensor, policy: ExecutionPolicy = AUTO) -> Tensor:
        return mlp_forward(x, self.gate_up, self.down_proj, policy)


def _set(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def quantized_layers(directory: Path) -> dict[str, str]:
    """Linear layer name -> ``fp8`` / ``nvfp4`` for every quantized layer of a checkpoint (by dtype)."""
    files = checkpoint_files(directory)
    weights = [n for n in files if n.endswith(".weight") and n[: -len("weight")] + "weight_scale" in files]
    tensors = read_tensors(directory, weights)
    return {n[: -len(".weight")]: detect_format(tensors, n[: -len("weight")]) for n in weights}


def load_quantized_target(directory: str | Path, dtype: torch.dtype = torch.bfloat16,
                          device: torch.device | str = "cpu",
                          recorded: dict[str, str] | None = None) -> OCRiaForConditionalGeneration:
    """The target of a quantized checkpoint, ready for the runtime (``forward_cached`` / ``forward``).

    Args:
        directory: the checkpoint (``config.json``, safetensors, ``hf_quant_config.json``).
        dtype: the dtype of the unquantized weights.
        device: where the weights go.
        recorded: the build's decisions, quantized layer name -> format (an engine manifest's ``quantized_layers``):
            the layers to load as quantized; the checkpoint's tensors must store exactly these. None: the
            layers whose weights are stored quantized.

    Returns:
        The model, in eval mode.
    """
    directory = Path(directory)
    cfg = OCRiaConfig.from_dict(read_config_json(directory / "config.json"))
    with torch.device("meta"):
        model = OCRiaForConditionalGeneration(cfg)
    modules = dict(model.named_modules())
    formats = quantized_layers(directory)
    if recorded is not None:
        decided = {name: Format(fmt) for name, fmt in recorded.items() if Format(fmt) != Format.BF16}
        for name in sorted(set(decided) | set(formats)):
            if decided.get(name) != formats.get(name):
                raise CheckpointError(f"{directory}: the engine manifest records {name} as "
                                      f"{decided.get(name, Format.BF16)}, but its weights are stored as "
                                      f"{formats.get(name, Format.BF16)}")
    quant = read_quant_config(directory)
    declared, algo = layer_formats(quant), quant.get("quant_algo")
    for name, fmt in formats.items():
        if not isinstance(modules.get(name), nn.Linear):
            raise CheckpointError(f"{directory}: quantized tensor {name}.weight is not a linear layer of the model")
        if (declared and declared.get(name) != fmt) or (not declared and algo and stored_format(algo) != fmt):
            raise CheckpointError(f"{directory}: {name} is stored as {fmt} but hf_quant_config.json says "
                                  f"{declared.get(name, algo)}")
    missing = sorted(set(declared) - set(formats))
    if missing:
        raise CheckpointError(f"{directory}: hf_quant_config.json lists {missing[0]} as quantized, "
                              "but its weight is not a quantized tensor")
    files = checkpoint_files(directory)
    names = [f"{layer}.{s}" for layer in formats for s in TENSOR_SUFFIXES if f"{layer}.{s}" in files]
    tensors = {k: v.to(device) for k, v in read_tensors(directory, names).items()}
    linears = {name: QuantLinear.from_tensors(tensors, name + ".") for name in formats}
    pre_scales = {name: tensors[f"{name}.pre_quant_scale"] for name in formats if f"{name}.pre_quant_scale" in tensors}
    quant_patterns = tuple(rf"^{re.escape(layer)}\." for layer in formats)
    tied = (r"^lm_head\.",) if cfg.text.tie_word_embeddings else ()
    for name in formats:  # placeholders so load_module neither wants nor refuses their tensors
        _set(model, name, nn.Identity())
    load_module(model, directory, {"": ""}, dtype, device, ignore=IGNORED_TENSORS + tied + quant_patterns,
                optional=tied)
    model.tie_weights()
    for name, linear in linears.items():
        if name in pre_scales:
            _set(model, name, PreScaledLinear(linear, pre_scales[name]))
    install_linears(model, {n: lin for n, lin in linears.items() if n not in pre_scales})
    return model.eval()


def install_linears(model: nn.Module, linears: dict[str, QuantLinear]) -> None:
    """Put quantized linears in place of the named layers; a SwiGLU whose gate and up share a format
    (and NVFP4 global scale) becomes one gate/up GEMM plus the fused SiLU-multiply(-quantize) kernel."""
    for name, linear in linears.items():
        _set(model, name, linear)
    _fuse_mlps(model, linears)


def _fuse_mlps(model: nn.Module, linears: dict[str, QuantLinear]) -> None:
    for name, module in list(model.named_modules()):
        if not isinstance(module, SwiGLU):
            continue
        gate, up = (linears.get(f"{name}.{p}") for p in ("gate_proj", "up_proj"))
        down = module.down_proj if isinstance(module.down_proj, (QuantLinear, PreScaledLinear)) else None
        if gate is None or up is None or down is None or gate.fmt != up.fmt:
            continue
        if gate.fmt == "nvfp4" and not torch.equal(gate.weight_scale_2, up.weight_scale_2):
            continue
        _set(model, name, QuantSwiGLU(gate, up, down, name))
