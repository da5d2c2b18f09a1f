"""Word lists and small text generators for synthetic documents (no external corpus).

Every function takes a `random.Random` so a document's text is fixed by its seed.
"""

import random

COMMON = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if so no will more can who its out
about up them some could than into other time only new very after also made over did two many before
must through back years where much your way well down should because each just those people how too
state good day used both own life being under never while last might great since against three right
place during without again around however home small found thought went say part general high upon
school every until left number course war within always fact though less public put think almost
hand enough far took head yet government system better set told nothing night end why called didn
eyes find going look asked later knew point next program city business give group toward young let
room side social present given several order national possible rather second face per among form
important often things looking early white case john become large big need four within felt along
children saw best church ever least power development light thing seemed family interest want members
""".split()

NOUNS = """
account address agreement amount analysis answer area balance bank board budget building customer
contract cost date delivery department design detail document effect energy equipment estimate event
expense factor figure file finance form group growth income index invoice item level line list loan
market material meeting method model month name network note notice number office order page payment
period plan point policy price process product profit program project quality quantity range rate
record region report request result review risk sale schedule section service share source staff
standard statement status step stock store summary supply support survey system table target tax
team term test title total trade transfer unit update value version volume week weight work year
""".split()

ADJECTIVES = """
annual available basic central clear common current daily direct early final financial first formal
full general global high internal key large late local main major manual monthly net new normal
official open personal previous primary private public quarterly recent regional regular related
second senior short simple small special standard total usual weekly
""".split()

NAMES = """
Alice Anna Bruno Carla Daniel Elena Frank Grace Henry Irene Jonas Karen Laura Marco Nadia Oscar Paula
Quinn Rosa Samuel Tessa Victor Wendy Xavier Yara Zoe
""".split()

SURNAMES = """
Adams Baker Clark Diaz Evans Fischer Garcia Hill Ito Jensen Klein Lopez Moreau Novak Olsen Perez
Rossi Schmidt Turner Weber Young Zhang
""".split()

CITIES = """
Amsterdam Athens Berlin Boston Chicago Dublin Geneva Lisbon London Madrid Milan Munich Oslo Paris
Prague Rome Seattle Sydney Tokyo Toronto Vienna Warsaw Zurich
""".split()

MONTHS = """
January February March April May June July August September October November December
""".split()

UNITS = ["kg", "km", "m", "cm", "mm", "h", "min", "pcs", "GB", "MB"]
CURRENCIES = ["$", "€", "£"]


def integer(rng: random.Random) -> str:
    """An integer, sometimes with thousands separators."""
    n = rng.choice([rng.randint(0, 99), rng.randint(100, 9999), rng.randint(10000, 999999)])
    return f"{n:,}" if n >= 10000 and rng.random() < 0.5 else str(n)


def decimal(rng: random.Random) -> str:
    """A decimal number with one to three fractional digits."""
    return f"{rng.uniform(0, 1000):.{rng.randint(1, 3)}f}"


def percent(rng: random.Random) -> str:
    return f"{rng.uniform(0, 100):.{rng.randint(0, 1)}f}%"


def money(rng: random.Random) -> str:
    """A currency amount such as `$1,234.50` or `€45.00`."""
    amount = rng.choice([rng.uniform(0, 100), rng.uniform(100, 10000), rng.uniform(10000, 500000)])
    return f"{rng.choice(CURRENCIES)}{amount:,.2f}"


def date(rng: random.Random) -> str:
    """A date in one of the common printed formats."""
    y, m, d = rng.randint(1990, 2030), rng.randint(1, 12), rng.randint(1, 28)
    style = rng.randrange(4)
    if style == 0:
        return f"{y:04d}-{m:02d}-{d:02d}"
    if style == 1:
        return f"{d:02d}/{m:02d}/{y:04d}"
    if style == 2:
        return f"{MONTHS[m - 1]} {d}, {y}"
    return f"{d} {MONTHS[m - 1][:3]} {y}"


def quantity(rng: random.Random) -> str:
    return f"{rng.randint(1, 500)} {rng.choice(UNITS)}"


def person(rng: random.Random) -> str:
    return f"{rng.choice(NAMES)} {rng.choice(SURNAMES)}"


def code(rng: random.Random) -> str:
    """An identifier such as `INV-2041` or `AB-17`."""
    prefix = rng.choice(["INV", "PO", "REF", "ID", "NO", "AB", "QX"])
    return f"{prefix}-{rng.randint(10, 99999)}"


VALUES = (integer, decimal, percent, money, date, quantity, code)


def value(rng: random.Random) -> str:
    """A random non-word token: a number, date, amount, quantity or code."""
    return rng.choice(VALUES)(rng)


def word(rng: random.Random) -> str:
    """One word, weighted towards common function words like real prose."""
    r = rng.random()
    if r < 0.55:
        return rng.choice(COMMON)
    if r < 0.8:
        return rng.choice(NOUNS)
    if r < 0.92:
        return rng.choice(ADJECTIVES)
    return rng.choice(NAMES + CITIES + MONTHS)


def sentence(rng: random.Random, n_words: int | None = None) -> str:
    """A capitalised sentence with occasional commas, values and a closing mark."""
    n = n_words if n_words is not None else rng.randint(4, 14)
    words = []
    for i in range(n):
        w = value(rng) if rng.random() < 0.1 else word(rng)
        if i == 0:
            w = w[:1].upper() + w[1:]
        if i < n - 1 and rng.random() < 0.08:
            w += rng.choice([",", ",", ";", ":"])
        words.append(w)
    return " ".join(words) + rng.choice([".", ".", ".", ".", "?", "!"])


def title(rng: random.Random) -> str:
    """A short heading in title case, e.g. `Annual Budget Report 2024`."""
    parts = [rng.choice(ADJECTIVES), rng.choice(NOUNS)]
    if rng.random() < 0.6:
        parts.append(rng.choice(NOUNS))
    words = [p.capitalize() for p in parts]
    r = rng.random()
    if r < 0.25:
        words.append(str(rng.randint(1990, 2030)))
    elif r < 0.4:
        words = [rng.choice(["Section", "Part", "Chapter"]), str(rng.randint(1, 20)) + ":"] + words
    elif r < 0.5:
        words += ["for", rng.choice(CITIES)]
    return " ".join(words)


def list_item(rng: random.Random) -> str:
    """A short list entry: a phrase, a labelled value or a small sentence without the full stop."""
    r = rng.random()
    if r < 0.35:
        return f"{rng.choice(NOUNS).capitalize()}: {value(rng)}"
    if r < 0.6:
        return f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS)}"
    return sentence(rng, rng.randint(2, 6))[:-1]


def cell(rng: random.Random, column_kind: str) -> str:
    """A table cell of the given column kind: `name`, `word`, `date`, `money`, `number` or `code`."""
    if column_kind == "name":
        return person(rng)
    if column_kind == "word":
        return rng.choice(NOUNS).capitalize() if rng.random() < 0.7 else rng.choice(CITIES)
    if column_kind == "date":
        return date(rng)
    if column_kind == "money":
        return money(rng)
    if column_kind == "number":
        return rng.choice([integer, decimal, percent, quantity])(rng)
    return code(rng)


COLUMN_HEADERS = {
    "name": ["Name", "Owner", "Contact", "Client"],
    "word": ["Item", "Category", "City", "Product", "Region"],
    "date": ["Date", "Due", "Issued", "Updated"],
    "money": ["Amount", "Price", "Total", "Cost"],
    "number": ["Qty", "Value", "Rate", "Count"],
    "code": ["Ref", "ID", "Code", "Invoice"],
}
