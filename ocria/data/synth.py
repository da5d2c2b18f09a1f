"""Synthetic documents with ground-truth Markdown: one per seed, in disjoint train / calib / heldout seed ranges.

A split is a fixed range of seeds, so the held-out documents can never appear in training, whatever
`start` and `n` a caller asks for. A document's layout family is drawn from its config's (`SynthConfig.layouts`)
by its seed; its typefaces come from the config's font split only.
"""

import random
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image

from ocria.data.compose import FAMILY_KINDS, compose
from ocria.data.config import LAYOUT_WEIGHTS, SynthConfig
from ocria.data.layout import KINDS, layout
from ocria.data.page import Page
from ocria.data.render import render
from ocria.errors import OcriaError

SPLIT_SIZE = 1 << 30
SPLITS = {"train": 0, "calib": SPLIT_SIZE, "heldout": 2 * SPLIT_SIZE}
MAX_SYNTHETIC = 100_000
DEFAULT_CONFIG = SynthConfig()


@dataclass(frozen=True)
class Document:
    """A rendered page and the Markdown a perfect reader would write for it."""

    image: Image.Image
    markdown: str
    kind: str
    seed: int
    layout: str = "classic"  # its layout family
    fonts: frozenset[str] = frozenset()  # the font files its text is drawn with


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise OcriaError(f"unknown synthetic document kind {kind!r}; choose one of {', '.join(KINDS)}")


def lay_out(seed: int, kind: str | None = None, config: SynthConfig = DEFAULT_CONFIG) -> Page:
    """Document `seed` laid out, not drawn: its layout family is drawn from those of `config` that make `kind`
    (any, when None)."""
    _check_kind(kind)
    names = [f for f in config.layouts if kind is None or kind in (KINDS if f == "classic" else FAMILY_KINDS[f])]
    if not names:
        raise OcriaError(f"none of the layout families {', '.join(config.layouts)} makes {kind!r} documents")
    family = names[0] if len(names) == 1 else random.Random(f"ocria-layout:{seed}:{kind or 'any'}").choices(
        names, [LAYOUT_WEIGHTS[n] for n in names])[0]
    return layout(seed, kind, config) if family == "classic" else compose(seed, family, kind, config)


def generate(seed: int, kind: str | None = None, config: SynthConfig = DEFAULT_CONFIG) -> Document:
    """Document number `seed`; `kind` forces one of `KINDS`, None draws it from the seed."""
    page = lay_out(seed, kind, config)
    return Document(render(page), page.markdown, page.kind, seed, page.layout, page.fonts)


def markdown(seed: int, kind: str | None = None, config: SynthConfig = DEFAULT_CONFIG) -> str:
    """The ground truth of `generate(seed, kind, config)` without drawing it (fast: text corpora)."""
    return lay_out(seed, kind, config).markdown


def split_seeds(split: str, n: int, start: int = 0) -> range:
    """Seeds of documents `start .. start+n-1` of `split`; refuses ranges that leave the split."""
    if split not in SPLITS:
        raise OcriaError(f"unknown synthetic split {split!r}; choose one of {', '.join(SPLITS)}")
    if n < 0 or start < 0 or start + n > SPLIT_SIZE:
        raise OcriaError(f"synthetic {split} range start={start} n={n} is outside 0..{SPLIT_SIZE}")
    base = SPLITS[split] + start
    return range(base, base + n)


def dataset(
    split: str, n: int, start: int = 0, kind: str | None = None, config: SynthConfig = DEFAULT_CONFIG
) -> Iterator[Document]:
    """Documents `start .. start+n-1` of `split` ('train', 'calib' or 'heldout'), rendered lazily."""
    _check_kind(kind)
    for seed in split_seeds(split, n, start):
        yield generate(seed, kind, config)


def is_synthetic_spec(spec: str) -> bool:
    """True when a calibration/data argument names the generator (`synthetic:N`) rather than a path."""
    return spec.split(":", 1)[0].strip().lower() == "synthetic"


def parse_synthetic_spec(spec: str) -> int:
    """N from `synthetic:N` (1 <= N <= 100000); anything else is a one-line OcriaError."""
    prefix, _, count = spec.partition(":")
    if prefix.strip().lower() != "synthetic" or not count.strip().isdigit():
        raise OcriaError(f"bad synthetic data spec {spec!r}: expected 'synthetic:N' with N a positive integer")
    n = int(count)
    if not 1 <= n <= MAX_SYNTHETIC:
        raise OcriaError(f"bad synthetic data spec {spec!r}: N must be between 1 and {MAX_SYNTHETIC}")
    return n


def synthetic_set(spec: str, config: SynthConfig = DEFAULT_CONFIG) -> list[Document]:
    """The calibration set named by `synthetic:N`: the first N documents of the 'calib' split."""
    return list(dataset("calib", parse_synthetic_spec(spec), config=config))
