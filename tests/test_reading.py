"""The training mixture (READING): deterministic pages, broad text every font draws, held-out typefaces and layout
family never in training, Markdown that is exactly the drawn text, answers that fit the evaluation's budget."""

import random
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from markdown_checks import check_markdown
from PIL import Image, ImageDraw, ImageFont
from transformers import PreTrainedTokenizerFast

from ocria.data import READING, SynthConfig, generate, split_seeds
from ocria.data import text as broad
from ocria.data import words as lexicon
from ocria.data.compose import FAMILY_KINDS
from ocria.data.config import HELDOUT_LAYOUTS, LAYOUT_FAMILIES, TRAIN_LAYOUTS
from ocria.data.fonts import FONT_DIR, TYPEFACES, split_files, typefaces
from ocria.data.page import TextOp
from ocria.data.synth import lay_out
from ocria.data.tokenizer import ASSET_DIR
from ocria.errors import ConfigError, OcriaError
from ocria.train.data import SplitDocuments

MARKERS = {"•", "-", "–", "·", "›", "*", "»", "#", "##", "|", "---"}
ORDINAL = re.compile(r"\d+[.)]")


def _words(texts: list[str]) -> list[str]:
    return [w for t in texts for w in t.split() if w not in MARKERS and not ORDINAL.fullmatch(w)]


@pytest.mark.parametrize("family", [f for f in LAYOUT_FAMILIES if f != "classic"])
def test_each_family_is_deterministic_and_draws_its_kinds(family):
    cfg = replace(READING, layouts=(family,))
    for kind in FAMILY_KINDS[family]:
        for seed in range(6):
            a, b = generate(seed, kind, cfg), generate(seed, kind, cfg)
            assert a.markdown == b.markdown and a.fonts == b.fonts and a.layout == family and a.kind == kind
            assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
            assert a.image.mode == "RGB" and a.image.width <= cfg.max_width * cfg.max_scale
            px = np.asarray(a.image).astype(np.float32).mean(axis=2)
            assert (px < np.median(px) - 60).sum() > 20, "no dark text pixels on the page"
            check_markdown(a.markdown)
    assert len({generate(s, None, cfg).markdown for s in range(12)}) == 12


def test_kinds_pick_the_families_that_make_them():
    assert {lay_out(s, "table", READING).layout for s in range(40)} == {"classic", "plain"}
    assert len({lay_out(s, None, READING).layout for s in range(200)}) == len(TRAIN_LAYOUTS)
    with pytest.raises(OcriaError, match="makes 'table' documents"):
        lay_out(0, "table", replace(READING, layouts=("letter",)))


def test_classic_is_unchanged_by_the_mixture():
    """A classic page drawn inside a mixture is the classic generator's page for that seed."""
    mix = replace(SynthConfig(), layouts=("classic", "plain"))
    seed = next(s for s in range(100) if lay_out(s, None, mix).layout == "classic")
    ours, classic = generate(seed, None, mix), generate(seed)
    assert ours.markdown == classic.markdown and np.array_equal(np.asarray(ours.image), np.asarray(classic.image))


def test_markdown_holds_exactly_the_drawn_text():
    """The words drawn on a page, in drawing order, are the Markdown's words (markers and structure aside)."""
    for seed in range(150):
        page = lay_out(seed, None, READING)
        drawn = _words([op.text for op in page.ops if isinstance(op, TextOp)])
        assert drawn == _words(page.markdown.split("\n")), (seed, page.layout)


def test_training_pages_never_draw_held_out_typefaces_or_layouts():
    train_files, held_files = split_files("train"), split_files("heldout")
    assert train_files and held_files and not train_files & held_files
    assert {t.name for t in typefaces("heldout")} == {"DejaVu Serif", "DejaVu Sans Mono"}
    assert set(HELDOUT_LAYOUTS).isdisjoint(READING.layouts) and READING.fonts == "train"
    assert SplitDocuments(ASSET_DIR).config == READING  # what the training loader renders
    seen, layouts = set(), Counter()
    for seed in split_seeds("train", 400):
        page = lay_out(seed, None, READING)
        seen |= page.fonts
        layouts[page.layout] += 1
    assert seen <= train_files and len(seen) >= 8  # many faces and weights, none held out
    assert set(layouts) == set(TRAIN_LAYOUTS)
    held = set().union(*(lay_out(s, None, replace(READING, fonts="heldout")).fonts for s in range(60)))
    assert held <= held_files and {"DejaVuSerif.ttf", "DejaVuSansMono.ttf"} <= held


def test_every_typeface_draws_every_character_of_the_text():
    """A missing glyph is drawn as the font's .notdef box: no character of the alphabet may look like it."""
    chars = sorted(broad.ALPHABET - {" "}) + ["•", "–", "·", "›", "*", "»"]

    def pixels(c: str, font: ImageFont.FreeTypeFont) -> bytes:
        img = Image.new("L", (48, 48))
        ImageDraw.Draw(img).text((8, 8), c, font=font, fill=255)
        return img.tobytes()

    for face in TYPEFACES:
        for name in face.files:
            font = ImageFont.truetype(str(FONT_DIR / name), 24)
            notdef = pixels("\ue000", font)
            missing = [c for c in chars if pixels(c, font) == notdef]
            assert not missing, (name, missing)


def test_text_is_broad():
    rng = random.Random(0)
    tokens = [broad.token(rng) for _ in range(3000)]
    known = set(lexicon.COMMON + lexicon.NOUNS + lexicon.ADJECTIVES + broad.MORE_WORDS)
    assert sum(t.lower() in known for t in tokens) < 0.45 * len(tokens)  # real words are a minority
    assert len(set(tokens)) > 0.6 * len(tokens)
    joined = "".join(tokens)
    assert set(joined) <= broad.ALPHABET and not set(joined) & set("|*_`\\<>~")
    for cls in (str.isdigit, str.isupper, str.islower, lambda c: c in broad.ACCENTED, lambda c: c in "€£$¥"):
        assert sum(map(cls, joined)) > 20
    dates = [broad.date(rng) for _ in range(300)]
    assert len({re.sub(r"\d", "9", re.sub(r"[A-Za-z]+", "A", d)) for d in dates}) >= 8  # many notations


def test_answers_fit_the_evaluation_budget():
    """Within eval_max_tokens (384) whatever the text, so a page's CER is never a truncated answer's."""
    tok = PreTrainedTokenizerFast.from_pretrained(str(ASSET_DIR), local_files_only=True)
    for cfg in (READING, replace(READING, fonts="heldout"), replace(READING, layouts=HELDOUT_LAYOUTS)):
        lengths = [len(tok.encode(lay_out(s, None, cfg).markdown)) for s in split_seeds("heldout", 150)]
        assert max(lengths) <= 384 and sorted(lengths)[75] >= 40, lengths


def test_some_pages_are_larger_than_the_pixel_budget_and_artifacts_vary():
    pages = [lay_out(s, None, READING) for s in range(300)]
    ours = [p for p in pages if p.layout != "classic"]
    assert sum(p.width * p.height > 512 * 512 for p in ours) > 10
    assert sum(p.jpeg_quality > 0 for p in ours) > 30 and sum(p.rotation != 0 for p in ours) > 30
    assert sum(p.noise_sigma == 0 for p in ours) > 30 and sum(p.tint != (1.0, 1.0, 1.0) for p in ours) > 30
    assert all(abs(p.rotation) <= READING.max_rotation for p in ours)


def test_bad_reading_configs_are_rejected():
    for kwargs in ({"layouts": ()}, {"layouts": ("plain", "plain")}, {"layouts": ("poster",)},
                   {"fonts": "test"}, {"max_scale": 0.5}, {"max_rotation": 30.0}, {"jpeg_share": 2.0},
                   {"max_chars": 10}):
        with pytest.raises(ConfigError):
            SynthConfig(**kwargs)
