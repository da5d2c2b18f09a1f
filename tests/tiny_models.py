"""Tiny random Qwen3.5 configs and checkpoints for the CPU tests (HF transformers is the reference)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

IMAGE_TOKEN, VISION_START, VISION_END = 5, 3, 4


def text_config(**over) -> dict:
    cfg = dict(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        max_position_embeddings=512, tie_word_embeddings=False,
    )
    cfg.update(over)
    return cfg


def vlm_config(text: dict | None = None, **vision_over) -> dict:
    text = text or text_config()
    vision = dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2, in_channels=3, patch_size=8,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                  num_position_embeddings=16, hidden_act="gelu_pytorch_tanh")
    vision.update(vision_over)
    return dict(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"], text_config=text,
                vision_config=vision, image_token_id=IMAGE_TOKEN, video_token_id=6,
                vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                tie_word_embeddings=text.get("tie_word_embeddings", False))


def hf_vlm(cfg: dict, seed: int = 0):
    """A randomly initialised HF Qwen3_5ForConditionalGeneration (fp32, eager attention)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**cfg)).eval()
    with torch.no_grad():  # HF zero-inits the zero-centred norms: randomise so they matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_hf(model, directory: Path, shards: int = 1) -> Path:
    """Save with HF's own writer (single file or sharded)."""
    directory.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        model.save_pretrained(directory)
    else:
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        model.save_pretrained(directory, max_shard_size=max(total // shards, 1024))
    return directory


def image_prompt(grid_hw: tuple[int, int], merge: int = 2, text_before=(7, 8), text_after=(9, 10, 11)):
    """Prompt ids with one image of grid (h, w) patches and random pixel values."""
    h, w = grid_hw
    n_tokens = h * w // merge**2
    ids = [*text_before, VISION_START] + [IMAGE_TOKEN] * n_tokens + [VISION_END, *text_after]
    return torch.tensor(ids), torch.tensor([[1, h, w]])


def pixels(grid_thw: torch.Tensor, vision: dict, generator: torch.Generator | None = None) -> torch.Tensor:
    n = int(grid_thw.prod(-1).sum())
    dim = vision["in_channels"] * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    return torch.randn(n, dim, generator=generator)


def drafter_config(target_text: dict, **dflash_over) -> dict:
    dflash = {"mask_token_id": 6, "target_layer_ids": [0, 2]}
    dflash.update(dflash_over)
    return dict(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=target_text["hidden_size"],
                intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, vocab_size=target_text["vocab_size"], rms_norm_eps=1e-6, rope_theta=10000.0,
                max_position_embeddings=512, block_size=4, num_target_layers=target_text["num_hidden_layers"],
                dflash_config=dflash)


def write_drafter(directory: Path, cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Write a z-lab-format DFlash drafter directory with random weights; returns the tensors."""
    g = torch.Generator().manual_seed(seed)
    h, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter = cfg["intermediate_size"]
    n_feat = len(cfg["dflash_config"]["target_layer_ids"])

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    t = {"fc.weight": r(h, n_feat * h), "hidden_norm.weight": 1 + r(h, scale=0.1), "norm.weight": 1 + r(h, scale=0.1)}
    for i in range(n_layers):
        p = f"layers.{i}."
        t.update({
            p + "self_attn.q_proj.weight": r(heads * hd, h), p + "self_attn.k_proj.weight": r(kv * hd, h),
            p + "self_attn.v_proj.weight": r(kv * hd, h), p + "self_attn.o_proj.weight": r(h, heads * hd),
            p + "self_attn.q_norm.weight": 1 + r(hd, scale=0.1), p + "self_attn.k_norm.weight": 1 + r(hd, scale=0.1),
            p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
            p + "mlp.down_proj.weight": r(h, inter),
            p + "input_layernorm.weight": 1 + r(h, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + r(h, scale=0.1),
        })
        if cfg["dflash_config"].get("local_conv_kernel", 0):
            t[p + "local_conv.weight"] = r(h, 1, cfg["dflash_config"]["local_conv_kernel"], scale=0.5)
    if cfg["dflash_config"].get("selector_head"):
        t["selector_head.weight"] = r(1, h, scale=1.0)
        t["selector_head.bias"] = torch.tensor([0.3])
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(cfg))
    return t
