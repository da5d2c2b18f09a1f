"""Plain PyTorch reference for ReplaySSM: Gated DeltaNet verification with replay-based rollback.

State layout (one entry per sequence slot ``s``; a batch row ``i`` uses slot ``slot_ids[i]``):

- ``state``       [S, Hv, Dk, Dv] fp32: the checkpoint (committed) recurrent state.
- ``ring_k``      [S, 2, Tmax, Hk, Dk] fp32: L2-normalised keys of recent tokens, two halves.
- ``ring_u``      [S, 2, Tmax, Hv, Dv] fp32: the delta-rule write ``u`` of recent tokens (below).
- ``ring_g``      [S, 2, Tmax, Hv] fp32: log-decay ``g`` of recent tokens.
- ``ring_phase``  [S] int32: which half holds the tokens accepted at the last step but not yet folded.
- ``pending_len`` [S] int32: how many of those tokens were accepted (the rollback cursor).
- ``conv_buf``    [S, K-1+Tmax, C]: raw conv inputs, time-major (a position's channels are contiguous, so
  a kernel's [T, channels] tiles are coalesced); after a step, ``[:, n:n+K-1]`` is the committed window
  when ``n`` tokens of the step were accepted.

One verify step for T new tokens: fold the pending tokens into the checkpoint (state written once),
compute the T outputs from it without storing per-token states, and park the T tokens' ``k, u, g`` in
the other ring half. Rollback after acceptance is a cursor move done by the caller, once for all layers:
``ring_phase ^= 1`` and ``pending_len = accepted`` (the whole contract, attention and drafter included, is in
``ocria.models.cache``). Gated delta rule (``alpha = exp(g)``):
``S' = alpha S; u = beta (v - S'^T k); S = S' + k u^T; o = S^T (q / sqrt(Dk))``.

The ring keeps ``u`` rather than ``v`` and ``beta``: ``u`` depends on the state the token saw, and the
verify step that parks a token computes it from exactly the state the next step folds into (the
checkpoint it writes). Folding is then ``S = alpha S + k u^T`` per pending token: no read of the
state feeds back into the update, so a kernel folds n tokens with one rank-n product.
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Same as flash-linear-attention / HF: ``x * rsqrt(sum(x^2) + eps)``."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_gates(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, both fp32."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def delta_write(S: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """``(alpha S, u)`` of one gated delta-rule update: the decayed state and the token's write
    ``u = beta (v - (alpha S)^T k)``. S [B, H, Dk, Dv]; k [B, H, Dk]; v [B, H, Dv]; g, beta [B, H]."""
    S = S * g.exp()[..., None, None]
    return S, beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))


def add_write(S: Tensor, k: Tensor, u: Tensor) -> Tensor:
    """``S + k u^T``: the rank-1 write of one token into the (decayed) state."""
    return S + k[..., :, None] * u[..., None, :]


def delta_step(S: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> Tensor:
    """One gated delta-rule update (shapes as ``delta_write``)."""
    S, u = delta_write(S, k, v, g, beta)
    return add_write(S, k, u)


def _expand_heads(x: Tensor, num_v_heads: int) -> Tensor:
    """Repeat key heads up to value heads (value head h reads key head h // (Hv // Hk))."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def fold_pending(
    state: Tensor,
    ring_k: Tensor,
    ring_u: Tensor,
    ring_g: Tensor,
    ring_phase: Tensor,
    pending_len: Tensor,
    slot_ids: Tensor,
) -> Tensor:
    """Return the states of ``slot_ids`` with their pending tokens applied (does not write)."""
    compute_dtype = torch.float64 if state.dtype == torch.float64 else torch.float32
    S = state[slot_ids].to(compute_dtype)
    phase = ring_phase[slot_ids].long()
    n = pending_len[slot_ids]
    pk, pu, pg = (r[slot_ids, phase].to(compute_dtype) for r in (ring_k, ring_u, ring_g))
    num_v_heads = pu.shape[-2]
    for t in range(pk.shape[1]):
        live = (n > t)[:, None, None, None]
        S_next = add_write(S * pg[:, t].exp()[..., None, None], _expand_heads(pk[:, t], num_v_heads), pu[:, t])
        S = torch.where(live, S_next, S)
    return S


def replay_verify_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    ring_k: Tensor,
    ring_u: Tensor,
    ring_g: Tensor,
    ring_phase: Tensor,
    pending_len: Tensor,
    slot_ids: Tensor,
) -> Tensor:
    """Verify T new tokens per sequence; returns o [B, T, Hv, Dv] in v's dtype.

    q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv] are the conv+SiLU outputs (q/k not yet normalised);
    a, b [B, T, Hv] are the raw ``in_proj_a`` / ``in_proj_b`` outputs. Mutates ``state`` (pending
    tokens folded in) and the ring half ``1 - ring_phase`` (the T new tokens' k, u, g); the caller then flips
    ``ring_phase`` and sets ``pending_len`` to the accepted count.
    """
    T, Dk = k.shape[1], k.shape[-1]
    num_v_heads = v.shape[-2]
    S = fold_pending(state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids)
    state[slot_ids] = S.to(state.dtype)

    compute_dtype = S.dtype
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    kn = l2norm(k.to(compute_dtype))
    qn = l2norm(q.to(compute_dtype)) * Dk**-0.5
    vc = v.to(compute_dtype)
    g, beta = g.to(compute_dtype), beta.to(compute_dtype)
    out = torch.empty(v.shape, dtype=compute_dtype, device=v.device)
    u = torch.empty(v.shape, dtype=compute_dtype, device=v.device)
    for t in range(T):
        k_t = _expand_heads(kn[:, t], num_v_heads)
        S, u[:, t] = delta_write(S, k_t, vc[:, t], g[:, t], beta[:, t])
        S = add_write(S, k_t, u[:, t])
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, _expand_heads(qn[:, t], num_v_heads))

    park = 1 - ring_phase[slot_ids].long()
    ring_k[slot_ids, park, :T] = kn.to(ring_k.dtype)
    ring_u[slot_ids, park, :T] = u.to(ring_u.dtype)
    ring_g[slot_ids, park, :T] = g.to(ring_g.dtype)
    return out.to(v.dtype)


def conv_window(conv_buf: Tensor, pending_len: Tensor, slot_ids: Tensor, width: int) -> Tensor:
    """Each slot's committed conv window [B, width, C]: the ``width`` raw inputs ending at its cursor."""
    buf = conv_buf[slot_ids]
    B, C = buf.shape[0], buf.shape[2]
    start = pending_len[slot_ids].long()
    idx = (start[:, None] + torch.arange(width, device=buf.device)[None, :])[:, :, None].expand(B, width, C)
    return buf.gather(1, idx)


def causal_conv_verify_ref(
    x: Tensor, weight: Tensor, conv_buf: Tensor, pending_len: Tensor, slot_ids: Tensor
) -> Tensor:
    """Depthwise causal conv + SiLU over T new inputs, continuing each slot's committed window.

    x [B, T, C]; weight [C, K]; conv_buf [S, K-1+Tmax, C] (mutated: ``[:, :K-1+T]`` becomes the
    committed window followed by the T new inputs). Returns y [B, T, C] in x's dtype.
    """
    T, C = x.shape[1:]
    W = weight.shape[-1] - 1
    full = torch.cat([conv_window(conv_buf, pending_len, slot_ids, W), x.to(conv_buf.dtype)], dim=1)
    y = F.conv1d(full.transpose(1, 2).to(weight.dtype), weight[:, None, :], groups=C)
    conv_buf[slot_ids, : W + T] = full
    return F.silu(y).transpose(1, 2).to(x.dtype)
