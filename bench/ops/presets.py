"""The two presets' model sizes the registry takes its shapes from (``configs/presets/*.yaml``)."""

from functools import cache

from ocria.builder.presets import load_preset

# Shape-name prefix -> preset.
PRESETS = {"mini": "ocria-mini", "sim": "ocria-1-sim"}


@cache
def text_config(label: str) -> dict:
    """The target's ``text_config`` of preset ``PRESETS[label]``."""
    return load_preset(PRESETS[label]).target["text_config"]


@cache
def drafter_config(label: str) -> dict:
    """The DFlash drafter's config of preset ``PRESETS[label]``."""
    return load_preset(PRESETS[label]).drafter


def linear_shapes(label: str) -> dict[str, tuple[int, int]]:
    """(N, K) of the linears of one decode step of the preset's target, by layer name (fused as the model fuses)."""
    t = text_config(label)
    h = t["hidden_size"]
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv = t["linear_key_head_dim"], t["linear_value_head_dim"]
    qo, kv = t["num_attention_heads"] * t["head_dim"], t["num_key_value_heads"] * t["head_dim"]
    return {"gdn_in_proj": (2 * hk * dk + 2 * hv * dv + 2 * hv, h),  # qkv, z, b, a fused
            "attn_qkv": (2 * qo + 2 * kv, h),  # q with its output gate, k, v fused
            "gdn_out_proj": (h, hv * dv), "attn_o_proj": (h, qo),
            "mlp_gate_up": (2 * t["intermediate_size"], h), "mlp_down": (h, t["intermediate_size"]),
            "lm_head": (t["vocab_size"], h)}
