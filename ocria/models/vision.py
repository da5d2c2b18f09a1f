"""Qwen3.5 vision encoder: 3D patch embed, interpolated learned positions, 2D rotary ViT, 2x2 merger.

Input is the processor's flattened patches [P, C * Tp * p * p] in spatial-merge-block order (the
order the Qwen2-VL image processor emits), output one embedding per merged 2x2 block.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ocria.models.config import VisionConfig
from ocria.models.layers import apply_rotary, inverse_frequencies


def _act(name: str):
    return (lambda x: F.gelu(x, approximate="tanh")) if name == "gelu_pytorch_tanh" else F.gelu


def block_order(h: int, w: int, merge: int, device=None) -> tuple[Tensor, Tensor]:
    """Row and column of each patch when patches are listed block by block (merge x merge blocks)."""
    rows = torch.arange(h, device=device)[:, None].expand(h, w)
    cols = torch.arange(w, device=device)[None, :].expand(h, w)
    shape = (h // merge, merge, w // merge, merge)
    return (rows.reshape(shape).transpose(1, 2).flatten(), cols.reshape(shape).transpose(1, 2).flatten())


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        d = cfg.hidden_size
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(d, 3 * d)
        self.attn.proj = nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = nn.Linear(d, cfg.intermediate_size)
        self.mlp.linear_fc2 = nn.Linear(cfg.intermediate_size, d)
        self.num_heads = cfg.num_heads
        self.act = _act(cfg.hidden_act)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, seqlens: list[int]) -> Tensor:
        n, d = x.shape
        q, k, v = self.attn.qkv(self.norm1(x)).view(n, 3, self.num_heads, -1).unbind(1)
        q = apply_rotary(q.float(), cos[:, None], sin[:, None]).to(v.dtype)
        k = apply_rotary(k.float(), cos[:, None], sin[:, None]).to(v.dtype)
        outs = []
        for qi, ki, vi in zip(q.split(seqlens), k.split(seqlens), v.split(seqlens)):
            o = F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1))
            outs.append(o.transpose(0, 1).reshape(-1, d))
        x = x + self.attn.proj(torch.cat(outs))
        return x + self.mlp.linear_fc2(self.act(self.mlp.linear_fc1(self.norm2(x))))


class VisionModel(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.patch_embed = nn.Module()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.patch_embed.proj = nn.Conv3d(cfg.in_channels, d, kernel_size=kernel, stride=kernel, bias=True)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, d)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        merged = d * cfg.spatial_merge_size**2
        self.merger = nn.Module()
        self.merger.norm = nn.LayerNorm(d, eps=1e-6)
        self.merger.linear_fc1 = nn.Linear(merged, merged)
        self.merger.linear_fc2 = nn.Linear(merged, cfg.out_hidden_size)

    def _positions(self, t: int, h: int, w: int, device) -> tuple[Tensor, Tensor, Tensor]:
        """Learned position embeddings bilinearly resized (align_corners) to h x w, plus rotary
        row/column ids, all in block order and repeated over t frames."""
        side = int(self.cfg.num_position_embeddings**0.5)
        table = self.pos_embed.weight.view(side, side, -1).permute(2, 0, 1)[None].float()
        grid = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]
        rows, cols = block_order(h, w, self.cfg.spatial_merge_size, device)
        pos = grid[:, rows, cols].t().repeat(t, 1)
        return pos, rows.repeat(t), cols.repeat(t)

    def forward(self, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
        """Encode the patches of N images.

        Args:
            pixel_values: [P, C*Tp*p*p] float patches, block order (as the processor lays them out).
            grid_thw: [N, 3] long (t, h, w) of each image in patches; P = sum(t * h * w).

        Returns:
            Merged embeddings [P / merge^2, out_hidden] in the encoder's dtype: one per image token.
        """
        cfg = self.cfg
        dtype = self.patch_embed.proj.weight.dtype
        x = pixel_values.view(-1, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        x = self.patch_embed.proj(x.to(dtype)).view(-1, cfg.hidden_size)
        pos, rows, cols, seqlens = [], [], [], []
        for t, h, w in grid_thw.tolist():
            p, r, c = self._positions(t, h, w, x.device)
            pos.append(p)
            rows.append(r)
            cols.append(c)
            seqlens += [h * w] * t
        x = x + torch.cat(pos).to(x.dtype)
        head_dim = cfg.hidden_size // cfg.num_heads
        inv_freq = inverse_frequencies(head_dim // 2, cfg.rope_theta, str(x.device))
        freqs = torch.cat([torch.cat(rows)[:, None] * inv_freq, torch.cat(cols)[:, None] * inv_freq], dim=-1)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        for block in self.blocks:
            x = block(x, cos, sin, seqlens)
        x = self.merger.norm(x).view(-1, cfg.hidden_size * cfg.spatial_merge_size**2)
        return self.merger.linear_fc2(F.gelu(self.merger.linear_fc1(x)))
