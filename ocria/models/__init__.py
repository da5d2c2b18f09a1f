"""OCRia models: Qwen3.5 VLM target (and text-only form) and the DFlash2 drafter."""

from ocria.models.cache import DrafterCache, TargetCache
from ocria.models.config import DrafterConfig, OCRiaConfig, TextConfig, VisionConfig
from ocria.models.drafter import DFlash2Drafter
from ocria.models.target import OCRiaForCausalLM, OCRiaForConditionalGeneration, mrope_positions

__all__ = [
    "DFlash2Drafter",
    "DrafterCache",
    "DrafterConfig",
    "OCRiaConfig",
    "OCRiaForCausalLM",
    "OCRiaForConditionalGeneration",
    "TargetCache",
    "TextConfig",
    "VisionConfig",
    "mrope_positions",
]
