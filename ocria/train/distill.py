"""DFlash2 drafter distillation on the trained target's own greedy outputs and hidden features.

Data. For a batch of training documents the target's greedy answer is approached by fixed-point
iteration of teacher forcing: feed a guess (the ground truth first), replace every answer token by the
target's argmax at the previous position, repeat. A guess equal to the argmax of its own prefix is exactly
the greedy decode, and each pass fixes at least one more token. Every answer position up to the guess's
end then has a label, the target's greedy token after the fed prefix; a block is a valid sample where the
tokens fed inside it are the target's own (the anchor, and the block's positions before a label), as they
are at inference. Context before the anchor may hold a few fed tokens the target would not have chosen.
With the shipped ocria-mini target, only the exact greedy prefix would give samples for 65% / 79% / 88% of
the answer tokens after 0 / 1 / 3 passes, this rule for 96% / 96% / 93%:
as much data from one or two target forwards per step as from four.

Training. Random anchors i in the answer; block ``[s_i, MASK x (Bs-1)]`` at
positions i..i+Bs-1 sees the context features of positions < i (KV injection) and its own block
(bidirectional); mask slot j predicts the greedy token at i+j. Cross-entropy weighted by
``exp(-(j-1)/7)``. Many anchors per sequence share one forward through an attention mask. The
selector head learns, by binary cross-entropy, whether each drafted token matches the target's.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ocria.models import DFlash2Drafter, DrafterConfig, OCRiaForConditionalGeneration
from ocria.models.init import random_init
from ocria.models.layers import apply_rotary
from ocria.plugins.policy import REFERENCE
from ocria.train.data import IGNORE, Batch

DECAY = 7.0


def build_drafter(drafter_cfg: dict, target: OCRiaForConditionalGeneration, seed: int) -> DFlash2Drafter:
    drafter = random_init(DFlash2Drafter(DrafterConfig.from_dict(drafter_cfg)), seed)
    return drafter.bind(target.text.embed_tokens, target.lm_head).train()


@torch.no_grad()
def greedy_sequences(target: OCRiaForConditionalGeneration, batch: Batch, capture: tuple[int, ...], iters: int,
                     slack: int, eos_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """The target's greedy answers by fixed-point teacher forcing.

    Returns seq [B, M] (prompt + answer guess, M = N + slack), feats [B, M, n*H] (captured layer
    outputs on seq) and labels [B, M]: the target's greedy token after ``seq[:t]`` at every answer index t up
    to the guess's first end-of-answer (IGNORE elsewhere). Where ``seq[t] == labels[t]`` the fed token is the
    target's own; an exact greedy prefix is a run of those from the answer's start.
    """
    B, N = batch.input_ids.shape
    dev = batch.input_ids.device
    ids = F.pad(batch.input_ids, (0, slack), value=0)
    tail = batch.positions[:, :, -1:] + torch.arange(1, slack + 1, device=dev)
    positions = torch.cat([batch.positions, tail], dim=2)
    M = N + slack
    index = torch.arange(M, device=dev)
    gen = index[None, :] >= batch.prompt_len[:, None]  # answer positions (may run past the ground truth)
    base = target.embed(ids, batch.pixel_values, batch.image_grid_thw)
    seq = ids
    for it in range(iters + 1):
        embeds = torch.where(gen[..., None], target.text.embed_tokens(seq), base)
        last = it == iters
        hidden, feats = target.text(embeds, positions, capture=capture if last else (), policy=REFERENCE)
        pred = target.logits(hidden, REFERENCE).argmax(-1)
        if last:
            break
        nxt = seq.clone()
        nxt[:, 1:] = torch.where(gen[:, 1:], pred[:, :-1], seq[:, 1:])
        if torch.equal(nxt, seq):
            embeds = torch.where(gen[..., None], target.text.embed_tokens(seq), base)
            hidden, feats = target.text(embeds, positions, capture=capture, policy=REFERENCE)
            pred = target.logits(hidden, REFERENCE).argmax(-1)
            break
        seq = nxt
    label = torch.full_like(seq, IGNORE)
    label[:, 1:] = pred[:, :-1]
    big = torch.full_like(index, M)[None].expand(B, M)
    end = torch.where(gen & (seq == eos_id), index[None], big).min(dim=1).values  # the guess's end-of-answer
    valid = gen & (index[None] <= end[:, None])  # no end-of-answer inside the fed prefix
    return seq, torch.cat(feats, dim=-1), torch.where(valid, label, torch.full_like(label, IGNORE))


def sample_blocks(seq: Tensor, labels: Tensor, num_anchors: int, block: int, mask_id: int,
                  generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Random anchors i: answer tokens the target chose itself (``seq[i] == labels[i]``, so drafting starts
    after the first answer token, from a committed token, as at inference) followed by a label at i+1.
    Returns anchors [B, nA], block ids [B, nA, Bs] and block labels [B, nA, Bs-1]: slot j's label where the
    tokens fed at i+1..i+j-1 are the target's own too (IGNORE from the first one that is not, and past the
    labels)."""
    B, M = seq.shape
    known = labels != IGNORE
    own = known & (seq == labels)  # the fed token is the target's greedy one
    ok = torch.zeros_like(known)
    ok[:, :-1] = own[:, :-1] & known[:, 1:]
    weights = ok.float().cpu()
    empty = weights.sum(1) == 0
    weights[empty, 0] = 1.0  # a row without answer tokens gets a dummy anchor whose labels are all IGNORE
    anchors = torch.multinomial(weights, num_anchors, replacement=True, generator=generator).to(seq.device)
    offs = torch.arange(block, device=seq.device)
    idx = anchors[..., None] + offs  # [B, nA, Bs]
    inside = idx < M
    gathered = labels.gather(1, idx.clamp_max(M - 1).flatten(1)).view(B, num_anchors, block)
    fed_own = own.gather(1, idx.clamp_max(M - 1).flatten(1)).view(B, num_anchors, block)
    chain = torch.ones_like(fed_own)  # chain[..., j]: the tokens fed at slots 1..j-1 are all the target's own
    chain[..., 2:] = fed_own[..., 1:-1].long().cumprod(-1).bool()
    blabels = torch.where(inside & chain, gathered, torch.full_like(gathered, IGNORE))[..., 1:]
    blabels[empty.to(seq.device)] = IGNORE
    ids = torch.full((B, num_anchors, block), mask_id, dtype=torch.long, device=seq.device)
    ids[..., 0] = seq.gather(1, anchors)
    return anchors, ids, blabels


def block_forward(drafter: DFlash2Drafter, feats: Tensor, anchors: Tensor, block_ids: Tensor
                  ) -> tuple[Tensor, Tensor | None]:
    """Draft every block of every row in one pass. feats [B, M, n*H]; anchors [B, nA]; block_ids [B, nA, Bs].

    Same function as ``append_context(feats[:, :i])`` + ``draft(s_i)`` for each anchor i. Returns
    logits [B, nA, Bs-1, V] (fp32) and selector logits [B, nA, Bs-1] (None without a selector).
    """
    cfg = drafter.config
    B, M, _ = feats.shape
    nA, Bs = block_ids.shape[1:]
    T = nA * Bs
    dev = feats.device
    ctx = drafter.hidden_norm(drafter.fc(feats), REFERENCE)
    ccos, csin = drafter._rope(torch.arange(M, device=dev).expand(B, M), ctx.dtype)
    x = drafter.embed_tokens(block_ids.view(B, T))
    bcos, bsin = drafter._rope((anchors[..., None] + torch.arange(Bs, device=dev)).view(B, T), x.dtype)
    sees_ctx = (torch.arange(M, device=dev)[None, None, :] < anchors[..., None]).repeat_interleave(Bs, dim=1)
    blk = torch.arange(nA, device=dev).repeat_interleave(Bs)
    mask = torch.cat([sees_ctx, (blk[:, None] == blk[None, :]).expand(B, T, T)], dim=-1)[:, None]
    for layer in drafter.layers:
        if hasattr(layer, "local_conv"):
            kc = layer.local_conv.kernel_size[0]
            xb = x.reshape(B * nA, Bs, -1).transpose(1, 2)
            conv = F.conv1d(F.pad(xb, (kc - 1, 0)), layer.local_conv.weight.to(xb.dtype), groups=xb.shape[1])
            x = x + conv.transpose(1, 2).reshape(B, T, -1)
        attn = layer.self_attn
        h = layer.input_layernorm(x, REFERENCE)
        q = attn.q_norm(attn.q_proj(h).view(B, T, attn.num_heads, attn.head_dim), REFERENCE)
        q = apply_rotary(q, bcos[:, :, None], bsin[:, :, None])
        kb, vb = attn.kv(h, bcos, bsin, REFERENCE)
        kx, vx = attn.kv(ctx, ccos, csin, REFERENCE)
        rep = attn.num_heads // attn.num_kv_heads
        k = torch.cat([kx, kb], dim=1).transpose(1, 2).repeat_interleave(rep, dim=1)
        v = torch.cat([vx, vb], dim=1).transpose(1, 2).repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                           scale=attn.head_dim**-0.5)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x, REFERENCE), REFERENCE)
    out = drafter.norm(x, REFERENCE).view(B, nA, Bs, -1)[:, :, 1:]
    sel = drafter.selector_head(out).float()[..., 0] if cfg.selector_head else None
    return drafter.lm_head(out).float(), sel


def drafter_loss(logits: Tensor, sel: Tensor | None, labels: Tensor, selector_weight: float
                 ) -> tuple[Tensor, dict[str, float]]:
    """Position-decayed CE (+ selector BCE). Also returns the mean accepted length of the blocks
    (drafts accepted while they equal the target's tokens, plus the bonus token) as a training proxy."""
    valid = labels != IGNORE
    j = torch.arange(labels.shape[-1], device=labels.device, dtype=torch.float32)
    w = torch.exp(-j / DECAY).expand_as(labels) * valid
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten().clamp_min(0), reduction="none").view_as(w)
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
    match = (logits.argmax(-1) == labels) & valid
    stats = {"ce": float(loss.detach()), "accept": float(match.long().cumprod(-1).sum(-1).float().mean() + 1)}
    if sel is not None:
        bce = F.binary_cross_entropy_with_logits(sel, match.float(), reduction="none")
        sel_loss = (bce * valid).sum() / valid.sum().clamp_min(1)
        stats["selector_bce"] = float(sel_loss.detach())
        loss = loss + selector_weight * sel_loss
    return loss, stats
