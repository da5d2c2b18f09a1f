"""Deterministic random weights (a preset without trained weights, benchmarks of random models)."""

import math

import torch
from torch import nn

from ocria.models.layers import ZeroCenteredRMSNorm


@torch.no_grad()
def random_init(model: nn.Module, seed: int, std: float = 0.02) -> nn.Module:
    """Initialise every parameter from a generator seeded per tensor name (order-independent).

    Linear/embedding weights ~ N(0, std); norms at identity (zero for zero-centred norms); GDN
    ``A_log`` = log U(1, 16) and ``dt_bias`` = 1 as in Qwen3.5; biases zero.
    """
    zero_centred = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, ZeroCenteredRMSNorm)}
    for name, p in model.named_parameters():
        g = torch.Generator().manual_seed(seed * 1_000_003 + sum(ord(c) * (i + 1) for i, c in enumerate(name)))
        leaf = name.rsplit(".", 1)[-1]
        if name in zero_centred or leaf == "bias":
            value = torch.zeros(p.shape)
        elif leaf == "A_log":
            value = torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log()
        elif leaf == "dt_bias" or "norm" in name:
            value = torch.ones(p.shape)
        elif "conv" in name:
            value = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
        else:
            value = torch.randn(p.shape, generator=g) * std
        p.copy_(value)
    return model
