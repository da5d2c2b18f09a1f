"""Lay out a page of one of the reading families (every layout family but "classic", which is layout.py's).

Families: "plain" (one column of headings, paragraphs, lists, tables and key-value lines; every kind),
"columns" (a heading over text flowing through two columns), "letter" (a memo: header lines, a rule,
paragraphs, a closing), "form" (an invoice: title, key-value lines, an item table, totals) and "centered"
(every block centered; held out of training). Within a family, a page draws its own style: typefaces and
weights, size, line spacing, margins, alignment (left, justified, right), heading form, list markers, table
rules and shading, and its scan artifacts.

The Markdown is built from what is placed (wrapped lines joined by a space, words that fit), so the truth
is exactly the page's text: headings ``#``/``##``, lists ``- `` / ``N.`` / ``N)``, tables ``| a | b |`` with a
``| --- |`` row, key-value lines ``Key: value`` one per line, blocks separated by a blank line.
"""

import math
import random
from dataclasses import dataclass

from ocria.data import text
from ocria.data.config import SynthConfig
from ocria.data.fonts import Typeface, typefaces
from ocria.data.layout import KINDS
from ocria.data.page import BoxOp, Page, RuleOp, TextOp, font, text_width

FAMILY_KINDS = {"plain": KINDS, "centered": KINDS, "columns": ("page",), "letter": ("page",), "form": ("page",)}
KIND_WEIGHTS = {"line": 0.14, "paragraph": 0.16, "heading": 0.16, "list": 0.16, "table": 0.16, "page": 0.22}
NUMERIC = ("money", "number", "quantity")


@dataclass(frozen=True)
class Style:
    """A page's typographic choices."""

    body_align: str  # left, justify, right or center
    heading_align: str  # left, center or right
    heading_upper: bool
    heading_rule: bool  # a rule under level-1 headings
    heading_bold: bool
    heading_scale: float  # level-1 size over the body size; level 2 is half-way to 1
    indent_first: bool  # paragraphs' first lines indented
    italic_share: float  # share of paragraphs set in italic
    list_marker: str  # the unordered lists' marker
    ordered_suffix: str  # "." or ")"
    kv_layout: str  # inline ("Key: value"), tab (values aligned) or right (values flush right)
    kv_bold_keys: bool
    table_borders: str  # grid, rules, header, box or none
    table_shade: str  # none, header or zebra
    table_right_numbers: bool  # numeric columns flush right


def draw_style(rng: random.Random, family: str) -> Style:
    centered = family == "centered"
    return Style(
        body_align="center" if centered else rng.choices(["left", "justify", "right"], [0.62, 0.33, 0.05])[0],
        heading_align="center" if centered else rng.choices(["left", "center", "right"], [0.65, 0.3, 0.05])[0],
        heading_upper=rng.random() < 0.2,
        heading_rule=rng.random() < 0.2,
        heading_bold=rng.random() < 0.75,
        heading_scale=rng.uniform(1.15, 1.8),
        indent_first=not centered and rng.random() < 0.2,
        italic_share=rng.choice([0.0, 0.0, 0.15, 0.5]),
        list_marker=rng.choice(["•", "•", "-", "–", "·", "›", "*", "»"]),
        ordered_suffix=rng.choice([".", ".", ".", ")"]),
        kv_layout="inline" if centered else rng.choice(["inline", "tab", "right"]),
        kv_bold_keys=rng.random() < 0.4,
        table_borders=rng.choice(["grid", "rules", "header", "box", "none"]),
        table_shade=rng.choice(["none", "none", "header", "zebra"]),
        table_right_numbers=rng.random() < 0.5,
    )


class Writer:
    """Places blocks top to bottom (through the columns, if any) and records each block's Markdown."""

    def __init__(self, rng: random.Random, cfg: SynthConfig, style: Style, body: Typeface, head: Typeface,
                 width: int, max_height: int, margin: int, size: int, scale: float):
        self.rng, self.cfg, self.style, self.body, self.head = rng, cfg, style, body, head
        self.width, self.size, self.scale = width, size, scale
        self.spacing = rng.uniform(1.1, 1.75)
        self.left, self.right = margin, width - margin
        self.columns = [(self.left, self.right)]
        self.column = 0
        self.top = self.y = margin + int(rng.uniform(0, 0.03) * width)
        self.bottom = max_height - margin
        self.low = self.y  # the lowest y any column reached
        self.ops: list[TextOp | RuleOp | BoxOp] = []
        self.blocks: list[str] = []

    # -- measuring ----------------------------------------------------------------------------------

    def face(self, bold: bool, italic: bool, heading: bool = False) -> tuple[str, bool]:
        return (self.head if heading else self.body).file(bold, italic)

    def measure(self, s: str, size: int, face: tuple[str, bool]) -> int:
        return text_width(s, face[0], size, face[1])

    def line_height(self, size: int) -> int:
        return int(round(size * self.spacing))

    @property
    def chars(self) -> int:
        return sum(len(b) + 2 for b in self.blocks)

    def budget(self) -> int:
        """Markdown characters still allowed on this page."""
        return self.cfg.max_chars - self.chars

    def room(self, size: int) -> bool:
        """Whether one more line of ``size`` fits, moving to the next column when this one is full."""
        while self.y + self.line_height(size) > self.bottom:
            if self.column + 1 >= len(self.columns):
                return False
            self.low = max(self.low, self.y)
            self.column += 1
            self.left, self.right = self.columns[self.column]
            self.y = self.top
        return True

    def split_columns(self, n: int) -> None:
        """From here down, text flows through ``n`` columns."""
        gutter = int(self.width * self.rng.uniform(0.03, 0.07))
        col = (self.right - self.left - (n - 1) * gutter) // n
        self.columns = [(self.left + i * (col + gutter), self.left + i * (col + gutter) + col) for i in range(n)]
        self.column, self.top = 0, self.y
        self.left, self.right = self.columns[0]

    def wrap(self, ws: list[str], size: int, face: tuple[str, bool], width: int, first_indent: int = 0,
             max_lines: int = 1000) -> list[list[str]]:
        """Greedy lines of ``ws`` within ``width`` (the first line ``first_indent`` narrower); a word wider
        than a line is left out, and so are the words past ``max_lines``."""
        lines: list[list[str]] = []
        cur: list[str] = []
        for w in ws:
            room = width - (first_indent if not lines else 0)
            if self.measure(w, size, face) > room:
                continue
            if cur and self.measure(" ".join(cur + [w]), size, face) > room:
                lines.append(cur)
                if len(lines) == max_lines:
                    return lines
                cur = []
            cur.append(w)
        if cur:
            lines.append(cur)
        return lines

    # -- drawing --------------------------------------------------------------------------------------

    def put(self, x: int, s: str, size: int, face: tuple[str, bool]) -> None:
        ascent, _ = font(face[0], size).getmetrics()
        self.ops.append(TextOp(int(x), self.y + ascent, s, face[0], size, face[1]))

    def place(self, ws: list[str], size: int, face: tuple[str, bool], align: str, last: bool = True,
              indent: int = 0) -> None:
        """One line of words on the current line, aligned in [left + indent, right]."""
        left, s = self.left + indent, " ".join(ws)
        w = self.measure(s, size, face)
        if align == "justify" and not last and len(ws) > 1:
            widths = [self.measure(x, size, face) for x in ws]
            gap = (self.right - left - sum(widths)) / (len(ws) - 1)
            if gap <= 3 * self.measure(" ", size, face) + 2:
                x = float(left)
                for word, ww in zip(ws, widths):
                    self.put(round(x), word, size, face)
                    x += ww + gap
                return
        x = {"center": left + (self.right - left - w) // 2, "right": self.right - w}.get(align, left)
        self.put(max(left, x), s, size, face)

    def rule(self, left: int | None = None, right: int | None = None) -> None:
        y = self.y + max(1, self.size // 6)
        self.ops.append(RuleOp(self.left if left is None else left, y, self.right if right is None else right, y,
                               max(1, round(self.scale))))
        self.y = y + max(2, self.size // 3)

    def gap(self, factor: float = 1.0) -> None:
        self.y += int(self.size * factor * self.rng.uniform(0.4, 1.0))

    # -- blocks ---------------------------------------------------------------------------------------

    def heading(self, s: str, level: int) -> bool:
        st = self.style
        size = int(round(self.size * (st.heading_scale if level == 1 else (1 + st.heading_scale) / 2)))
        face = self.face(st.heading_bold, False, heading=True)
        shown = s.upper() if st.heading_upper else s
        lines = self.wrap(shown.split(), size, face, self.right - self.left, max_lines=2)
        if not lines or not self.room(size) or len("#" * level) + len(shown) + 3 > self.budget():
            return False
        placed = []
        for i, ws in enumerate(lines):
            if i and not self.room(size):
                break
            self.place(ws, size, face, st.heading_align)
            self.y += self.line_height(size)
            placed += ws
        if level == 1 and st.heading_rule:
            self.rule()
        self.blocks.append("#" * level + " " + " ".join(placed))
        return True

    def paragraph(self, s: str, max_lines: int, align: str | None = None) -> bool:
        st = self.style
        face = self.face(False, self.rng.random() < st.italic_share)
        indent = int(self.size * self.rng.uniform(1.0, 2.5)) if st.indent_first else 0
        lines = self.wrap(s.split(), self.size, face, self.right - self.left, indent, max_lines)
        placed: list[str] = []
        for i, ws in enumerate(lines):
            if not self.room(self.size) or len(" ".join(placed + ws)) + 2 > self.budget():
                break
            self.place(ws, self.size, face, align or st.body_align, last=i == len(lines) - 1,
                       indent=indent if i == 0 else 0)
            self.y += self.line_height(self.size)
            placed += ws
        if not placed:
            return False
        self.blocks.append(" ".join(placed))
        return True

    def bullet_list(self, items: list[str], ordered: bool) -> bool:
        st = self.style
        face = self.face(False, False)
        start = 1 if self.rng.random() < 0.85 else self.rng.randint(2, 20)
        align = "center" if st.body_align == "center" else "left"
        indent = self.measure(f"{start + len(items)}{st.ordered_suffix} " if ordered else "•  ", self.size, face) + \
            int(self.size * self.rng.uniform(0.0, 1.0))
        out = []
        for n, item in enumerate(items, start):
            marker = f"{n}{st.ordered_suffix}" if ordered else st.list_marker
            truth = (f"{n}{st.ordered_suffix} " if ordered else "- ")
            if align == "center":
                room = self.right - self.left - self.measure(marker + " ", self.size, face)
                lines = self.wrap(item.split(), self.size, face, room, max_lines=2)
                lines = [[marker] + lines[0]] + lines[1:] if lines else []
            else:
                lines = self.wrap(item.split(), self.size, face, self.right - self.left - indent, max_lines=3)
            placed: list[str] = []
            for i, ws in enumerate(lines):
                if not self.room(self.size) or len(truth + " ".join(placed + ws)) + 1 > self.budget() - len(
                        "\n".join(out)):
                    break
                if align == "center":
                    self.place(ws, self.size, face, "center")
                else:
                    if i == 0:
                        self.put(self.left + indent - self.measure(marker + " ", self.size, face), marker, self.size,
                                 face)
                    self.place(ws, self.size, face, "left", indent=indent)
                self.y += self.line_height(self.size)
                placed += ws[1:] if align == "center" and i == 0 else ws
            if not placed:
                break
            out.append(truth + " ".join(placed))
        if not out:
            return False
        self.blocks.append("\n".join(out))
        return True

    def key_values(self, pairs: list[tuple[str, str]], layout: str | None = None, right_block: bool = False) -> bool:
        """``Key: value`` lines; ``layout`` overrides the page's; ``right_block``: the block sits in the right
        half (an invoice's totals)."""
        st = self.style
        layout = layout or st.kv_layout
        kface, vface = self.face(st.kv_bold_keys, False), self.face(False, False)
        left = self.left + (self.right - self.left) // 2 if right_block else self.left
        space = self.measure(" ", self.size, vface)
        tab = max(self.measure(k + ":", self.size, kface) for k, _ in pairs) + 2 * space
        out = []
        for k, v in pairs:
            label = k + ":"
            lw = self.measure(label, self.size, kface)
            at = left + (tab if layout == "tab" else lw + space)
            fit = self.wrap(v.split(), self.size, vface, self.right - at, max_lines=1)
            if not fit or (len(v.split()) <= 2 and len(fit[0]) < len(v.split())):  # a short value is never cut
                continue
            line = f"{label} {' '.join(fit[0])}"
            if not self.room(self.size) or len(line) + 1 > self.budget() - len("\n".join(out)):
                break
            value = " ".join(fit[0])
            if st.body_align == "center":
                start = self.left + (self.right - self.left - (lw + space + self.measure(value, self.size, vface))) // 2
                self.put(start, label, self.size, kface)
                self.put(start + lw + space, value, self.size, vface)
            else:
                self.put(left, label, self.size, kface)
                x = self.right - self.measure(value, self.size, vface) if layout == "right" else at
                self.put(max(x, left + lw + space), value, self.size, vface)
            self.y += self.line_height(self.size)
            out.append(line)
        if not out:
            return False
        self.blocks.append("\n".join(out))
        return True

    def table(self, kinds: list[str], rows: int) -> bool:
        st, rng = self.style, self.rng
        header = [text.header(rng, k) for k in kinds]
        while len(set(header)) < len(header):  # distinct headers
            header = [h if h not in header[:i] else text.header(rng, kinds[i]) for i, h in enumerate(header)]
        body = [[text.cell(rng, k) for k in kinds] for _ in range(rows)]
        hface, bface = self.face(rng.random() < 0.7, False), self.face(False, False)
        size, smallest, frac = self.size, max(12, self.size * 2 // 3), rng.uniform(0.25, 0.6)
        while True:  # the whole table, in type down to 2/3 of the body's; then columns dropped from the right
            pad = max(3, int(size * frac))
            widths = [max([self.measure(header[c], size, hface)] + [self.measure(r[c], size, bface) for r in body])
                      + 2 * pad for c in range(len(kinds))]
            if sum(widths) <= self.right - self.left or size <= smallest:
                break
            size = max(smallest, size - 2)
        while len(widths) > 1 and sum(widths) > self.right - self.left:
            widths.pop()
        cols = len(widths)
        if sum(widths) > self.right - self.left:
            return False
        header, body = header[:cols], [r[:cols] for r in body]
        row_h = int(round(size * rng.uniform(1.25, 1.7))) + pad
        lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * cols]
        n = 0
        while n < len(body) and self.y + (n + 2) * row_h <= self.bottom and \
                sum(len(x) + 1 for x in lines) + len("| " + " | ".join(body[n]) + " |") + 2 <= self.budget():
            lines.append("| " + " | ".join(body[n]) + " |")
            n += 1
        if n == 0 or sum(len(x) + 1 for x in lines[:2]) > self.budget():
            return False
        body = body[:n]
        x0 = self.left + ((self.right - self.left - sum(widths)) // 2 if st.body_align == "center" else 0)
        edges = [x0]
        for w in widths:
            edges.append(edges[-1] + w)
        top, bottom = self.y, self.y + (n + 1) * row_h
        shade = rng.randint(18, 45)
        for r in range(n + 1):
            if (st.table_shade == "header" and r == 0) or (st.table_shade == "zebra" and r % 2 == 1):
                self.ops.append(BoxOp(edges[0], top + r * row_h, edges[-1], top + (r + 1) * row_h, shade))
        ascent, descent = font(bface[0], size).getmetrics()
        for r, cells in enumerate([header] + body):
            base = top + r * row_h + (row_h - ascent - descent) // 2 + ascent
            for c, s in enumerate(cells):
                face = hface if r == 0 else bface
                x = edges[c] + pad
                if st.table_right_numbers and kinds[c] in NUMERIC:
                    x = edges[c + 1] - pad - self.measure(s, size, face)
                self.ops.append(TextOp(x, base, s, face[0], size, face[1]))
        t = max(1, round(self.scale))
        ys = {"grid": [top + r * row_h for r in range(n + 2)], "rules": [top, top + row_h, bottom],
              "header": [top + row_h], "box": [top, top + row_h, bottom], "none": []}[st.table_borders]
        for y in ys:
            self.ops.append(RuleOp(edges[0], y, edges[-1], y, t))
        for x in {"grid": edges, "box": [edges[0], edges[-1]]}.get(st.table_borders, []):
            self.ops.append(RuleOp(x, top, x, bottom, t))
        self.y = bottom + max(2, size // 4)
        self.blocks.append("\n".join(lines))
        return True


# -- families -------------------------------------------------------------------------------------------


def _paragraph(w: Writer, max_lines: int = 6) -> bool:
    sentences = " ".join(text.sentence(w.rng) for _ in range(4))
    return w.paragraph(sentences, w.rng.randint(1, max_lines))


def _list(w: Writer) -> bool:
    return w.bullet_list([text.list_item(w.rng) for _ in range(w.rng.randint(2, 6))], w.rng.random() < 0.4)


def _kv(w: Writer) -> bool:
    return w.key_values([text.key_value(w.rng) for _ in range(w.rng.randint(2, 6))])


def _table(w: Writer) -> bool:
    rng = w.rng
    kinds = [rng.choice(["text", "text", "name", "code", "date"])]
    kinds += [rng.choice(text.COLUMN_KINDS) for _ in range(rng.randint(1, w.cfg.max_table_cols - 1))]
    return w.table(kinds, rng.randint(1, w.cfg.max_table_rows))


def _line(w: Writer) -> bool:
    r = w.rng.random()
    if r < 0.5:
        return w.paragraph(text.sentence(w.rng, w.rng.randint(2, 10)), 1)
    if r < 0.75:
        return w.key_values([text.key_value(w.rng)], "inline")
    return w.paragraph(" ".join(text.value(w.rng) for _ in range(w.rng.randint(1, 4))), 1)


def _stack(w: Writer, kind: str) -> None:
    """The plain and centered families: blocks of one kind, or a page of mixed blocks."""
    rng = w.rng
    if kind == "line":
        _line(w)
    elif kind == "paragraph":
        for _ in range(rng.randint(1, 2)):
            _paragraph(w)
            w.gap()
    elif kind == "heading":
        w.heading(text.title(rng), rng.choice([1, 1, 2]))
        w.gap(0.5)
        _paragraph(w)
    elif kind == "list":
        if rng.random() < 0.5 and w.heading(text.title(rng), 2):
            w.gap(0.5)
        _list(w)
    elif kind == "table":
        if rng.random() < 0.4 and w.heading(text.title(rng), rng.choice([1, 2])):
            w.gap(0.5)
        _table(w)
        if rng.random() < 0.2:
            w.gap()
            w.paragraph(text.sentence(rng), 2)
    else:
        w.heading(text.title(rng), 1)
        blocks = {"paragraph": _paragraph, "list": _list, "table": _table, "kv": _kv,
                  "subheading": lambda x: x.heading(text.title(x.rng), 2)}
        for _ in range(rng.randint(2, 6)):
            w.gap()
            name = rng.choices(list(blocks), [0.35, 0.17, 0.16, 0.14, 0.18])[0]
            if not blocks[name](w) and w.budget() < 60:
                break


def _columns(w: Writer) -> None:
    rng = w.rng
    if rng.random() < 0.85 and w.heading(text.title(rng), 1):
        w.gap()
    w.split_columns(2)
    for _ in range(rng.randint(2, 5)):
        if not (_paragraph(w, 8) if rng.random() < 0.75 else _list(w)):
            break
        w.gap(0.6)


def _letter(w: Writer) -> None:
    rng = w.rng
    if rng.random() < 0.6 and w.heading(rng.choice(["Memo", "Memorandum", "Notice", text.title(rng)]), 1):
        w.gap(0.5)
    keys = rng.sample(["To", "From", "Date", "Subject", "CC", "Re", "Ref"], rng.randint(2, 4))
    vals = {"Date": text.date, "Ref": text.code}
    w.key_values([(k, vals.get(k, text.person)(rng) if k not in ("Subject", "Re") else text.title(rng))
                  for k in keys])
    w.rule()
    w.gap(0.5)
    for _ in range(rng.randint(1, 3)):
        if not _paragraph(w):
            break
        w.gap(0.6)
    if w.paragraph(rng.choice(["Regards,", "Kind regards,", "Sincerely,", "Best wishes,", "Thank you,"]), 1):
        w.paragraph(text.person(rng), 1)


def _form(w: Writer) -> None:
    rng = w.rng
    w.heading(rng.choice(["Invoice", "INVOICE", "Receipt", "Statement", "Order Confirmation", "Quote",
                          text.title(rng)]), 1)
    w.gap(0.5)
    w.key_values([text.key_value(rng) for _ in range(rng.randint(2, 4))])
    w.gap()
    kinds = ["text", rng.choice(["number", "quantity"]), "money"] + (["money"] if rng.random() < 0.4 else [])
    w.table(kinds[: w.cfg.max_table_cols], rng.randint(1, w.cfg.max_table_rows))
    w.gap(0.5)
    totals = [(k, text.money(rng)) for k in rng.sample(["Subtotal", "Tax", "VAT", "Discount", "Shipping"],
                                                          rng.randint(0, 2))] + [("Total", text.money(rng))]
    w.key_values(totals, "right", right_block=rng.random() < 0.6)
    if rng.random() < 0.3:
        w.gap()
        w.paragraph(text.sentence(rng), 2)


FILLERS = {"plain": _stack, "centered": _stack, "columns": lambda w, _k: _columns(w),
           "letter": lambda w, _k: _letter(w), "form": lambda w, _k: _form(w)}


def compose(seed: int, family: str, kind: str | None, cfg: SynthConfig) -> Page:
    """Choose everything about page ``seed`` of ``family`` and place it; deterministic in (seed, family, kind,
    cfg). ``kind`` must be one of the family's (FAMILY_KINDS); None draws it."""
    rng = random.Random(f"ocria-compose:{family}:{seed}:{kind or 'any'}")
    kinds = FAMILY_KINDS[family]
    kind = kind if kind is not None else rng.choices(kinds, [KIND_WEIGHTS[k] for k in kinds])[0]
    scale = rng.uniform(1.0, cfg.max_scale) if rng.random() < 0.3 else 1.0
    min_width = max(cfg.min_width, {"columns": 448, "form": 384, "letter": 320}.get(family, 0))
    base_width = rng.randint(min(min_width, cfg.max_width), cfg.max_width)
    width = int(base_width * scale)
    size = int(round(rng.randint(cfg.min_font_px, cfg.max_font_px) * scale))
    margin = int(width * rng.uniform(0.04, 0.1))  # wide enough that a rotated page keeps its corners' text
    faces = typefaces(cfg.fonts)
    body = rng.choice(faces)
    head = body if rng.random() < 0.7 else rng.choice(faces)
    w = Writer(rng, cfg, draw_style(rng, family), body, head, width, int(cfg.max_height * scale), margin, size, scale)
    FILLERS[family](w, kind)
    if not w.blocks:  # nothing fitted (a narrow page at a large size): a short number always does
        w.paragraph(str(rng.randint(0, 999)), 1)
    if not w.blocks:
        raise RuntimeError(f"reading page {seed} ({family}, {kind}) laid out nothing: the config checks missed a case")
    height = min(int(cfg.max_height * scale), max(w.low, w.y) + margin)
    tinted = rng.random() < 0.4
    return Page(
        width=width, height=height, kind=kind, markdown="\n\n".join(w.blocks),
        ink=rng.randint(0, 70), paper=rng.randint(228, 255),
        tint=(rng.uniform(0.9, 1.0), rng.uniform(0.9, 1.0), rng.uniform(0.86, 1.0)) if tinted else (1.0, 1.0, 1.0),
        noise_sigma=rng.uniform(0.0, cfg.max_noise) if rng.random() < 0.65 else 0.0,  # a third clean
        blur=rng.uniform(0.3, 0.9) * scale if rng.random() < 0.3 else 0.0,
        noise_seed=rng.getrandbits(63),
        ops=w.ops, layout=family,
        rotation=rng.uniform(-cfg.max_rotation, cfg.max_rotation) if rng.random() < 0.4 else 0.0,
        shading=rng.uniform(0.03, 0.12) if rng.random() < 0.25 else 0.0,
        shading_angle=rng.uniform(0.0, 2 * math.pi),
        jpeg_quality=rng.randint(35, 90) if rng.random() < cfg.jpeg_share else 0,
    )
