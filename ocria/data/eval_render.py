"""An independent page renderer, used only for evaluation: clean printed pages drawn with plain PIL text drawing.

It shares no code with the training generator and imports nothing from ocria (a test checks this): its own
documents (a memo, an invoice, a table, a notice with a list, a letter), its own words, names and formats,
its own layout arithmetic. Only the font files and the Markdown conventions of the answer are common: a
``#`` heading, ``- `` list items, ``| a | b |`` tables with a ``| --- |`` row, ``Key: value`` lines, blocks
separated by a blank line. Pages are black on white, one column, of any size (not on the 32-pixel grid).
``megapixels`` draws the same page as a high-resolution scan of that many pixels (the realistic-size split).
"""

import math
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FONT_DIR = Path(__file__).parent / "fonts"
# (regular, bold) files: the common serif and sans faces; bold None: headings drawn in the regular face.
FACES = (
    ("LiberationSerif-Regular.ttf", None), ("LiberationSans-Regular.ttf", None),
    ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf"), ("DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf"),
    ("STIXGeneral.ttf", "STIXGeneralBol.ttf"),
)
MAX_CHARS = 460  # a page's answer stays well within 384 tokens

PEOPLE = ["Maria Lindqvist", "Tom Okafor", "Sarah Brennan", "Luis Ortega", "Hana Sato", "Peter Novak",
          "Grace Mwangi", "Oliver Grant", "Amelie Roux", "Daniel Kim", "Ruth Feldman", "Kwame Asante"]
COMPANIES = ["Northwind Traders", "Bluebell Dairy", "Harbor Logistics", "Acme Tools Ltd", "Greenfield Farms",
             "Summit Printing", "Riverside Clinic", "Orchid Software", "Lakeview Hotel", "Copperline Electric"]
ITEMS = ["Desk lamp", "Printer paper", "USB cable", "Office chair", "Toner cartridge", "Coffee beans",
         "Safety gloves", "Whiteboard", "Label tape", "Monitor stand", "Notebook", "Stapler", "Extension cord"]
TOPICS = ["budget review", "office move", "safety training", "software update", "quarterly report",
          "holiday schedule", "parking permits", "client visit", "network outage", "supplier contract"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SENTENCES = [
    "Please send the signed {doc} to {person} before {date}.",
    "The {topic} has been moved to {weekday} at {time} in room {room}.",
    "We received {n} boxes from {company} on {date} and checked every one.",
    "Payment of {amount} is due within {days} days of the invoice date.",
    "Contact {person} at {email} or {phone} with any questions.",
    "All staff should finish the {topic} form by the end of {month}.",
    "The new opening hours start on {date}: from {time} on weekdays.",
    "Our records show an open balance of {amount} on account {code}.",
    "Thank you for your order of {n} items, shipped today under reference {code}.",
    "Parking on the north side will be closed from {date} for repairs.",
    "The {topic} notes are attached; comments are welcome until {weekday}.",
    "A copy of this letter has been sent to {company} for their files.",
    "If you have already paid, please ignore this reminder.",
    "Questions about the {topic} can be raised at the next meeting.",
]


@dataclass(frozen=True)
class _Text:
    x: float
    baseline: float
    text: str
    size: float
    bold: bool


@dataclass(frozen=True)
class _Line:
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True)
class IndependentPage:
    """A rendered evaluation page and its Markdown truth."""

    image: Image.Image
    markdown: str
    doc: str  # memo, invoice, table, notice or letter
    font: str  # the regular font file


class _Sheet:
    """Lays a document out in page units (scale 1) and keeps what to draw and the Markdown."""

    def __init__(self, rng: random.Random, regular: str, bold: str | None):
        self.rng, self.regular, self.bold = rng, regular, bold
        self.width = rng.randint(420, 560)
        self.size = rng.randint(22, 29)
        self.lead = rng.uniform(1.3, 1.5)
        self.margin = round(self.width * rng.uniform(0.05, 0.08))
        self.y = float(self.margin)
        self.texts: list[_Text] = []
        self.lines: list[_Line] = []
        self.blocks: list[str] = []

    def font(self, size: float, bold: bool) -> ImageFont.FreeTypeFont:
        name = self.bold if bold and self.bold else self.regular
        return ImageFont.truetype(str(FONT_DIR / name), round(size))

    def length(self, s: str, size: float, bold: bool = False) -> float:
        return self.font(size, bold).getlength(s)

    def room(self) -> int:
        return MAX_CHARS - sum(len(b) + 2 for b in self.blocks)

    def write(self, x: float, s: str, size: float, bold: bool = False) -> None:
        ascent = self.font(size, bold).getmetrics()[0]
        self.texts.append(_Text(x, self.y + ascent, s, size, bold))

    def heading(self, s: str, level: int = 1) -> None:
        size = self.size * (1.45 if level == 1 else 1.2)
        self.write(self.margin, s, size, bold=True)
        self.y += size * 1.5
        self.blocks.append("#" * level + " " + s)

    def wrapped(self, s: str, indent: float = 0.0) -> list[str]:
        limit = self.width - 2 * self.margin - indent
        out, cur = [], ""
        for w in s.split():
            trial = f"{cur} {w}" if cur else w
            if cur and self.length(trial, self.size) > limit:
                out.append(cur)
                cur = w
            else:
                cur = trial
        return out + ([cur] if cur else [])

    def paragraph(self, s: str) -> None:
        if len(s) > self.room():
            return
        for line in self.wrapped(s):
            self.write(self.margin, line, self.size)
            self.y += self.size * self.lead
        self.y += self.size * 0.6
        self.blocks.append(s)

    def fields(self, pairs: list[tuple[str, str]]) -> None:
        tab = max(self.length(k + ":", self.size, True) for k, _ in pairs) + self.size
        for k, v in pairs:
            self.write(self.margin, k + ":", self.size, bold=True)
            self.write(self.margin + tab, v, self.size)
            self.y += self.size * self.lead
        self.y += self.size * 0.6
        self.blocks.append("\n".join(f"{k}: {v}" for k, v in pairs))

    def items(self, entries: list[str]) -> None:
        kept = []
        for e in entries:
            if sum(len(x) + 3 for x in kept + [e]) > self.room():
                break
            lines = self.wrapped(e, indent=self.size * 1.2)
            self.write(self.margin + self.size * 0.3, "\u2022", self.size)
            for line in lines:
                self.write(self.margin + self.size * 1.2, line, self.size)
                self.y += self.size * self.lead
            kept.append(e)
        self.y += self.size * 0.6
        self.blocks.append("\n".join("- " + e for e in kept))

    def grid(self, head: list[str], rows: list[list[str]], ruled: bool) -> None:
        pad = self.size * 0.45
        size = self.size
        widths = [max(self.length(r[c], size, r is head) for r in [head] + rows) + 2 * pad for c in range(len(head))]
        while sum(widths) > self.width - 2 * self.margin:  # a narrower type for a wide table
            size *= 0.92
            widths = [w * 0.92 for w in widths]
        height = size * 1.6
        top, x = self.y, float(self.margin)
        edges = [x]
        for w in widths:
            edges.append(edges[-1] + w)
        for r, row in enumerate([head] + rows):
            self.y = top + r * height + (height - size) / 2
            for c, cell in enumerate(row):
                self.write(edges[c] + pad, cell, size, bold=r == 0)
        bottom = top + height * (len(rows) + 1)
        self.lines.append(_Line(edges[0], top + height, edges[-1], top + height))
        if ruled:
            for r in range(len(rows) + 2):
                self.lines.append(_Line(edges[0], top + r * height, edges[-1], top + r * height))
            for e in edges:
                self.lines.append(_Line(e, top, e, bottom))
        self.y = bottom + self.size * 0.8
        md = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        self.blocks.append("\n".join(md + ["| " + " | ".join(r) + " |" for r in rows]))

    def draw(self, scale: float) -> Image.Image:
        w, h = round(self.width * scale), round((self.y + self.margin) * scale)
        img = Image.new("RGB", (w, h), "white")
        pen = ImageDraw.Draw(img)
        for t in self.texts:
            pen.text((t.x * scale, t.baseline * scale), t.text, fill="black", anchor="ls",
                     font=self.font(t.size * scale, t.bold))
        for ln in self.lines:
            pen.line([(ln.x0 * scale, ln.y0 * scale), (ln.x1 * scale, ln.y1 * scale)], fill="black",
                     width=max(1, round(scale)))
        return img


def _date(rng: random.Random) -> str:
    d, m, y = rng.randint(1, 28), rng.randint(1, 12), rng.randint(2019, 2027)
    return rng.choice([f"{MONTHS[m - 1]} {d}, {y}", f"{d} {MONTHS[m - 1]} {y}", f"{y}-{m:02d}-{d:02d}",
                       f"{d:02d}/{m:02d}/{y}"])


def _amount(rng: random.Random) -> str:
    return rng.choice(["$", "€", "£"]) + f"{rng.uniform(5, 9000):,.2f}"


def _code(rng: random.Random) -> str:
    return f"{rng.choice(['A', 'B', 'K', 'R', 'T'])}{rng.randint(100, 999)}-{rng.randint(10, 99)}"


def _sentence(rng: random.Random) -> str:
    person = rng.choice(PEOPLE)
    slots = {
        "doc": rng.choice(["contract", "form", "report", "quote", "order"]), "person": person,
        "date": _date(rng), "topic": rng.choice(TOPICS), "weekday": rng.choice(WEEKDAYS),
        "time": f"{rng.randint(8, 17)}:{rng.choice(['00', '15', '30', '45'])}", "room": str(rng.randint(101, 420)),
        "n": str(rng.randint(2, 40)), "company": rng.choice(COMPANIES), "amount": _amount(rng),
        "days": str(rng.choice([14, 30, 45, 60])), "email": person.split()[0].lower() + "@example.com",
        "phone": f"+1 {rng.randint(200, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
        "month": rng.choice(MONTHS), "code": _code(rng),
    }
    return rng.choice(SENTENCES).format(**slots)


def _memo(s: _Sheet) -> None:
    rng = s.rng
    s.heading(rng.choice(["MEMO", "Memorandum"]))
    s.fields([("To", rng.choice(PEOPLE)), ("From", rng.choice(PEOPLE)), ("Date", _date(rng)),
              ("Subject", rng.choice(TOPICS).capitalize())])
    for _ in range(2):
        s.paragraph(" ".join(_sentence(rng) for _ in range(rng.randint(1, 2))))


def _invoice(s: _Sheet) -> None:
    rng = s.rng
    s.heading(f"Invoice {_code(rng)}")
    s.fields([("Date", _date(rng)), ("Customer", rng.choice(COMPANIES)), ("Due", _date(rng))])
    rows = []
    for item in rng.sample(ITEMS, rng.randint(2, 3)):
        qty, price = rng.randint(1, 12), rng.uniform(2, 400)
        rows.append([item, str(qty), f"{price:,.2f}", f"{qty * price:,.2f}"])
    s.grid(["Item", "Qty", "Price", "Amount"], rows, ruled=rng.random() < 0.5)
    s.paragraph(f"Total: {_amount(rng)}")


def _table(s: _Sheet) -> None:
    rng = s.rng
    s.heading(rng.choice(["Delivery schedule", "Contact list", "Stock count", "Room bookings"]), 2)
    rows = [[rng.choice(ITEMS), _date(rng), str(rng.randint(1, 250))] for _ in range(rng.randint(2, 4))]
    s.grid(["Item", "Date", "Count"], rows, ruled=rng.random() < 0.5)
    s.paragraph(_sentence(rng))


def _notice(s: _Sheet) -> None:
    rng = s.rng
    s.heading(rng.choice(["Notice", "Reminder", "Announcement"]) + ": " + rng.choice(TOPICS))
    s.paragraph(_sentence(rng))
    s.items([_sentence(rng).rstrip(".") for _ in range(rng.randint(2, 4))])


def _letter(s: _Sheet) -> None:
    rng = s.rng
    s.paragraph(_date(rng))
    s.paragraph(f"Dear {rng.choice(PEOPLE)},")
    s.paragraph(" ".join(_sentence(rng) for _ in range(2)))
    s.paragraph(_sentence(rng))
    s.paragraph(rng.choice(["Sincerely,", "Kind regards,", "Yours faithfully,"]))
    s.paragraph(rng.choice(PEOPLE))


DOCUMENTS = {"memo": _memo, "invoice": _invoice, "table": _table, "notice": _notice, "letter": _letter}


def independent_page(index: int, megapixels: float | None = None) -> IndependentPage:
    """Evaluation page ``index`` (deterministic); ``megapixels``: drawn at that many million pixels instead of
    its own size of about 0.1-0.3."""
    rng = random.Random(f"ocria-independent:{index}")
    doc = rng.choice(list(DOCUMENTS))
    regular, bold = rng.choice(FACES)
    sheet = _Sheet(rng, regular, bold)
    DOCUMENTS[doc](sheet)
    height = sheet.y + sheet.margin
    scale = 1.0 if megapixels is None else math.sqrt(megapixels * 1e6 / (sheet.width * height))
    return IndependentPage(sheet.draw(scale), "\n\n".join(b for b in sheet.blocks if b), doc, regular)
