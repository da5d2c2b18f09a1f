"""Target training: teacher forcing on prompt + Markdown answer, cross-entropy on the answer tokens only."""

import torch.nn.functional as F
from torch import Tensor

from ocria.models import OCRiaConfig, OCRiaForConditionalGeneration
from ocria.models.init import random_init
from ocria.train.data import IGNORE, Batch


def build_target(target_cfg: dict, seed: int) -> OCRiaForConditionalGeneration:
    """Seeded random init (the builder's ``random_init``), trainable, tied head bound."""
    model = random_init(OCRiaForConditionalGeneration(OCRiaConfig.from_dict(target_cfg)), seed)
    model.tie_weights()
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


def target_loss(model: OCRiaForConditionalGeneration, batch: Batch) -> Tensor:
    """Mean next-token cross-entropy over answer positions (fp32 logits on those positions only)."""
    embeds = model.embed(batch.input_ids, batch.pixel_values, batch.image_grid_thw)
    hidden, _ = model.text(embeds, batch.positions)
    keep = batch.labels != IGNORE
    return F.cross_entropy(model.logits(hidden[keep]), batch.labels[keep])
