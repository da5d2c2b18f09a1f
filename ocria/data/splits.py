"""The evaluation splits: pages no training batch holds, each measuring one kind of reading.

The synthetic splits use the held-out seed range, so none of their pages is a training page; the font and
layout splits use typefaces and a layout family that training never draws (``READING`` excludes them);
the independent splits come from eval_render.py, which shares no code with the training generator.
"""

import random
from dataclasses import replace

from PIL import Image

from ocria.data.config import HELDOUT_LAYOUTS, READING, SynthConfig
from ocria.data.eval_render import independent_page
from ocria.data.synth import DEFAULT_CONFIG, generate, split_seeds
from ocria.errors import OcriaError

EVAL_SPLITS = {
    "synthetic": "the training mixture on held-out seeds (in distribution)",
    "heldout_fonts": "the training layouts drawn only in the held-out typeface families",
    "heldout_layout": "the held-out layout family (every block centered) in training typefaces",
    "independent": "pages of the independent renderer (eval_render.py): other layout, text and drawing code",
    "realistic": "the independent renderer's pages as 1-4 megapixel scans (resized to the engine's budget)",
    "classic": "the classic generator's held-out pages (what the first shipped pair was trained on)",
}
SYNTHETIC_CONFIGS: dict[str, SynthConfig] = {
    "synthetic": READING,
    "heldout_fonts": replace(READING, fonts="heldout"),
    "heldout_layout": replace(READING, layouts=HELDOUT_LAYOUTS),
    "classic": DEFAULT_CONFIG,
}


def check_splits(names: list[str]) -> list[str]:
    """``names`` if every one is an evaluation split; else a one-line OcriaError naming the bad one."""
    for name in names:
        if name not in EVAL_SPLITS:
            raise OcriaError(f"unknown evaluation split {name!r}; choose from {', '.join(EVAL_SPLITS)}")
    return names


def eval_pages(split: str, n: int, start: int = 0) -> list[tuple[Image.Image, str]]:
    """Pages ``start .. start+n-1`` of an evaluation split, as (RGB image, Markdown truth)."""
    check_splits([split])
    if split in SYNTHETIC_CONFIGS:
        docs = [generate(s, None, SYNTHETIC_CONFIGS[split]) for s in split_seeds("heldout", n, start)]
        return [(d.image, d.markdown) for d in docs]
    pages = []
    for i in range(start, start + n):
        mp = random.Random(f"ocria-realistic:{i}").uniform(1.0, 4.0) if split == "realistic" else None
        page = independent_page(i, mp)
        pages.append((page.image, page.markdown))
    return pages
