"""Synthetic documents with ground-truth Markdown: one per seed, in disjoint train / calib / heldout seed ranges.

A split is a fixed range of seeds, so the held-out documents can never appear in training, whatever
`start` and `n` a caller asks for.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image

from ocria.data.layout import KINDS, SynthConfig, layout
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


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise OcriaError(f"unknown synthetic document kind {kind!r}; choose one of {', '.join(KINDS)}")


def generate(seed: int, kind: str | None = None, config: SynthConfig = DEFAULT_CONFIG) -> Document:
    """Document number `seed`; `kind` forces one of `KINDS`, None draws it from the seed."""
    _check_kind(kind)
    page = layout(seed, kind, config)
    return Document(render(page), page.markdown, page.kind, seed)


def markdown(seed: int, kind: str | None = None, config: SynthConfig = DEFAULT_CONFIG) -> str:
    """The ground truth of `generate(seed, kind, config)` without drawing it (fast: text corpora)."""
    _check_kind(kind)
    return layout(seed, kind, config).markdown


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
