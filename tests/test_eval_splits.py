"""Evaluation pages: the independent renderer shares no code with the training generator, its pages are clean,
deterministic and well-formed, and every evaluation split gives pages outside training."""

import ast
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from markdown_checks import check_markdown
from transformers import PreTrainedTokenizerFast

import ocria.data
from ocria.data import READING, generate, split_seeds
from ocria.data.config import HELDOUT_LAYOUTS
from ocria.data.eval_render import DOCUMENTS, independent_page
from ocria.data.fonts import split_files
from ocria.data.splits import EVAL_SPLITS, SYNTHETIC_CONFIGS, eval_pages
from ocria.data.tokenizer import ASSET_DIR
from ocria.errors import OcriaError

DATA = Path(ocria.data.__file__).parent
# The generator's modules: what draws, lays out or writes training pages.
GENERATOR = ("compose", "config", "fonts", "layout", "page", "render", "synth", "text", "words")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def test_independent_renderer_shares_no_code_with_the_generator():
    """eval_render.py imports the standard library and PIL only, and no generator module imports it."""
    own = _imports(DATA / "eval_render.py")
    assert all(name.split(".")[0] in sys.stdlib_module_names or name.split(".")[0] == "PIL" for name in own), own
    for module in GENERATOR:
        assert not any("eval_render" in name or "splits" in name for name in _imports(DATA / f"{module}.py")), module


def test_independent_pages_are_deterministic_clean_prints():
    pages = [independent_page(i) for i in range(40)]
    tok = PreTrainedTokenizerFast.from_pretrained(str(ASSET_DIR), local_files_only=True)
    assert max(len(tok.encode(p.markdown)) for p in pages) <= 384  # within the evaluation's answer budget
    again = independent_page(7)
    assert again.markdown == pages[7].markdown and again.image.tobytes() == pages[7].image.tobytes()
    assert set(Counter(p.doc for p in pages)) == set(DOCUMENTS) and len({p.font for p in pages}) >= 4
    assert any(p.image.width % 32 or p.image.height % 32 for p in pages)  # any size, as real pages come
    for p in pages:
        px = np.asarray(p.image)
        assert p.image.mode == "RGB" and px.min() < 40 and np.median(px) == 255
        assert 50_000 < p.image.width * p.image.height < 600_000
        check_markdown(p.markdown)
    assert len({p.markdown for p in pages}) == 40


def test_realistic_pages_are_the_independent_pages_at_1_to_4_megapixels():
    big, small = eval_pages("realistic", 4, start=3), eval_pages("independent", 4, start=3)
    for (image, truth), (ref, ref_truth) in zip(big, small):
        assert truth == ref_truth
        assert 0.98e6 <= image.width * image.height <= 4.05e6
        assert abs(image.width / image.height - ref.width / ref.height) < 0.01


def test_every_split_gives_pages_outside_training():
    for split in EVAL_SPLITS:
        pages = eval_pages(split, 2)
        assert len(pages) == 2 and all(truth for _, truth in pages), split
    heldout = split_seeds("heldout", 3)
    for split, cfg in SYNTHETIC_CONFIGS.items():
        assert [t for _, t in eval_pages(split, 3)] == [generate(s, None, cfg).markdown for s in heldout]
    assert SYNTHETIC_CONFIGS["heldout_fonts"] == replace(READING, fonts="heldout")
    assert SYNTHETIC_CONFIGS["heldout_layout"].layouts == HELDOUT_LAYOUTS
    fonts = set().union(*(generate(s, None, SYNTHETIC_CONFIGS["heldout_fonts"]).fonts for s in heldout))
    assert fonts and fonts <= split_files("heldout")
    with pytest.raises(OcriaError, match="unknown evaluation split 'test'"):
        eval_pages("test", 1)
