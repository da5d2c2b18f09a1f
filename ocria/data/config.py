"""What a synthetic page may look like: sizes, layout families, font split and scan artifacts.

``SynthConfig()`` is the classic generator (layout.py), kept byte-identical: the shipped tokenizer was fitted
to it, the examples in ``examples/`` are its pages and calibration and the GPU benchmarks read it.
``READING`` is the training mixture (compose.py): every layout family but the held-out one, broad text,
many typefaces, scan artifacts and pages over the engine's pixel budget.
"""

from dataclasses import dataclass

from ocria.data.fonts import FONT_SPLITS
from ocria.errors import ConfigError

ALIGN = 32  # patch 16 x spatial merge 2: classic image sides are multiples of this
# Layout families. "classic" is layout.py; the others are compose.py's. "centered" is held out of training.
LAYOUT_FAMILIES = ("classic", "plain", "columns", "letter", "form", "centered")
TRAIN_LAYOUTS = ("classic", "plain", "columns", "letter", "form")
HELDOUT_LAYOUTS = ("centered",)
# Relative share of each family in a mixture (normalised over the config's families).
LAYOUT_WEIGHTS = {"classic": 0.1, "plain": 0.46, "columns": 0.12, "letter": 0.16, "form": 0.16, "centered": 1.0}


@dataclass(frozen=True)
class SynthConfig:
    """Size knobs, layout families and artifacts. The defaults are the classic generator: small pages
    (<= 256 image tokens), a few lines of text, four typefaces, no scan artifacts but light noise."""

    min_width: int = 256
    max_width: int = 512
    max_height: int = 512
    max_paragraph_lines: int = 4
    max_list_items: int = 4
    max_table_rows: int = 4
    max_table_cols: int = 3
    max_blocks: int = 3
    # Text at scan resolution (a 10-12 pt font at ~200 dpi): one text line per 32-pixel row of image
    # tokens and ~2-3 characters per 16-pixel patch, the density at which a small vision encoder learns
    # to read (13-20 px text puts ~5 characters and two lines in each image token).
    min_font_px: int = 24
    max_font_px: int = 32
    max_noise: float = 6.0  # std of the Gaussian pixel noise is drawn from [0, max_noise] (0..255 scale)
    layouts: tuple[str, ...] = ("classic",)  # the layout families pages are drawn from (LAYOUT_FAMILIES)
    fonts: str = "train"  # the font split (fonts.py): 'train' or 'heldout'
    # The next four apply to compose.py's families only.
    max_scale: float = 1.0  # a page may be drawn up to this many times larger (the processor shrinks it back)
    max_rotation: float = 0.0  # degrees either way
    jpeg_share: float = 0.0  # share of pages saved through JPEG (quality 35-90) and decoded again
    max_chars: int = 520  # Markdown characters a page stops at (its answer stays within ~384 tokens)

    def __post_init__(self) -> None:
        sides = (self.min_width, self.max_width, self.max_height)
        if any(v % ALIGN for v in sides) or self.min_width < 256 or self.max_width < self.min_width:
            raise ConfigError(f"synthetic page widths must be multiples of {ALIGN}, >= 256 and min <= max: {sides}")
        if self.max_height < 128 or not 8 <= self.min_font_px <= self.max_font_px <= 48:
            raise ConfigError("synthetic pages need max_height >= 128 and 8 <= min_font_px <= max_font_px <= 48")
        if not 2 <= self.max_table_cols <= 4:
            raise ConfigError(f"synthetic tables have 2 to 4 columns, got max_table_cols={self.max_table_cols}")
        bad = [f for f in self.layouts if f not in LAYOUT_FAMILIES]
        if not self.layouts or bad or len(set(self.layouts)) != len(self.layouts):
            raise ConfigError(f"synthetic layouts must be distinct names from {', '.join(LAYOUT_FAMILIES)}, "
                              f"got {self.layouts}")
        if self.fonts not in FONT_SPLITS:
            raise ConfigError(f"synthetic font split must be one of {', '.join(FONT_SPLITS)}, got {self.fonts!r}")
        if not (1.0 <= self.max_scale <= 3.0 and 0.0 <= self.max_rotation <= 5.0 and 0.0 <= self.jpeg_share <= 1.0
                and self.max_chars >= 40):
            raise ConfigError("synthetic artifacts need 1 <= max_scale <= 3, 0 <= max_rotation <= 5, "
                              "0 <= jpeg_share <= 1 and max_chars >= 40")


# The benchmarks' long document: dense 13-20 px text, the prompt the GPU benchmarks measure on.
LONG_PAGE = SynthConfig(
    min_width=512, max_width=768, max_height=1024, max_paragraph_lines=10, max_list_items=8,
    max_table_rows=8, max_table_cols=4, max_blocks=6, min_font_px=13, max_font_px=20,
)

# The training mixture: 20-34 px text (a page drawn larger is shrunk back to the pixel budget), light noise,
# blur, tints, small rotations and JPEG artifacts.
READING = SynthConfig(layouts=TRAIN_LAYOUTS, min_font_px=20, max_font_px=34, max_noise=8.0, max_scale=2.0,
                      max_rotation=1.5, jpeg_share=0.3)
