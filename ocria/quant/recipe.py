"""Quantization recipes: ordered glob -> format rules over the target's module names, as YAML.

A recipe (``configs/quant/NAME.yaml`` or any YAML path)::

    name: mixed
    description: NVFP4 MLPs, FP8 attention and GDN projections
    algorithm: max                # calibration: max, awq_lite (activation-aware weight scales) or mse
                                  # (weight amax searched for least weight quantization error); the two
                                  # searches need CUDA with NVFP4 layers, on CPU such recipes fall back to max
    rules:                        # applied in order, later rules win
      - {match: "model.language_model.layers.*.mlp.*", format: nvfp4}
      - {match: "model.language_model.layers.*.self_attn.*", format: fp8}
    lm_head:                      # optional: the LM head in FP8 (absent: BF16)
      format: fp8
      scale: per_channel          # per_channel: one weight scale per vocabulary row, per-token activation
                                  # scales (ModelOpt FP8_PER_CHANNEL_PER_TOKEN); per_tensor: one weight scale and
                                  # a calibrated static activation scale (ModelOpt FP8)
    auto:                         # optional: mtq.auto_quantize chooses per layer among `formats`
      effective_bits: 6.5         # weight-bits budget over the searched layers
      formats: [nvfp4, fp8]
      score: kl_div               # sensitivity = KL(bf16 logits || quantized logits) on calibration data
      gpu_aware: true             # default: a layer's candidates are the formats its GEMM is not slower in than
                                  # in any format of more bits, by the build's format cost table (ocria.quant.costs)

Globs are ``fnmatch`` patterns (``*`` crosses dots) over module names such as
``model.language_model.layers.3.self_attn.q_proj``. Whatever the rules say, the vision encoder,
embeddings, LM head, GDN ``in_proj_a``/``in_proj_b``/``conv1d`` and norms stay BF16 (ModelOpt's own
default exclusions say the same); only the vision encoder can be opted in, with
``allow_vision_quant``, and the LM head with ``lm_head``. A rule with an unknown format, a glob that
matches no module, a quantizing rule that matches no quantizable layer, or one that reaches the
vision encoder without the flag is refused before any work starts.
"""

import fnmatch
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch
import yaml
from torch import nn

from ocria.errors import OcriaError
from ocria.models.quantized.formats import FORMAT_BITS, FORMATS, Format

ALGORITHMS = ("max", "awq_lite", "mse")
SCORES = ("kl_div",)
VISION = "model.visual.*"
# Always BF16, on top of the recipe's rules (matched against module names).
PROTECTED = ("*embed_tokens", "lm_head", "*.linear_attn.in_proj_a", "*.linear_attn.in_proj_b",
             "*.linear_attn.conv1d", "*norm")
HEAD = "lm_head"
RECIPE_DIR = Path(__file__).resolve().parents[2] / "configs" / "quant"
_SCHEMA_LAYERS, _SCHEMA_BLOCKS = 256, 128


class RecipeError(OcriaError):
    """A quantization recipe is malformed or asks for something not allowed."""


@dataclass(frozen=True)
class Rule:
    match: str  # fnmatch glob over module names
    format: Format


class HeadScale(str, Enum):
    """Weight scale granularity of a quantized LM head (ModelOpt's quantizer presets of the same name)."""

    PER_CHANNEL = "per_channel"  # FP8_PER_CHANNEL_PER_TOKEN: [vocab] weight scales, per-token activation scales
    PER_TENSOR = "per_tensor"  # FP8_DEFAULT: one weight scale, one calibrated static activation scale


@dataclass(frozen=True)
class HeadQuant:
    """The recipe's LM head format (``lm_head:`` in the YAML); FP8 is the only quantized head format."""

    format: str
    scale: HeadScale


@dataclass(frozen=True)
class AutoSearch:
    effective_bits: float
    formats: tuple[str, ...]
    score: str = "kl_div"
    gpu_aware: bool = True  # drop a layer's formats that its GEMM runs slower in (``ocria.quant.costs``)


@dataclass
class Recipe:
    name: str
    rules: list[Rule]
    algorithm: str = "max"
    auto: AutoSearch | None = None
    lm_head: HeadQuant | None = None
    description: str = ""
    allow_vision_quant: bool = False
    source: str = ""
    raw: dict = field(default_factory=dict)

    @property
    def quantizes(self) -> bool:
        return self.auto is not None or self.lm_head is not None or any(r.format != "bf16" for r in self.rules)

    def formats(self, modules: dict[str, nn.Module]) -> dict[str, str]:
        """Format of every quantizable linear under the rules (later rules win; protected -> bf16)."""
        out = {}
        for name in quantizable(modules, self.allow_vision_quant):
            fmt = "bf16"
            for rule in self.rules:
                if fnmatch.fnmatchcase(name, rule.match):
                    fmt = rule.format
            out[name] = fmt
        return out

    def check(self, modules: dict[str, nn.Module], where: str = "the target") -> None:
        """Refuse rules that match nothing, quantize nothing, or touch the vision encoder without the flag."""
        names = list(modules)
        targets = quantizable(modules, allow_vision=True)
        for rule in self.rules:
            hits = [n for n in names if fnmatch.fnmatchcase(n, rule.match)]
            if not hits:
                raise RecipeError(f"recipe {self.name!r}: rule {rule.match!r} matches no module of {where}")
            if rule.format == "bf16":
                continue
            linear_hits = [n for n in hits if n in targets]
            if not self.allow_vision_quant and any(fnmatch.fnmatchcase(n, VISION) for n in linear_hits):
                raise RecipeError(f"recipe {self.name!r}: rule {rule.match!r} quantizes the vision encoder "
                                  f"(model.visual.*); pass --allow-vision-quant to allow it")
            if not [n for n in linear_hits if not _protected(n)]:
                raise RecipeError(f"recipe {self.name!r}: rule {rule.match!r} ({rule.format}) matches only layers "
                                  "that stay BF16 (embeddings, LM head, GDN in_proj_a/in_proj_b/conv1d, norms)")


def _protected(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in PROTECTED)


def quantizable(modules: dict[str, nn.Module], allow_vision: bool) -> list[str]:
    """Names of the linear layers a recipe may quantize, in model order."""
    return [n for n, m in modules.items() if isinstance(m, nn.Linear) and not _protected(n)
            and (allow_vision or not fnmatch.fnmatchcase(n, VISION))]


def schema_modules() -> dict[str, nn.Module]:
    """Module names of any Qwen3.5 VLM target (both layer types at every index up to 256, vision
    blocks up to 128), to check a recipe before a model is loaded."""
    from ocria.models import OCRiaConfig, OCRiaForConditionalGeneration

    cfg = OCRiaConfig.from_dict({
        "model_type": "qwen3_5",
        "text_config": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
        "vision_config": {"depth": 1, "out_hidden_size": 4096},
    })
    with torch.device("meta"):
        model = OCRiaForConditionalGeneration(cfg)
    out: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        layer = re.match(r"(model\.language_model\.layers\.)\d+(\..*)?$", name)
        block = re.match(r"(model\.visual\.blocks\.)\d+(\..*)?$", name)
        if layer or block:
            prefix, rest = (layer or block).groups()
            for i in range(_SCHEMA_LAYERS if layer else _SCHEMA_BLOCKS):
                out[f"{prefix}{i}{rest or ''}"] = module
        elif name:
            out[name] = module
    return out


def _parse(raw: object, source: str, allow_vision_quant: bool) -> Recipe:
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping with 'name' and 'rules'")
    unknown = sorted(set(raw) - {"name", "description", "algorithm", "rules", "auto", "lm_head"})
    if unknown:
        raise RecipeError(f"{source}: unknown recipe keys {unknown}")
    name = str(raw.get("name") or Path(source).stem)
    rules = []
    for i, entry in enumerate(raw.get("rules") or []):
        if not isinstance(entry, dict) or set(entry) != {"match", "format"}:
            raise RecipeError(f"{source}: rule {i} must be {{match: GLOB, format: FORMAT}}, got {entry!r}")
        fmt = str(entry["format"]).lower()
        if fmt not in FORMATS:
            raise RecipeError(f"{source}: rule {i} ({entry['match']!r}) has unknown format {entry['format']!r}; "
                              f"choose one of {', '.join(FORMATS)}")
        rules.append(Rule(str(entry["match"]), Format(fmt)))
    algorithm = str(raw.get("algorithm", "max"))
    if algorithm not in ALGORITHMS:
        raise RecipeError(f"{source}: unknown calibration algorithm {algorithm!r}; "
                          f"choose one of {', '.join(ALGORITHMS)}")
    auto = None
    if raw.get("auto") is not None:
        a = raw["auto"]
        if not isinstance(a, dict) or "effective_bits" not in a:
            raise RecipeError(f"{source}: 'auto' needs effective_bits (and optionally formats, score)")
        formats = tuple(str(f).lower() for f in a.get("formats", (Format.NVFP4, Format.FP8)))
        bad = [f for f in formats if f not in FORMATS or f == Format.BF16]
        if bad or not formats:
            raise RecipeError(f"{source}: auto formats {list(a.get('formats', []))} "
                              "must be a non-empty list of fp8/nvfp4")
        bits = float(a["effective_bits"])
        if not min(FORMAT_BITS[f] for f in formats) <= bits <= 16.0:
            raise RecipeError(f"{source}: auto effective_bits {bits} is outside "
                              f"[{min(FORMAT_BITS[f] for f in formats)}, 16]")
        score = str(a.get("score", "kl_div"))
        if score not in SCORES:
            raise RecipeError(f"{source}: unknown auto score {score!r}; choose one of {', '.join(SCORES)}")
        unknown = sorted(set(a) - {"effective_bits", "formats", "score", "gpu_aware"})
        if unknown:
            raise RecipeError(f"{source}: unknown auto keys {unknown}")
        gpu_aware = a.get("gpu_aware", True)
        if not isinstance(gpu_aware, bool):
            raise RecipeError(f"{source}: auto gpu_aware must be true or false, got {gpu_aware!r}")
        auto = AutoSearch(bits, formats, score, gpu_aware)
    head = _parse_head(raw.get("lm_head"), source)
    return Recipe(name, rules, algorithm, auto, head, str(raw.get("description", "")), allow_vision_quant, source,
                  raw)


def _parse_head(raw: object, source: str) -> HeadQuant | None:
    """``lm_head: {format: fp8, scale: per_channel | per_tensor}``; absent (or ``lm_head: bf16``): a BF16 head."""
    if raw is None or raw == "bf16":
        return None
    if not isinstance(raw, dict) or set(raw) != {"format", "scale"}:
        raise RecipeError(f"{source}: lm_head must be {{format: fp8, scale: per_channel | per_tensor}}, got {raw!r}")
    fmt = str(raw["format"]).lower()
    if fmt != "fp8":
        raise RecipeError(f"{source}: lm_head format {raw['format']!r} is not supported; the LM head quantizes to fp8")
    try:
        scale = HeadScale(str(raw["scale"]).lower())
    except ValueError:
        raise RecipeError(f"{source}: lm_head scale {raw['scale']!r}; choose one of "
                          f"{', '.join(s.value for s in HeadScale)}") from None
    return HeadQuant(fmt, scale)


def load_recipe(recipe: str | Path, allow_vision_quant: bool = False) -> Recipe:
    """A shipped recipe by name (``configs/quant/NAME.yaml``) or a YAML path, checked against the
    module names of the Qwen3.5 target architecture. Raises ``RecipeError`` (an ``OcriaError``)."""
    path = Path(recipe)
    if path.suffix not in (".yaml", ".yml"):
        path = RECIPE_DIR / f"{recipe}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
        raise RecipeError(f"unknown quantization recipe {str(recipe)!r} (known: {', '.join(known)}; "
                          f"or give a YAML path)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    parsed = _parse(raw, str(path), allow_vision_quant)
    parsed.check(schema_modules(), where="a Qwen3.5 target")
    return parsed
