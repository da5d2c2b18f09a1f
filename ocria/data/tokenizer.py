"""Train the ocria-mini tokenizer: a 512-entry byte-level BPE fitted to the synthetic documents' Markdown.

Byte-level means every UTF-8 string encodes and decodes back exactly, whatever the merges learned.
The special tokens sit at fixed ids 0..6 (Qwen3.5's names, plus the DFlash drafter's mask).
Regenerate (byte-identical) with `python -m ocria.data.tokenizer`; `--check` only compares.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from ocria.data.config import LONG_PAGE, SynthConfig
from ocria.data.synth import markdown, split_seeds

VOCAB_SIZE = 512
SPECIAL_TOKENS = (
    "<|endoftext|>",  # 0: document end / padding
    "<|im_start|>",  # 1: chat turn start
    "<|im_end|>",  # 2: chat turn end = end of generation (eos)
    "<|vision_start|>",  # 3
    "<|vision_end|>",  # 4
    "<|image_pad|>",  # 5: one per merged image patch
    "<|mask|>",  # 6: DFlash drafter mask slot
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
CORPUS_DOCS = 6000  # short pages from the train split
# The short pages' layout when the shipped tokenizer was fitted (13-20 px text, more words per page):
# pinned so the tokenizer rebuilds byte-identically whatever the generator's defaults become.
CORPUS_CONFIG = SynthConfig(min_font_px=13, max_font_px=20)
CORPUS_LONG_DOCS = 400  # long pages, so merges see more list / table / page structure
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "ocria-mini"
# Pieces before byte mapping: a word with at most one leading non-letter, single digits (numbers stay
# digit by digit, as in Qwen), punctuation runs with their newlines, newline runs, other whitespace.
SPLIT_PATTERN = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CHAT_TEMPLATE = (  # Qwen-style turns; one <|image_pad|> per image, expanded by the processor / runtime
    "{% for message in messages %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for item in message.content %}"
    "{% if item.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item.type == 'text' %}{{ item.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    """The training text: Markdown of the first train-split documents, short and long layouts."""
    texts = [markdown(s, config=CORPUS_CONFIG) for s in split_seeds("train", CORPUS_DOCS)]
    texts += [markdown(s, config=LONG_PAGE) for s in split_seeds("train", CORPUS_LONG_DOCS, start=CORPUS_DOCS)]
    return texts


def build_tokenizer() -> Tokenizer:
    """Train the BPE; deterministic (fixed corpus, the trainer breaks ties by pair order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise RuntimeError(f"BPE training gave {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t} got id {tok.token_to_id(t)}, expected {i}")
    return tok


def tokenizer_config() -> dict:
    """`tokenizer_config.json` for transformers' PreTrainedTokenizerFast: eos is <|im_end|> (id 2)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "mask_token": "<|mask|>",
        "extra_special_tokens": {
            "image_token": "<|image_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": CHAT_TEMPLATE,
    }


def files() -> dict[str, str]:
    """File name -> exact text of every tokenizer file."""
    return {
        "tokenizer.json": build_tokenizer().to_str(pretty=True) + "\n",
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n",
    }


def write(out_dir: Path) -> list[Path]:
    """Write the tokenizer files into `out_dir`, each through a temp file renamed into place."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files().items():
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_dir / name)
        written.append(out_dir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ocria.data.tokenizer", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ASSET_DIR, help="directory for tokenizer.json + tokenizer_config.json")
    ap.add_argument("--check", action="store_true", help="only report whether the files in --out are up to date")
    args = ap.parse_args(argv)
    if args.check:
        wanted = files()
        stale = [n for n, t in wanted.items() if not (args.out / n).is_file() or (args.out / n).read_text("utf-8") != t]
        print("stale: " + ", ".join(stale) if stale else "tokenizer files are up to date")
        return 1 if stale else 0
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
