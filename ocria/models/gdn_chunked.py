"""Chunked gated delta rule in plain PyTorch: the GDN prefill recurrence for long inputs.

The sequential recurrence (``ocria.models.gdn.gated_delta_rule``) is one Python step per token:
fine for a decode step, slow for a long prompt and far too slow to backpropagate through. Here the T
tokens are cut into chunks of C; inside a chunk the recurrence is solved with a unit-lower-triangular
system (the WY form of a product of Householder-like updates), so only T / C steps stay sequential.
It is differentiable (training uses it too).

Per value head, with ``G`` the running sum of ``g`` inside the chunk and ``S0`` the state entering it:
``(I + A) U = beta * (V - exp(G) * K S0)`` with ``A[t, j] = beta_t exp(G_t - G_j) k_t.k_j`` (j < t);
``O = exp(G) * Q S0 + (exp(G_t - G_j) q_t.k_j)_{j <= t} U``;
``S_C = exp(G_C) S0 + (exp(G_C - G) * K)^T U``.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_CHUNK = 64


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Same as flash-linear-attention / HF: ``x * rsqrt(sum(x^2) + eps)``."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                           chunk: int = DEFAULT_CHUNK) -> tuple[Tensor, Tensor]:
    """Same contract as ``gated_delta_rule``: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    state [B, Hv, Dk, Dv]. Returns (o [B, T, Hv, Dv], final state), in fp32 (fp64 for fp64 inputs)."""
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    with torch.autocast(q.device.type, enabled=False):
        return _chunked(q, k, v, g, beta, state, chunk, dtype)


def _chunked(q, k, v, g, beta, state, chunk, dtype):
    B, T, hk, dk = k.shape
    hv = v.shape[2]
    rep = hv // hk
    # [B, H, T, D] layout, keys/queries repeated up to the value heads as in the sequential rule.
    qn = (l2norm(q.to(dtype)) * dk**-0.5).repeat_interleave(rep, dim=2).transpose(1, 2)
    kn = l2norm(k.to(dtype)).repeat_interleave(rep, dim=2).transpose(1, 2)
    vf = v.to(dtype).transpose(1, 2)
    gf, bf = g.to(dtype).transpose(1, 2), beta.to(dtype).transpose(1, 2)
    pad = (-T) % chunk
    if pad:  # padded steps have g = 0 and beta = 0: they leave the state untouched
        qn, kn, vf = (F.pad(x, (0, 0, 0, pad)) for x in (qn, kn, vf))
        gf, bf = F.pad(gf, (0, pad)), F.pad(bf, (0, pad))
    n = (T + pad) // chunk
    qc, kc, vc = (x.reshape(B, hv, n, chunk, -1) for x in (qn, kn, vf))
    G = gf.reshape(B, hv, n, chunk).cumsum(-1)
    bc = bf.reshape(B, hv, n, chunk)

    idx = torch.arange(chunk, device=q.device)
    causal = idx[:, None] >= idx[None, :]
    strict = idx[:, None] > idx[None, :]
    # exp(G_t - G_j) only where j <= t (masked to -inf first: no overflow, no NaN gradient)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kk = kc @ kc.transpose(-1, -2)
    A = (bc[..., :, None] * decay * kk).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=dtype, device=q.device)
    rhs = torch.cat([bc[..., None] * vc, (bc * G.exp())[..., None] * kc], dim=-1)
    sol = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    u_v, w = sol[..., : vc.shape[-1]], sol[..., vc.shape[-1]:]  # U = u_v - w @ S0
    qk = (qc @ kc.transpose(-1, -2)) * decay
    q_decay = qc * G.exp()[..., None]
    k_decay = kc * (G[..., -1:] - G).exp()[..., None]
    g_last = G[..., -1].exp()

    S = state.to(dtype)
    outs = []
    for i in range(n):
        U = u_v[:, :, i] - w[:, :, i] @ S
        outs.append(q_decay[:, :, i] @ S + qk[:, :, i] @ U)
        S = g_last[:, :, i, None, None] * S + k_decay[:, :, i].transpose(-1, -2) @ U
    o = torch.stack(outs, dim=2).reshape(B, hv, n * chunk, -1)[:, :, :T]
    return o.transpose(1, 2), S
