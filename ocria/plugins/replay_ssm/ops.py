"""ReplaySSM as PyTorch custom operators (``ocria::replay_verify``, ``ocria::causal_conv_verify``).

The operators declare what they mutate and have fake implementations, so CUDA graphs and
``torch.compile`` take them as opaque calls; ``launch`` is the execution policy's ``Launch`` flags. Their contract
and plain PyTorch reference are the GDN layer's own math, ``ocria.models.gdn.replay_verify_reference`` and
``causal_conv_verify_reference``; ``ocria.models.gdn.replay_verify`` / ``causal_conv_verify`` pick the operator or
the reference by the policy.
"""

import torch
from torch import Tensor

from ocria.plugins.policy import Launch

_RING = ("state", "ring_k", "ring_u", "ring_g")


@torch.library.custom_op("ocria::replay_verify", mutates_args=_RING)
def replay_verify_op(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
    state: Tensor, ring_k: Tensor, ring_u: Tensor, ring_g: Tensor,
    ring_phase: Tensor, pending_len: Tensor, slot_ids: Tensor, launch: int,
) -> Tensor:  # fmt: skip
    """Triton ``replay_verify`` (the contract: ``ocria.models.gdn.replay_verify_reference``)."""
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
    """Triton ``causal_conv_verify`` (the contract: ``ocria.models.gdn.causal_conv_verify_reference``)."""
    from ocria.plugins.replay_ssm.kernel import causal_conv_verify_kernel

    return causal_conv_verify_kernel(x, weight, conv_buf, pending_len, slot_ids, launch=Launch(launch))


@causal_conv_verify_op.register_fake
def _(x, weight, conv_buf, pending_len, slot_ids, launch: int):
    return torch.empty_like(x)
