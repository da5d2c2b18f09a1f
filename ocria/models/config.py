"""Typed configs read from HF ``config.json`` files: Qwen3.5 VLM / text-only target and DFlash drafter.

Only the fields the architecture needs are kept; unknown keys are ignored (HF configs carry many),
but an unknown ``model_type`` or inconsistent shapes are refused with one line naming the problem.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ocria.errors import ConfigError

LINEAR, FULL = "linear_attention", "full_attention"


def _rope(d: dict, default_theta: float) -> dict:
    """Merge HF's ``rope_parameters`` (new) and ``rope_scaling``/``rope_theta`` (legacy) spellings."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    rope.setdefault("rope_theta", d.get("rope_theta", default_theta))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "axial", "mrope"):
        raise ConfigError(f"unsupported rope_type {rope_type!r} (only default/mrope rotary is implemented)")
    return rope


@dataclass
class TextConfig:
    vocab_size: int = 248320
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    layer_types: list[str] = field(default_factory=list)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    mrope_section: list[int] = field(default_factory=lambda: [11, 11, 10])
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    hidden_act: str = "silu"
    eos_token_id: int | list[int] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], tie_default: bool = False) -> "TextConfig":
        rope = _rope(d, 10000.0)
        n = int(d.get("num_hidden_layers", cls.num_hidden_layers))
        layer_types = d.get("layer_types")
        if layer_types is None:
            interval = int(d.get("full_attention_interval", 4))
            layer_types = [LINEAR if (i + 1) % interval else FULL for i in range(n)]
        num_heads = int(d.get("num_attention_heads", cls.num_attention_heads))
        hidden = int(d.get("hidden_size", cls.hidden_size))
        cfg = cls(
            vocab_size=int(d.get("vocab_size", cls.vocab_size)),
            hidden_size=hidden,
            intermediate_size=int(d.get("intermediate_size", cls.intermediate_size)),
            num_hidden_layers=n,
            num_attention_heads=num_heads,
            num_key_value_heads=int(d.get("num_key_value_heads", cls.num_key_value_heads)),
            head_dim=int(d.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(d.get("rms_norm_eps", cls.rms_norm_eps)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", tie_default)),
            layer_types=list(layer_types),
            linear_conv_kernel_dim=int(d.get("linear_conv_kernel_dim", cls.linear_conv_kernel_dim)),
            linear_key_head_dim=int(d.get("linear_key_head_dim", cls.linear_key_head_dim)),
            linear_value_head_dim=int(d.get("linear_value_head_dim", cls.linear_value_head_dim)),
            linear_num_key_heads=int(d.get("linear_num_key_heads", cls.linear_num_key_heads)),
            linear_num_value_heads=int(d.get("linear_num_value_heads", cls.linear_num_value_heads)),
            rope_theta=float(rope["rope_theta"]),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))),
            mrope_section=list(rope.get("mrope_section", [11, 11, 10])),
            max_position_embeddings=int(d.get("max_position_embeddings", cls.max_position_embeddings)),
            attention_bias=bool(d.get("attention_bias", False)),
            hidden_act=str(d.get("hidden_act", "silu")),
            eos_token_id=d.get("eos_token_id"),
        )
        cfg.validate()
        return cfg

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def validate(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}"
            )
        bad = sorted(set(self.layer_types) - {LINEAR, FULL})
        if bad:
            raise ConfigError(f"unknown layer_types {bad}: expected {LINEAR!r} or {FULL!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        if self.rotary_dim % 2 or sum(self.mrope_section) != self.rotary_dim // 2:
            raise ConfigError(
                f"mrope_section {self.mrope_section} must sum to rotary_dim/2 = {self.rotary_dim // 2} "
                f"(head_dim {self.head_dim} x partial_rotary_factor {self.partial_rotary_factor})"
            )
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (Qwen3.5 uses 'silu')")

    def to_hf(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("rope_theta", "partial_rotary_factor", "mrope_section"):
            d.pop(key)
        d["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
            "mrope_section": self.mrope_section,
            "mrope_interleaved": True,
        }
        d["model_type"] = "qwen3_5_text"
        return d


@dataclass
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VisionConfig":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "rope_theta"}
        cfg = cls(**known, rope_theta=float(_rope(d, 10000.0)["rope_theta"]))
        if cfg.hidden_size % cfg.num_heads:
            raise ConfigError(f"vision hidden_size={cfg.hidden_size} is not a multiple of num_heads={cfg.num_heads}")
        side = int(cfg.num_position_embeddings**0.5)
        if side * side != cfg.num_position_embeddings:
            raise ConfigError(f"vision num_position_embeddings={cfg.num_position_embeddings} is not a square")
        if cfg.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
            raise ConfigError(f"vision hidden_act {cfg.hidden_act!r} is not supported")
        return cfg

    def to_hf(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("rope_theta")
        d["model_type"] = "qwen3_5_vision"
        return d


@dataclass
class OCRiaConfig:
    """Top-level ``qwen3_5`` VLM config (``Qwen3_5ForConditionalGeneration``)."""

    text: TextConfig
    vision: VisionConfig
    image_token_id: int = 248056
    video_token_id: int = 248057
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OCRiaConfig":
        model_type = d.get("model_type")
        if model_type != "qwen3_5":
            raise ConfigError(f"model_type {model_type!r} is not supported: expected 'qwen3_5'")
        for key in ("text_config", "vision_config"):
            if not isinstance(d.get(key), dict):
                raise ConfigError(f"qwen3_5 config has no {key} object")
        text = TextConfig.from_dict(d["text_config"], tie_default=bool(d.get("tie_word_embeddings", False)))
        if "tie_word_embeddings" in d:
            text.tie_word_embeddings = bool(d["tie_word_embeddings"])
        vision = VisionConfig.from_dict(d["vision_config"])
        if vision.out_hidden_size != text.hidden_size:
            raise ConfigError(
                f"vision out_hidden_size={vision.out_hidden_size} must equal text hidden_size={text.hidden_size}"
            )
        cfg = cls(text=text, vision=vision)
        for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
            if key in d:
                setattr(cfg, key, int(d[key]))
        if not 0 <= cfg.image_token_id < text.vocab_size:
            raise ConfigError(f"image_token_id={cfg.image_token_id} is outside the vocabulary ({text.vocab_size})")
        return cfg

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": self.text.to_hf(),
            "vision_config": self.vision.to_hf(),
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.text.tie_word_embeddings,
        }


@dataclass
class DrafterConfig:
    """DFlash ``DFlashDraftModel`` config (Qwen3-style layers) plus the DFlash2 extensions.

    DFlash2 fields live in ``dflash_config`` and are off by default: ``local_conv_kernel`` (0 = off)
    and ``selector_head`` (False = off) with its ``selector_threshold``; ``draft_vocab_size`` (0 = the
    whole vocabulary) drafts from the first ids only (a BPE vocabulary's most frequent tokens).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    local_conv_kernel: int = 0
    selector_head: bool = False
    selector_threshold: float = 0.5
    draft_vocab_size: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DrafterConfig":
        archs = d.get("architectures") or []
        if "DFlashDraftModel" not in archs and "DFlash2DraftModel" not in archs:
            raise ConfigError(f"drafter architectures {archs} do not name DFlashDraftModel")
        dflash = d.get("dflash_config") or {}
        for key in ("mask_token_id", "target_layer_ids"):
            if key not in dflash and key not in d:
                raise ConfigError(f"drafter config has no dflash_config.{key}")
        hidden = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim") or hidden // heads),
            vocab_size=int(d.get("vocab_size", 0)),
            block_size=int(dflash.get("block_size", d.get("block_size", 16))),
            mask_token_id=int(dflash.get("mask_token_id", d.get("mask_token_id"))),
            target_layer_ids=[int(i) for i in dflash.get("target_layer_ids", d.get("target_layer_ids"))],
            num_target_layers=int(d.get("num_target_layers", 0)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope(d, 1000000.0)["rope_theta"]),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            attention_bias=bool(d.get("attention_bias", False)),
            local_conv_kernel=int(dflash.get("local_conv_kernel", 0)),
            selector_head=bool(dflash.get("selector_head", False)),
            selector_threshold=float(dflash.get("selector_threshold", 0.5)),
            draft_vocab_size=int(dflash.get("draft_vocab_size", 0)),
        )
        if cfg.block_size < 2:
            raise ConfigError(f"drafter block_size={cfg.block_size} must be at least 2")
        if not cfg.target_layer_ids:
            raise ConfigError("drafter dflash_config.target_layer_ids is empty")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError("drafter num_attention_heads is not a multiple of num_key_value_heads")
        cfg.check_draft_vocab(cfg.draft_vocab_size)
        return cfg

    def check_draft_vocab(self, size: int, vocab: int = 0) -> None:
        """A ``draft_vocab_size`` must leave real tokens to draft and fit the vocabulary (``vocab``, or the
        config's own ``vocab_size``; unchecked when both are 0). 0 drafts from the whole vocabulary."""
        vocab = vocab or self.vocab_size
        if size < 0 or (vocab and size > vocab):
            raise ConfigError(f"drafter dflash_config.draft_vocab_size={size} must be in "
                              f"0..vocab_size ({vocab}); 0 drafts from the whole vocabulary")
        if 0 < size <= self.mask_token_id:
            raise ConfigError(f"drafter dflash_config.draft_vocab_size={size} leaves only special "
                              f"tokens (mask_token_id={self.mask_token_id}) to draft")

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": self.target_layer_ids,
                "local_conv_kernel": self.local_conv_kernel,
                "selector_head": self.selector_head,
                "selector_threshold": self.selector_threshold,
                **({"draft_vocab_size": self.draft_vocab_size} if self.draft_vocab_size else {}),
            },
        }


def read_config_json(path: Path) -> dict[str, Any]:
    """Read a config.json with a one-line error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
