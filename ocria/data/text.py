"""Text of the reading families' pages, drawn from a broad distribution so that a model must read it.

No one word list: real words (words.py's lists) are a minority beside pronounceable made-up words, random
letter strings, names, numbers in several notations, dates, times, amounts, codes built from random
templates, e-mail addresses, web addresses and phone numbers, in lower, Title, UPPER and mixed case, with
punctuation. Every character comes from ``ALPHABET``, which every shipped font draws (tests check it), and
none of them is Markdown syntax that would change the page's structure (``| * _ ` \\ < > ~``).
Every function takes a ``random.Random``: a page's text is fixed by its seed.
"""

import random
import string

from ocria.data import words

ACCENTED = "äöüéèêëàâáíóúñçøåæœßÄÖÜÉÈÊËÀÂÁÍÓÚÑÇØÅÆŒ"
PUNCTUATION = ".,;:!?'\"()[]{}/-–—&%#@+=$€£¥°§…‘’“”«»"
ALPHABET = frozenset(string.ascii_letters + string.digits + ACCENTED + PUNCTUATION + " ½×±·•›")

FIRST_NAMES = words.NAMES + """
Ahmed Akira Amara Björn Chen Diego Emma Fatima Giulia Hannah Igor Jamal Kofi Leila Mateo Mei Niamh Olga
Pedro Priya Rahul Sofia Tomás Ursula Viktor Wei Yusuf Zainab José Renée Søren François Chloé
""".split()

SURNAMES = words.SURNAMES + """
Abbott Bergström Castillo Dubois Eriksen Fernández Gonzalez Hoffmann Ivanova Kowalski Larsen Müller
Nakamura O'Brien Patel Quintero Rasmussen Silva Tanaka Urquhart Van Dijk Wójcik Yilmaz Zimmermann
""".split()

# Words beside words.py's lists: verbs, adverbs and the vocabulary of letters, reports, science and trade.
MORE_WORDS = """
accept achieve acquire adjust admit advise afford agree allow announce apply arrange arrive assume attach
avoid believe borrow calculate cancel carry cause change check choose claim collect compare complain
complete confirm consider contain continue correct create decide deliver depend describe develop discuss
divide double earn enable enter establish examine exchange expand expect explain extend fail finish
follow forward gather guarantee handle happen hold identify improve include increase indicate inform
install intend introduce invite involve issue join justify keep launch lend limit maintain manage measure
mention mind monitor move notify obtain occur offer operate organise perform permit plan prefer prepare
present prevent produce promise propose protect provide publish purchase qualify receive recommend reduce
refer reflect refuse register reject release remain remind remove renew repair replace reply represent
require reserve resolve respond restore retain return reveal schedule select send settle share ship sign
solve specify submit suggest supply suspend switch train transfer translate understand upgrade verify
visit wait warn welcome wonder write yield quickly slowly carefully usually rarely nearly already almost
perhaps indeed otherwise therefore meanwhile furthermore although whereas unless whether despite beyond
within towards throughout beneath alongside above below across behind inside outside around between
apparatus archive audit battery bicycle blanket boiler bracket cabinet calendar canvas capacity catalogue
ceiling certificate chamber chapter circuit climate coffee column committee compass component concrete
contractor corridor cotton counter courier crystal cylinder database deadline deposit diagram diameter
dinner document drawer elevator engine envelope estate evidence factory feedback festival fibre garden
generator glacier harbour hardware harvest helmet highway horizon hospital hydrogen insurance interval
inventory journal kitchen ladder landlord laptop lecture ledger library license machine magnet mailbox
manuscript meadow membrane mineral mirror molecule mortgage motor museum network nitrogen notebook
nutrient orchard oxygen package painting pamphlet parcel passenger patent pension pepper pigment pipeline
plastic platform pocket portfolio powder printer protein pump quarter radius railway receipt recipe
reservoir resistor ribbon satellite scanner sediment semester sensor shelter signal silver socket solvent
spectrum spreadsheet statute storage studio subscription sugar surface syllabus tablet teacher telescope
tenant terminal textile thermostat ticket timber tissue tractor turbine umbrella vaccine valve vehicle
velocity village vitamin voltage voucher wallet warehouse warranty website window winter workshop yoghurt
accurate ancient brief broad busy careful cheap chemical civil coastal complex confidential constant
correct crucial curious domestic double dry durable eager electric empty equal exact external fair famous
fragile fresh frozen generous gentle heavy hidden honest huge humid ideal initial juicy lean legal liquid
loud loyal modern narrow neutral noble obvious optional orange organic pale patient plain polite popular
portable precise pure purple quiet rapid rare raw remote rough rural safe scarce secure sharp silent
smooth solid spare stable steep sticky strict sudden sweet tall thick tiny urgent valid vast vivid warm
wide wild wooden yellow young zero
""".split()

KEYS = """
Invoice No|Invoice Date|Date|Due Date|Customer|Client|Account|Account No|Reference|Ref|Order|Order No|PO Number|
Phone|Tel|Fax|Email|Website|Address|City|Country|Postcode|Total|Subtotal|Tax|VAT|Discount|Balance|Amount Due|
Paid|Project|Status|Ship To|Bill To|Attn|Subject|From|To|CC|Prepared by|Approved by|Department|Contact|Terms|
Currency|Method|Period|Version|Page|Serial No|Model|Weight|Quantity|Unit Price|Notes|Room|Time|Location
""".replace("\n", "").split("|")

UNITS = ["kg", "g", "mg", "km", "m", "cm", "mm", "ml", "l", "h", "min", "s", "pcs", "GB", "MB", "kB", "km/h",
         "°C", "%", "V", "W", "kWh", "ft", "in", "lb", "oz"]
CURRENCIES = ["$", "€", "£", "¥", "USD ", "EUR ", "GBP ", "CHF ", "JPY "]
DOMAINS = ["com", "org", "net", "io", "de", "fr", "co.uk", "eu", "edu"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "ch",
          "cl", "dr", "fl", "gr", "kr", "pl", "pr", "sh", "sk", "sl", "st", "str", "th", "tr", "qu", "x", "y"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ee", "ie", "oo", "ou", "y"]
CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "rt", "ck", "ng", "x", "ll", "ss", "k", "p", "th"]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(n))


def pseudo_word(rng: random.Random) -> str:
    """A pronounceable made-up word of 1-4 syllables, now and then with an accented vowel."""
    n = rng.choices((1, 2, 3, 4), (0.3, 0.42, 0.22, 0.06))[0]
    out = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(n))
    if rng.random() < 0.1:
        i = rng.randrange(len(out))
        out = out[:i] + rng.choice(ACCENTED[:20]) + out[i + 1:]
    return out


def random_string(rng: random.Random) -> str:
    """1-10 random letters, with digits or a hyphen mixed in now and then."""
    pool = string.ascii_lowercase if rng.random() < 0.6 else string.ascii_letters + string.digits
    s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 10)))
    return s[:len(s) // 2] + "-" + s[len(s) // 2:] if len(s) > 3 and rng.random() < 0.1 else s


def real_word(rng: random.Random) -> str:
    pools = [words.COMMON, words.NOUNS, words.ADJECTIVES, words.CITIES, words.MONTHS, MORE_WORDS, MORE_WORDS]
    return rng.choice(rng.choice(pools))


def word(rng: random.Random) -> str:
    """One word: real (about half), made up or random letters."""
    r = rng.random()
    return real_word(rng) if r < 0.55 else pseudo_word(rng) if r < 0.88 else random_string(rng)


def cased(rng: random.Random, w: str, title_share: float = 0.15) -> str:
    """``w`` in lower case mostly, Title, UPPER or mixed case sometimes."""
    r = rng.random()
    if r < title_share:
        return w[:1].upper() + w[1:]
    if r < title_share + 0.06:
        return w.upper()
    if r < title_share + 0.08:
        return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in w)
    return w


def person(rng: random.Random) -> str:
    """A name in one of the usual written forms."""
    first, last = rng.choice(FIRST_NAMES), rng.choice(SURNAMES)
    if rng.random() < 0.25:
        first = pseudo_word(rng).capitalize()
    if rng.random() < 0.2:
        last = pseudo_word(rng).capitalize()
    style = rng.randrange(6)
    if style == 0:
        return f"{first[0]}. {last}"
    if style == 1:
        return f"{last}, {first}"
    if style == 2:
        return f"{rng.choice(['Dr.', 'Mr.', 'Ms.', 'Mrs.', 'Prof.'])} {last}"
    if style == 3:
        return f"{first} {rng.choice(string.ascii_uppercase)}. {last}"
    return f"{first} {last}"


def integer(rng: random.Random) -> str:
    """An integer of 1-9 digits, with thousands separators ("," "." " " or none) when large, sometimes signed."""
    n = int(10 ** rng.uniform(0, 9))
    sep = rng.choice([",", ",", ".", " ", ""])
    s = f"{n:,}".replace(",", sep) if n >= 1000 else str(n)
    return ("-" + s) if rng.random() < 0.08 else s


def decimal(rng: random.Random) -> str:
    """A decimal with a point or a comma, 1-4 fraction digits."""
    s = f"{rng.uniform(0, 10 ** rng.randint(1, 5)):.{rng.randint(1, 4)}f}"
    return s.replace(".", ",") if rng.random() < 0.25 else s


def number(rng: random.Random) -> str:
    """A number in one of many notations: integer, decimal, percent, ordinal, fraction, range, exponent."""
    r = rng.random()
    if r < 0.35:
        return integer(rng)
    if r < 0.6:
        return decimal(rng)
    if r < 0.72:
        return f"{rng.uniform(0, 100):.{rng.randint(0, 2)}f}{rng.choice(['%', ' %'])}"
    if r < 0.8:
        n = rng.randint(1, 99)
        return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
    if r < 0.86:
        return rng.choice(["½", f"{rng.randint(1, 9)}/{rng.randint(2, 16)}"])
    if r < 0.94:
        a = rng.randint(0, 500)
        return f"{a}{rng.choice(['-', '–', ' to '])}{a + rng.randint(1, 500)}"
    return f"{rng.uniform(1, 10):.{rng.randint(1, 3)}f}e{rng.choice(['-', '+', ''])}{rng.randint(1, 12)}"


def date(rng: random.Random) -> str:
    """A date in one of a dozen printed formats."""
    y, m, d = rng.randint(1950, 2040), rng.randint(1, 12), rng.randint(1, 28)
    month = words.MONTHS[m - 1]
    return rng.choice([
        f"{y:04d}-{m:02d}-{d:02d}", f"{d:02d}/{m:02d}/{y:04d}", f"{m}/{d}/{y % 100:02d}", f"{d}.{m}.{y}",
        f"{month} {d}, {y}", f"{d} {month[:3]} {y}", f"{d} {month} {y}", f"{month[:3]}. {d}, {y}",
        f"{rng.choice(WEEKDAYS)}, {d} {month} {y}", f"{d:02d}-{month[:3].upper()}-{y}", f"{month} {y}",
        f"{y}/{m:02d}/{d:02d}",
    ])


def time_of_day(rng: random.Random) -> str:
    h, m = rng.randint(0, 23), rng.randint(0, 59)
    return rng.choice([f"{h:02d}:{m:02d}", f"{h % 12 or 12}:{m:02d} {rng.choice(['AM', 'PM', 'am', 'pm'])}",
                       f"{h:02d}:{m:02d}:{rng.randint(0, 59):02d}", f"{h}h{m:02d}"])


def money(rng: random.Random) -> str:
    """An amount: symbol or ISO code before or after, point or comma decimals, thousands separators."""
    amount = 10 ** rng.uniform(-1, 6)
    s = f"{amount:,.2f}"
    if rng.random() < 0.25:  # 1.234,56
        s = s.replace(",", " ").replace(".", ",").replace(" ", rng.choice([".", " "]))
    if rng.random() < 0.05:
        s = "-" + s
    cur = rng.choice(CURRENCIES)
    s = f"{s} {cur.strip()}" if rng.random() < 0.2 else f"{cur}{s}"
    return f"({s})" if rng.random() < 0.05 else s


def code(rng: random.Random) -> str:
    """An identifier from a random template: 1-3 groups of letters, digits or both, joined by - / . or space."""
    classes = [string.ascii_uppercase, string.digits, string.digits, string.ascii_uppercase + string.digits,
               "0123456789ABCDEF", string.ascii_lowercase + string.digits]
    groups = ["".join(rng.choice(pool) for _ in range(rng.randint(2, 6)))
              for pool in (rng.choice(classes) for _ in range(rng.randint(1, 3)))]
    s = rng.choice(["-", "-", "/", ".", " ", ""]).join(groups)
    r = rng.random()
    if r < 0.1:
        return "#" + s
    if r < 0.18:
        return rng.choice(["No. ", "Nr. ", "ID ", "SN "]) + s
    return s


def email(rng: random.Random) -> str:
    user = rng.choice([pseudo_word(rng), real_word(rng).lower(), rng.choice(FIRST_NAMES).lower()])
    if rng.random() < 0.5:
        user += rng.choice([".", "-", ""]) + rng.choice([pseudo_word(rng), _digits(rng, 2)])
    return f"{user}@{pseudo_word(rng)}.{rng.choice(DOMAINS)}"


def web_address(rng: random.Random) -> str:
    host = f"{rng.choice(['www.', '', 'https://', 'https://www.'])}{pseudo_word(rng)}.{rng.choice(DOMAINS)}"
    return host + "".join("/" + rng.choice([pseudo_word(rng), _digits(rng, 3)]) for _ in range(rng.randint(0, 2)))


def phone(rng: random.Random) -> str:
    return rng.choice([
        f"+{rng.randint(1, 99)} {_digits(rng, 3)} {_digits(rng, 3)} {_digits(rng, 4)}",
        f"({_digits(rng, 3)}) {_digits(rng, 3)}-{_digits(rng, 4)}", f"0{_digits(rng, 3)} {_digits(rng, 6)}",
        f"{_digits(rng, 3)}-{_digits(rng, 3)}-{_digits(rng, 4)}",
        f"+{rng.randint(1, 99)} ({_digits(rng, 2)}) {_digits(rng, 7)}",
    ])


def quantity(rng: random.Random) -> str:
    n = rng.choice([str(rng.randint(1, 999)), f"{rng.uniform(0, 100):.{rng.randint(1, 2)}f}"])
    return f"{n}{rng.choice(['', ' '])}{rng.choice(UNITS)}" if rng.random() < 0.8 else f"{n} × {rng.randint(2, 99)}"


VALUES = (number, number, date, time_of_day, money, money, code, code, email, web_address, phone, quantity)


def value(rng: random.Random) -> str:
    """A non-word token: a number, date, time, amount, code, address, phone number or quantity."""
    return rng.choice(VALUES)(rng)


def token(rng: random.Random) -> str:
    """One token of running text: mostly words, also names, values and random strings."""
    r = rng.random()
    if r < 0.72:
        return cased(rng, word(rng))
    if r < 0.8:
        return person(rng)
    return value(rng)


def sentence(rng: random.Random, n_tokens: int | None = None) -> str:
    """A sentence of tokens, capitalised, with inner punctuation, brackets or quotes and a closing mark."""
    n = n_tokens if n_tokens is not None else rng.randint(3, 16)
    out = []
    for i in range(n):
        t = token(rng)
        if i == 0:
            t = t[:1].upper() + t[1:]
        r = rng.random()
        if r < 0.04:
            t = rng.choice(["(", "[", "“", "‘", "\"", "'", "«"]) + t
            t += {"(": ")", "[": "]", "“": "”", "‘": "’", "\"": "\"", "'": "'", "«": "»"}[t[0]]
        if i < n - 1 and rng.random() < 0.12:
            t += rng.choice([",", ",", ",", ";", ":", " –", " —", " /", " &"])
        out.append(t)
    return " ".join(out) + rng.choice([".", ".", ".", ".", "!", "?", "…", "", ":"])


def title(rng: random.Random) -> str:
    """A heading of 1-6 tokens, in Title Case or UPPER, sometimes numbered."""
    ws = [word(rng) if rng.random() < 0.85 else value(rng) for _ in range(rng.randint(1, 6))]
    ws = [w.upper() for w in ws] if rng.random() < 0.25 else [w[:1].upper() + w[1:] for w in ws]
    r = rng.random()
    if r < 0.15:
        ws.insert(0, f"{rng.randint(1, 12)}.")
    elif r < 0.25:
        ws.insert(0, f"{rng.randint(1, 9)}.{rng.randint(1, 9)}")
    elif r < 0.3:
        ws[:0] = [rng.choice(["Section", "Part", "Chapter", "Annex", "Article"]), f"{rng.randint(1, 30)}:"]
    return " ".join(ws)


def list_item(rng: random.Random) -> str:
    """A list entry: a key-value pair, a short phrase or a sentence."""
    r = rng.random()
    if r < 0.3:
        return f"{key(rng)}: {value(rng)}"
    if r < 0.6:
        return " ".join(cased(rng, word(rng), 0.3) for _ in range(rng.randint(1, 4)))
    return sentence(rng, rng.randint(3, 12))


def key(rng: random.Random) -> str:
    """A form label: a usual one, or made-up words in Title Case."""
    if rng.random() < 0.6:
        k = rng.choice(KEYS)
    else:
        k = " ".join(pseudo_word(rng).capitalize() for _ in range(rng.randint(1, 2)))
    return k.upper() if rng.random() < 0.15 else k


def key_value(rng: random.Random) -> tuple[str, str]:
    """A label and its value (a value, a name or a few words)."""
    r = rng.random()
    v = value(rng) if r < 0.6 else person(rng) if r < 0.75 else " ".join(token(rng) for _ in range(rng.randint(1, 4)))
    return key(rng), v


COLUMN_KINDS = ("text", "name", "date", "money", "number", "code", "quantity")


def cell(rng: random.Random, column_kind: str) -> str:
    """A table cell of one column kind (``COLUMN_KINDS``)."""
    if column_kind == "text":
        return " ".join(cased(rng, word(rng), 0.5) for _ in range(rng.randint(1, 3)))
    return {"name": person, "date": date, "money": money, "number": number, "code": code,
            "quantity": quantity}[column_kind](rng)


def header(rng: random.Random, column_kind: str) -> str:
    """A column header: a usual one for the kind, or made-up words."""
    usual = {"text": ["Item", "Description", "Product", "Category", "Name", "Region", "Task"],
             "name": ["Name", "Owner", "Contact", "Client", "Author", "Assignee"],
             "date": ["Date", "Due", "Issued", "Updated", "Deadline", "Shipped"],
             "money": ["Amount", "Price", "Total", "Cost", "Net", "Balance"],
             "number": ["Qty", "Value", "Rate", "Count", "Score", "No."],
             "code": ["Ref", "ID", "Code", "Invoice", "SKU", "Serial"],
             "quantity": ["Size", "Weight", "Volume", "Length", "Duration"]}[column_kind]
    h = rng.choice(usual) if rng.random() < 0.7 else pseudo_word(rng).capitalize()
    return h.upper() if rng.random() < 0.2 else h
