"""AdamW with decoupled weight decay on matrices only, and a warmup + cosine learning-rate schedule.

The schedule is a pure function of the step, so a resumed run needs no scheduler state.
"""

import math

import torch
from torch import nn


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """Matrices (linear, conv, embedding) decay; norms, biases and GDN gate parameters do not."""
    decay, plain = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else plain).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.05) -> float:
    """Linear warmup to ``peak``, then cosine down to ``floor * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
