"""Qwen3.5 text decoder (``layer_types`` mix of GDN and gated attention) with explicit slot state."""

import torch
from torch import Tensor, nn

from ocria.models.attention import PROJECTIONS as ATTENTION_PROJECTIONS
from ocria.models.attention import GatedAttention, cache_position
from ocria.models.cache import TargetCache
from ocria.models.config import LINEAR, TextConfig
from ocria.models.gdn import PROJECTIONS as GDN_PROJECTIONS
from ocria.models.gdn import GatedDeltaNet
from ocria.models.layers import (
    GATE_UP,
    SwiGLU,
    ZeroCenteredRMSNorm,
    fuse_linears,
    inverse_frequencies,
    mrope_cos_sin,
    norm_mlp,
    norm_project,
)
from ocria.plugins.policy import AUTO, ExecutionPolicy


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, layer_type: str, cache_index: int):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == LINEAR:
            self.linear_attn = GatedDeltaNet(cfg, cache_index)
        else:
            self.self_attn = GatedAttention(cfg, cache_index)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor, mode: str,
                cache: TargetCache | None, slots: Tensor | None, attn_len: int | None,
                position: tuple[Tensor, Tensor, Tensor] | None, policy: ExecutionPolicy) -> tuple[Tensor, Tensor]:
        """The layer's input is ``x + delta`` (delta None: x); returns its output as ``(x', delta')``, the
        MLP's residual add left to the next norm, which fuses it (one launch per add + norm; in decode and
        verify steps the add + norm is folded into the next input projection)."""
        if self.layer_type == LINEAR:
            x, proj = norm_project(self.input_layernorm, x, delta, self.linear_attn, GDN_PROJECTIONS, policy)
            h = self.linear_attn(proj, mode, cache, slots, policy)
        else:
            x, proj = norm_project(self.input_layernorm, x, delta, self.self_attn, ATTENTION_PROJECTIONS, policy)
            h = self.self_attn(proj, cos, sin, cache, slots, attn_len, position, policy)
        return norm_mlp(self.post_attention_layernorm, h, x, self.mlp, policy)


class TextModel(nn.Module):
    """Embeddings, decoder layers and final norm; parameter names as HF ``Qwen3_5TextModel``.

    ``forward`` modes: ``full`` (no cache), ``prefill`` (append T tokens to each slot and commit
    them), ``verify`` (append T tokens provisionally; the caller commits a prefix with
    ``TargetCache.commit``). ``capture`` lists layer indices whose outputs are returned too
    (HF ``hidden_states[i + 1]``: the drafter's context features).
    """

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        counters = {"linear_attention": 0, "full_attention": 0}
        layers = []
        for layer_type in cfg.layer_types:
            layers.append(DecoderLayer(cfg, layer_type, counters[layer_type]))
            counters[layer_type] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def fuse_projections(self) -> None:
        """Inference: run the projections that share an input as one GEMM (fewer launches per step)."""
        for layer in self.layers:
            mixer = layer.linear_attn if layer.layer_type == LINEAR else layer.self_attn
            fuse_linears(mixer, GDN_PROJECTIONS if layer.layer_type == LINEAR else ATTENTION_PROJECTIONS)
            fuse_linears(layer.mlp, GATE_UP)

    def rotary(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [3, B, T] -> cos, sin [B, T, rotary_dim]."""
        inv_freq = inverse_frequencies(self.cfg.rotary_dim, self.cfg.rope_theta, str(positions.device))
        return mrope_cos_sin(positions, inv_freq, self.cfg.mrope_section, dtype)

    def forward(self, embeds: Tensor, positions: Tensor, mode: str = "full", cache: TargetCache | None = None,
                slots: Tensor | None = None, capture: tuple[int, ...] = (), attn_len: int | None = None,
                policy: ExecutionPolicy = AUTO):
        """Run the decoder layers.

        Args:
            embeds: [B, T, H] input embeddings.
            positions: [3, B, T] long mRoPE ids.
            mode: ``full`` (no cache), ``prefill`` or ``verify`` (see the class docstring).
            cache: the target cache (``prefill`` / ``verify``).
            slots: [B] long, each row's cache slot (with ``cache``).
            capture: layer indices whose outputs are returned too.
            attn_len: keys attention reads per row at most (None: the cache's length).
            policy: the execution policy of every plugin op.

        Returns:
            (normed hidden [B, T, H], [captured [B, T, H] per ``capture`` index, pre-norm]).
        """
        if mode not in ("full", "prefill", "verify"):
            raise ValueError(f"unknown forward mode {mode!r}")
        cos, sin = self.rotary(positions, embeds.dtype)
        position = cache_position(cache, slots, embeds.shape[1]) if cache is not None else None
        x, delta, captured = embeds, None, {}
        for i, layer in enumerate(self.layers):
            x, delta = layer(x, delta, cos, sin, mode, cache, slots, attn_len, position, policy)
            if i in capture:
                captured[i] = x + delta
        return self.norm.add(delta, x, policy)[1], [captured[i] for i in capture]
