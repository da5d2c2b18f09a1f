"""DFlash2 block-diffusion drafter: loads z-lab DFlash checkpoints; DFlash2 extensions are optional.

Tensors of one drafting call (batch B, block size Bs, drafter hidden H, n = len(target_layer_ids)):

- context features ``feats`` [B, C, n*H_t]: the target's outputs of layers ``target_layer_ids``
  (HF ``hidden_states[i + 1]``) for the C newly committed tokens of each row (rows may commit
  fewer: ``counts`` [B]); ``ctx = hidden_norm(fc(feats))`` [B, C, H]. Every layer projects ctx with
  its own ``k_proj``/``v_proj`` (+ ``k_norm``, RoPE at the tokens' sequence indices) and appends the
  result to its context cache (KV injection). Context hidden states never run through the layers.
- block ``[last committed token, MASK x (Bs-1)]`` embedded with the *target's* embeddings,
  at sequence indices ``ctx_len .. ctx_len + Bs - 1``. Queries come from the block; keys/values are
  the cached context followed by the block's own (bidirectional inside the block, no mask).
- DFlash2 (a), ``local_conv_kernel`` = Kc > 0: each layer starts with
  ``h = h + conv(h)``, a depthwise causal conv over the Bs block positions, weight
  ``layers.i.local_conv.weight`` [H, 1, Kc] (zero left padding: position 0 sees only itself).
- output ``out = norm(h)`` [B, Bs, H]; drafted logits ``target.lm_head(out[:, 1:])`` [B, Bs-1, V]:
  mask slot j predicts the token at block position j. With ``draft_vocab_size`` = Vd > 0 only the
  head's first Vd rows run (logits [B, Bs-1, Vd], ids < Vd): at a 248k vocabulary the full head
  rereads 1 GB per step, as much as the target's own head. Verification treats the drafts as any
  others, so output stays lossless; only ids >= Vd can no longer be drafted.
- DFlash2 (b), ``selector_head``: ``conf = sigmoid(selector_head(out[:, 1:]))`` [B, Bs-1]; the
  number of drafts sent for verification is the length of the leading run with
  ``conf >= selector_threshold`` (acceptance is capped there; it never changes which tokens win).
"""

from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ocria.errors import ConfigError
from ocria.models.attention import cache_index
from ocria.models.cache import DrafterCache
from ocria.models.checkpoint import load_module
from ocria.models.config import DrafterConfig, read_config_json
from ocria.models.layers import (
    GATE_UP,
    PolicyLinear,
    RMSNorm,
    SwiGLU,
    dense,
    fuse_linears,
    inverse_frequencies,
    project,
    rope_cos_sin,
)
from ocria.plugins.decode_attention import decode_attention
from ocria.plugins.kv_write import kv_write
from ocria.plugins.policy import AUTO, ExecutionPolicy


@lru_cache(maxsize=16)
def rope_table(head_dim: int, theta: float, length: int, dtype: torch.dtype, device: str) -> Tensor:
    """cos, sin [2, length, head_dim] of positions 0 .. length-1, made once per cache length by the same
    elementwise ops as ``rope_cos_sin``: gathering its rows gives that function's values in one launch
    (instead of seven per call), and a captured CUDA graph only reads it."""
    positions = torch.arange(length, device=device)
    return torch.stack(rope_cos_sin(positions, inverse_frequencies(head_dim, theta, device), dtype))


def _float_weight(module: nn.Module) -> bool:
    """Whether ``module`` has a floating-point ``weight`` the drafter can slice rows of."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and weight.is_floating_point()


class DrafterAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor, policy: ExecutionPolicy) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated) and values [B, T, kv heads, D] of x: one GEMM when fused."""
        return self.kv_heads(*project(self, x, ("k_proj", "v_proj"), policy), cos, sin, policy)

    def kv_heads(self, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor,
                 policy: ExecutionPolicy) -> tuple[Tensor, Tensor]:
        B, T, _ = k.shape
        k = self.k_norm.rope(k.view(B, T, self.num_kv_heads, self.head_dim), cos, sin, policy)
        return k, v.view(B, T, self.num_kv_heads, -1)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = DrafterAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if cfg.local_conv_kernel > 0:
            self.local_conv = nn.Conv1d(cfg.hidden_size, cfg.hidden_size, cfg.local_conv_kernel,
                                        groups=cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, delta: Tensor | None, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                slots: Tensor, ctx_len: Tensor, index: tuple[Tensor, Tensor], attn_len: int, policy: ExecutionPolicy
                ) -> tuple[Tensor, Tensor]:
        """The layer's input is ``x + delta`` (delta None: x); returns its output as ``(x', delta')``, the MLP's
        residual add left to the next norm, which fuses it (as the target's decoder layers)."""
        if hasattr(self, "local_conv"):  # x + conv(x): the conv's residual add is fused into the input norm
            if delta is not None:
                x = x + delta
            kc = self.local_conv.kernel_size[0]
            x, delta = F.conv1d(F.pad(x.transpose(1, 2), (kc - 1, 0)), self.local_conv.weight,
                                groups=x.shape[-1]).transpose(1, 2), x
        x, h = self.input_layernorm.add(x, delta, policy)
        attn = self.self_attn
        B, T, _ = x.shape
        q, k, v = project(attn, h, ("q_proj", "k_proj", "v_proj"), policy)  # one GEMM when fused
        q = attn.q_norm.rope(q.view(B, T, attn.num_heads, attn.head_dim), cos, sin, policy)
        k, v = attn.kv_heads(k, v, cos, sin, policy)
        kv_write(k_cache, v_cache, k, v, *index, policy=policy)
        o = decode_attention(q.transpose(1, 2), k_cache, v_cache, slots, ctx_len, attn_len,
                             attn.head_dim**-0.5, causal_block=False, policy=policy)
        x, h = self.post_attention_layernorm.add(dense(attn.o_proj, o.transpose(1, 2).reshape(B, T, -1), policy),
                                                 x, policy)
        return x, self.mlp(h, policy)


class DFlash2Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if cfg.selector_head:
            self.selector_head = nn.Linear(cfg.hidden_size, 1, bias=True)
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: nn.Linear | None = None

    def bind(self, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> "DFlash2Drafter":
        """Share the target's embeddings and LM head (the drafter has none of its own)."""
        if embed_tokens.weight.shape[1] != self.config.hidden_size:
            raise ConfigError(
                f"drafter hidden_size={self.config.hidden_size} differs from the target's "
                f"{embed_tokens.weight.shape[1]}")
        if self.config.draft_vocab_size and not (hasattr(lm_head, "rows") or _float_weight(lm_head)):
            raise ConfigError(f"drafter draft_vocab_size={self.config.draft_vocab_size} needs the target's LM head "
                              f"as a plain linear or a quantized one with row views, got {type(lm_head).__name__}")
        object.__setattr__(self, "embed_tokens", embed_tokens)
        object.__setattr__(self, "lm_head", lm_head)
        return self

    def fuse_projections(self) -> None:
        """Inference: each layer's q/k/v (k/v alone for context tokens) and gate/up projections as one GEMM."""
        for layer in self.layers:
            fuse_linears(layer.self_attn, ("q_proj", "k_proj", "v_proj"))
            fuse_linears(layer.mlp, GATE_UP)

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        inv_freq = inverse_frequencies(self.config.head_dim, self.config.rope_theta, str(positions.device))
        return rope_cos_sin(positions, inv_freq, dtype)

    def _cached_rope(self, positions: Tensor, dtype: torch.dtype, cache: DrafterCache) -> tuple[Tensor, Tensor]:
        """``_rope`` for positions inside the cache, gathered from ``rope_table``."""
        cs = rope_table(self.config.head_dim, self.config.rope_theta, cache.k[0].shape[2], dtype,
                        str(positions.device))[:, positions]
        return cs[0], cs[1]

    def append_context(self, feats: Tensor, counts: Tensor, cache: DrafterCache, slots: Tensor,
                       policy: ExecutionPolicy = AUTO) -> None:
        """KV-inject the first ``counts[b]`` of each row's features after its slot's context.

        Args:
            feats: [B, C, n*H] the target's captured hidden states (n = ``len(target_layer_ids)``) of C tokens.
            counts: [B] long, how many of the C tokens each row keeps (the rest are written past ``ctx_len`` and
                overwritten later).
            cache: the drafter's context cache; ``ctx_len[slots]`` grows by ``counts``.
            slots: [B] long cache slots.
            policy: the execution policy of the plugin ops.
        """
        ctx = self.hidden_norm(self.fc(feats), policy)
        rows, pos = cache_index(slots, cache.ctx_len[slots], feats.shape[1])
        cos, sin = self._cached_rope(pos, ctx.dtype, cache)
        for layer, k_cache, v_cache in zip(self.layers, cache.k, cache.v):
            kv_write(k_cache, v_cache, *layer.self_attn.kv(ctx, cos, sin, policy), rows, pos, policy=policy)
        cache.ctx_len[slots] += counts.to(torch.int32)

    def draft(self, last_tokens: Tensor, cache: DrafterCache, slots: Tensor,
              attn_len: int | None = None, policy: ExecutionPolicy = AUTO) -> tuple[Tensor, Tensor | None]:
        """Draft Bs-1 tokens after each row's last token.

        The block's K/V are written past the context and dropped (``ctx_len`` does not move).

        Args:
            last_tokens: [B] long, each row's newest committed token (the block's anchor).
            cache: the drafter's context cache.
            slots: [B] long cache slots.
            attn_len: keys attention reads per row at most (None: the cache's length).
            policy: the execution policy of the plugin ops.

        Returns:
            (logits [B, Bs-1, V or Vd] in the model dtype, selector confidences [B, Bs-1] float32 or None
            without a selector head).
        """
        cfg = self.config
        B, Bs = last_tokens.shape[0], cfg.block_size
        ids = torch.full((B, Bs), cfg.mask_token_id, dtype=torch.long, device=last_tokens.device)
        ids[:, 0] = last_tokens
        x = self.embed_tokens(ids)
        start = cache.ctx_len[slots]
        index = cache_index(slots, start, Bs)
        cos, sin = self._cached_rope(index[1], x.dtype, cache)
        attn_len = attn_len or cache.k[0].shape[2]
        delta = None
        for layer, k_cache, v_cache in zip(self.layers, cache.k, cache.v):
            x, delta = layer(x, delta, cos, sin, k_cache, v_cache, slots, start, index, attn_len, policy)
        out = self.norm.add(x, delta, policy)[1][:, 1:]
        conf = torch.sigmoid(self.selector_head(out).float())[..., 0] if self.config.selector_head else None
        return self.head(out, policy), conf

    def head(self, out: Tensor, policy: ExecutionPolicy = AUTO) -> Tensor:
        """Drafted logits: the target's LM head, or its first ``draft_vocab_size`` rows (a quantized head's
        ``rows`` view: the same format and scales as the target's)."""
        vd = self.config.draft_vocab_size
        head = self.lm_head.rows(vd) if vd and hasattr(self.lm_head, "rows") else self.lm_head
        if isinstance(head, PolicyLinear):
            return head(out, policy)
        if not vd:
            return head(out)
        return F.linear(out, head.weight[:vd])

    def propose(self, logits: Tensor, cache: DrafterCache, slots: Tensor) -> Tensor:
        """Drafted tokens [B, Bs-1] from the drafted logits (greedy; a hook benchmarks override)."""
        return logits.argmax(-1)

    def verify_budget(self, conf: Tensor | None) -> Tensor | None:
        """Drafted tokens per row the selector sends for verification: the confident prefix.

        Args:
            conf: [B, Bs-1] float32 selector confidences from ``draft``, or None.

        Returns:
            [B] long counts, or None (all of them) without confidences.
        """
        if conf is None:
            return None
        return (conf >= self.config.selector_threshold).int().cumprod(dim=1).sum(dim=1)

    @classmethod
    def from_pretrained(cls, directory: str | Path, target: nn.Module, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> "DFlash2Drafter":
        """Load a z-lab DFlash (or our DFlash2) directory and bind it to ``target``'s embeddings/head.

        Args:
            directory: config.json + model.safetensors.
            target: the target model whose ``embed_tokens`` and ``lm_head`` the drafter shares.
            dtype, device: of the drafter's own weights.

        Returns:
            The drafter in eval mode; ConfigError if it does not fit the target.
        """
        directory = Path(directory)
        cfg = DrafterConfig.from_dict(read_config_json(directory / "config.json"))
        text_cfg = target.text_config
        if max(cfg.target_layer_ids) >= text_cfg.num_hidden_layers:
            raise ConfigError(
                f"{directory}: target_layer_ids {cfg.target_layer_ids} exceed the target's "
                f"{text_cfg.num_hidden_layers} layers")
        if cfg.vocab_size and cfg.vocab_size != text_cfg.vocab_size:
            raise ConfigError(f"{directory}: drafter vocab_size {cfg.vocab_size} != target {text_cfg.vocab_size}")
        with torch.device("meta"):
            model = cls(cfg)
        load_module(model, directory, {"": ""}, dtype, device)
        return model.eval().bind(target.text.embed_tokens, target.lm_head)
