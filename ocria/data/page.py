"""A laid-out page, before drawing: what to draw where, its Markdown truth and its scan artifacts.

Both layout modules (layout.py, compose.py) produce a ``Page``; render.py draws it. The artifact fields
after ``noise_seed`` default to none, which is how the classic pages are drawn.
"""

from dataclasses import dataclass, field
from functools import lru_cache

from PIL import ImageFont

from ocria.data.fonts import FONT_DIR


@dataclass(frozen=True)
class TextOp:
    """One string drawn with its left baseline at (x, y); ``bold``: thickened by a 1 px stroke."""

    x: int
    y: int
    text: str
    font: str
    size: int
    bold: bool


@dataclass(frozen=True)
class RuleOp:
    """A straight line (a table border or a rule) from (x0, y0) to (x1, y1), ``width`` pixels thick."""

    x0: int
    y0: int
    x1: int
    y1: int
    width: int = 1


@dataclass(frozen=True)
class BoxOp:
    """A filled rectangle (a shaded table row), ``shade`` levels darker than the paper."""

    x0: int
    y0: int
    x1: int
    y1: int
    shade: int


@dataclass
class Page:
    """A laid-out document: canvas size, what to draw, its Markdown, and the noise and artifacts to add."""

    width: int
    height: int
    kind: str
    markdown: str
    ink: int
    paper: int
    tint: tuple[float, float, float]
    noise_sigma: float
    blur: float
    noise_seed: int
    ops: list[TextOp | RuleOp | BoxOp] = field(default_factory=list)
    layout: str = "classic"  # the layout family (config.LAYOUT_FAMILIES)
    rotation: float = 0.0  # degrees, counter-clockwise, about the centre (the corners show paper)
    shading: float = 0.0  # uneven lighting: brightness falls linearly by up to this share across the page
    shading_angle: float = 0.0  # direction of that fall, radians
    jpeg_quality: int = 0  # 0: no JPEG round trip

    @property
    def fonts(self) -> frozenset[str]:
        """Every font file the page draws text with."""
        return frozenset(op.font for op in self.ops if isinstance(op, TextOp))


@lru_cache(maxsize=4096)
def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONT_DIR / name), size)


def text_width(text: str, name: str, size: int, bold: bool = False) -> int:
    return int(font(name, size).getlength(text)) + (2 if bold else 0)
