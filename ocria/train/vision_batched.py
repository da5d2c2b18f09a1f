"""The vision encoder with all images of a batch in one attention call per block, for training.

``VisionModel.forward`` attends image by image in a Python loop (right for inference, where a
request has one image); a training batch has dozens, and the loop's launches then dominate the step.
Here the patches are scattered into a padded [images, max patches] layout and each block runs one
``scaled_dot_product_attention`` with a key mask: the same function (tested against the loop).
Position tables are computed once per distinct image size in the batch.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from ocria.models.layers import apply_rotary, inverse_frequencies
from ocria.models.vision import VisionBlock, VisionModel


def _block(block: VisionBlock, x: Tensor, cos: Tensor, sin: Tensor, rows: Tensor, valid: Tensor) -> Tensor:
    n, d = x.shape
    q, k, v = block.attn.qkv(block.norm1(x)).view(n, 3, block.num_heads, -1).unbind(1)
    q = apply_rotary(q.float(), cos[:, None], sin[:, None]).to(v.dtype)
    k = apply_rotary(k.float(), cos[:, None], sin[:, None]).to(v.dtype)
    padded = []
    for t in (q, k, v):
        p = t.new_zeros(*valid.shape, *t.shape[1:])
        p[rows] = t
        padded.append(p.transpose(1, 2))  # [N, H, P, hd]
    o = F.scaled_dot_product_attention(*padded, attn_mask=valid[:, None, None, :])
    x = x + block.attn.proj(o.transpose(1, 2)[rows].reshape(n, d))
    return x + block.mlp.linear_fc2(block.act(block.mlp.linear_fc1(block.norm2(x))))


def batched_vision_forward(vis: VisionModel, pixel_values: Tensor, grid_thw: Tensor) -> Tensor:
    """Same contract as ``VisionModel.forward``: [P, C*Tp*p*p], [N, 3] -> [P / merge^2, out_hidden]."""
    cfg = vis.cfg
    dtype = vis.patch_embed.proj.weight.dtype
    x = pixel_values.view(-1, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
    x = vis.patch_embed.proj(x.to(dtype)).view(-1, cfg.hidden_size)
    sizes = [tuple(g) for g in grid_thw.tolist()]
    tables = {s: vis._positions(*s, x.device) for s in dict.fromkeys(sizes)}
    pos = torch.cat([tables[s][0] for s in sizes])
    rows_id = torch.cat([tables[s][1] for s in sizes])
    cols_id = torch.cat([tables[s][2] for s in sizes])
    x = x + pos.to(x.dtype)
    head_dim = cfg.hidden_size // cfg.num_heads
    inv_freq = inverse_frequencies(head_dim // 2, cfg.rope_theta, str(x.device))
    freqs = torch.cat([rows_id[:, None] * inv_freq, cols_id[:, None] * inv_freq], dim=-1)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    seqlens = torch.tensor([h * w for t, h, w in sizes for _ in range(t)], device=x.device)
    valid = torch.arange(int(seqlens.max()), device=x.device)[None, :] < seqlens[:, None]  # [N, P]
    rows = valid.nonzero(as_tuple=True)  # patch order = image by image, as in the packed layout
    for block in vis.blocks:
        x = _block(block, x, cos, sin, rows, valid)
    x = vis.merger.norm(x).view(-1, cfg.hidden_size * cfg.spatial_merge_size**2)
    return vis.merger.linear_fc2(F.gelu(vis.merger.linear_fc1(x)))


@contextmanager
def batched_vision() -> Iterator[None]:
    """Route every ``VisionModel`` through the batched form, then restore the per-image loop."""
    per_image = VisionModel.forward
    VisionModel.forward = batched_vision_forward
    try:
        yield
    finally:
        VisionModel.forward = per_image
