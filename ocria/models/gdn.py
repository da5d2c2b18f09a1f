"""Gated DeltaNet (linear-attention) layer of the Qwen3.5 text decoder, and the GDN math it runs.

Three ways through the layer, all with HF parameter names:
- ``full``: no cache, zero initial state (parity forward);
- ``prefill``: continue each slot's committed state over T tokens and write the new state back;
- ``verify``: ReplaySSM step (pending tokens folded, T outputs computed, T inputs parked), so the
  caller can keep any prefix of the T tokens with a cursor move (``TargetCache.commit``).

The math is plain PyTorch in fp32 (fp64 inputs stay fp64): the gates (``gdn_gates``), the gated delta rule
(``delta_step``, ``gated_delta_rule``) and ReplaySSM's verify step (``fold_pending``, ``conv_window``,
``replay_verify_reference``, ``causal_conv_verify_reference``). The Triton kernels of ``ocria.plugins.replay_ssm``
implement the verify step; these functions are their reference, and ``replay_verify`` / ``causal_conv_verify``
pick one or the other by the execution policy.

ReplaySSM state layout (one entry per sequence slot ``s``; a batch row ``i`` uses slot ``slot_ids[i]``):

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
from torch import Tensor, nn

from ocria.models.cache import TargetCache
from ocria.models.config import TextConfig
from ocria.models.gdn_chunked import chunk_gated_delta_rule, l2norm
from ocria.models.layers import GatedRMSNorm, dense, prologue_dense
from ocria.plugins.gemm_prologue import Prologue
from ocria.plugins.policy import AUTO, ExecutionPolicy

PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
CHUNKED_FROM = 32  # CUDA prefill lengths above this use the chunked recurrence


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


def expand_heads(x: Tensor, num_v_heads: int) -> Tensor:
    """Repeat key heads up to value heads (value head h reads key head h // (Hv // Hk))."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def fold_pending(state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor, ring_phase: Tensor,
                 pending_len: Tensor, slot_ids: Tensor) -> Tensor:
    """The states of ``slot_ids`` with their pending tokens applied (nothing is written).

    Args:
        state: [S, Hv, Dk, Dv] checkpoints.
        ring_k, ring_u, ring_g: [S, 2, Tmax, Hk, Dk] / [S, 2, Tmax, Hv, Dv] / [S, 2, Tmax, Hv] parked tokens.
        ring_phase, pending_len: [S] int32: the half holding each slot's pending tokens, and how many there are.
        slot_ids: [B] long.

    Returns:
        [B, Hv, Dk, Dv] in fp32 (fp64 for an fp64 state).
    """
    compute_dtype = torch.float64 if state.dtype == torch.float64 else torch.float32
    S = state[slot_ids].to(compute_dtype)
    phase = ring_phase[slot_ids].long()
    n = pending_len[slot_ids]
    pk, pu, pg = (r[slot_ids, phase].to(compute_dtype) for r in (ring_k, ring_u, ring_g))
    num_v_heads = pu.shape[-2]
    for t in range(pk.shape[1]):
        live = (n > t)[:, None, None, None]
        S_next = add_write(S * pg[:, t].exp()[..., None, None], expand_heads(pk[:, t], num_v_heads), pu[:, t])
        S = torch.where(live, S_next, S)
    return S


def replay_verify_reference(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor,
    ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor,
) -> Tensor:  # fmt: skip
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
        k_t = expand_heads(kn[:, t], num_v_heads)
        S, u[:, t] = delta_write(S, k_t, vc[:, t], g[:, t], beta[:, t])
        S = add_write(S, k_t, u[:, t])
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, expand_heads(qn[:, t], num_v_heads))

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


def causal_conv_verify_reference(
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


def replay_verify(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor,
    ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor, policy: ExecutionPolicy = AUTO,
) -> Tensor:  # fmt: skip
    """Fold pending tokens, verify T new ones, park them: ``ocria::replay_verify`` where the policy uses the
    ``replay_ssm`` kernel, else ``replay_verify_reference`` (same arguments, effects and result).

    Args:
        q, k: [B, T, Hk, Dk] conv + SiLU outputs, not yet normalised.
        v: [B, T, Hv, Dv].
        a, b: [B, T, Hv] the raw ``in_proj_a`` / ``in_proj_b`` outputs (gates from them, ``A_log`` and ``dt_bias``).
        A_log, dt_bias: [Hv].
        state: [S, Hv, Dk, Dv] fp32 checkpoints (mutated: the pending tokens folded in).
        ring_k, ring_u, ring_g: [S, 2, Tmax, Hk, Dk] / [S, 2, Tmax, Hv, Dv] / [S, 2, Tmax, Hv] fp32 (the half
            ``1 - ring_phase`` gets the T new tokens).
        ring_phase, pending_len: [S] int32 cursors (read; the caller moves them).
        slot_ids: [B] long, each row's slot.
        policy: which implementation runs and how its kernel launches.

    Returns:
        o [B, T, Hv, Dv] in v's dtype.
    """
    args = (q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids)
    if policy.uses("replay_ssm", q.device):
        return torch.ops.ocria.replay_verify(*args, int(policy.launch))
    return replay_verify_reference(*args)


def causal_conv_verify(
    x: Tensor, weight: Tensor, conv_buf: Tensor, pending_len: Tensor, slot_ids: Tensor, policy: ExecutionPolicy = AUTO
) -> Tensor:
    """Conv window rollback + depthwise causal conv + SiLU: ``ocria::causal_conv_verify`` where the policy uses the
    ``replay_ssm`` kernel, else ``causal_conv_verify_reference``.

    Args:
        x: [B, T, C] raw conv inputs of the T new tokens.
        weight: [C, K] depthwise kernel.
        conv_buf: [S, K-1+Tmax, C] (mutated: ``[:, :K-1+T]`` becomes the committed window, then the T inputs).
        pending_len: [S] int32, the tokens of the last step each slot kept.
        slot_ids: [B] long, each row's slot.
        policy: which implementation runs and how its kernel launches.

    Returns:
        y [B, T, C] in x's dtype.
    """
    if policy.uses("replay_ssm", x.device):
        return torch.ops.ocria.causal_conv_verify(x, weight, conv_buf, pending_len, slot_ids, int(policy.launch))
    return causal_conv_verify_reference(x, weight, conv_buf, pending_len, slot_ids)


def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor):
    """Sequential gated delta rule in fp32, one token at a time (the reference).

    Args:
        q, k: [B, T, Hk, Dk], not yet normalised (Hv a multiple of Hk).
        v: [B, T, Hv, Dv].
        g: [B, T, Hv] fp32 log-decays.
        beta: [B, T, Hv] fp32 write strengths.
        state: [B, Hv, Dk, Dv] the state entering the first token.

    Returns:
        (o [B, T, Hv, Dv] fp32, final state [B, Hv, Dk, Dv] fp32).
    """
    hv, dk = v.shape[2], k.shape[-1]
    rep = hv // k.shape[2]
    qn = (l2norm(q.float()) * dk**-0.5).repeat_interleave(rep, dim=2)
    kn = l2norm(k.float()).repeat_interleave(rep, dim=2)
    vf = v.float()
    out = torch.empty(vf.shape, dtype=torch.float32, device=v.device)
    S = state.float()
    for t in range(q.shape[1]):
        S = delta_step(S, kn[:, t], vf[:, t], g[:, t], beta[:, t])
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, qn[:, t])
    return out, S


def prefill_recurrence(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor):
    """The GDN recurrence of a no-cache or prefill pass. On CUDA, long inputs take the chunked form
    (T / 64 sequential steps instead of T kernel-launch-bound ones); elsewhere, and for short inputs,
    the per-token reference loop. Arguments and results as ``gated_delta_rule``."""
    if q.is_cuda and q.shape[1] > CHUNKED_FROM:
        return chunk_gated_delta_rule(q, k, v, g, beta, state)
    return gated_delta_rule(q, k, v, g, beta, state)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: TextConfig, cache_index: int):
        super().__init__()
        self.cache_index = cache_index
        self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = cfg.linear_conv_kernel_dim
        h = cfg.hidden_size
        self.in_proj_qkv = nn.Linear(h, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(h, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False,
                                padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, eps=cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)

    def _split(self, y: Tensor):
        B, T, _ = y.shape
        q, k, v = torch.split(y, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (q.reshape(B, T, self.num_k_heads, self.head_k_dim),
                k.reshape(B, T, self.num_k_heads, self.head_k_dim),
                v.reshape(B, T, self.num_v_heads, self.head_v_dim))

    def _conv_prefill(self, qkv: Tensor, cache: TargetCache | None, slots: Tensor | None) -> Tensor:
        """Causal conv + SiLU over T tokens continuing the slot's window (zeros without cache)."""
        B, T, C = qkv.shape
        W = self.kernel - 1
        weight = self.conv1d.weight[:, 0, :]
        if cache is None:
            window = qkv.new_zeros(B, W, C)
        else:
            buf = cache.conv_buf[self.cache_index]
            window = conv_window(buf, cache.pending_len, slots, W).to(qkv.dtype)
        full = torch.cat([window, qkv], dim=1)
        if cache is not None:
            buf[slots, :W] = full[:, -W:].to(buf.dtype)
        y = F.conv1d(full.transpose(1, 2).to(weight.dtype), weight[:, None, :], groups=C)
        return F.silu(y).transpose(1, 2).to(qkv.dtype)

    def forward(self, projections: tuple[Tensor, ...], mode: str, cache: TargetCache | None = None,
                slots: Tensor | None = None, policy: ExecutionPolicy = AUTO) -> Tensor:
        """The layer from its input projections on (``PROJECTIONS`` of the normed input, [B, T, *] each): the
        decoder layer computes them, folding its norm into their GEMM in decode steps (``norm_project``).

        Args:
            projections: (qkv [B, T, 2*Hk*Dk + Hv*Dv], z [B, T, Hv*Dv], b [B, T, Hv], a [B, T, Hv]).
            mode: ``full``, ``prefill`` or ``verify`` (see the module docstring).
            cache: the target cache (``prefill`` / ``verify``).
            slots: [B] long cache slots (with ``cache``).
            policy: the execution policy of the plugin ops.

        Returns:
            [B, T, hidden] in the model dtype.
        """
        qkv, z, b, a = projections
        B, T, _ = qkv.shape
        z = z.reshape(B, T, self.num_v_heads, self.head_v_dim)
        i = self.cache_index
        if mode == "verify":
            y = causal_conv_verify(qkv, self.conv1d.weight[:, 0, :], cache.conv_buf[i], cache.pending_len, slots,
                                       policy=policy)
            q, k, v = self._split(y)
            o = replay_verify(
                q, k, v, a, b, self.A_log, self.dt_bias, cache.ssm[i], cache.ring_k[i], cache.ring_u[i],
                cache.ring_g[i], cache.ring_phase, cache.pending_len, slots,
                policy=policy,
            )
        else:
            q, k, v = self._split(self._conv_prefill(qkv, cache, slots))
            g, beta = gdn_gates(a, b, self.A_log, self.dt_bias)
            if cache is None:
                state = torch.zeros(B, self.num_v_heads, self.head_k_dim, self.head_v_dim, device=qkv.device)
            else:
                state = fold_pending(cache.ssm[i], cache.ring_k[i], cache.ring_u[i], cache.ring_g[i],
                                     cache.ring_phase, cache.pending_len, slots)
            o, state = prefill_recurrence(q, k, v, g, beta, state)
            if cache is not None:
                cache.ssm[i][slots] = state
        o = o.to(qkv.dtype)
        y = prologue_dense(self.out_proj, Prologue.GATED_NORM, o, z, policy, self.norm)
        if y is not None:  # the gated norm (and an FP8 out_proj's input quantization) in out_proj's launch
            return y
        quant = getattr(self.out_proj, "input_quant", None)
        if quant is not None:  # an FP8 out_proj: the norm's launch writes its FP8 input
            q8, token_scales = self.norm.fp8(o, z, *quant, policy)
            return self.out_proj.forward_fp8(q8, token_scales, qkv.dtype, policy)
        o = self.norm(o, z, policy)
        return dense(self.out_proj, o.reshape(B, T, self.value_dim), policy)
