"""AdamW over flat per-group buffers with bf16 moments, and a warmup + cosine learning-rate schedule.

Why bf16 moments: the resumable state must travel back and forth in files of at most 16 MiB and
64 MiB per transfer, so it is 8 bytes per parameter (fp32 weight + two bf16 moments) instead of
12. Each step reads the stored (rounded) moments, so a resumed run continues bit-identically.
With beta2 = 0.95 the second moment's decay (5% a step) stays far above bf16's resolution (0.4%).
Flat buffers keep the step to a few kernels whatever the number of tensors. The schedule is a pure
function of the step, so it needs no state.
"""

import math

import torch
from torch import Tensor, nn


class FlatAdamW:
    """Decoupled weight decay on matrices (linear, conv, embedding), none on norms, biases, GDN gates."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8):
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        plain = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
        self.betas, self.eps, self.steps = betas, eps, 0
        self.param_groups = []
        for params, wd in ((decay, weight_decay), (plain, 0.0)):
            if params:
                n = sum(p.numel() for p in params)
                zeros = dict(dtype=torch.bfloat16, device=params[0].device)
                self.param_groups.append({"params": params, "weight_decay": wd, "lr": lr,
                                          "exp_avg": torch.zeros(n, **zeros), "exp_avg_sq": torch.zeros(n, **zeros)})

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self, apply: Tensor | None = None) -> None:
        """One update. ``apply``, a bool scalar on the device: where False (a non-finite gradient) weights and
        moments stay as they were, decided on the GPU, so the host never waits for the gradient norm; the
        step still counts for the bias correction."""
        self.steps += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.steps, 1 - b2**self.steps
        for group in self.param_groups:
            params = group["params"]
            grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                              for p in params])
            m = group["exp_avg"].float().mul_(b1).add_(grad, alpha=1 - b1)
            v = group["exp_avg_sq"].float().mul_(b2).addcmul_(grad, grad, value=1 - b2)
            if apply is not None:
                m = torch.where(apply, m, group["exp_avg"].float())
                v = torch.where(apply, v, group["exp_avg_sq"].float())
            group["exp_avg"].copy_(m)
            group["exp_avg_sq"].copy_(v)
            update = (m / c1).div_(v.div_(c2).sqrt_().add_(self.eps))
            decay = 1 - group["lr"] * group["weight_decay"]
            if apply is not None:
                update = torch.where(apply, update, 0.0)
                decay = torch.where(apply, decay, 1.0)
            if group["weight_decay"]:
                torch._foreach_mul_(params, decay)
            parts = [u.view_as(p) for u, p in zip(update.split([p.numel() for p in params]), params)]
            torch._foreach_add_(params, parts, alpha=-group["lr"])

    def state_tensors(self, prefix: str) -> dict[str, Tensor]:
        out = {f"{prefix}.steps": torch.tensor([self.steps], dtype=torch.int64)}
        for i, group in enumerate(self.param_groups):
            out[f"{prefix}.{i}.exp_avg"] = group["exp_avg"]
            out[f"{prefix}.{i}.exp_avg_sq"] = group["exp_avg_sq"]
        return out

    def load_state_tensors(self, prefix: str, tensors: dict[str, Tensor]) -> None:
        self.steps = int(tensors[f"{prefix}.steps"][0])
        for i, group in enumerate(self.param_groups):
            for key in ("exp_avg", "exp_avg_sq"):
                group[key].copy_(tensors[f"{prefix}.{i}.{key}"])


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.05) -> float:
    """Linear warmup to ``peak``, then cosine down to ``floor * peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(opt: FlatAdamW, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
