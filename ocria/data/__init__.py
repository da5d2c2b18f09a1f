"""Synthetic printed documents with ground-truth Markdown, for training, calibration and evaluation."""

from ocria.data.layout import KINDS, LONG_PAGE, SynthConfig
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
    "KINDS", "LONG_PAGE", "SPLITS", "Document", "SynthConfig", "dataset", "generate", "is_synthetic_spec",
    "markdown", "parse_synthetic_spec", "split_seeds", "synthetic_set",
]
