"""The typefaces synthetic pages are drawn with, and which of them training may use.

A family is held out whole (every style of it): pages of the "heldout" font split are drawn only with
families no training page ever uses, so their error rate measures reading type the model has not seen.
Files live in ``fonts/`` beside their licences (fonts/README.txt says where each comes from).
"""

from dataclasses import dataclass
from pathlib import Path

FONT_DIR = Path(__file__).parent / "fonts"
FONT_SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Typeface:
    """One typeface family: its files per style (None: drawn from the regular file, bold by a 1 px stroke)."""

    name: str
    regular: str
    bold: str | None = None
    italic: str | None = None
    bold_italic: str | None = None
    split: str = "train"

    def file(self, bold: bool, italic: bool) -> tuple[str, bool]:
        """(font file, whether bold must be drawn by stroking) for a style; italic falls back to upright."""
        if bold and italic and self.bold_italic:
            return self.bold_italic, False
        if italic and self.italic:
            return self.italic, bold
        if bold and self.bold:
            return self.bold, False
        return self.regular, bold

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.regular, self.bold, self.italic, self.bold_italic) if f)


TYPEFACES = (
    Typeface("DejaVu Sans", "DejaVuSans.ttf", bold="DejaVuSans-Bold.ttf"),
    Typeface("Liberation Sans", "LiberationSans-Regular.ttf"),
    Typeface("Liberation Serif", "LiberationSerif-Regular.ttf"),
    Typeface("Liberation Mono", "LiberationMono-Regular.ttf"),
    Typeface("STIX General", "STIXGeneral.ttf", bold="STIXGeneralBol.ttf", italic="STIXGeneralItalic.ttf",
           bold_italic="STIXGeneralBolIta.ttf"),
    Typeface("DejaVu Serif", "DejaVuSerif.ttf", bold="DejaVuSerif-Bold.ttf", italic="DejaVuSerif-Italic.ttf",
           split="heldout"),
    Typeface("DejaVu Sans Mono", "DejaVuSansMono.ttf", split="heldout"),
)


def typefaces(split: str) -> tuple[Typeface, ...]:
    """The typeface families of a font split ('train' or 'heldout')."""
    return tuple(f for f in TYPEFACES if f.split == split)


def split_files(split: str) -> frozenset[str]:
    """Every font file of a split's families."""
    return frozenset(name for f in typefaces(split) for name in f.files)
