"""Target training: teacher forcing on prompt + Markdown answer, cross-entropy on the answer tokens only."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ocria.models import OCRiaConfig, OCRiaForConditionalGeneration
from ocria.models.gdn import GatedDeltaNet
from ocria.models.init import name_seeded, random_init
from ocria.plugins.policy import REFERENCE
from ocria.train.data import IGNORE, Batch

DT_RANGE = (1e-3, 0.1)  # per-head step size softplus(dt_bias) at init, log-uniform


@torch.no_grad()
def init_gdn_memory(model: torch.nn.Module, seed: int, dt_range: tuple[float, float] = DT_RANGE) -> None:
    """Give every GDN head a long memory at init: ``dt_bias = softplus^-1(dt)``, dt log-uniform in ``dt_range``.

    Why: a GDN head forgets at ``exp(g)`` per token with ``g = -exp(A_log) * softplus(a + dt_bias)``.
    The engine's random weights (``dt_bias = 1``, ``A`` in [1, 16]) give ``g <= -1.3``: every head
    keeps at most ~1 token, so the prompt text after the image (~40 tokens) wipes the image out of
    all GDN states and only the 2 attention layers of ocria-mini can carry it to the answer. With dt
    in [1e-3, 0.1] (the Mamba2 / flash-linear-attention training init) ``-g`` spans ~[1e-3, 1.6]:
    heads remember from ~1 to ~1000 tokens, and training picks the spans it needs.
    """
    lo, hi = math.log(dt_range[0]), math.log(dt_range[1])
    for name, module in model.named_modules():
        if isinstance(module, GatedDeltaNet):
            g = name_seeded(seed, name)
            dt = torch.exp(torch.rand(module.dt_bias.shape, generator=g, dtype=torch.float64) * (hi - lo) + lo)
            inverse_softplus = dt + torch.log(-torch.expm1(-dt))
            module.dt_bias.copy_(inverse_softplus.to(module.dt_bias.dtype))


def build_target(target_cfg: dict, seed: int) -> OCRiaForConditionalGeneration:
    """Seeded random init (the builder's ``random_init``) with long-memory GDN heads, trainable, tied head
    bound. Its forwards run under ``REFERENCE``: autograd needs the references (the kernels have no backward), and
    no-grad diagnostics then match training."""
    model = random_init(OCRiaForConditionalGeneration(OCRiaConfig.from_dict(target_cfg)), seed)
    init_gdn_memory(model, seed)
    model.tie_weights()
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


def target_loss(model: OCRiaForConditionalGeneration, batch: Batch) -> Tensor:
    """Mean next-token cross-entropy over answer positions. fp32 logits at every position: with a vocabulary of
    hundreds that is cheap, and selecting the answer positions first (a boolean index) would stop the host
    until the GPU had run the whole forward."""
    embeds = model.embed(batch.input_ids, batch.pixel_values, batch.image_grid_thw)
    hidden, _ = model.text(embeds, batch.positions, policy=REFERENCE)
    return F.cross_entropy(model.logits(hidden, REFERENCE).flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def image_reliance(model: OCRiaForConditionalGeneration, own: Batch, swapped: Batch) -> float:
    """Answer loss with another document's image minus with its own (``data.image_swap_pair``), in nats
    per token: near 0 means the model transcribes from its language prior alone (image-blind)."""
    was_training = model.training
    model.eval()
    gap = (target_loss(model, swapped) - target_loss(model, own)).item()
    model.train(was_training)
    return gap
