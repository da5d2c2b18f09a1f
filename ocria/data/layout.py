"""Lay out a classic synthetic document: choose its text and style, place every line, and derive its Markdown.

The Markdown is built from what is placed on the page (after wrapping and truncation to fit), so the
ground truth always matches the pixels. Drawing happens in `render.py`; this module only measures.
This is the generator the shipped tokenizer and examples come from; it stays byte-identical
(compose.py lays out the other families).
"""

import random

from ocria.data import words
from ocria.data.config import ALIGN, SynthConfig
from ocria.data.fonts import typefaces
from ocria.data.page import Page, RuleOp, TextOp, font, text_width

FONTS = ("DejaVuSans.ttf", "LiberationSans-Regular.ttf", "LiberationSerif-Regular.ttf", "LiberationMono-Regular.ttf")
KINDS = ("line", "paragraph", "heading", "list", "table", "page")
KIND_WEIGHTS = (0.15, 0.2, 0.2, 0.15, 0.15, 0.15)


class _Cursor:
    """Places blocks top to bottom and refuses lines that would cross the bottom margin."""

    def __init__(self, rng: random.Random, width: int, max_height: int, margin: int, face: str, size: int):
        self.rng, self.face, self.size = rng, face, size
        self.left, self.right = margin, width - margin
        self.bottom = max_height - margin
        self.y = margin
        self.spacing = rng.uniform(1.2, 1.5)
        self.ops: list[TextOp | RuleOp] = []
        self.blocks: list[str] = []

    @property
    def avail(self) -> int:
        return self.right - self.left

    def line_height(self, size: int) -> int:
        return int(round(size * self.spacing))

    def fits(self, size: int, n_lines: int = 1) -> bool:
        return self.y + n_lines * self.line_height(size) <= self.bottom

    def put(self, x: int, text: str, size: int, bold: bool = False) -> None:
        ascent, _ = font(self.face, size).getmetrics()
        self.ops.append(TextOp(x, self.y + ascent, text, self.face, size, bold))

    def gap(self) -> None:
        self.y += int(self.size * self.rng.uniform(0.5, 1.0))

    def fit_words(self, ws: list[str], size: int, width: int, bold: bool = False) -> list[str]:
        """The longest prefix of `ws` that fits on one line of `width` pixels."""
        while ws and text_width(" ".join(ws), self.face, size, bold) > width:
            ws = ws[:-1]
        return ws

    def heading(self, text: str, level: int) -> bool:
        size = int(round(self.size * (1.6 if level == 1 else 1.3)))
        bold = self.rng.random() < 0.5
        ws = self.fit_words(text.split(), size, self.avail, bold)
        if not ws or not self.fits(size):
            return False
        self.put(self.left, " ".join(ws), size, bold)
        self.y += self.line_height(size)
        self.blocks.append("#" * level + " " + " ".join(ws))
        return True

    def paragraph(self, text: str, max_lines: int) -> bool:
        lines: list[list[str]] = [[]]
        for w in text.split():
            if text_width(w, self.face, self.size) > self.avail:
                continue
            if lines[-1] and text_width(" ".join(lines[-1] + [w]), self.face, self.size) > self.avail:
                if len(lines) == max_lines or not self.fits(self.size, len(lines) + 1):
                    break
                lines.append([])
            lines[-1].append(w)
        if not lines[0] or not self.fits(self.size, len(lines)):
            return False
        for ws in lines:
            self.put(self.left, " ".join(ws), self.size)
            self.y += self.line_height(self.size)
        self.blocks.append(" ".join(" ".join(ws) for ws in lines))
        return True

    def bullet_list(self, items: list[str], ordered: bool) -> bool:
        marker = self.rng.choice(["\u2022", "-", "\u2013"])
        indent = text_width("00. ", self.face, self.size)
        out = []
        for i, item in enumerate(items, 1):
            if not self.fits(self.size):
                break
            room = self.avail - indent
            fitting = [w for w in item.split() if text_width(w, self.face, self.size) <= room]
            ws = self.fit_words(fitting, self.size, room)
            if not ws:
                continue  # a narrow page at a large font: no word of this item fits beside the marker
            shown = f"{i}." if ordered else marker
            self.put(self.left + indent - text_width(shown + " ", self.face, self.size), shown, self.size)
            self.put(self.left + indent, " ".join(ws), self.size)
            self.y += self.line_height(self.size)
            out.append((f"{i}. " if ordered else "- ") + " ".join(ws))
        if not out:
            return False
        self.blocks.append("\n".join(out))
        return True

    def table_fit(self, header: list[str], rows: list[list[str]]) -> tuple[int, int, list[int]]:
        """(font size, columns, column widths) of the widest table that fits: columns are dropped from
        the right; when not even one fits, the font shrinks 2 px at a time (as far as 8 px)."""
        size = self.size
        while True:
            pad = max(4, size // 3)
            for cols in range(len(header), 0, -1):
                widths = [max(text_width(r[c], self.face, size, bold=(r is header)) for r in [header] + rows)
                          + 2 * pad for c in range(cols)]
                if sum(widths) <= self.avail:
                    return size, cols, widths
            if size <= 8:
                return size, 1, widths
            size = max(8, size - 2)

    def table(self, header: list[str], rows: list[list[str]]) -> bool:
        borders = self.rng.choice(["grid", "rules", "none"])
        size, cols, widths = self.table_fit(header, rows)
        pad = max(4, size // 3)
        header, rows = header[:cols], [r[:cols] for r in rows]
        if sum(widths) > self.avail:
            return False
        row_h = self.line_height(size) + pad
        n_rows = 1 + len(rows)
        while n_rows > 1 and self.y + n_rows * row_h > self.bottom:
            n_rows -= 1
        if n_rows < 2:
            return False
        rows = rows[: n_rows - 1]
        top, x_edges = self.y, [self.left]
        for w in widths:
            x_edges.append(x_edges[-1] + w)
        ascent, descent = font(self.face, size).getmetrics()
        for r, cells in enumerate([header] + rows):
            y0 = top + r * row_h
            base = y0 + (row_h - ascent - descent) // 2 + ascent
            for c, text in enumerate(cells):
                self.ops.append(TextOp(x_edges[c] + pad, base, text, self.face, size, r == 0))
        y_end = top + n_rows * row_h
        if borders == "grid":
            for r in range(n_rows + 1):
                self.ops.append(RuleOp(x_edges[0], top + r * row_h, x_edges[-1], top + r * row_h))
            for x in x_edges:
                self.ops.append(RuleOp(x, top, x, y_end))
        elif borders == "rules":
            for y in (top, top + row_h, y_end):
                self.ops.append(RuleOp(x_edges[0], y, x_edges[-1], y))
        self.y = y_end + 2
        lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * cols]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        self.blocks.append("\n".join(lines))
        return True


def _table_content(rng: random.Random, cfg: SynthConfig) -> tuple[list[str], list[list[str]]]:
    n_cols = rng.randint(2, max(2, cfg.max_table_cols))
    kinds = [rng.choice(["word", "name", "code"])] + [
        rng.choice(["word", "date", "money", "number", "code"]) for _ in range(n_cols - 1)
    ]
    header: list[str] = []
    for k in kinds:
        header.append(rng.choice([h for h in words.COLUMN_HEADERS[k] if h not in header]))
    rows = [[words.cell(rng, k) for k in kinds] for _ in range(rng.randint(1, max(1, cfg.max_table_rows)))]
    return header, rows


def _paragraph_text(rng: random.Random, cfg: SynthConfig) -> str:
    return " ".join(words.sentence(rng) for _ in range(cfg.max_paragraph_lines + 1))


def _list_block(cur: _Cursor, rng: random.Random, cfg: SynthConfig) -> bool:
    items = [words.list_item(rng) for _ in range(rng.randint(2, max(2, cfg.max_list_items)))]
    return cur.bullet_list(items, ordered=rng.random() < 0.35)


def _fill(cur: _Cursor, rng: random.Random, kind: str, cfg: SynthConfig) -> None:
    """Add the blocks of one document kind; later blocks are skipped when the page is full."""
    if kind == "line":
        cur.paragraph(words.sentence(rng, rng.randint(3, 9)) if rng.random() < 0.7 else words.list_item(rng), 1)
    elif kind == "paragraph":
        cur.paragraph(_paragraph_text(rng, cfg), rng.randint(2, max(2, cfg.max_paragraph_lines)))
    elif kind == "heading":
        cur.heading(words.title(rng), rng.choice([1, 1, 2]))
        cur.gap()
        cur.paragraph(_paragraph_text(rng, cfg), rng.randint(1, cfg.max_paragraph_lines))
    elif kind == "list":
        if rng.random() < 0.5:
            cur.heading(words.title(rng), 2)
            cur.gap()
        _list_block(cur, rng, cfg)
    elif kind == "table":
        if rng.random() < 0.4:
            cur.heading(words.title(rng), 2)
            cur.gap()
        cur.table(*_table_content(rng, cfg))
    else:
        cur.heading(words.title(rng), 1)
        for _ in range(rng.randint(2, max(2, cfg.max_blocks))):
            cur.gap()
            block = rng.choice(["paragraph", "paragraph", "list", "table", "subheading"])
            if block == "paragraph":
                cur.paragraph(_paragraph_text(rng, cfg), rng.randint(1, cfg.max_paragraph_lines))
            elif block == "list":
                _list_block(cur, rng, cfg)
            elif block == "table":
                cur.table(*_table_content(rng, cfg))
            else:
                cur.heading(words.title(rng), 2)


def _faces(split: str) -> tuple[str, ...]:
    """The classic pages' font files: its own four (all in the train split), or the held-out families' regular
    files."""
    return FONTS if split == "train" else tuple(t.regular for t in typefaces(split))


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(seed: int, kind: str | None, cfg: SynthConfig) -> Page:
    """Choose everything about document `seed` and place it; deterministic in (seed, kind, cfg)."""
    rng = random.Random(f"ocria-synth:{seed}:{kind or 'any'}")
    kind = kind if kind is not None else rng.choices(KINDS, KIND_WEIGHTS)[0]
    width = rng.randrange(_round_up(cfg.min_width), cfg.max_width + 1, ALIGN)
    face = rng.choice(_faces(cfg.fonts))
    size = rng.randint(cfg.min_font_px, cfg.max_font_px)
    margin = rng.randint(8, 24)
    cur = _Cursor(rng, width, cfg.max_height, margin, face, size)
    _fill(cur, rng, kind, cfg)
    if not cur.blocks:
        raise RuntimeError(f"synthetic document {seed} ({kind}) laid out nothing: the config checks missed a case")
    height = min(cfg.max_height, max(2 * ALIGN, _round_up(cur.y + margin)))
    return Page(
        width=width,
        height=height,
        kind=kind,
        markdown="\n\n".join(cur.blocks),
        ink=rng.randint(0, 60),
        paper=rng.randint(225, 255),
        tint=(1.0, rng.uniform(0.96, 1.0), rng.uniform(0.9, 1.0)),
        noise_sigma=rng.uniform(0.0, cfg.max_noise),
        blur=rng.choice([0.0, 0.0, 0.0, rng.uniform(0.3, 0.6)]),
        noise_seed=rng.getrandbits(63),
        ops=cur.ops,
    )
