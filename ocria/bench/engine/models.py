"""What a run benchmarks: an engine's models or a preset's random ones (optionally quantized), and the prompt."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ocria.bench.engine.config import BenchConfig
from ocria.errors import OcriaError

if TYPE_CHECKING:
    import torch

    from ocria.models import DFlash2Drafter, OCRiaForConditionalGeneration
    from ocria.plugins.policy import ExecutionPolicy
    from ocria.runtime.processor import PreparedPrompt, Processor

PAGE_SEED = 7  # the default document: this seed's long synthetic page


@dataclass
class Models:
    """What a run benchmarks: target and drafter on one device, and the processor that makes the prompt."""

    target: OCRiaForConditionalGeneration
    drafter: DFlash2Drafter | None
    processor: Processor
    dtype: torch.dtype
    device: torch.device
    quantized_layers: dict[str, int]  # format -> layers (empty: unquantized)
    fused: bool
    max_pixels: int | None  # the processor's image limit
    recipe: str | None  # the quantization recipe (an engine's from its manifest)
    policy: ExecutionPolicy  # how every forward of the run executes its plugin ops

    @property
    def block(self) -> int:
        return self.drafter.config.block_size if self.drafter is not None else 1


def load_models(cfg: BenchConfig, dtype: torch.dtype, plain: bool = False) -> Models:
    """The engine's models (``--engine``) or the preset's random ones; ``plain``: a preset's without the recipe
    and the projection fusion (the fp32 check's reference)."""
    models = _engine_models(cfg, dtype) if cfg.engine is not None else _preset_models(cfg, dtype, plain)
    if models.drafter is not None:
        set_draft_vocab(models.drafter, cfg.draft_vocab)
    return models


def _engine_models(cfg: BenchConfig, dtype: torch.dtype) -> Models:
    from ocria.runtime import load_engine

    engine = load_engine(cfg.engine, device=cfg.device, dtype=dtype, policy=cfg.policy, use_graphs=False)
    quant = _quantized_layers(engine.target)
    return Models(engine.target, engine.drafter, engine.processor, engine.dtype, engine.device, quant, True,
                  engine.processor.max_pixels, engine.manifest.get("recipe"), cfg.policy)


def _preset_models(cfg: BenchConfig, dtype: torch.dtype, plain: bool) -> Models:
    import torch

    from ocria.builder.presets import load_preset, random_models
    from ocria.runtime.processor import Processor

    preset = load_preset(cfg.preset)
    recipe = None
    if cfg.recipe is not None and not plain:
        from ocria.quant.recipe import load_recipe

        recipe = load_recipe(cfg.recipe)  # a bad recipe fails before the weights are made
        if recipe.auto is not None:
            raise OcriaError(f"--recipe {cfg.recipe}: it searches formats with calibration data; "
                             "benchmark a built engine of it (--engine) or name a fixed-rule recipe")
    target, drafter = random_models(preset, cfg.device, dtype)
    formats = {}
    if recipe is not None:
        from ocria.quant.direct import quantize_in_place

        formats = quantize_in_place(target, recipe)
        drafter.bind(target.text.embed_tokens, target.lm_head)  # the recipe's FP8 head, if any, replaced the bound one
    fuse = cfg.fuse and not plain
    if fuse:
        target.text.fuse_projections()
        drafter.fuse_projections()
    quant = {f: list(formats.values()).count(f) for f in sorted(set(formats.values()))}
    processor = Processor(preset.assets)
    return Models(target, drafter, processor, dtype, torch.device(cfg.device), quant, fuse, processor.max_pixels,
                  cfg.recipe or "bf16", cfg.policy)


def _quantized_layers(target) -> dict[str, int]:
    from ocria.models.quantized.linear import QuantLinear

    formats = [m.fmt for m in target.modules() if isinstance(m, QuantLinear)]
    return {f: formats.count(f) for f in sorted(set(formats))}


def set_draft_vocab(drafter, size: int | None) -> None:
    """``--draft-vocab N`` overrides the drafter's ``draft_vocab_size`` (0: the whole vocabulary), for A/B runs."""
    from ocria.errors import ConfigError

    if size is None:
        return
    try:
        drafter.config.check_draft_vocab(size, drafter.lm_head.weight.shape[0])
    except ConfigError as e:
        raise OcriaError(f"--draft-vocab {size}: {e}") from None
    drafter.config.draft_vocab_size = size


def check_modes(cfg: BenchConfig, models: Models) -> None:
    """Modes the loaded models can run: spec-family modes (and ``--profile``) need a drafter, ``tau=X`` at most
    its block size."""
    if (cfg.spec_modes or cfg.profile) and models.drafter is None:
        raise OcriaError("this engine has no drafter: modes other than ar and --profile need one (--modes ar)")
    for m in cfg.modes:
        if m.tau is not None and m.tau > models.block:
            raise OcriaError(f"--modes {m.name}: the drafter's block is {models.block} tokens, so X can be at most "
                             f"{models.block}")


def default_page(max_pixels: int | None):
    """The package's long synthetic page, shrunk (aspect kept) when it is over ``max_pixels``."""
    from PIL import Image

    from ocria.data import LONG_PAGE, generate

    page = generate(PAGE_SEED, kind="page", config=LONG_PAGE).image
    w, h = page.size
    if max_pixels and w * h > max_pixels:
        scale = math.sqrt(max_pixels / (w * h))
        page = page.resize((max(1, int(w * scale)), max(1, int(h * scale))), Image.Resampling.LANCZOS)
    return page


def document(cfg: BenchConfig, models: Models) -> bytes:
    """The document every row prefills, encoded: ``--image``, or the default page as PNG."""
    if cfg.image is not None:
        return cfg.image.read_bytes()
    buf = io.BytesIO()
    default_page(models.max_pixels).save(buf, format="PNG")
    return buf.getvalue()


def prepare_prompt(cfg: BenchConfig, models: Models) -> PreparedPrompt:
    """The document prompt every row prefills."""
    return models.processor.prepare(document(cfg, models))

