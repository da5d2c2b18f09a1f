"""ReplaySSM as PyTorch custom operators (``ocria::replay_verify``, ``ocria::causal_conv_verify``).

The operators declare what they mutate and have fake implementations, so CUDA graphs and
``torch.compile`` take them as opaque calls. ``replay_verify`` / ``causal_conv_verify`` below are
what callers use: the execution policy picks the Triton kernel or the PyTorch reference (``policy.uses``) and
tells the kernel how to launch (its ``Launch`` flags, the operators' ``launch`` argument).
"""

import torch
from torch import Tensor

from ocria.plugins.policy import AUTO, ExecutionPolicy, Launch
from ocria.plugins.replay_ssm.reference import causal_conv_verify_ref, replay_verify_ref

_RING = ("state", "ring_k", "ring_u", "ring_g")


@torch.library.custom_op("ocria::replay_verify", mutates_args=_RING)
def replay_verify_op(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor,
    ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor, launch: int,
) -> Tensor:  # fmt: skip
    """Triton ``replay_verify`` (see ``reference.replay_verify_ref`` for the contract)."""
    from ocria.plugins.replay_ssm.kernel import replay_verify_kernel

    return replay_verify_kernel(
        q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids,
        launch=Launch(launch),
    )


@replay_verify_op.register_fake
def _(q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids, launch: int):
    return torch.empty_like(v)


@torch.library.custom_op("ocria::causal_conv_verify", mutates_args=("conv_buf",))
def causal_conv_verify_op(x: Tensor, weight: Tensor, conv_buf: Tensor, pending_len: Tensor, slot_ids: Tensor,
                          launch: int) -> Tensor:
    """Triton ``causal_conv_verify`` (see ``reference.causal_conv_verify_ref`` for the contract)."""
    from ocria.plugins.replay_ssm.kernel import causal_conv_verify_kernel

    return causal_conv_verify_kernel(x, weight, conv_buf, pending_len, slot_ids, launch=Launch(launch))


@causal_conv_verify_op.register_fake
def _(x, weight, conv_buf, pending_len, slot_ids, launch: int):
    return torch.empty_like(x)


def replay_verify(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor,
    ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor, policy: ExecutionPolicy = AUTO,
) -> Tensor:  # fmt: skip
    """Fold pending tokens, verify T new ones, park them; same contract as ``replay_verify_ref``.

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
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        o [B, T, Hv, Dv] in v's dtype.
    """
    args = (q, k, v, a, b, A_log, dt_bias, state, ring_k, ring_u, ring_g, ring_phase, pending_len, slot_ids)
    if policy.uses("replay_ssm", q.device):
        return torch.ops.ocria.replay_verify(*args, int(policy.launch()))
    return replay_verify_ref(*args)


def causal_conv_verify(
    x: Tensor, weight: Tensor, conv_buf: Tensor, pending_len: Tensor, slot_ids: Tensor, policy: ExecutionPolicy = AUTO
) -> Tensor:
    """Conv window rollback + depthwise causal conv + SiLU; same contract as ``causal_conv_verify_ref``.

    Args:
        x: [B, T, C] raw conv inputs of the T new tokens.
        weight: [C, K] depthwise kernel.
        conv_buf: [S, K-1+Tmax, C] (mutated: ``[:, :K-1+T]`` becomes the committed window, then the T inputs).
        pending_len: [S] int32, the tokens of the last step each slot kept.
        slot_ids: [B] long, each row's slot.
        policy: which implementation runs (``policy.uses``) and how its kernel launches.

    Returns:
        y [B, T, C] in x's dtype.
    """
    if policy.uses("replay_ssm", x.device):
        return torch.ops.ocria.causal_conv_verify(x, weight, conv_buf, pending_len, slot_ids, int(policy.launch()))
    return causal_conv_verify_ref(x, weight, conv_buf, pending_len, slot_ids)
