"""The shipped ocria-mini tokenizer and image processor config: ids, exact round trips, regeneration, loading."""

import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLImageProcessorPil

from ocria.data import dataset, generate
from ocria.data.examples import EXAMPLES
from ocria.data.tokenizer import ASSET_DIR, SPECIAL_TOKENS, VOCAB_SIZE, files

REPO = Path(__file__).resolve().parent.parent
EXPECTED_IDS = {
    "<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|vision_start|>": 3, "<|vision_end|>": 4,
    "<|image_pad|>": 5, "<|mask|>": 6,
}


@pytest.fixture(scope="module")
def hf_tok():
    return AutoTokenizer.from_pretrained(str(ASSET_DIR), local_files_only=True)


def _random_text(rng: random.Random, n: int) -> str:
    pools = [
        " \t\n", "abcXYZ019.,;:|#-", "éüßøñç€£°•–", "日本語中文한국어", "🙂🚀𝔘", "\u00a0\u200b\u2028",
    ]
    out = []
    for _ in range(n):
        out.append(rng.choice(rng.choice(pools)) if rng.random() < 0.8 else chr(rng.randint(0x20, 0xD7FF)))
    return "".join(out)


def test_vocab_and_special_ids(hf_tok):
    assert len(hf_tok) == VOCAB_SIZE
    assert list(SPECIAL_TOKENS) == list(EXPECTED_IDS)
    for tok, i in EXPECTED_IDS.items():
        assert hf_tok.convert_tokens_to_ids(tok) == i
        assert hf_tok.encode(f"a{tok}b", add_special_tokens=False)[1] == i
    assert hf_tok.eos_token_id == 2 and hf_tok.pad_token_id == 0 and hf_tok.mask_token_id == 6
    assert hf_tok.image_token_id == 5 and hf_tok.bos_token is None
    assert hf_tok.encode("# Title", add_special_tokens=True) == hf_tok.encode("# Title", add_special_tokens=False)


def test_round_trip_is_exact(hf_tok):
    raw = Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json"))
    texts = [
        "", " ", "  leading and trailing  ", "\n\n| a | b |\n| --- | --- |\n", "tab\there", "€1,234.50 £7 °C",
        "naïve café — “quotes” 日本語 🙂 𝔘", "\r\n\r\n", "x" * 300, "<|im_end|> literal",
    ]
    texts += [d.markdown for d in dataset("heldout", 40)]
    rng = random.Random(0)
    texts += [_random_text(rng, rng.randint(1, 80)) for _ in range(300)]
    for text in texts:
        ids = hf_tok.encode(text, add_special_tokens=False)
        assert hf_tok.decode(ids) == text
        assert raw.decode(raw.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_bpe_learned_document_structure(hf_tok):
    md = generate(3, "table").markdown
    assert len(hf_tok.encode(md, add_special_tokens=False)) < 0.75 * len(md.encode())
    assert len(hf_tok.tokenize(" ---")) == 1


def test_regenerates_byte_identically():
    for name, text in files().items():
        assert (ASSET_DIR / name).read_text("utf-8") == text, f"{name} is stale: run python -m ocria.data.tokenizer"


def test_chat_template(hf_tok):
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Read."}]}]
    text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    expected = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Read.<|im_end|>\n"
    assert text == expected + "<|im_start|>assistant\n"


def test_image_processor_loads_and_counts_tokens():
    proc = Qwen2VLImageProcessorPil.from_pretrained(str(ASSET_DIR), local_files_only=True)
    assert type(AutoImageProcessor.from_pretrained(str(ASSET_DIR), local_files_only=True)) is Qwen2VLImageProcessorPil
    assert (proc.patch_size, proc.temporal_patch_size, proc.merge_size) == (16, 2, 2)
    images = [Image.open(REPO / "examples" / f"{n}.png") for n in EXAMPLES] + [generate(6, "page").image]
    for img in images:
        out = proc(images=[img], return_tensors="np")
        (t, gh, gw), = out["image_grid_thw"].tolist()
        w, h = img.size
        assert (t, gh * 16, gw * 16) == (1, h, w), "aligned images must not be resized"
        assert out["pixel_values"].shape == (gh * gw, 3 * 2 * 16 * 16)
        assert gh * gw // 4 <= 256
        # first row = top-left 16x16 patch, (channel, time, y, x), scaled by mean 1 (white = 0), std 0.5
        first = np.asarray(img.convert("RGB"), dtype=np.float32)[:16, :16].transpose(2, 0, 1) / 127.5 - 2.0
        expected = np.broadcast_to(first[:, None], (3, 2, 16, 16)).reshape(-1)
        np.testing.assert_allclose(out["pixel_values"][0], expected, atol=1e-5)
    big = Image.new("RGB", (1024, 1024), "white")
    (_, gh, gw), = proc(images=[big], return_tensors="np")["image_grid_thw"].tolist()
    assert gh * gw // 4 <= 256
