"""Draw a laid-out `Page` into an RGB image: text, rules and shaded boxes, then the scan's artifacts (rotation,
blur, uneven lighting, noise, paper tint, JPEG compression), each only when the page asks for it."""

import io
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from ocria.data.page import BoxOp, Page, RuleOp, TextOp, font


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
            draw.line([(op.x0, op.y0), (op.x1, op.y1)], fill=page.ink, width=op.width)
        elif isinstance(op, BoxOp):
            draw.rectangle([op.x0, op.y0, op.x1, op.y1], fill=max(0, page.paper - op.shade))
    if page.rotation:
        img = img.rotate(page.rotation, resample=Image.Resampling.BICUBIC, fillcolor=page.paper)
    if page.blur > 0:
        img = img.filter(ImageFilter.GaussianBlur(page.blur))
    gray = np.asarray(img, dtype=np.float32)
    if page.shading:
        gray = gray * _lighting(page)
    if page.noise_sigma:  # (adding zero noise would change no pixel)
        gray = gray + np.random.default_rng(page.noise_seed).normal(0.0, page.noise_sigma, gray.shape).astype(
            np.float32)
    channels: dict[float, np.ndarray] = {}  # one array per distinct tint factor (white paper: one for all three)
    for t in page.tint:
        if t not in channels:
            channels[t] = np.clip(np.rint(gray * np.float32(t)), 0, 255).astype(np.uint8)
    out = Image.fromarray(np.stack([channels[t] for t in page.tint], axis=-1))
    return _jpeg(out, page.jpeg_quality) if page.jpeg_quality else out


def _lighting(page: Page) -> np.ndarray:
    """[H, W] brightness factors: 1 on the lit side, falling linearly to 1 - shading across the page."""
    xs = np.linspace(0.0, 1.0, page.width, dtype=np.float32) * math.cos(page.shading_angle)
    ys = np.linspace(0.0, 1.0, page.height, dtype=np.float32) * math.sin(page.shading_angle)
    u = ys[:, None] + xs[None, :]
    u = (u - u.min()) / max(float(u.max() - u.min()), 1e-6)
    return 1.0 - np.float32(page.shading) * u


def _jpeg(img: Image.Image, quality: int) -> Image.Image:
    """``img`` after a JPEG round trip at ``quality`` (its block artifacts and ringing)."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    return Image.open(buf).convert("RGB")
