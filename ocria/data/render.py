"""Draw a laid-out `Page` into an RGB image: text, table rules, paper tint, light blur and noise."""

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ocria.data.layout import Page, RuleOp, TextOp, font


def render(page: Page) -> Image.Image:
    """Pixels of `page`; deterministic because every random choice was made in the layout."""
    img = Image.new("L", (page.width, page.height), color=page.paper)
    draw = ImageDraw.Draw(img)
    for op in page.ops:
        if isinstance(op, TextOp):
            draw.text(
                (op.x, op.y), op.text, font=font(op.font, op.size), fill=page.ink, anchor="ls",
                stroke_width=1 if op.bold else 0, stroke_fill=page.ink,
            )
        elif isinstance(op, RuleOp):
            draw.line([(op.x0, op.y0), (op.x1, op.y1)], fill=page.ink, width=1)
    if page.blur > 0:
        img = img.filter(ImageFilter.GaussianBlur(page.blur))
    gray = np.asarray(img, dtype=np.float32)
    noise = np.random.default_rng(page.noise_seed).normal(0.0, page.noise_sigma, gray.shape).astype(np.float32)
    rgb = (gray + noise)[..., None] * np.asarray(page.tint, dtype=np.float32)
    return Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8))
