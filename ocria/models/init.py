"""Deterministic random weights (a preset without trained weights, benchmarks of random models)."""

import math

import torch
from torch import nn

from ocria.models.layers import ZeroCenteredRMSNorm


def name_seeded(seed: int, name: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded by ``seed`` and a tensor's name: each tensor's values do not depend on the order
    tensors are initialised in."""
    return torch.Generator(device).manual_seed(seed * 1_000_003 + sum(ord(c) * (i + 1) for i, c in enumerate(name)))


@torch.no_grad()
def random_init(model: nn.Module, seed: int, std: float = 0.02, embed_std: float | None = None) -> nn.Module:
    """Initialise every parameter from a generator seeded per tensor name (order-independent), on the
    parameter's own device (a 2B model initialises in seconds on a GPU).

    Linear weights ~ N(0, std), embeddings ~ N(0, embed_std or std) (a wider spread keeps a random
    model's top-2 logits apart, so bf16 rounding rarely flips a greedy token); norms at identity (zero
    for zero-centred norms); GDN ``A_log`` = log U(1, 16) (HF draws U(0, 16)) and ``dt_bias`` = 1; biases
    zero. Every GDN head then keeps under 0.3 of its state per token: fine for speed work, not a
    training init (``ocria.train.target.init_gdn_memory`` gives the heads long memory first).
    """
    zero_centred = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, ZeroCenteredRMSNorm)}
    for name, p in model.named_parameters():
        g = name_seeded(seed, name, p.device)
        kw = dict(device=p.device, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        if name in zero_centred or leaf == "bias":
            value = torch.zeros(p.shape, **kw)
        elif leaf == "A_log":
            value = torch.empty(p.shape, **kw).uniform_(1.0, 16.0, generator=g).log()
        elif leaf == "dt_bias" or "norm" in name:
            value = torch.ones(p.shape, **kw)
        elif "conv" in name:
            value = torch.randn(p.shape, generator=g, **kw) / math.sqrt(p.shape[-1])
        else:
            scale = embed_std if embed_std is not None and "embed_tokens" in name else std
            value = torch.randn(p.shape, generator=g, **kw) * scale
        p.copy_(value)
    return model
