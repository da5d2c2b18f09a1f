"""Synthetic printed documents with ground-truth Markdown, for training, calibration and evaluation."""

from ocria.data.config import LAYOUT_FAMILIES, LONG_PAGE, READING, SynthConfig
from ocria.data.layout import KINDS
from ocria.data.synth import (
    SPLITS,
    Document,
    dataset,
    generate,
    is_synthetic_spec,
    markdown,
    parse_synthetic_spec,
    split_seeds,
    synthetic_set,
)

__all__ = [
    "KINDS", "LAYOUT_FAMILIES", "LONG_PAGE", "READING", "SPLITS", "Document", "SynthConfig", "dataset", "generate",
    "is_synthetic_spec", "markdown", "parse_synthetic_spec", "split_seeds", "synthetic_set",
]
