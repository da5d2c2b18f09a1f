"""Export a ModelOpt-quantized target as a ModelOpt unified HF checkpoint with ModelOpt's own exporter.

``export_hf_checkpoint`` expects a transformers model: a ``config`` object, ``device`` and
``save_pretrained(dir, state_dict=...)``, and a forward taking token ids (its probe for layers
sharing an input, whose FP8 input scales / NVFP4 global scales it unifies). ``ExportView`` gives it
exactly that around our module, sharing the same submodules so every name stays
``model.visual.*`` / ``model.language_model.*`` / ``lm_head``. What ModelOpt writes is what a
deployment runtime reads: FP8 ``weight`` float8_e4m3fn + ``weight_scale`` + ``input_scale``, NVFP4
``weight`` uint8 + ``weight_scale`` float8_e4m3fn + ``weight_scale_2`` + ``input_scale``, and
``hf_quant_config.json`` with ``quant_algo`` (``MIXED_PRECISION`` + ``quantized_layers`` when formats
differ). Unquantized floating-point tensors are stored in BF16; the tied LM head is stored once.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import AutoConfig

from ocria.models import OCRiaForConditionalGeneration
from ocria.models.layers import ZeroCenteredRMSNorm

SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale")


def storage_tensors(state_dict: dict[str, Tensor], tied_head: bool) -> dict[str, Tensor]:
    """BF16 for plain floating-point tensors, quantized tensors and fp32 scales as they are."""
    out = {}
    for name, t in state_dict.items():
        if tied_head and name == "lm_head.weight":
            continue
        if t.dtype == torch.float32 and not name.endswith(SCALE_SUFFIXES):
            t = t.to(torch.bfloat16)
        out[name] = t.detach().contiguous().cpu()
    return out


class ExportView(nn.Module):
    """The transformers-model face ModelOpt's exporter needs, over our target's own submodules."""

    def __init__(self, target: OCRiaForConditionalGeneration):
        super().__init__()
        self.model = target.model
        self.lm_head = target.lm_head
        hf = target.config.to_hf()
        self.config = AutoConfig.for_model(hf.pop("model_type"), **hf)
        object.__setattr__(self, "_target", target)  # not a submodule: names stay model.* / lm_head
        # Qwen3.5 norms are x * (1 + w); tell ModelOpt so any scale it folds into them stays exact.
        for module in target.modules():
            if isinstance(module, ZeroCenteredRMSNorm):
                module.zero_centered_gamma = True

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def forward(self, input_ids: Tensor, **_) -> Tensor:
        return self._target(input_ids)

    def save_pretrained(self, directory: str | Path, state_dict: dict[str, Tensor], **_) -> None:
        directory = Path(directory)
        tensors = storage_tensors(state_dict, self._target.text_config.tie_word_embeddings)
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(self._target.config.to_hf(), indent=2) + "\n")


@torch.no_grad()
def export_target(target: OCRiaForConditionalGeneration, directory: Path) -> Path:
    """Write ``directory`` (config.json with ``quantization_config``, model.safetensors and, when
    anything is quantized, hf_quant_config.json) from a model quantized by ``mtq.quantize`` /
    ``mtq.auto_quantize``."""
    from modelopt.torch.export import export_hf_checkpoint

    directory.mkdir(parents=True, exist_ok=True)
    # Quantize from the weights' own dtype: exporting an fp32 model "as bf16" would divide by the
    # scale in bf16 and round twice (bf16, then E4M3), unlike ModelOpt's fake quantization.
    dtype = next(p.dtype for p in target.parameters() if p.is_floating_point())
    export_hf_checkpoint(ExportView(target), dtype=dtype, export_dir=directory)
    return directory
