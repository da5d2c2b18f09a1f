"""Gated DeltaNet (linear-attention) layer of the Qwen3.5 text decoder.

Three ways through the layer, all with HF parameter names:
- ``full``: no cache, zero initial state (parity forward);
- ``prefill``: continue each slot's committed state over T tokens and write the new state back;
- ``verify``: ReplaySSM step (pending tokens folded, T outputs computed, T inputs parked), so the
  caller can keep any prefix of the T tokens with a cursor move (``TargetCache.commit``).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ocria.models.cache import TargetCache
from ocria.models.config import TextConfig
from ocria.models.gdn_chunked import chunk_gated_delta_rule
from ocria.models.layers import GatedRMSNorm, dense, prologue_dense
from ocria.plugins.gemm_prologue import Prologue
from ocria.plugins.policy import AUTO, ExecutionPolicy
from ocria.plugins.replay_ssm import ops
from ocria.plugins.replay_ssm.reference import conv_window, delta_step, fold_pending, gdn_gates, l2norm

PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
CHUNKED_FROM = 32  # CUDA prefill lengths above this use the chunked recurrence


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
            y = ops.causal_conv_verify(qkv, self.conv1d.weight[:, 0, :], cache.conv_buf[i], cache.pending_len, slots,
                                       policy=policy)
            q, k, v = self._split(y)
            o = ops.replay_verify(
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
