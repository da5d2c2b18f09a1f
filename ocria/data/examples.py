"""The example documents shipped in `examples/`: held-out synthetic pages, each PNG with its `.md` truth.

A `.md` file holds the document's Markdown followed by one newline.

Regenerate with `python -m ocria.data.examples [--out examples]` (byte-identical on the same Pillow).
They are rendered without pixel noise (a clean scan) so the PNGs stay a few KB.
"""

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

from ocria.data.config import SynthConfig
from ocria.data.synth import Document, generate, split_seeds

CLEAN = SynthConfig(max_noise=0.0)
# name -> (kind, index in the held-out split)
EXAMPLES = {"report": ("heading", 2), "invoice_table": ("table", 0), "checklist": ("list", 3)}


def example(name: str) -> Document:
    kind, index = EXAMPLES[name]
    return generate(split_seeds("heldout", 1, start=index)[0], kind, CLEAN)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_examples(out_dir: Path) -> list[Path]:
    """Write `<name>.png` and `<name>.md` for every example into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in EXAMPLES:
        doc = example(name)
        png = io.BytesIO()
        doc.image.save(png, format="PNG", optimize=True)
        for path, data in ((out_dir / f"{name}.png", png.getvalue()), (out_dir / f"{name}.md", doc.markdown.encode())):
            _atomic_write(path, data + (b"\n" if path.suffix == ".md" else b""))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ocria.data.examples", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("examples"), help="output directory (default: ./examples)")
    args = ap.parse_args(argv)
    for path in write_examples(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
